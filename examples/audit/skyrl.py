"""SkyRL's PPO policy loss with its off-policy correction, callable by `is-study audit` and `is-study case --target`.

SkyRL's release on PyPI (skyrl 0.3.0) predates the audited code, so it is read from the repository at a commit
(examples/audit/released.py's CHECKOUTS). skyrl/backends/skyrl_train/utils/ppo_utils.py imports Ray, jaxtyping,
loguru and the trainer's config at module level; this adapter compiles, *from the checkout you point it at*,
only what the `regular` policy loss runs: `ppo_policy_loss` and `reduce_loss` of ppo_utils.py, every function of
off_policy_correction_utils.py, and `masked_mean` and `safe_exp_delta` of torch_utils.py, keeping their file
names and line numbers. Nothing of SkyRL is copied here.

    git clone https://github.com/NovaSky-AI/SkyRL skyrl && git -C skyrl checkout a9564572
    is-study audit --target examples/audit/skyrl.py:PPOPolicyLoss \\
        --target-kwargs '{"skyrl": "skyrl/skyrl", "tis_ratio_type": "token"}'

`skyrl` is the folder of the `skyrl` package. The other kwargs are the fields of SkyRL's
`off_policy_correction` config (tis_ratio_type, sequence_mask_metric, the clip and mask bounds, the outlier and
token-mask thresholds), SkyRL's defaults where not given. SkyRL's loss is a sum: its trainer divides the
advantages by the batch's token count beforehand (loss_reduction=token_mean), and so does the adapter.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import torch
from compiled_source import compile_into

COMMIT = "a9564572eb8e91076be43c1bd5e4615e3de17265"
# SkyRL's OffPolicyCorrectionConfig defaults (skyrl/train/config/config.py at COMMIT)
DEFAULTS = {
    "tis_ratio_type": None,
    "token_tis_ratio_clip_high": 2.0,
    "sequence_tis_ratio_clip_high": 5.0,
    "sequence_mask_metric": None,
    "geo_mask_high": 1.01,
    "geo_mask_low": 0.99,
    "product_mask_high": 2.0,
    "product_mask_low": 0.5,
    "outlier_token_is_threshold_low": None,
    "outlier_token_is_threshold_high": None,
    "token_mask_is_threshold_low": None,
    "token_mask_is_threshold_high": None,
}


def load(skyrl: str | Path) -> dict[str, Any]:
    """ppo_policy_loss and what it calls, compiled from the package folder."""
    utils = Path(skyrl) / "backends" / "skyrl_train" / "utils"
    if not (utils / "ppo_utils.py").is_file():
        raise FileNotFoundError(f"{utils / 'ppo_utils.py'} not found: `skyrl` must be the folder of the skyrl package")
    ns: dict[str, Any] = {
        "torch": torch,
        "Optional": Optional,
        "Tuple": tuple,
        "DictConfig": Any,
        "AlgorithmConfig": Any,
        # the registry decorators only record the function under a name
        "register_policy_loss": lambda name: lambda fn: fn,
        "PolicyLossType": SimpleNamespace(REGULAR="regular", DUAL_CLIP="dual_clip"),
    }
    compile_into(ns, utils / "torch_utils.py", {"masked_mean", "safe_exp_delta"})
    compile_into(
        ns,
        utils / "off_policy_correction_utils.py",
        {
            "off_policy_correction_enabled",
            "compute_tis_ratio",
            "compute_outlier_token_mask",
            "compute_token_mask",
            "compute_sequence_mask",
            "compute_off_policy_correction",
            "apply_off_policy_correction",
        },
    )
    compile_into(ns, utils / "ppo_utils.py", {"ppo_policy_loss", "reduce_loss"})
    return ns


class PPOPolicyLoss:
    """(log_probs, old_log_probs, advantages, action_mask, rollout_log_probs) → SkyRL's `regular` policy loss
    with its off-policy correction and loss_reduction=token_mean."""

    def __init__(self, skyrl: str, eps_clip_low: float = 0.2, eps_clip_high: float = 0.2, **off_policy_correction):
        unknown = sorted(set(off_policy_correction) - set(DEFAULTS))
        if unknown:
            raise TypeError(f"unknown off_policy_correction field(s): {', '.join(unknown)}")
        self.loss_fn = load(skyrl)["ppo_policy_loss"]
        self.config = SimpleNamespace(
            policy_loss_type="regular",
            eps_clip_low=eps_clip_low,
            eps_clip_high=eps_clip_high,
            off_policy_correction=SimpleNamespace(**{**DEFAULTS, **off_policy_correction}),
        )

    def __call__(self, log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None):
        mask = torch.ones_like(old_log_probs) if action_mask is None else action_mask.to(old_log_probs.dtype)
        # apply_loss_reduction_to_advantages_minibatch, loss_reduction=token_mean: A / (tokens in the batch)
        scaled = advantages / mask.sum().clamp(min=1)
        loss, _metrics = self.loss_fn(log_probs, old_log_probs, scaled, self.config, mask, rollout_log_probs)
        return loss
