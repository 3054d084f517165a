"""is-study's own JSONL format: one JSON object per sequence, any number of steps in a file.

    {"step": 3, "seq": 0, "old": [...], "roll": [...], "mask": [...], "advantages": [...] or a number, "lp": [...]}

old and lp are optional, step defaults to 0 and seq to the line's number within its step. Each list holds one
value per token of the sequence; sequences of a step may differ in length (they are right-padded).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from runner.errors import UserError
from runner.replay.limits import Limits, check_size
from runner.replay.schema import StepBatch, from_rows

NAME = "jsonl"


def accepts(path: Path) -> bool:
    return path.suffix == ".jsonl" and not path.name.startswith("train_data_step")


def read_lines(path: Path, limits: Limits) -> Iterator[tuple[int, dict]]:
    """(line number, object) for every non-empty line; a line that is not a JSON object is refused."""
    check_size(path, limits)
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}: line {number}: not JSON ({exc.msg}; a truncated file?)") from None
            if not isinstance(obj, dict):
                raise UserError(f"{path}: line {number}: expected a JSON object, got {type(obj).__name__}")
            yield number, obj


def read(path: Path, limits: Limits) -> Iterator[StepBatch]:
    by_step: dict[int, list[dict]] = {}
    for number, obj in read_lines(path, limits):
        step = obj.get("step", 0)
        if isinstance(step, bool) or not isinstance(step, int):
            raise UserError(f"{path}: line {number}: field 'step' must be an integer, got {step!r}")
        by_step.setdefault(step, []).append(obj)
    for step in sorted(by_step):
        rows = by_step[step]
        seq = [row.get("seq", i) for i, row in enumerate(rows)]
        yield from_rows(str(path), step, rows, seq)
