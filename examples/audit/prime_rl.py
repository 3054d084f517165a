"""prime-rl's RL loss, callable by `is-study audit` and `is-study case --target`.

prime-rl's loss module imports beartype, jaxtyping and its pydantic configs at module level. This adapter
compiles, *from the prime-rl checkout you point it at*, only what the trainer's `compute_loss` runs for the rl
component: `LossInputs`, `LossOutputs`, `_safe_mean`, `compute_importance_ratio_and_mismatch_kl`,
`default_loss_fn`, `ipo_loss_fn` and `compute_loss` of src/prime_rl/trainer/rl/loss.py, keeping their file name
and line numbers. Nothing of prime-rl is copied here.

    git clone https://github.com/PrimeIntellect-ai/prime-rl prime-rl && git -C prime-rl checkout 559b4477
    is-study audit --target examples/audit/prime_rl.py:RLLoss \\
        --target-kwargs '{"prime_rl": "prime-rl/src/prime_rl", "type": "default"}'

`prime_rl` is the folder of the `prime_rl` package. `type` is trainer.loss.type (default or ipo); the other
kwargs are DefaultLossConfig's (dppo_mask_low, dppo_mask_high, adv_tau, kl_tau) or IPOLossConfig's
(ipo_threshold, adv_tau, kl_tau), prime-rl's defaults where not given. Each row of the batch is one sample of
the packed micro-batch; the loss is divided by the loss mask's token count (at least 1), as train.py's
rl_scale. prime-rl has no θ_old: the ratio is trainer against inference log-probs, so old_log_probs is unused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from compiled_source import compile_into

COMMIT = "559b44772e471d1538537b8805cc77f3824a5e64"
# DefaultLossConfig and IPOLossConfig defaults (packages/prime-rl-configs/src/prime_rl/configs/trainer.py)
DEFAULTS = {
    "default": {"dppo_mask_low": 0.2, "dppo_mask_high": 0.2, "adv_tau": 1.0, "kl_tau": 1e-3},
    "ipo": {"ipo_threshold": 0.1, "adv_tau": 1.0, "kl_tau": 1e-3},
}


class _Annotation:
    """jaxtyping's Float[Tensor, "seq"] and friends, read only as annotations."""

    def __class_getitem__(cls, item):
        return Any


def load(prime_rl: str | Path) -> dict[str, Any]:
    path = Path(prime_rl) / "trainer" / "rl" / "loss.py"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: `prime_rl` must be the folder of the prime_rl package")
    ns: dict[str, Any] = {
        "torch": torch,
        "Tensor": torch.Tensor,
        "Any": Any,
        "Callable": Callable,
        "dataclass": dataclasses.dataclass,
        "field": dataclasses.field,
        "Float": _Annotation,
        "Bool": _Annotation,
        "Int": _Annotation,
        "DefaultLossConfig": Any,
        "IPOLossConfig": Any,
        "LossFn": Callable,  # a module-level alias there, not a definition
    }
    names = {
        "LossInputs",
        "LossOutputs",
        "_safe_mean",
        "compute_importance_ratio_and_mismatch_kl",
        "default_loss_fn",
        "ipo_loss_fn",
        "compute_loss",
    }
    compile_into(ns, path, names)
    return ns


class RLLoss:
    """(log_probs, old_log_probs, advantages, action_mask, rollout_log_probs) → prime-rl's rl loss."""

    def __init__(self, prime_rl: str, type: str = "default", **loss_config):
        if type not in DEFAULTS:
            raise TypeError(f"type must be one of {', '.join(DEFAULTS)}, got {type!r}")
        unknown = sorted(set(loss_config) - set(DEFAULTS[type]))
        if unknown:
            raise TypeError(f"unknown {type} loss config field(s): {', '.join(unknown)}")
        ns = load(prime_rl)
        config = SimpleNamespace(**{**DEFAULTS[type], **loss_config})
        fn = ns["default_loss_fn"] if type == "default" else ns["ipo_loss_fn"]
        self.rl_loss_fn = lambda inputs: fn(inputs, config)
        self.compute_loss = ns["compute_loss"]

    def __call__(self, log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None):
        mask = torch.ones_like(log_probs, dtype=torch.bool) if action_mask is None else action_mask > 0
        inference = old_log_probs if rollout_log_probs is None else rollout_log_probs
        loss, _metrics = self.compute_loss(
            trainer_logprobs=list(log_probs),
            inference_logprobs=list(inference),
            ref_logprobs=None,
            advantages=list(advantages),
            loss_mask=list(mask),
            rl_weights=None,
            ce_weights=None,
            ref_kl_weights=None,
            rl_loss_fn=self.rl_loss_fn,
            rl_scale=max(int(mask.sum()), 1),
            ce_scale=1,
            ref_kl_scale=1,
        )
        return loss
