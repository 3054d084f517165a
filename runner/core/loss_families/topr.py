"""TOPR, tapered off-policy REINFORCE (arXiv 2503.14286, eq. 8), as ROLL ships it (pg_variant=topr).

ROLL 8eb27cc (roll/pipeline/agentic/agentic_actor_pg_worker.py, _compute_topr_loss): positive examples get
the plain REINFORCE term −w₊·A·log π (no importance weight: pushing a good sample up is safe); the others
get −w₋·sg(clamp(r, 0, 1))·A·log π with r = exp(lp − old), so a negative sample is pushed down at most as
hard as on-policy. ROLL splits on the episode's score (> 0 positive, ≤ 0 negative); the loss here receives
only the advantage and splits on its sign (A > 0 positive), the same split wherever the score and the
advantage have the same sign. exp() is unbounded as in ROLL: r = inf clamps to 1.
"""

from __future__ import annotations

import torch

from runner.core.loss_families.common import clipped_in_mask, live_log_probs, loss_log_ratio


def topr_per_token(spec, corr, cres, lp, old, roll, adv, mask, sanitise, metrics):
    positive = adv > 0
    with torch.no_grad():
        ratio = torch.exp(loss_log_ratio(spec, lp, old, roll, mask, sanitise))
        taper = torch.where(positive, spec.positive_weight, spec.negative_weight * ratio.clamp(0.0, 1.0))
        clipped = clipped_in_mask(~positive & (ratio > 1.0), mask, metrics)  # ROLL's negative upper clipfrac
    per_token = -adv * taper * live_log_probs(lp, mask, sanitise) * cres.coef
    return per_token, clipped, cres.mask
