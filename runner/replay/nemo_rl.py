"""NeMo-RL's per-step training data: `train_data_step{N}.jsonl` in the log dir, written by
`Logger.log_batched_dict_as_jsonl` (nemo_rl/utils/logger.py) from grpo.py's `log_data` (NVIDIA-NeMo/RL at
7ea279abfbeb698b092856d0dab61e7cf39bc909, 2026-08-22).

It iterates `make_microbatch_iterator(1)`, so each line is one sample but every field keeps the batch dimension:
`"token_ids": [[...]]`, `"sample_loss_mask": [1.0]`. This reader takes a field's outer list as the samples of
the line (one, as written; more if a version writes several) and reads:
    generation_logprobs  [T] the engine's log-probs          → roll
    prev_logprobs        [T] the trainer's, before the update → old
    advantages           [T]                                  → advantages
    token_loss_mask      [T] × sample_loss_mask (one a sample) → mask
    idx (the line's sample number)                           → seq
over the full sequence (prompt and response, padded to the step's longest; the mask is 0 outside the generated
tokens), and N of the file name as the step. token_ids, input_lengths, content and rewards are not read.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from runner.errors import UserError
from runner.replay.limits import Limits
from runner.replay.own_jsonl import read_lines
from runner.replay.schema import BatchError, StepBatch, from_rows

NAME = "nemo-rl"
FILE = re.compile(r"train_data_step(\d+)\.jsonl$")
TOKEN_FIELDS = {"roll": "generation_logprobs", "old": "prev_logprobs", "advantages": "advantages"}


def accepts(path: Path) -> bool:
    return FILE.search(path.name) is not None


def _samples(value, src: str, step: int, field: str, line: int) -> list:
    """A field's per-sample values: [[...], ...] (the batch dimension kept) or a bare [...] (one sample)."""
    if not isinstance(value, list):
        raise BatchError(src, step, field, f"line {line}: expected a list, got {type(value).__name__}")
    if value and all(isinstance(v, list) for v in value):
        return value
    return [value]


def read(path: Path, limits: Limits) -> Iterator[StepBatch]:
    src = str(path)
    match = FILE.search(path.name)
    if match is None:
        raise UserError(f"{src}: not a NeMo-RL train_data_step{{N}}.jsonl file name")
    step = int(match.group(1))
    rows, ids = [], []
    for line, obj in read_lines(path, limits):
        for field in ("generation_logprobs", "advantages", "token_loss_mask"):
            if field not in obj:
                raise BatchError(src, step, field, f"missing on line {line}")
        columns = {
            ours: _samples(obj[theirs], src, step, theirs, line)
            for ours, theirs in TOKEN_FIELDS.items()
            if theirs in obj
        }
        token_mask = _samples(obj["token_loss_mask"], src, step, "token_loss_mask", line)
        sample_mask = obj.get("sample_loss_mask", [1.0] * len(token_mask))
        sample_mask = sample_mask if isinstance(sample_mask, list) else [sample_mask]
        count = len(token_mask)
        for name, values in [*columns.items(), ("sample_loss_mask", sample_mask)]:
            if len(values) != count:
                raise BatchError(src, step, name, f"line {line}: {len(values)} samples, token_loss_mask has {count}")
        for k in range(count):
            keep = sample_mask[k]
            if not isinstance(keep, (int, float)) or keep not in (0, 1):
                raise BatchError(src, step, "sample_loss_mask", f"line {line}: {keep!r} is not 0 or 1")
            row = {name: values[k] for name, values in columns.items()}
            row["mask"] = (
                [m * keep for m in token_mask[k]]
                if all(isinstance(m, (int, float)) for m in token_mask[k])
                else token_mask[k]
            )
            rows.append(row)
            idx = obj.get("idx", len(ids))
            ids.append(idx if count == 1 and isinstance(idx, int) else len(ids))
    if not rows:
        raise BatchError(src, step, "token_loss_mask", "the file holds no samples")
    yield from_rows(src, step, rows, ids)
