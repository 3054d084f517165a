"""DPPO (arXiv 2602.04879) Binary-TV and Binary-KL, and prime-rl's IPO: a policy gradient through the ratio
r = π_θ / μ against the engine's log-probs, with a trust region that drops tokens whose probability moved too
far, and prime-rl's squared-log-ratio term.

    per token = −keep·adv_tau·A·r + kl_tau·(log r)²

- dppo-tv: prime-rl 559b447 (src/prime_rl/trainer/rl/loss.py, default_loss_fn): with Δp = π_θ − μ, a token
  is dropped where A > 0 and Δp > δ_high, or A < 0 and Δp < −δ_low (the trust region in the direction the
  advantage pushes).
- dppo-kl: SkyRL a956457 (skyrl/backends/skyrl_train/utils/ppo_utils.py, dppo_policy_loss, binary_kl): the
  Bernoulli KL of the token's probability, μ·log(μ/π) + (1 − μ)·log((1 − μ + 1e-8)/(1 − π + 1e-8)), beyond
  δ_high where A > 0 and Δp > 0, beyond δ_low where A < 0 and Δp < 0.
- ipo: prime-rl 559b447 (ipo_loss_fn): dropped where |Δp| > ipo_threshold, whatever A's sign.

r = exp(clamp(log r, ±20)), as SkyRL's safe_exp_delta: prime-rl's unbounded exp gives r = inf past 88 nats,
so −inf on a kept token and 0·inf = NaN on a dropped one; the squared term is unbounded, as in prime-rl.
`loss.log_ratio_bound: null` is prime-rl's unbounded exp (conf/loss/prime-rl/), bugs included.
"""

from __future__ import annotations

import torch

from runner.core.loss_families.common import clipped_in_mask, loss_log_ratio

BINARY_KL_EPS = 1e-8  # SkyRL's eps inside the log of the complement probabilities


def _base(spec, old, roll):
    return roll if spec.ratio_against == "behaviour" else old


def binary_tv_drop(lp, base, adv, spec):
    diff = torch.exp(lp) - torch.exp(base)
    return torch.where(adv > 0, diff > spec.mask_high, diff < -spec.mask_low)


def binary_kl_drop(lp, base, adv, spec):
    p, mu = torch.exp(lp), torch.exp(base)
    diff = p - mu
    kl = mu * (base - lp) + (1 - mu) * torch.log((1 - mu + BINARY_KL_EPS) / (1 - p + BINARY_KL_EPS))
    return ((adv > 0) & (diff > 0) & (kl > spec.mask_high)) | ((adv < 0) & (diff < 0) & (kl > spec.mask_low))


def ipo_drop(lp, base, adv, spec):
    return (torch.exp(lp) - torch.exp(base)).abs() > spec.ipo_threshold


def _trust_region_pg(drop_rule, spec, corr, cres, lp, old, roll, adv, mask, sanitise, metrics):
    log_ratio = loss_log_ratio(spec, lp, old, roll, mask, sanitise)
    with torch.no_grad():
        drop = drop_rule(lp.detach(), _base(spec, old, roll), adv, spec)
        keep = (~drop).to(lp.dtype)
    bound = spec.log_ratio_bound
    ratio = torch.exp(log_ratio) if bound is None else torch.exp(log_ratio.clamp(-bound, bound))
    per_token = -keep * (spec.adv_tau * adv) * ratio
    if spec.kl_tau:
        per_token = per_token + spec.kl_tau * log_ratio.square()
    return per_token * cres.coef, clipped_in_mask(drop, mask, metrics), cres.mask


def dppo_tv_per_token(*args):
    return _trust_region_pg(binary_tv_drop, *args)


def dppo_kl_per_token(*args):
    return _trust_region_pg(binary_kl_drop, *args)


def ipo_per_token(*args):
    return _trust_region_pg(ipo_drop, *args)
