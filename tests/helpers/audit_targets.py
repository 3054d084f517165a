"""Small external targets for tests/test_audit_targets.py, each with one property the audit must
see (or must not be fooled by). Written for the tests; none is anyone's released code."""

from __future__ import annotations

import torch

from runner.core.corrections import Correction
from runner.core.losses import LossSpec, policy_loss

OURS = Correction(name="seq-mask-tis", weight="token", weight_op="clamp", filter="geometric", low=0.5, high=5.0)


def live(x, mask):
    """x with exactly 0 at padding: NaN there reaches neither the loss nor (through where) the gradient."""
    return torch.where(mask > 0, x, 0.0)


def _ppo(lp, old, adv, mask, clamp=True):
    log_ratio = live(lp, mask) - live(old, mask)
    ratio = (log_ratio.clamp(-20, 20) if clamp else log_ratio).exp()
    adv = live(adv, mask)
    return -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv)


def token_mean(x, mask):
    return (x * mask).sum() / mask.sum()


def unclamped_ppo(log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None):
    """Plain PPO without the ±20 log-ratio bound: at lp − old = 100 the clip binds (gradient 0 in
    float64) but float32's e^100 = inf turns the unused branch into 0·inf = NaN. PPO clipped that
    token; no correction rejected it."""
    per_token = _ppo(log_probs, old_log_probs, advantages, action_mask, clamp=False)
    return (per_token * action_mask).sum() / action_mask.sum().clamp(min=1)


def icepop_with_ess(log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None):
    """Token IcePop whose effective-sample-size metric divides by zero when every token is filtered,
    and which refuses an all-masked batch with ValueError, as verl 0.9.1's helper does."""
    if not bool(action_mask.any()):
        raise ValueError("action_mask must contain at least one valid token")
    rho = (live(old_log_probs, action_mask) - live(rollout_log_probs, action_mask)).clamp(-20, 20).exp()
    weights = live(torch.where((rho >= 0.5) & (rho <= 5.0), rho, 0.0), action_mask)
    mean_square = float(((weights / weights.sum().clamp(min=1e-8)) ** 2).sum())
    ess = 1.0 / mean_square  # ZeroDivisionError when every token is filtered
    del ess
    return token_mean(weights.detach() * _ppo(log_probs, old_log_probs, advantages, action_mask), action_mask)


def nan_when_empty(log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None):
    """Ours, reduced with an unguarded token mean: 0/0 = NaN on an all-masked batch, on-policy or not."""
    res = policy_loss(
        LossSpec(), OURS, log_probs, old_log_probs, rollout_log_probs, advantages, action_mask, metrics=False
    )
    return token_mean(res.per_token, action_mask)


def weight_leaks_when_empty(log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None):
    """Multiplies the unclamped ρ into the loss before masking: finite on-policy (ρ = 1), NaN when an
    all-masked batch holds e^1000 under the mask (inf·0)."""
    rho = (old_log_probs - rollout_log_probs).exp()
    loss = (rho * _ppo(log_probs, old_log_probs, advantages, action_mask) * action_mask).sum()
    return loss / action_mask.sum().clamp(min=1)


def shape_error(log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None):
    """Raises inside torch on any batch with more than one row: the finding must name this file's line."""
    if log_probs.shape[0] > 1:
        return torch.cat([log_probs, log_probs[:, :0].T], dim=0).sum()
    return token_mean(_ppo(log_probs, old_log_probs, advantages, action_mask), action_mask)


def verl_style(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, rollout_is_weights=None
):
    """verl's calling convention: config object, (loss, metrics) back, weights precomputed."""
    assert loss_agg_mode == "token-mean" and config.clip_ratio == 0.2
    per_token = _ppo(log_prob, old_log_prob, advantages, response_mask)
    if rollout_is_weights is not None:
        per_token = per_token * rollout_is_weights
    return token_mean(per_token, response_mask), {"actor/pg_clipfrac": 0.0}


def clamped_weights(log_ratio, response_mask, high: float = 2.0):
    """verl-style TIS weights: min(ρ, high), from the log-ratio."""
    return live(log_ratio.clamp(-20, 20).exp(), response_mask).clamp(max=high), {}


def unclamped_weights(old_log_prob, rollout_log_prob, response_mask):
    """Says it truncates but forgets to: ρ straight through (within ±20 nats)."""
    return live((old_log_prob - rollout_log_prob).clamp(-20, 20).exp(), response_mask)


def dict_loss(log_probs, old_log_probs, rollout_log_probs, advantages, action_mask):
    """The plain convention, returning a dict."""
    per_token = _ppo(log_probs, old_log_probs, advantages, action_mask)
    return {"metrics": {}, "policy_loss": token_mean(per_token, action_mask)}


_CALLS = [0]


def flaky(log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None):
    """NaN on every third call, whatever the input: hypothesis cannot replay what it found."""
    _CALLS[0] += 1
    loss = token_mean(_ppo(log_probs, old_log_probs, advantages, action_mask), action_mask)
    return loss * float("nan") if _CALLS[0] % 3 == 0 else loss
