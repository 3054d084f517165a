"""`is-study report PATH [OVERRIDES]`: Markdown for an issue or a lab notebook. Two reports:
analysis/reports/dataset.py for a run, sweep or probe dir, analysis/reports/case_card.py for a case
file's repro card. This module holds what both share: which one PATH asks for, where the Markdown
goes, and its tables.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from runner.errors import UserError

CASE_SUFFIXES = (".yaml", ".yml", ".json")


# ----------------------------------------------------------------------------------------- entry
def case_file(path: str) -> Path | None:
    """The case file PATH names (a file, or a shipped case's name); None when PATH is a run, sweep or
    probe dir, or a sweep.csv. Anything else is a one-line error."""
    target = Path(path)
    if target.is_dir() or (target.is_file() and target.suffix == ".csv"):
        return None
    case_path = _case_path(path)
    if case_path is None:
        raise UserError(f"no such file or directory: {path}")
    return case_path


def write(text: str, dest: Path | None) -> None:
    if dest is None:
        sys.stdout.write(text)
        return
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write --out {dest}: {exc.strerror or exc}") from None


def destination(out: str | None, default: Path | None) -> Path | None:
    """Where --out sends a report: a file, or None for stdout ('-', or no --out and no default)."""
    if out == "-":
        return None
    if out is None:
        return default
    dest = Path(out)
    if dest.is_dir():
        raise UserError(f"--out {out} is a directory; give a file name, e.g. {dest / 'report.md'}")
    return dest


def _case_path(path: str) -> Path | None:
    p = Path(path)
    if p.is_file():
        if p.suffix not in CASE_SUFFIXES:
            raise UserError(f"{p}: expected a run dir, a sweep dir or a case file (.yaml/.json)")
        return p
    if not p.exists() and "/" not in path and os.sep not in path:
        from runner import registry

        return registry.shipped_case(path)
    return None


# ----------------------------------------------------------------------------------------- markdown bits
def fmt(v: Any, digits: int = 4) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        if v == int(v) and abs(v) < 1e6:
            return str(int(v))
        return f"{v:.{digits}g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(fmt(x, digits) for x in v) + "]"
    return str(v)


def cell(v: Any) -> str:
    return fmt(v).replace("|", "\\|").replace("\n", " ")


def table(rows: list[dict], columns: Sequence[str] | None = None) -> str:
    """A GitHub Markdown table via pandas.to_markdown (tabulate)."""
    import pandas as pd

    if not rows:
        return "_(no rows)_"
    df = pd.DataFrame([{k: cell(v) for k, v in r.items()} for r in rows], columns=columns)
    return df.to_markdown(index=False, disable_numparse=True)
