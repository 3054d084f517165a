"""GMPO, geometric-mean policy optimisation (arXiv 2507.20673), as verl ships it (loss_mode=geo_mean).

verl b178a3c (verl/trainer/ppo/core_algos.py, compute_policy_loss_geo_mean): each token's log-ratio
x = lp − old is clipped to [−ε_low, ε_high] on the side the advantage's sign makes pessimistic,
x̃ = sgn(A)·min(sgn(A)·x, sgn(A)·clip(x)); the sequence's ratio is the geometric mean exp(mean_t x̃), and
its loss −Ā·exp(mean_t x̃) (Ā: the sequence's mean advantage), averaged over the B sequences whatever
loss_agg_mode says. A correction's coefficients enter as their geometric mean over the sequence,
exp(mean_t log(c_t + 1e-10)), as verl aggregates rollout_is_weights for this loss (a rejected token's
c_t = 0 counts as e^−23). The mean log-ratio is bounded to ±20 before exp (verl leaves that clamp
commented out; without it a sequence mean past 88 nats overflows).

Laid out per token as loss_i·m_it / n_i, so that seq-mean-token-sum gives verl's torch.mean over sequences.
"""

from __future__ import annotations

import torch

from runner.core.loss_families.common import clipped_in_mask, loss_log_ratio
from runner.core.masking import SAFETY_BOUND

GEO_WEIGHT_EPS = 1e-10  # verl's floor inside log(rollout_is_weights + 1e-10)


def gmpo_per_token(spec, corr, cres, lp, old, roll, adv, mask, sanitise, metrics):
    seq_mask = cres.mask  # after a `drop` rejection, as verl's rejection shrinks response_mask
    log_ratio = loss_log_ratio(spec, lp, old, roll, mask, sanitise)
    sign = torch.sign(adv)
    clipped_log_ratio = log_ratio.clamp(-spec.eps_low, spec.eps_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clipped_log_ratio)
    tokens = seq_mask.sum(-1, keepdim=True).clamp(min=1)  # = verl's n + 1e-8 in float32, 0/1 = 0 when empty
    seq_log_ratio = (pessimistic * seq_mask).sum(-1, keepdim=True) / tokens
    seq_ratio = torch.exp(seq_log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    seq_adv = (adv * seq_mask).sum(-1, keepdim=True) / tokens
    seq_loss = -seq_adv * seq_ratio
    if corr.active:
        log_coef = torch.log(cres.coef + GEO_WEIGHT_EPS) * seq_mask
        seq_loss = seq_loss * torch.exp(log_coef.sum(-1, keepdim=True) / tokens)
    with torch.no_grad():
        clipped = clipped_in_mask(log_ratio != clipped_log_ratio, mask, metrics)
    return seq_loss * seq_mask / tokens, clipped, seq_mask
