"""verl's vanilla PPO loss behind its whole rollout correction, IS weights *and* rejection mask, callable by
`is-study audit` and `is-study case --target`.

`--weights-fn .../rollout_corr_helper.py:compute_rollout_correction_weights` reaches verl's IS weights only;
its rejection sampling (`rollout_rs`: token_k*, seq_sum_k*, seq_mean_k*, seq_max_k*) changes the response mask
the loss is reduced over, which no weights function can. This adapter runs, from the verl package you point it
at, what `compute_rollout_correction_and_rejection_mask` runs (its two steps: compute_rollout_correction_weights
when rollout_is is set, compute_rollout_rejection_mask when rollout_rs is set; the wrapper itself is left out
because it wraps the weights in a DataProto, whose tensordict is stubbed) and hands both to
`compute_policy_loss_vanilla`, as verl's actor does. Nothing of verl is copied here.

    pip download --no-deps verl==0.9.1 -d wheels    # then unzip it, or run examples/audit/released.py
    is-study case verl-rs-batch-norm --stub tensordict,transformers,ray,codetiming,orjson \\
        --target examples/audit/verl_rollout_corr.py:RolloutCorrectedLoss \\
        --target-kwargs '{"verl": "wheels/site/verl", "rollout_rs": "seq_max_k2", "rollout_rs_threshold": 0.5}'

`verl` is the folder of the verl package; verl's modules import tensordict, transformers, ray, codetiming and
orjson at module level, which neither function calls (hence the stubs). The other kwargs are
RolloutCorrectionConfig's (rollout_is, rollout_is_threshold, rollout_is_batch_normalize, rollout_rs,
rollout_rs_threshold); the loss is token-mean with ActorConfig's defaults (clip 0.2, dual clip 3).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import torch


class RolloutCorrectedLoss:
    """(log_probs, old_log_probs, advantages, action_mask, rollout_log_probs) → verl's loss under its rollout
    correction: IS weights from old − roll, the rejection mask on the response mask, then the vanilla PPO loss."""

    def __init__(
        self,
        verl: str,
        rollout_is: str | None = None,
        rollout_is_threshold: str | float | None = 2.0,
        rollout_is_batch_normalize: bool = False,
        rollout_rs: str | None = None,
        rollout_rs_threshold: str | float | None = None,
        loss_agg_mode: str = "token-mean",
    ):
        root = Path(verl)
        if not (root / "trainer" / "ppo" / "rollout_corr_helper.py").is_file():
            raise FileNotFoundError(f"{root}: `verl` must be the folder of the verl package")
        if str(root.parent) not in sys.path:
            sys.path.insert(0, str(root.parent))
        self.helper = importlib.import_module("verl.trainer.ppo.rollout_corr_helper")
        self.core = importlib.import_module("verl.trainer.ppo.core_algos")
        actor = importlib.import_module("verl.workers.config")
        self.config = actor.ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1)
        self.settings = dict(
            rollout_is=rollout_is,
            rollout_is_threshold=rollout_is_threshold,
            rollout_is_batch_normalize=rollout_is_batch_normalize,
            rollout_rs=rollout_rs,
            rollout_rs_threshold=rollout_rs_threshold,
        )
        self.loss_agg_mode = loss_agg_mode

    def __call__(self, log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None):
        mask = torch.ones_like(old_log_probs) if action_mask is None else action_mask.to(old_log_probs.dtype)
        roll = old_log_probs if rollout_log_probs is None else rollout_log_probs
        s = self.settings
        log_ratio = old_log_probs - roll  # as compute_rollout_correction_and_rejection_mask's step 1
        weights = None
        if s["rollout_is"] is not None and s["rollout_is_threshold"] is not None:
            weights, _ = self.helper.compute_rollout_correction_weights(
                log_ratio=log_ratio,
                response_mask=mask,
                rollout_is=s["rollout_is"],
                rollout_is_threshold=s["rollout_is_threshold"],
                rollout_is_batch_normalize=s["rollout_is_batch_normalize"],
            )
        if s["rollout_rs"] is not None:
            mask, _ = self.helper.compute_rollout_rejection_mask(
                log_ratio=log_ratio,
                response_mask=mask,
                rollout_rs=s["rollout_rs"],
                rollout_rs_threshold=s["rollout_rs_threshold"],
            )
        loss = self.core.compute_policy_loss_vanilla(
            old_log_prob=old_log_probs,
            log_prob=log_probs,
            advantages=advantages,
            response_mask=mask,
            loss_agg_mode=self.loss_agg_mode,
            config=self.config,
            rollout_is_weights=weights,
        )
        return loss[0]
