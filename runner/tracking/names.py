"""The name a tracker logs each metrics.csv column under: one table, namespaced as the frameworks do.

Where verl logs the same quantity (docs/metrics.md's table says which are the same and which only close),
the tracker name is verl's, so an is-study curve lands beside a verl run's curve of the same name in one
dashboard. Every other column keeps its flat name under the namespace of its kind: `training/` for what
the step measured, `actor/` for what the update did, `rollout_corr/` for the correction's diagnostics,
`faults/` for the NaN/inf flags, `perf/` for timing. The run's constants (seed, correction, staleness,
precision) are the tracker run's config, not curves.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# metrics.csv column → tracker name; docs/metrics.md's "Tracker names" table is this table (a test checks it)
TRACKER_NAMES: dict[str, str] = {
    "step": "training/global_step",
    "update": "training/update",
    "reward": "training/reward",
    "objective": "training/objective",
    "objective_se": "training/objective_se",
    "loss": "actor/pg_loss",
    "grad_norm": "actor/grad_norm",
    "clipped": "actor/grad_clipped",
    "update_norm": "actor/update_norm",
    "entropy": "actor/entropy",
    "nonfinite_loss": "faults/nonfinite_loss",
    "nonfinite_grad": "faults/nonfinite_grad",
    "skipped": "faults/skipped",
    "all_rejected": "faults/all_rejected",
    "is_weight_mean": "rollout_corr/rollout_is_mean",
    "is_weight_std": "rollout_corr/rollout_is_std",
    "is_weight_min": "rollout_corr/rollout_is_min",
    "is_weight_max": "rollout_corr/rollout_is_max",
    "ess": "rollout_corr/ess",
    "token_masked_fraction": "rollout_corr/rollout_rs_masked_fraction",
    "seq_masked_fraction": "rollout_corr/seq_masked_fraction",
    "clamped_fraction": "rollout_corr/clamped_fraction",
    "kl_k1": "rollout_corr/kl",
    "kl_k3": "rollout_corr/k3_kl",
    "chi2_token": "rollout_corr/chi2_token",
    "chi2_seq": "rollout_corr/chi2_seq",
    # verl's rollout_corr/log_ppl_diff is engine minus trainer; is-study's is the opposite sign
    "log_ppl_diff": "rollout_corr/neg_log_ppl_diff",
    "max_abs_prob_diff": "training/rollout_probs_diff_max",
    "ppo_clip_fraction": "actor/pg_clipfrac",
    "policy_kl_k3": "actor/ppo_kl_k3",
    "wall_ms": "perf/wall_ms",
}


def tracker_data(row: Mapping[str, Any]) -> dict[str, float]:
    """A metrics.csv row as a tracker logs it: the numeric cells under their tracker names, in the
    table's order. An empty cell (J between evaluations, the final row's per-update cells) is left out;
    NaN and ±inf stay (JSONL writes them as null, as verl's logger does)."""
    data = {}
    for column, name in TRACKER_NAMES.items():
        value = row.get(column)
        if value is None or value == "":
            continue
        data[name] = value
    return data
