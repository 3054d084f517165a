"""Tidy tables built from a `Dataset` (analysis.load) for the figures and the dataset report: the
metrics rows of updates only, one row per train job (`per_job`), and probe.csv's rows with rel_mse and
`degenerate` filled in (`probe_frame`). Never imports torch.
"""

from __future__ import annotations

from analysis.load import Dataset
from runner.core.schema import DEGENERATE_MASKED, DEGENERATE_NORM_RATIO


# ----------------------------------------------------------------------------------------- per job
def update_rows(df):
    """metrics rows of updates only: without each run's final row (J after the last update, no reward,
    its per-update cells empty, which a figure would otherwise take for NaN/inf values)."""
    if df is None or "reward" not in df.columns:
        return df
    return df[df["reward"].notna()]


def per_job(ds: Dataset):
    """One row per train job: correction, staleness, precision, the key columns, and
    updates, nonfinite (fraction of updates with a NaN/inf loss or gradient), nonfinite_events
    (NaN/inf loss events + NaN/inf gradient events, as events.csv counts them), first_bad (step),
    skipped, final_objective, best_objective, final_reward, collapsed (1/0; NaN without
    summary.json), nonfinite_params (1 when the run ended with NaN/inf parameters), done. Values come
    from summary.json where the job has one, else from the metrics."""
    import numpy as np

    df = ds.metrics
    if df is None:
        return None
    loss_bad = df["nonfinite_loss"].fillna(0) if "nonfinite_loss" in df.columns else 0
    grad_bad = df["nonfinite_grad"].fillna(0) if "nonfinite_grad" in df.columns else 0
    events = loss_bad + grad_bad
    # metrics.csv's final row (J after the last update, runner/core/schema.py) is no update: it has no reward
    updates = df["reward"].notna() if "reward" in df.columns else True
    frame = df.assign(
        _bad=events > 0,
        _events=events,
        _update=updates,
        _skipped=df["skipped"].fillna(0) if "skipped" in df.columns else 0,
    )
    seed = {"seed": ("seed", "first")} if "seed" in frame.columns else {}
    precision = {"precision": ("precision", "first")} if "precision" in frame.columns else {}
    per = (
        frame.groupby("job", sort=True)
        .agg(
            correction=("correction", "first"),
            staleness=("staleness", "first"),
            **precision,
            **seed,
            updates=("_update", "sum"),
            nonfinite=("_bad", "sum"),
            nonfinite_events=("_events", "sum"),
            skipped=("_skipped", "sum"),
            last_objective=("objective", "last"),
            max_objective=("objective", "max"),
            last_reward=("reward", "last"),
        )
        .reset_index()
    )
    per["nonfinite"] = per["nonfinite"] / per["updates"].where(per["updates"] > 0)
    per["updates"] = per["updates"].astype(int)
    per["first_bad"] = per["job"].map(frame.loc[frame["_bad"]].groupby("job")["step"].min())
    summ = {j.index: j.summary or {} for j in ds.jobs}
    done = {j.index: j.done for j in ds.jobs}

    def from_summary(key, fallback):
        return [
            summ.get(j, {}).get(key, fb) if summ.get(j, {}).get(key) is not None else fb
            for j, fb in zip(per["job"], fallback)
        ]

    per["final_objective"] = from_summary("final_objective", per["last_objective"])
    per["best_objective"] = from_summary("peak_objective", per["max_objective"])
    per["final_reward"] = from_summary("final_reward", per["last_reward"])
    per["collapsed"] = [float(summ[j]["collapsed"]) if "collapsed" in summ.get(j, {}) else np.nan for j in per["job"]]
    # learned: False when J never rose above its start (summary.json); NaN for runs that predate it
    per["learned"] = [
        float(summ[j]["learned"]) if summ.get(j, {}).get("learned") is not None else np.nan for j in per["job"]
    ]
    per["initial_objective"] = [summ.get(j, {}).get("initial_objective", np.nan) for j in per["job"]]
    for key in ("peak_step", "collapse_step", "collapse_reason"):
        per[key] = [summ.get(j, {}).get(key) for j in per["job"]]
    # final_objective: J after the last update, the last J of metrics.csv (its final row) and summary.json's.
    # NaN/inf parameters end a run: its J is undefined from then on (summary.json's final_objective
    # is null, and final_objective above falls back to the last finite J, from before the NaN).
    per["nonfinite_params"] = [
        float(summ[j]["nonfinite_params"]) if "nonfinite_params" in summ.get(j, {}) else np.nan for j in per["job"]
    ]
    per["done"] = [done.get(j, True) for j in per["job"]]
    per = per.drop(columns=["last_objective", "max_objective", "last_reward"])
    firsts = df.drop_duplicates("job").set_index("job")
    for k in ds.keys:
        if k not in per.columns and k in firsts.columns:
            per[k] = per["job"].map(firsts[k])
    per.attrs.update(keys=list(ds.keys), swept=list(ds.swept))
    return per


# ----------------------------------------------------------------------------------------- probe
def probe_frame(ds: Dataset):
    """probe.csv's rows with rel_mse (MSE / ‖∇J‖²) and `degenerate` filled in for files written
    before the probe wrote them: degenerate from the masked fraction (and the norm ratio, where the
    file has it). None without probe results."""
    import numpy as np

    pr = ds.probe
    if pr is None:
        return None
    pr = pr.copy()
    if "rel_mse" not in pr.columns and {"mse", "exact_grad_norm"} <= set(pr.columns):
        g2 = pr["exact_grad_norm"].astype(float) ** 2
        pr["rel_mse"] = pr["mse"].astype(float) / g2.where(g2 > 0)
    if "degenerate" not in pr.columns:
        masked = pr["mean_masked_fraction"].astype(float) if "mean_masked_fraction" in pr.columns else 0.0
        ratio = pr["norm_ratio"].astype(float) if "norm_ratio" in pr.columns else np.inf
        pr["degenerate"] = ((masked >= DEGENERATE_MASKED) | (ratio < DEGENERATE_NORM_RATIO)).astype(int)
    pr["degenerate"] = pr["degenerate"].fillna(0).astype(int)
    return pr


DEGENERATE_RULE = f"degenerate: masks ≥ {DEGENERATE_MASKED:.0%} of the tokens or ‖E ĝ‖ < {DEGENERATE_NORM_RATIO:g}·‖∇J‖"
