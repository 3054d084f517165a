"""The 2026 losses (docs/corrections.md, §4.1), one family a file, each following a named release.

Every function here has the signature of runner.core.losses' per-token losses:
(spec, corr, cres, lp, old, roll, adv, mask, sanitise, metrics) → (per_token, clipped, reduction mask),
where per_token is already multiplied by the correction's coefficient and `clipped` marks the masked-in
tokens where the loss's own clip or trust-region mask binds (ppo_clip_fraction), or is None.
"""

from runner.core.loss_families.cispo import cispo_per_token, rollout_is_per_token
from runner.core.loss_families.dppo import dppo_kl_per_token, dppo_tv_per_token, ipo_per_token
from runner.core.loss_families.gmpo import gmpo_per_token
from runner.core.loss_families.kimi15 import kimi15_per_token
from runner.core.loss_families.sapo import sapo_per_token
from runner.core.loss_families.topr import topr_per_token

PER_TOKEN_2026 = {
    "cispo": cispo_per_token,
    "dppo-tv": dppo_tv_per_token,
    "dppo-kl": dppo_kl_per_token,
    "ipo": ipo_per_token,
    "sapo": sapo_per_token,
    "gmpo": gmpo_per_token,
    "topr": topr_per_token,
    "rollout-is": rollout_is_per_token,
    "kimi15": kimi15_per_token,
}
