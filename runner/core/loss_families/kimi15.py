"""Kimi k1.5's policy loss (arXiv 2501.12599, eq. 3), as ROLL ships it (pg_variant=kimi15).

ROLL 8eb27cc (roll/pipeline/agentic/agentic_actor_pg_worker.py, _compute_kimi15_loss): per token
−A·log π + (τ/2)·(lp − old)², the plain policy gradient with a squared-log-ratio pull towards π_old instead of
a clip (here `kl_tau` = τ/2). No ratio multiplies the gradient, so nothing overflows: a finite input gives a
finite loss and gradient, (lp − old)² included.
"""

from __future__ import annotations

from runner.core.loss_families.common import live_log_probs, loss_log_ratio


def kimi15_per_token(spec, corr, cres, lp, old, roll, adv, mask, sanitise, metrics):
    log_ratio = loss_log_ratio(spec, lp, old, roll, mask, sanitise)
    per_token = -adv * live_log_probs(lp, mask, sanitise) + spec.kl_tau * log_ratio.square()
    return per_token * cres.coef, None, cres.mask
