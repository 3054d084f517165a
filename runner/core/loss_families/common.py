"""What the 2026 losses share: the log-ratio against the base the spec names, with padding zeroed."""

from __future__ import annotations

import torch

from runner.core.masking import SAFETY_BOUND, zero_padding


def loss_log_ratio(spec, lp, old, roll, mask, sanitise: bool) -> torch.Tensor:
    """lp − base, base = roll under loss.ratio_against=behaviour, else old; under our presets exactly 0 at
    padding, so a NaN or inf there reaches neither an exp nor a gradient. Carries lp's gradient."""
    base = roll if spec.ratio_against == "behaviour" else old
    log_ratio = lp - base
    return zero_padding(log_ratio, mask) if sanitise else log_ratio


def bounded_exp(log_ratio: torch.Tensor) -> torch.Tensor:
    """exp(clamp(x, ±20)): SkyRL's safe_exp_delta, so a finite log-ratio never overflows to inf."""
    return torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))


def live_log_probs(lp: torch.Tensor, mask: torch.Tensor, sanitise: bool) -> torch.Tensor:
    """lp for the REINFORCE-form losses (CISPO, TOPR), exactly 0 at padding under our presets."""
    return zero_padding(lp, mask) if sanitise else lp


def clipped_in_mask(flags: torch.Tensor, mask: torch.Tensor, metrics: bool) -> torch.Tensor | None:
    return (flags & (mask > 0)) if metrics else None
