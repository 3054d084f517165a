"""The one batch every reader produces: a step's sequences as [B, T] tensors, whatever the framework.

    roll        [B, T] float32  the rollout engine's log-probs of the sampled tokens (required)
    mask        [B, T] float32  1 where a token counts in the loss, 0 elsewhere (required; 0/1 only)
    advantages  [B, T] float32  per-token advantages (required by the file formats that have them; None in
                                is-study's tokens.csv, and then the loss columns stay empty)
    old         [B, T] float32  the trainer's log-probs before the update (None: the dump has none, and only
                                a bypass form, lp − roll, can be evaluated)
    lp          [B, T] float32  the trainer's current log-probs (optional; without it the loss is taken at
                                lp = old, a step's first update, where PPO's ratio is 1)
    seq         [B]    int64    the sequences' ids in the dump
    step        int             the training step (or rollout id) the batch belongs to

Padding may sit on either side (SkyRL pads on the left): every correction reduces over the mask, so where the
real tokens sit in a row does not matter. Values at mask = 0 are never read by our presets (they are zeroed
before any arithmetic), so a framework's NaN or garbage padding is harmless.

Malformed input raises a UserError naming the file, the step and the field: `BatchError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from runner.errors import UserError

FIELDS = ("old", "roll", "mask", "advantages", "lp")  # the [B, T] tensors, in this order everywhere
REQUIRED = ("roll", "mask")


class BatchError(UserError):
    """A file whose content is not a batch: one line naming file, step and field."""

    def __init__(self, source: str, step: int | None, field: str, what: str):
        where = f"{source}: " + (f"step {step}: " if step is not None else "")
        super().__init__(f"{where}field {field!r}: {what}")


@dataclass
class StepBatch:
    step: int
    roll: torch.Tensor
    mask: torch.Tensor
    seq: torch.Tensor
    advantages: torch.Tensor | None = None
    old: torch.Tensor | None = None
    lp: torch.Tensor | None = None
    source: str = ""

    @property
    def tokens(self) -> int:
        return int(self.mask.sum())

    def tensor(self, name: str) -> torch.Tensor | None:
        return getattr(self, name)


def as_float_tensor(value, source: str, step: int | None, field: str) -> torch.Tensor:
    """A numeric array of any framework's (list, NumPy, torch) as a float32 tensor; text or objects refused."""
    try:
        if isinstance(value, torch.Tensor):
            out = value.detach().to("cpu", torch.float32)
        else:
            array = np.asarray(value)
            if array.dtype == object or array.dtype.kind not in "biuf":
                raise TypeError(f"holds {array.dtype} values")
            out = torch.from_numpy(np.array(array, dtype=np.float32, order="C"))  # a copy: NPZ arrays are read-only
    except (TypeError, ValueError) as exc:
        raise BatchError(source, step, field, f"not a numeric array ({exc})") from None
    return out


def check(batch: StepBatch) -> StepBatch:
    """Shapes agree, the mask is 0/1 (a NaN where a mask belongs is refused), seq has one id per row."""
    src, step = batch.source, batch.step
    for name in REQUIRED:
        if batch.tensor(name) is None:
            raise BatchError(src, step, name, "missing")
    shape = tuple(batch.mask.shape)
    if len(shape) != 2:
        raise BatchError(src, step, "mask", f"expected [sequences, tokens], got shape {list(shape)}")
    for name in FIELDS:
        value = batch.tensor(name)
        if value is not None and tuple(value.shape) != shape:
            raise BatchError(src, step, name, f"shape {list(value.shape)} disagrees with mask's {list(shape)}")
    mask = batch.mask
    bad = ~((mask == 0) | (mask == 1))
    if bool(bad.any()):
        row, col = (int(i) for i in bad.nonzero()[0])
        raise BatchError(
            src,
            step,
            "mask",
            f"value {float(mask[row, col])!r} at sequence {int(batch.seq[row])}, token {col}: a mask holds 0 or 1",
        )
    if tuple(batch.seq.shape) != (shape[0],):
        raise BatchError(src, step, "seq", f"{batch.seq.numel()} ids for {shape[0]} sequences")
    return batch


def from_rows(source: str, step: int, rows: Sequence[Mapping], seq_ids: Sequence[int] | None = None) -> StepBatch:
    """A step from one dict per sequence of 1-D values (lists or arrays), right-padded to the longest row.
    Each row must give every present field as many values as its mask; a field present in one row and not
    in another is refused too (the batch would be half-corrected)."""
    if not rows:
        raise BatchError(source, step, "mask", "no sequences")
    present = [name for name in FIELDS if rows[0].get(name) is not None]
    width = 0
    arrays: list[dict[str, np.ndarray]] = []
    for i, row in enumerate(rows):
        seq = seq_ids[i] if seq_ids is not None else i
        got = {}
        for name in FIELDS:
            value = row.get(name)
            if (value is None) != (name not in present):
                raise BatchError(source, step, name, f"present in some sequences and not in sequence {seq}")
            if value is None:
                continue
            got[name] = _row_array(value, source, step, name, seq)
        for name in REQUIRED:
            if name not in got:
                raise BatchError(source, step, name, f"missing in sequence {seq}")
        length = got["mask"].shape[0]
        if "advantages" in got and got["advantages"].ndim == 0:  # one advantage per sequence, as GRPO's
            got["advantages"] = np.full(length, got["advantages"], dtype=np.float32)
        for name, arr in got.items():
            if arr.shape[0] != length:
                raise BatchError(source, step, name, f"sequence {seq} has {arr.shape[0]} values, its mask {length}")
        width = max(width, length)
        arrays.append(got)
    out = {name: np.zeros((len(rows), width), dtype=np.float32) for name in present}
    for i, got in enumerate(arrays):
        for name, arr in got.items():
            out[name][i, : arr.shape[0]] = arr
    ids = torch.as_tensor(list(seq_ids) if seq_ids is not None else range(len(rows)), dtype=torch.int64)
    tensors = {name: torch.from_numpy(value) for name, value in out.items()}
    return check(StepBatch(step=step, seq=ids, source=source, **tensors))


def _row_array(value, source: str, step: int, name: str, seq: int) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().to("cpu", torch.float32).numpy()
    try:
        arr = np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError):
        raise BatchError(source, step, name, f"sequence {seq}: not a list of numbers") from None
    if arr.ndim == 0 and name == "advantages":
        return arr  # broadcast below by the caller's shape check: a per-sequence advantage
    if arr.ndim != 1:
        raise BatchError(
            source, step, name, f"sequence {seq}: expected one value per token, got shape {list(arr.shape)}"
        )
    return arr


def concat(batches: Sequence[StepBatch]) -> StepBatch:
    """One step's pieces (a framework's ranks or shards) as one batch, right-padded to the widest."""
    if len(batches) == 1:
        return batches[0]
    first = batches[0]
    width = max(b.mask.shape[1] for b in batches)
    fields = {}
    for name in FIELDS:
        have = [b.tensor(name) is not None for b in batches]
        if any(have) and not all(have):
            missing = next(b for b in batches if b.tensor(name) is None)
            raise BatchError(missing.source, first.step, name, "missing here, present in another file of the step")
        if all(have):
            fields[name] = torch.cat(
                [torch.nn.functional.pad(b.tensor(name), (0, width - b.mask.shape[1])) for b in batches]
            )
    seq = torch.cat([b.seq for b in batches])
    return check(StepBatch(step=first.step, seq=seq, source=first.source, **fields))
