"""What a study leaves in its run dir: CSV files flushed row by row, an atomic summary.json, and a
`DONE` marker written last (a sweep treats a run dir without it as unfinished; a sweep job that
failed holds `ERROR` instead, written by runner/sweep/job.py).

A write that fails (a full disk, a quota, a vanished directory) raises WriteFailed: one line naming
the file and saying that its run dir is incomplete. Atomic writes go through a temporary file with
a name of its own (pid and random suffix) beside the target, so two writers never share one.

Values are formatted deterministically, so the same run gives the same bytes: floats by repr()
(the shortest string that round-trips), NaN and ±inf as nan / inf / -inf, None as empty.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import secrets
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from runner.errors import UserError

DONE = "DONE"
DONE_TEXT = "done\n"  # DONE's whole content: anything else is a damaged marker
ERROR = "ERROR"


class WriteFailed(UserError):
    """A file could not be written. The message names it and what is now incomplete."""


def write_failed(path: Path, exc: OSError, incomplete: str | None = None) -> WriteFailed:
    what = incomplete if incomplete is not None else f"the run dir {path.parent} is incomplete (no {DONE})"
    return WriteFailed(f"{exc.strerror or exc} while writing {path}; {what}")


def open_for_writing(path: Path, newline: str | None = None):
    """Every file a run writes is opened here (tests replace it with a writer that fails)."""
    return open(path, "w", newline=newline, encoding="utf-8")


@contextlib.contextmanager
def _writing(path: Path) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        raise write_failed(path, exc) from None


def fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    return str(value)


def _fast_fmt(value: Any) -> str:
    """fmt, with finite floats and ints (nearly every cell) taking the short path."""
    kind = type(value)
    if kind is float and -math.inf < value < math.inf:
        return repr(value)
    if kind is int:
        return str(value)
    return fmt(value)


class CsvWriter:
    """A CSV file with a fixed header; every row is flushed as it is written, so a crashed or
    still-running study can be read at any time."""

    def __init__(self, path: Path | str, columns: Sequence[str]):
        self.path = Path(path)
        self.columns = list(columns)
        with _writing(self.path):
            self._file = open_for_writing(self.path, newline="")
        self._csv = csv.writer(self._file, lineterminator="\n")
        with self._guard():
            self._csv.writerow(self.columns)
            self._file.flush()

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """A failed write closes the file (what it could not flush is dropped: the rows already on
        disk are whole) and raises WriteFailed."""
        try:
            yield
        except OSError as exc:
            self._abandon()
            raise write_failed(self.path, exc) from None

    def _abandon(self) -> None:
        with contextlib.suppress(OSError):
            self._file.close()

    def write(self, row: Mapping[str, Any]) -> None:
        with self._guard():
            self._csv.writerow([_fast_fmt(row.get(c)) for c in self.columns])
            self._file.flush()

    def write_rows(self, rows: Sequence[Sequence[Any]]) -> None:
        """Many positional rows (in column order), flushed once."""
        with self._guard():
            self._csv.writerows([[_fast_fmt(v) for v in row] for row in rows])
            self._file.flush()

    def write_number_rows(self, rows: Sequence[Sequence[int | float]], template: str) -> None:
        """Many positional rows of ints and floats only, flushed once: `template` is one %-format
        per row, e.g. "%d,%.9g\n" for float32 values (9 significant digits give back any float32
        exactly). A number never needs quoting, so the csv module's per-cell work is skipped."""
        text = "".join([template % tuple(row) for row in rows])
        with self._guard():
            self._file.write(text)
            self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            with self._guard():
                self._file.close()

    def __enter__(self) -> CsvWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class NumberCsvWriter(CsvWriter):
    """A CsvWriter for rows whose cells are ints and floats, except `constants`: cells that are the
    same in every row (a run's seed, correction name, ...), formatted and quoted once. Each row is
    then one %-format call instead of a Python loop over cells, byte for byte what CsvWriter writes
    (str of an int or a float, nan and ±inf included, is what fmt gives it; pass flags as ints)."""

    def __init__(self, path: Path | str, columns: Sequence[str], constants: Mapping[str, Any]):
        super().__init__(path, columns)
        self._variable = [c for c in self.columns if c not in constants]
        line = io.StringIO()
        csv.writer(line, lineterminator="").writerow(
            [fmt(constants[c]).replace("%", "%%") if c in constants else "\0" for c in self.columns]
        )
        self._template = line.getvalue().replace("\0", "%s") + "\n"

    def write(self, row: Mapping[str, Any]) -> None:
        line = self._template % tuple([row[c] for c in self._variable])
        with self._guard():
            self._file.write(line)
            self._file.flush()


class EventWriter(CsvWriter):
    """events.csv: one row per notable event, and a count per kind for the summary."""

    COLUMNS = ("step", "kind", "detail", "action")

    def __init__(self, path: Path | str):
        super().__init__(path, self.COLUMNS)
        self.counts: Counter[str] = Counter()

    def event(self, step: int, kind: str, detail: str, action: str) -> None:
        self.counts[kind] += 1
        self.write({"step": step, "kind": kind, "detail": detail, "action": action})


def unique_temp(path: Path) -> Path:
    """A new, empty, hidden file beside `path` that no other writer can be given (created with
    O_EXCL; the usual permissions, unlike mkstemp's 0600)."""
    while True:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except FileExistsError:
            continue


def write_text_atomic(path: Path | str, text: str, incomplete: str | None = None) -> None:
    """Write to a temporary file of its own beside `path`, then rename: a reader never sees half a
    file, and two writers never share a temporary file. On failure the temporary file is removed,
    the old `path` (if any) is left as it was, and WriteFailed says what is incomplete."""
    path = Path(path)
    tmp = None
    try:
        tmp = unique_temp(path)
        with open_for_writing(tmp) as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise write_failed(path, exc, incomplete) from None


def write_json_atomic(path: Path | str, data: Any, incomplete: str | None = None) -> None:
    """write_text_atomic of `data` as JSON. Non-finite floats become null (JSON has no NaN)."""
    write_text_atomic(path, json.dumps(_json_safe(data), indent=2, sort_keys=False) + "\n", incomplete)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def mark_done(run_dir: Path | str) -> None:
    """DONE, written atomically: a full disk leaves no marker rather than an empty one."""
    write_text_atomic(Path(run_dir) / DONE, DONE_TEXT)


def is_done(run_dir: Path | str) -> bool:
    """DONE is there and whole (its exact text)."""
    try:
        with open(Path(run_dir) / DONE, "rb") as f:
            return f.read(len(DONE_TEXT) + 1) == DONE_TEXT.encode()
    except OSError:
        return False
