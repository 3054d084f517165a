"""prime-rl's rollout hand-off: the orchestrator writes rollouts/step_{N}/rank_{r}.bin, a msgspec msgpack
encoding of list[MicroBatch] (src/prime_rl/transports/rollouts/filesystem.py `_encode_and_write`, types.py
`MicroBatch`; PrimeIntellect-ai/prime-rl at 559b44772e471d1538537b8805cc77f3824a5e64, 2026-08-21).

MicroBatch is a msgspec Struct with array_like=True, so each micro batch is a msgpack array of its fields in
declaration order (trailing defaults omitted): input_ids, loss_mask, advantages, inference_logprobs,
position_ids, sequence_lengths, temperatures, env_names, seq_lens, ref_logprobs, ... Its samples are packed
end to end; sequence_lengths cuts them apart. This reader takes:
    inference_logprobs  the engine's log-probs → roll
    loss_mask           (bools)                → mask
    advantages                                 → advantages
per sample, with N of the directory name as the step and every rank's file of a step joined. The dump holds no
trainer log-probs (the trainer computes them when it trains), so no decoupled correction can be evaluated on
it: docs/replay.md. Decoded with msgpack, which builds only lists, numbers, strings and bytes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import msgpack

from runner.errors import UserError
from runner.replay.limits import Limits, check_size
from runner.replay.schema import BatchError, StepBatch, from_rows

NAME = "prime-rl"
STEP_DIR = re.compile(r"^step_(\d+)$")
MICROBATCH_FIELDS = (
    "input_ids",
    "loss_mask",
    "advantages",
    "inference_logprobs",
    "position_ids",
    "sequence_lengths",
    "temperatures",
    "env_names",
    "seq_lens",
    "ref_logprobs",
)
READ = ("loss_mask", "advantages", "inference_logprobs", "sequence_lengths")


def accepts(path: Path) -> bool:
    return path.suffix == ".bin" and path.name.startswith("rank_") and STEP_DIR.match(path.parent.name) is not None


def _fields(micro, src: str, step: int, number: int) -> dict:
    if isinstance(micro, dict):  # a struct encoded without array_like
        return micro
    if not isinstance(micro, list):
        raise BatchError(src, step, "micro batch", f"{number}: expected an array, got {type(micro).__name__}")
    return dict(zip(MICROBATCH_FIELDS, micro))


def read(path: Path, limits: Limits) -> Iterator[StepBatch]:
    src = str(path)
    match = STEP_DIR.match(path.parent.name)
    if match is None:
        raise UserError(f"{src}: not in a prime-rl step_{{N}} directory")
    step = int(match.group(1))
    check_size(path, limits)
    try:
        micro_batches = msgpack.unpackb(path.read_bytes(), raw=False, strict_map_key=False)
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError) as exc:
        raise UserError(
            f"{src}: not a readable msgpack file ({type(exc).__name__}: {exc}; a truncated file?)"
        ) from None
    if not isinstance(micro_batches, list):
        raise UserError(f"{src}: expected a msgpack array of micro batches, got {type(micro_batches).__name__}")
    rows = []
    for number, micro in enumerate(micro_batches):
        fields = _fields(micro, src, step, number)
        for name in READ:
            if not isinstance(fields.get(name), list):
                raise BatchError(src, step, name, f"missing in micro batch {number}")
        total = len(fields["loss_mask"])
        for name in ("advantages", "inference_logprobs"):
            if len(fields[name]) != total:
                raise BatchError(
                    src, step, name, f"micro batch {number}: {len(fields[name])} values, loss_mask has {total}"
                )
        lengths = fields["sequence_lengths"]
        if sum(lengths) != total:
            raise BatchError(
                src, step, "sequence_lengths", f"micro batch {number}: they sum to {sum(lengths)}, not {total}"
            )
        start = 0
        for length in lengths:
            end = start + length
            rows.append(
                {
                    "roll": fields["inference_logprobs"][start:end],
                    "mask": [float(m) for m in fields["loss_mask"][start:end]],
                    "advantages": fields["advantages"][start:end],
                }
            )
            start = end
    if not rows:
        raise BatchError(src, step, "micro batch", "the file holds none")
    yield from_rows(src, step, rows)
