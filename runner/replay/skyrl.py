"""SkyRL's training batch dump: `trainer.dump_data_batch=true` writes
{export_path}/dumped_data/global_step_{N}_training_input.pkl, `TrainingInputBatch.save` = pickle.dump of the batch
(skyrl/train/trainer.py `dump_data`, skyrl/backends/skyrl_train/training_batch.py; NovaSky-AI/SkyRL at
a9564572eb8e91076be43c1bd5e4615e3de17265, 2026-08-21).

The batch pickles through its __reduce__ as `_rebuild_tensor_batch(TrainingInputBatch, state)`, with
state = {batch_dict: {key: {"format": "numpy", "data": bytes, "shape", "dtype"} or {"format": "torch", "data":
torch.save bytes}}, batch_size, device, metadata}. Those two names are given inert stand-ins here, so the file
is read as that plain dict, without importing SkyRL or running its __setstate__; the numpy entries are rebuilt
with numpy.frombuffer, the torch ones (bfloat16) with torch.load(weights_only=True). Every tensor is padded on
the left. This reader takes:
    rollout_logprobs   [B, R] the engine's log-probs             → roll
    action_log_probs   [B, R] the trainer's forward, before the update → old
    advantages         [B, R]                                    → advantages
    loss_mask          [B, R] × response_mask (when present)     → mask
and N of the file name as the step; sequences, attention_mask, values, returns, kl are not read.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from runner.errors import UserError
from runner.replay.limits import Limits
from runner.replay.safe_load import load_pickle
from runner.replay.schema import BatchError, StepBatch, as_float_tensor, check

NAME = "skyrl"
FILE = re.compile(r"global_step_(\d+)_training_input\.pkl$")
MODULES = ("skyrl.backends.skyrl_train.training_batch", "skyrl_train.training_batch")  # now, and before the move
CLASSES = ("TrainingInputBatch", "TrainingOutputBatch", "TensorBatch")
FIELDS = {"roll": "rollout_logprobs", "old": "action_log_probs", "advantages": "advantages", "mask": "loss_mask"}


class BatchClass:
    """Stands in for SkyRL's batch class: only its name is kept."""

    def __init__(self, name: str):
        self.name = name


def _rebuild(cls, state):
    return {"class": getattr(cls, "name", "?"), "state": state}


def stand_ins() -> dict:
    out = {}
    for module in MODULES:
        out[(module, "_rebuild_tensor_batch")] = _rebuild
        for name in CLASSES:
            out[(module, name)] = BatchClass(name)
    return out


def accepts(path: Path) -> bool:
    return FILE.search(path.name) is not None or (path.suffix == ".pkl" and path.parent.name == "dumped_data")


def _tensor(entry, src: str, step: int, field: str) -> torch.Tensor:
    if not isinstance(entry, dict):
        raise BatchError(src, step, field, f"expected a serialised tensor, got {type(entry).__name__}")
    try:
        if entry.get("format") == "torch":
            value = torch.load(io.BytesIO(entry["data"]), weights_only=True)
        else:
            array = np.frombuffer(entry["data"], dtype=np.dtype(entry["dtype"])).reshape(entry["shape"])
            value = array
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise BatchError(src, step, field, f"not a readable tensor ({type(exc).__name__}: {exc})") from None
    return as_float_tensor(value, src, step, field)


def read(path: Path, limits: Limits) -> Iterator[StepBatch]:
    src = str(path)
    match = FILE.search(path.name)
    step = int(match.group(1)) if match else 0
    loaded = load_pickle(path, limits, stand_ins())
    if isinstance(loaded, dict) and "state" in loaded:
        batch = loaded["state"].get("batch_dict") if isinstance(loaded["state"], dict) else None
    else:
        batch = None
    if not isinstance(batch, dict):
        raise UserError(f"{src}: not a SkyRL training-input dump (no batch_dict)")
    tensors = {}
    for ours, theirs in FIELDS.items():
        entry = batch.get(theirs)
        if entry is None:
            if ours in ("roll", "mask", "advantages"):
                raise BatchError(src, step, theirs, "missing")
            continue
        tensors[ours] = entry.float() if isinstance(entry, torch.Tensor) else _tensor(entry, src, step, theirs)
    response_mask = batch.get("response_mask")
    if response_mask is not None:
        response_mask = (
            response_mask.float()
            if isinstance(response_mask, torch.Tensor)
            else _tensor(response_mask, src, step, "response_mask")
        )
        if response_mask.shape != tensors["mask"].shape:
            raise BatchError(
                src,
                step,
                "response_mask",
                f"shape {list(response_mask.shape)} disagrees with loss_mask's {list(tensors['mask'].shape)}",
            )
        tensors["mask"] = tensors["mask"] * response_mask
    rows = tensors["mask"].shape[0] if tensors["mask"].dim() else 0
    yield check(StepBatch(step=step, seq=torch.arange(rows), source=src, **tensors))
