"""What a study leaves in its run dir: CSV files flushed row by row, an atomic summary.json, and a
`DONE` marker written last (a sweep treats a run dir without it as unfinished; a sweep job that
failed holds `ERROR` instead, written by runner/sweep_job.py).

Values are formatted deterministically, so the same run gives the same bytes: floats by repr()
(the shortest string that round-trips), NaN and ±inf as nan / inf / -inf, None as empty.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Sequence

DONE = "DONE"
ERROR = "ERROR"


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
        self._file = open(self.path, "w", newline="", encoding="utf-8")
        self._csv = csv.writer(self._file, lineterminator="\n")
        self._csv.writerow(self.columns)
        self._file.flush()

    def write(self, row: Mapping[str, Any]) -> None:
        self._csv.writerow([_fast_fmt(row.get(c)) for c in self.columns])
        self._file.flush()

    def write_rows(self, rows: Sequence[Sequence[Any]]) -> None:
        """Many positional rows (in column order), flushed once."""
        self._csv.writerows([[_fast_fmt(v) for v in row] for row in rows])
        self._file.flush()

    def write_number_rows(self, rows: Sequence[Sequence[int | float]], template: str) -> None:
        """Many positional rows of ints and floats only, flushed once: `template` is one %-format
        per row, e.g. "%d,%.9g\n" for float32 values (9 significant digits give back any float32
        exactly). A number never needs quoting, so the csv module's per-cell work is skipped."""
        self._file.write("".join([template % tuple(row) for row in rows]))
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> "CsvWriter":
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
            [fmt(constants[c]).replace("%", "%%") if c in constants else "\0" for c in self.columns])
        self._template = line.getvalue().replace("\0", "%s") + "\n"

    def write(self, row: Mapping[str, Any]) -> None:
        self._file.write(self._template % tuple([row[c] for c in self._variable]))
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


def write_json_atomic(path: Path | str, data: Any) -> None:
    """Write to a temporary file beside `path`, then rename: a reader never sees half a file.
    Non-finite floats become null (JSON has no NaN)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(_json_safe(data), indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def mark_done(run_dir: Path | str) -> None:
    (Path(run_dir) / DONE).write_text("done\n", encoding="utf-8")


def is_done(run_dir: Path | str) -> bool:
    return (Path(run_dir) / DONE).is_file()
