"""The column names of every file a study writes, in one place. No torch: the studies write these
columns, `runner.core.metrics` computes the correction metrics under these names, and `analysis.load`
reads them, all from here.

metrics.csv (study=train), one row per optimizer update, then a final row (step = train.steps, update 0)
holding J(θ_T) after the last update in `objective` (and objective_se) with the other per-update cells
empty: the run's final J, the same number as summary.json's final_objective. Select the update rows
with `df[df["reward"].notna()]` (every update row has its step's reward).
  ids        the run's constants repeated on every row, so concatenated runs stay self-describing
  training   what one update did (reward: the step's mean sampled reward; objective: J(θ_t), exact or
             Monte Carlo with objective_se beside it, empty on steps between evaluations; clipped:
             1 when the grad clip bound)
  faults     0/1 flags of NaN/inf and of a batch the correction rejected whole
  correction the correction's metrics over the update's mini-batch (runner.core.metrics); flat names, mapped to
             each framework's own in docs/metrics.md
  timing     ms since training began; left out with log.timing=false, so the file is then
             byte-identical across runs of the same config and seed
"""

from __future__ import annotations

ID_COLUMNS = ("step", "update", "seed", "correction", "staleness", "precision")
CONSTANT_COLUMNS = ("seed", "correction", "staleness", "precision")  # the same in every row of a run
TRAINING_COLUMNS = ("reward", "objective", "loss", "grad_norm", "clipped", "update_norm", "entropy")
MONTE_CARLO_COLUMNS = ("objective_se",)  # after `objective`, in worlds whose J is estimated
FAULT_COLUMNS = ("nonfinite_loss", "nonfinite_grad", "skipped", "all_rejected")
CORRECTION_METRICS = (
    "is_weight_mean",
    "is_weight_std",
    "is_weight_min",
    "is_weight_max",
    "ess",
    "token_masked_fraction",
    "seq_masked_fraction",
    "clamped_fraction",
    "kl_k1",
    "kl_k3",
    "chi2_token",
    "chi2_seq",
    "log_ppl_diff",
    "max_abs_prob_diff",
)
LOSS_METRICS = ("ppo_clip_fraction", "policy_kl_k3")
UPDATE_METRICS = CORRECTION_METRICS + LOSS_METRICS  # what log.metrics=false leaves out
TIMING_COLUMNS = ("wall_ms",)


def metrics_columns(metrics: bool = True, timing: bool = True, monte_carlo: bool = False) -> tuple[str, ...]:
    """metrics.csv's header for a run's log settings and how its world gives J."""
    training = TRAINING_COLUMNS[:2] + (MONTE_CARLO_COLUMNS if monte_carlo else ()) + TRAINING_COLUMNS[2:]
    return (
        ID_COLUMNS + training + FAULT_COLUMNS + (UPDATE_METRICS if metrics else ()) + (TIMING_COLUMNS if timing else ())
    )


ALL_METRICS_COLUMNS = metrics_columns(monte_carlo=True)

# tokens.csv: every generated token's trainer (fp32) and engine log-probs at sampled steps
# with the run's constants after `step`, as in metrics.csv, so tokens of many runs concatenate
TOKEN_COLUMNS = ("step", *CONSTANT_COLUMNS, "seq", "pos", "token", "old", "roll")

# events.csv
EVENT_COLUMNS = ("step", "kind", "detail", "action")
EVENT_KINDS = ("nonfinite_loss", "nonfinite_grad", "all_rejected", "nonfinite_params", "collapse")

# probe.csv (study=probe), one row per preset × band
PROBE_FIGURES = (
    "bias_norm",
    "bias_norm_ci",
    "bias_norm_lo",
    "bias_norm_hi",
    "bias_significant",
    "bias_norm_debiased",
    "rel_bias",
    "variance",
    "mse",
    "rel_mse",
    "norm_ratio",
    "cosine",
    "mean_grad_norm",
    "nonfinite_rate",
    "n_finite",
    "mean_ess",
    "mean_masked_fraction",
    "mean_seq_masked_fraction",
    "clamped_fraction",
    "degenerate",
)
PROBE_WORLD = (
    "seed",
    "task",
    "loss",
    "reduction",
    "baseline",
    "staleness",
    "precision",
    "logit_noise",
    "temperature",
    "top_p",
    "outlier_rate",
    "outlier_shift",
    "vocab_size",
    "seq_len",
    "prompt_len",
    "eos_token",
    "group_size",
    "batch_size",
    "repeats",
    "pretrain_steps",
    "drift_lr",
    "ci",
    "ci_level",
    "objective",
    "exact_grad_norm",
    "engine_kl",
    "policy",
    "reference",
    "reference_noise",
)
PROBE_COLUMNS = ("preset", "faithful", "low", "high", *PROBE_FIGURES, *PROBE_WORLD)
PROBE_INTEGER = ("bias_significant", "n_finite", "degenerate")

# A probe arm is degenerate when it learns (almost) nothing: it masks at least this fraction of the
# tokens, or its mean estimate is shorter than this fraction of ‖∇J‖. Such an arm can still have the
# lowest MSE (when ‖∇J‖² is below one batch's variance, returning ~0 "wins"), so it is flagged in
# probe.csv and never starred or picked as the best arm.
DEGENERATE_MASKED = 0.9
DEGENERATE_NORM_RATIO = 0.1


def is_degenerate(masked_fraction: float, norm_ratio: float) -> bool:
    """The rule above; a NaN figure (no finite batch) does not make an arm degenerate by itself."""
    return bool(masked_fraction >= DEGENERATE_MASKED or norm_ratio < DEGENERATE_NORM_RATIO)
