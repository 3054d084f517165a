"""External policy losses in OpenRLHF's PolicyLoss convention, for `is-study audit --target`.

    loss_fn(log_probs, old_log_probs, advantages, action_mask=..., rollout_log_probs=...)
        -> loss, or (loss, *extras)

PlantedLoss has a planted bug, the one of the seed report (OpenRLHF bc71bb1's seq-mask-tis): the
geometric-mean filter *multiplies* the unclamped token ratio ρ_t = exp(old − roll) by a 0/1 mask,
so an overflowing ρ_t gives ±inf when the sequence is kept and 0·inf = NaN when it is rejected;
and padding is removed by multiplying with the mask, so NaN padding leaks. The audit must find it
(invariants 1, 2 and 4).

CorrectLoss and correct_policy_loss are thin wrappers over runner.core.losses.policy_loss with our
seq-mask-tis; the audit must pass them.
"""

from __future__ import annotations

import torch

from runner.core.corrections import Correction
from runner.core.losses import LossSpec, policy_loss


def _masked_mean(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


class PlantedLoss(torch.nn.Module):
    """PPO with seq-mask-tis as released in OpenRLHF bc71bb1 (the bug included)."""

    def __init__(self, clip_eps_low: float = 0.2, clip_eps_high: float = 0.2, low: float = 0.5, high: float = 5.0):
        super().__init__()
        self.clip_eps_low, self.clip_eps_high = clip_eps_low, clip_eps_high
        self.low, self.high = low, high

    def forward(self, log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None):
        if action_mask is None:
            action_mask = torch.ones_like(log_probs)
        ratio = (log_probs - old_log_probs).clamp(-20, 20).exp()
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - self.clip_eps_low, 1 + self.clip_eps_high) * advantages
        loss = -torch.min(surr1, surr2)
        if rollout_log_probs is not None:
            log_ratio = (old_log_probs - rollout_log_probs).detach()
            seq_geo = _masked_mean(log_ratio, action_mask, dim=-1).exp()
            seq_mask = ((seq_geo >= self.low) & (seq_geo <= self.high)).to(log_probs.dtype).unsqueeze(-1)
            loss = seq_mask * log_ratio.exp() * loss  # BUG: no clamp, and rejection by multiplication
        clip_ratio = _masked_mean(((surr2 < surr1) & (action_mask > 0)).to(log_probs.dtype), action_mask)
        return _masked_mean(loss, action_mask), clip_ratio  # BUG: padding removed by multiplication


def _ours(low: float, high: float) -> Correction:
    return Correction(name="seq-mask-tis", weight="token", weight_op="clamp", filter="geometric", low=low, high=high)


class CorrectLoss(torch.nn.Module):
    """Our seq-mask-tis in the same convention: passes every invariant."""

    def __init__(self, low: float = 0.5, high: float = 5.0):
        super().__init__()
        self.corr = _ours(low, high)

    def forward(self, log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None):
        mask = torch.ones_like(log_probs) if action_mask is None else action_mask
        roll = old_log_probs if rollout_log_probs is None else rollout_log_probs
        return policy_loss(LossSpec(), self.corr, log_probs, old_log_probs, roll, advantages, mask, metrics=False).loss


def correct_policy_loss(
    log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None, low: float = 0.5, high: float = 5.0
):
    """The function form of CorrectLoss (kwargs come from --target-kwargs)."""
    return CorrectLoss(low, high)(
        log_probs, old_log_probs, advantages, action_mask=action_mask, rollout_log_probs=rollout_log_probs
    )


NOT_CALLABLE = 42
