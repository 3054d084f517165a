"""Is a run dir whole? What a sweep trusts before it counts a job as done, skips it on `--resume` or
copies its rows into sweep.csv.

A finished run dir holds DONE (exactly its text), summary.json (a JSON object) and its tables, each
checked as a CSV the studies write it:
  - a header of unique names, the first one the table's first column (`step`, `preset`);
  - every row with as many cells as the header, and the file ending with a newline (a file cut in
    the middle of a line has no newline at its end);
  - the numeric columns parse as numbers (an empty cell is allowed: `objective` between
    evaluations); `step` and `update` as integers;
  - in metrics.csv, (step, update) strictly increasing, so unique: two writers interleaving one
    file, or a row written twice, break it.
A damage is reported as `Damage(path, reason)`, the reason one short line.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass
from pathlib import Path

from runner.bounded import clip
from runner.core.schema import ALL_METRICS_COLUMNS, EVENT_COLUMNS, PROBE_COLUMNS, PROBE_FIGURES
from runner.records import DONE, DONE_TEXT


@dataclass(frozen=True)
class TableRule:
    first: str  # the header's first column
    numeric: frozenset[str]  # cells that must parse as numbers (or be empty)
    integer: frozenset[str]  # cells that must parse as integers (never empty)
    ordered: tuple[str, ...] = ()  # these columns, as a tuple of ints, strictly increase row by row


RULES = {
    "metrics.csv": TableRule(
        "step",
        frozenset(ALL_METRICS_COLUMNS) - {"correction", "precision", "step", "update"},
        frozenset({"step", "update"}),
        ("step", "update"),
    ),
    "probe.csv": TableRule(PROBE_COLUMNS[0], frozenset(PROBE_FIGURES) | {"low", "high"}, frozenset()),
    "events.csv": TableRule(EVENT_COLUMNS[0], frozenset(), frozenset({"step"})),
}
DATA_TABLES = ("metrics.csv", "probe.csv")  # a finished run has at least one
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*\Z")


class Damage(Exception):
    def __init__(self, path: Path, reason: str):
        self.path, self.reason = Path(path), reason
        super().__init__(f"{path}: {reason}")


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(0, 2)
        if f.tell() == 0:
            return True
        f.seek(-1, 2)
        return f.read(1) == b"\n"


def check_table(path: Path | str, rule: TableRule | None = None) -> int:
    """The number of data rows of a whole table; raises Damage otherwise."""
    path = Path(path)
    rule = rule if rule is not None else RULES.get(path.name)
    try:
        if not _ends_with_newline(path):
            raise Damage(path, "ends in the middle of a line (cut short?)")
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if not header:
                raise Damage(path, "no header")
            if len(set(header)) != len(header) or not all(_NAME.match(c) for c in header):
                raise Damage(path, f"header {clip(','.join(header))} is not a list of unique column names")
            if rule is not None and header[0] != rule.first:
                raise Damage(path, f"header starts with {clip(header[0])}, not {rule.first}")
            width = len(header)
            numeric = [(i, c) for i, c in enumerate(header) if rule and c in rule.numeric]
            integer = [(i, c) for i, c in enumerate(header) if rule and c in rule.integer]
            order = [header.index(c) for c in rule.ordered] if rule and all(c in header for c in rule.ordered) else []
            previous: tuple[int, ...] | None = None
            rows = 0
            for row in reader:
                line = reader.line_num
                if len(row) != width:
                    cells = f"{len(row)} cell" + ("" if len(row) == 1 else "s")
                    raise Damage(path, f"line {line} has {cells}, the header {width}")
                for i, c in numeric:
                    if row[i]:
                        try:
                            float(row[i])
                        except ValueError:
                            raise Damage(path, f"line {line}: {c} = {clip(row[i])} is not a number") from None
                for i, c in integer:
                    try:
                        int(row[i])
                    except ValueError:
                        raise Damage(path, f"line {line}: {c} = {clip(row[i])} is not an integer") from None
                if order:
                    key = tuple(int(row[i]) for i in order)
                    if previous is not None and key <= previous:
                        names = ", ".join(rule.ordered)
                        raise Damage(
                            path,
                            f"line {line}: ({names}) = {key} after {previous}: "
                            f"not increasing (a row repeated, or two writers)",
                        )
                    previous = key
                rows += 1
            return rows
    except UnicodeDecodeError:
        raise Damage(path, "not UTF-8 text") from None
    except csv.Error as exc:
        raise Damage(path, f"not CSV ({clip(str(exc))})") from None
    except OSError as exc:
        raise Damage(path, f"cannot be read ({exc.strerror or exc})") from None


def check_run_dir(run_dir: Path | str, done: bool = True) -> None:
    """Raise Damage unless the run dir's files are whole: with `done`, DONE and summary.json too (a
    failed run has neither)."""
    run_dir = Path(run_dir)
    if done:
        marker = run_dir / DONE
        try:
            text = marker.read_bytes()[: len(DONE_TEXT) + 1]
        except OSError as exc:
            raise Damage(marker, f"cannot be read ({exc.strerror or exc})") from None
        if text != DONE_TEXT.encode():
            raise Damage(marker, f"holds {clip(text)}, not {DONE_TEXT.strip()!r}")
        summary = run_dir / "summary.json"
        try:
            data = json.loads(summary.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise Damage(summary, "missing") from None
        except (OSError, ValueError):
            raise Damage(summary, "not valid JSON") from None
        if not isinstance(data, dict):
            raise Damage(summary, "not a JSON object")
        if not any((run_dir / t).is_file() for t in DATA_TABLES):
            raise Damage(run_dir / DATA_TABLES[0], f"missing (nor is there {', '.join(DATA_TABLES[1:])})")
    for name in RULES:
        if (run_dir / name).is_file():
            check_table(run_dir / name)


def damage(run_dir: Path | str, done: bool = True) -> Damage | None:
    try:
        check_run_dir(run_dir, done)
    except Damage as exc:
        return exc
    return None
