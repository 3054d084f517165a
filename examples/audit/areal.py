"""AReaL's PPO actor loss with its rejection sampling (areal==1.0.4 on PyPI), callable by `is-study audit` and
`is-study case --target`.

areal/utils/functional/functional.py imports AReaL's config module (uvloop, hydra, the launcher) and its data
utilities (einops, torchdata) at module level. This adapter compiles, *from the unpacked wheel you point it
at*, only what `ppo_actor_loss_fn` runs on a 2-D padded batch: `RejectionSamplingConfig` of
areal/api/cli_args.py, `KLEstimator` of areal/utils/data.py, and `RejectionSamplingResult`, `_check_bounds`,
`apply_rejection_sampling` and `ppo_actor_loss_fn` of functional.py, keeping their file names and line
numbers. Nothing of AReaL is copied here.

    pip download --no-deps areal==1.0.4 -d wheels    # then unzip it, or run examples/audit/released.py
    is-study audit --target examples/audit/areal.py:PPOActorLoss \\
        --target-kwargs '{"areal": "wheels/site/areal", "level": "token", "action": "mask"}'

`areal` is the folder of the `areal` package. The other kwargs are RejectionSamplingConfig's (level, action,
metric, agg, upper, lower; AReaL's defaults: token, mask, ratio, mean, 5.0, None), the loss's eps_clip
(0.2), `m2_threshold` (PPOActorConfig's M2PO threshold: grpo_loss_fn's _apply_m2po_masking of
areal/trainer/ppo/actor.py, compiled from there too, masks the batch before the loss) and
`rejection_sampling: false` for the loss without rejection sampling (as grpo_loss_fn calls it when unset). In AReaL's names the audit's `old` is the proximal policy and `roll` the behaviour policy (the
inference engine's `old_logprobs`): the rejection compares π_proximal / π_behave, PPO's ratio is π_θ / π_proximal.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from compiled_source import compile_into

VERSION = "areal==1.0.4"


def load(areal: str | Path) -> dict[str, Any]:
    """RejectionSamplingConfig, ppo_actor_loss_fn and what it calls, compiled from the package folder."""
    root = Path(areal)
    functional = root / "utils" / "functional" / "functional.py"
    if not functional.is_file():
        raise FileNotFoundError(f"{functional} not found: `areal` must be the folder of the areal package")
    ns: dict[str, Any] = {
        "torch": torch,
        "functools": functools,
        "dataclass": dataclass,
        "field": field,
        "Any": Any,
    }
    compile_into(ns, root / "api" / "cli_args.py", {"RejectionSamplingConfig"})
    compile_into(ns, root / "utils" / "data.py", {"KLEstimator"})
    compile_into(
        ns,
        functional,
        {"RejectionSamplingResult", "_check_bounds", "apply_rejection_sampling", "ppo_actor_loss_fn"},
    )
    return ns


def load_m2po(areal: str | Path) -> Any:
    """_apply_m2po_masking and _get_m2po_loss_mask of areal/trainer/ppo/actor.py (which imports the trainer's
    engines at module level), compiled from the package folder."""
    ns: dict[str, Any] = {"torch": torch}
    compile_into(ns, Path(areal) / "trainer" / "ppo" / "actor.py", {"_apply_m2po_masking", "_get_m2po_loss_mask"})
    return ns["_apply_m2po_masking"]


class PPOActorLoss:
    """(log_probs, old_log_probs, advantages, action_mask, rollout_log_probs) → AReaL's ppo_actor_loss_fn with
    its rejection sampling: proximal_logprobs = old_log_probs, old_logprobs (behaviour) = rollout_log_probs."""

    def __init__(
        self,
        areal: str,
        eps_clip: float = 0.2,
        m2_threshold: float | None = None,
        rejection_sampling: bool = True,
        **config: Any,
    ):
        ns = load(areal)
        self.loss_fn = ns["ppo_actor_loss_fn"]
        self.config = ns["RejectionSamplingConfig"](**config) if rejection_sampling else None
        self.eps_clip = eps_clip
        self.m2_threshold = m2_threshold
        self.m2po = load_m2po(areal) if m2_threshold is not None else None

    def __call__(self, log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None):
        mask = torch.ones_like(old_log_probs) if action_mask is None else action_mask
        behave = old_log_probs if rollout_log_probs is None else rollout_log_probs
        loss_mask = mask.bool()  # AReaL's loss_mask is boolean (torch.where takes it as the condition)
        if self.m2po is not None:  # grpo_loss_fn: M2PO on (behaviour, proximal) before the loss
            loss_mask = self.m2po(behave, old_log_probs, loss_mask, self.m2_threshold)
        loss, _stat = self.loss_fn(
            logprobs=log_probs,
            proximal_logprobs=old_log_probs,
            old_logprobs=behave,
            advantages=advantages,
            eps_clip=self.eps_clip,
            loss_mask=loss_mask,
            rejection_sampling=self.config,
        )
        return loss
