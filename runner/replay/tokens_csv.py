"""is-study's own tokens.csv (runner/core/schema.py TOKEN_COLUMNS: step, the run's constants, seq, pos, token,
old, roll): a train run's logged tokens, at step 0 and every `log.tokens_every` steps. It holds no advantages,
so the loss columns of its replay stay empty; every correction metric is there.

A row is a masked-in token at (seq, pos); a step's batch is rebuilt as [max seq + 1, max pos + 1] with mask 1
where a row is, so the metrics see what the run's own step saw (its mask is exactly the logged tokens).
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from runner.core.schema import CONSTANT_COLUMNS, TOKEN_COLUMNS
from runner.errors import UserError
from runner.replay.limits import Limits, check_size
from runner.replay.schema import StepBatch, check

NAME = "tokens-csv"


def accepts(path: Path) -> bool:
    return path.suffix == ".csv" and path.name.endswith("tokens.csv")


def read(path: Path, limits: Limits) -> Iterator[StepBatch]:
    check_size(path, limits)
    src = str(path)
    with open(path, encoding="utf-8", newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None or [c for c in TOKEN_COLUMNS if c not in header]:
            missing = TOKEN_COLUMNS if header is None else [c for c in TOKEN_COLUMNS if c not in header]
            raise UserError(f"{src}: not an is-study tokens.csv (missing column(s) {', '.join(missing)})")
        at = {c: header.index(c) for c in TOKEN_COLUMNS}
        constants = [at[c] for c in CONSTANT_COLUMNS]
        run = None
        step_rows: list[list[str]] = []
        step = None
        for number, cells in enumerate(reader, 2):
            if len(cells) != len(header):
                raise UserError(
                    f"{src}: line {number}: {len(cells)} cells, the header has {len(header)} (a truncated file?)"
                )
            key = tuple(cells[i] for i in constants)
            if run is None:
                run = key
            elif key != run:
                raise UserError(
                    f"{src}: line {number}: holds the tokens of more than one run ({', '.join(CONSTANT_COLUMNS)} "
                    "change); replay one run's tokens.csv"
                )
            if cells[at["step"]] != step and step_rows:
                yield _batch(src, step, step_rows, at)
                step_rows = []
            step = cells[at["step"]]
            step_rows.append(cells)
        if step_rows:
            yield _batch(src, step, step_rows, at)


def _batch(src: str, step_text: str, rows: list[list[str]], at: dict[str, int]) -> StepBatch:
    try:
        step = int(step_text)
        seq = np.array([int(r[at["seq"]]) for r in rows])
        pos = np.array([int(r[at["pos"]]) for r in rows])
    except ValueError as exc:
        raise UserError(f"{src}: step {step_text}: step, seq and pos must be integers ({exc})") from None
    values = {}
    for name in ("old", "roll"):
        try:
            values[name] = np.array([float(r[at[name]]) for r in rows], dtype=np.float32)
        except ValueError as exc:
            raise UserError(f"{src}: step {step}: field {name!r}: not a number ({exc})") from None
    if seq.min() < 0 or pos.min() < 0:
        raise UserError(f"{src}: step {step}: field 'seq' or 'pos': negative index")
    shape = (int(seq.max()) + 1, int(pos.max()) + 1)
    tensors = {}
    for name in ("old", "roll", "mask"):
        grid = np.zeros(shape, dtype=np.float32)
        grid[seq, pos] = 1.0 if name == "mask" else values[name]
        tensors[name] = torch.from_numpy(grid)
    return check(StepBatch(step=step, seq=torch.arange(shape[0]), source=src, **tensors))
