"""slime's training-data dump: `--save-debug-train-data PATH` or `--dump-details DIR`, which writes
DIR/train_data/{rollout_id}.pt with torch.save (slime/observability/train_data_utils.py, `_build_dump_payload`,
THUDM/slime at 624b824a898ab0ec1fcb4d373004c7f3852bf515, 2026-08-21).

Read with torch.load(weights_only=True). The payload is a dict with `format_version` 2, `rollout_id`, `rank`,
`dp_shards` (the data-parallel layout, not read) and `samples`, one dict per training sample, sorted into the
rollout dump's order. Of each sample this reader takes:
    rollout_log_probs  [R] the engine's log-probs             → roll
    log_probs          [R] the trainer's, before the update     → old
    advantages         [R]                                      → advantages
    loss_masks         [R] 1 = in the loss                      → mask
    rollout_position / sample_index (else the sample's number)  → seq
with R = response_lengths, and `rollout_id` as the step. DIR/rollout_data/{rollout_id}.pt (the rollout-side dump,
no trainer log-probs) is not read: train_data holds both sides.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from runner.errors import UserError
from runner.replay.limits import Limits
from runner.replay.safe_load import load_pt
from runner.replay.schema import BatchError, StepBatch, from_rows

NAME = "slime"
FORMAT_VERSION = 2
FIELDS = {"roll": "rollout_log_probs", "old": "log_probs", "advantages": "advantages", "mask": "loss_masks"}


def accepts(path: Path) -> bool:
    return path.suffix == ".pt" and path.parent.name != "rollout_data"


def read(path: Path, limits: Limits) -> Iterator[StepBatch]:
    src = str(path)
    payload = load_pt(path, limits)
    if not isinstance(payload, dict) or "samples" not in payload:
        raise UserError(f"{src}: not a slime train-data dump (expected a dict with 'samples')")
    version = payload.get("format_version")
    if version != FORMAT_VERSION:
        raise BatchError(
            src, None, "format_version", f"{version!r}; this reader reads slime's version {FORMAT_VERSION}"
        )
    step = payload.get("rollout_id")
    if isinstance(step, bool) or not isinstance(step, int):
        step_text = path.stem
        if not step_text.isdigit():
            raise BatchError(src, None, "rollout_id", f"{step!r} is not an integer, nor is the file name")
        step = int(step_text)
    samples = payload["samples"]
    if not isinstance(samples, list) or not all(isinstance(s, dict) for s in samples):
        raise BatchError(src, step, "samples", "expected a list of dicts")
    rows, ids = [], []
    for i, sample in enumerate(samples):
        row = {}
        for ours, theirs in FIELDS.items():
            if theirs not in sample and ours in ("roll", "mask", "advantages"):
                raise BatchError(src, step, theirs, f"missing in sample {i}")
            row[ours] = sample.get(theirs)
        rows.append(row)
        position = sample.get("rollout_position", sample.get("sample_index"))
        ids.append(position if isinstance(position, int) and not isinstance(position, bool) else i)
    yield from_rows(src, step, rows, ids)
