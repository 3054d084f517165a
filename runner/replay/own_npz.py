"""is-study's own NPZ format: one file holding any number of steps, as flat [N, T] arrays.

    old, roll, mask, lp     [N, T] float   (old and lp optional; roll and mask required)
    advantages              [N, T] or [N]  (one per token, or one per sequence)
    step                    [N] int        (optional: every row is step 0)
    seq                     [N] int        (optional: row numbers within the step)

Read with numpy.load(allow_pickle=False): an object array (a pickle inside the zip) is refused, not run.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from runner.errors import UserError
from runner.replay.limits import Limits, check_size
from runner.replay.schema import FIELDS, BatchError, StepBatch, as_float_tensor, check

NAME = "npz"


def accepts(path: Path) -> bool:
    return path.suffix == ".npz"


def read(path: Path, limits: Limits) -> Iterator[StepBatch]:
    check_size(path, limits)
    src = str(path)
    try:
        with zipfile.ZipFile(path) as archive:  # what the arrays expand to, before numpy inflates them
            check_size(path, limits, sum(info.file_size for info in archive.infolist()))
        with np.load(path, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as exc:
        raise UserError(f"{src}: not a readable NPZ file ({exc})") from None
    for name in ("roll", "mask"):
        if name not in arrays:
            raise BatchError(src, None, name, f"missing (the file holds: {', '.join(sorted(arrays)) or 'nothing'})")
    rows = arrays["mask"].shape[0] if arrays["mask"].ndim else 0
    steps = arrays.get("step", np.zeros(rows, dtype=np.int64))
    if steps.shape != (rows,):
        raise BatchError(src, None, "step", f"{steps.size} values for {rows} rows")
    seq = arrays.get("seq")
    if seq is not None and seq.shape != (rows,):
        raise BatchError(src, None, "seq", f"{seq.size} values for {rows} rows")
    adv = arrays.get("advantages")
    if adv is not None and adv.ndim == 1 and arrays["mask"].ndim == 2:
        arrays["advantages"] = np.broadcast_to(adv[:, None], arrays["mask"].shape)
    for step in np.unique(steps):
        rows_of = np.flatnonzero(steps == step)
        step = int(step)
        tensors = {name: as_float_tensor(arrays[name][rows_of], src, step, name) for name in FIELDS if name in arrays}
        ids = torch.from_numpy(seq[rows_of].astype(np.int64)) if seq is not None else torch.arange(len(rows_of))
        yield check(StepBatch(step=step, seq=ids, source=src, **tensors))
