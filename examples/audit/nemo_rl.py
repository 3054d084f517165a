"""NeMo-RL's clipped policy-gradient loss with its importance-sampling correction, callable by `is-study audit`
and `is-study case --target`.

NeMo-RL is not on PyPI at the audited commit, and its loss module imports the whole trainer (Ray, Megatron,
transformers) at module level. This adapter compiles, *from the NeMo-RL checkout you point it at*, only what
`ClippedPGLossFn.__call__` runs: the classes `ClippedPGLossConfig` and `ClippedPGLossFn` of
nemo_rl/algorithms/loss/loss_functions.py, the functions `masked_mean` and `calculate_kl` of
nemo_rl/algorithms/utils.py and the enums of nemo_rl/algorithms/loss/interfaces.py, keeping their file names
and line numbers, so a finding points at NeMo-RL's line. Nothing of NeMo-RL is copied here.

    git clone https://github.com/NVIDIA-NeMo/RL nemo-rl && git -C nemo-rl checkout 7ea279ab
    is-study audit --target examples/audit/nemo_rl.py:ClippedPGLoss \\
        --target-kwargs '{"nemo_rl": "nemo-rl/nemo_rl", "truncated_importance_sampling_type": "icepop"}'

`nemo_rl` is the folder of the `nemo_rl` package. The other kwargs are ClippedPGLossConfig's; the defaults
here are a GRPO run with the correction on and no KL penalty (reference_policy_kl_penalty=0), so the loss is
the corrected PPO surrogate alone, token-level, over one micro-batch that is the whole batch.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Any, NotRequired, Optional, Protocol, TypedDict, TypeVar

import torch
from compiled_source import compile_into

COMMIT = "7ea279abfbeb698b092856d0dab61e7cf39bc909"
# the reference bounds of each truncated_importance_sampling_type (NeMo-RL's comments and docs)
BOUNDS = {"tis": (None, 2.0), "icepop": (0.5, 5.0), "seq-mask-tis": (0.999, 1.002)}


def load(nemo_rl: str | Path) -> dict[str, Any]:
    """ClippedPGLossConfig, ClippedPGLossFn and what they call, compiled from the checkout."""
    from pydantic import BaseModel  # a dependency of typer, hence of is-study

    root = Path(nemo_rl)
    if not (root / "algorithms" / "loss" / "loss_functions.py").is_file():
        raise FileNotFoundError(f"{root}: `nemo_rl` must be the folder of the nemo_rl package")
    ns: dict[str, Any] = {
        "torch": torch,
        "Tensor": torch.Tensor,
        "enum": enum,
        "Any": Any,
        "Optional": Optional,
        "NotRequired": NotRequired,
        "Protocol": Protocol,
        "TypedDict": TypedDict,
        "TypeVar": TypeVar,
        "BaseModel": BaseModel,
        "BatchedDataDict": dict,  # the loss only indexes it and calls .get
    }
    compile_into(
        ns,
        root / "algorithms" / "loss" / "interfaces.py",
        {"LossType", "MetricNormalizer", "LossInputType", "LossFunction"},
    )
    compile_into(ns, root / "algorithms" / "utils.py", {"masked_mean", "calculate_kl"})
    compile_into(
        ns,
        root / "algorithms" / "loss" / "loss_functions.py",
        {"ClippedPGLossConfig", "ClippedPGLossDataDict", "ClippedPGLossFn"},
    )
    return ns


class ClippedPGLoss:
    """(log_probs, old_log_probs, advantages, action_mask, rollout_log_probs) → NeMo-RL's loss, as
    ClippedPGLossFn computes it for one micro-batch that is the global batch (global_valid_toks and
    global_valid_seqs are its own counts). NeMo-RL's tensors carry a leading prompt token that the loss
    drops ([:, 1:]); the adapter prepends one."""

    def __init__(
        self,
        nemo_rl: str,
        truncated_importance_sampling_type: str | None = "tis",
        truncated_importance_sampling_ratio: float | None = None,
        truncated_importance_sampling_ratio_min: float | None = None,
        use_importance_sampling_correction: bool = True,
        reference_policy_kl_penalty: float = 0.0,
        **config: Any,
    ):
        ns = load(nemo_rl)
        low, high = BOUNDS.get(truncated_importance_sampling_type, (None, None))
        cfg = ns["ClippedPGLossConfig"](
            use_importance_sampling_correction=use_importance_sampling_correction,
            truncated_importance_sampling_type=truncated_importance_sampling_type,
            truncated_importance_sampling_ratio=(
                high if truncated_importance_sampling_ratio is None else truncated_importance_sampling_ratio
            ),
            truncated_importance_sampling_ratio_min=(
                low if truncated_importance_sampling_ratio_min is None else truncated_importance_sampling_ratio_min
            ),
            reference_policy_kl_penalty=reference_policy_kl_penalty,
            **config,
        )
        self.loss_fn = ns["ClippedPGLossFn"](cfg)

    def __call__(self, log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None):
        mask = torch.ones_like(old_log_probs) if action_mask is None else action_mask.to(old_log_probs.dtype)
        roll = old_log_probs if rollout_log_probs is None else rollout_log_probs

        def shifted(x: torch.Tensor) -> torch.Tensor:  # the prompt column the loss drops
            return torch.cat([torch.zeros_like(x[:, :1]), x], dim=1)

        data = {
            "advantages": shifted(advantages),
            "prev_logprobs": shifted(old_log_probs),
            "generation_logprobs": shifted(roll),
            "token_mask": shifted(mask),
            "sample_mask": torch.ones(mask.shape[0], dtype=mask.dtype),
        }
        loss, _metrics = self.loss_fn(log_probs, data, torch.tensor(float(mask.shape[0])), mask.sum())
        return loss
