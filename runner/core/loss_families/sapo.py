"""SAPO, soft adaptive policy optimisation (Qwen, arXiv 2511.20347), as SkyRL ships it.

SkyRL a956457 (skyrl/backends/skyrl_train/utils/ppo_utils.py, sapo_policy_loss): PPO's hard clip replaced by
a sigmoid gate, f(r) = σ(τ·(r − 1))·4/τ, τ = τ_pos where A > 0 and τ_neg elsewhere; per token −f(r)·A with
r = exp(clamp(lp − old, ±20)). f'(1) = 1, so at r = 1 the gradient is PPO's, and it fades smoothly, as
4·σ(1 − σ)·r, as r leaves 1 (τ_neg > τ_pos fades negative tokens faster).
"""

from __future__ import annotations

import torch

from runner.core.loss_families.common import bounded_exp, loss_log_ratio


def sapo_per_token(spec, corr, cres, lp, old, roll, adv, mask, sanitise, metrics):
    ratio = bounded_exp(loss_log_ratio(spec, lp, old, roll, mask, sanitise))
    tau = torch.where(adv > 0, adv.new_tensor(spec.tau_pos), adv.new_tensor(spec.tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    return -gate * adv * cres.coef, None, cres.mask
