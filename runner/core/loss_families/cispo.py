"""CISPO (MiniMax-M1, arXiv 2506.13585, eq. 4-5), as slime ships it, and SkyRL's rollout_is, its masked twin.

slime 624b824 (slime/utils/ppo_utils.py, compute_cispo_loss): −sg(clip(r, 1 − ε_low, 1 + ε_high))·A·log π
with r = exp(lp − old), unbounded. The ratio is a detached weight, not a surrogate, so a clipped token keeps
its gradient −w·A (PPO's clip would zero it). exp() is left unbounded as slime leaves it: an overflowed
r = inf clamps to 1 + ε_high, r = 0 to 1 − ε_low, so a finite log-ratio never gives a non-finite weight.
`loss.cispo_mask: true` is ROLL 8eb27cc's cispo_use_unified_mask (agentic_actor_pg_worker.py, _compute_cispo_loss,
the paper's eq. 7): the weight times M_t = 0 where A > 0 and r > 1 + ε_high or A < 0 and r < 1 − ε_low.
"""

from __future__ import annotations

import torch

from runner.core.loss_families.common import bounded_exp, clipped_in_mask, live_log_probs, loss_log_ratio


def cispo_per_token(spec, corr, cres, lp, old, roll, adv, mask, sanitise, metrics):
    with torch.no_grad():
        ratio = torch.exp(loss_log_ratio(spec, lp, old, roll, mask, sanitise))
        weight = ratio.clamp(1 - spec.eps_low, 1 + spec.eps_high)
        clipped = clipped_in_mask(weight != ratio, mask, metrics)  # slime's clipfrac: ratio_truncated != ratio
        if spec.cispo_mask:  # ROLL's unified mask: the token leaves where PPO's clip would stop its gradient
            beyond = ((adv > 0) & (ratio > 1 + spec.eps_high)) | ((adv < 0) & (ratio < 1 - spec.eps_low))
            weight = weight * (~beyond).to(weight.dtype)
    per_token = -adv * weight * live_log_probs(lp, mask, sanitise) * cres.coef
    return per_token, clipped, cres.mask


def rollout_is_per_token(spec, corr, cres, lp, old, roll, adv, mask, sanitise, metrics):
    """SkyRL a956457 (skyrl/backends/skyrl_train/utils/ppo_utils.py, rollout_is_policy_loss):
    −sg(r·1[1 − ε_low < r < 1 + ε_high])·A·log π with r = exp(clamp(lp − roll, ±20)) against the engine: the
    CISPO form with out-of-band tokens zeroed instead of capped (bounds exclusive, as SkyRL's)."""
    with torch.no_grad():
        ratio = bounded_exp(loss_log_ratio(spec, lp, old, roll, mask, sanitise))
        in_band = (ratio > 1 - spec.eps_low) & (ratio < 1 + spec.eps_high)
        weight = torch.where(in_band, ratio, 0.0)
        clipped = clipped_in_mask(~in_band, mask, metrics)
    per_token = -(weight * adv * live_log_probs(lp, mask, sanitise)) * cres.coef
    return per_token, clipped, cres.mask
