"""From an experiment's dataset (analysis.load) to the small tidy frames the claims' rules read: each job's
override and config values as columns, a clear error when the experiment has not run, and one update index
per job."""

from __future__ import annotations

from typing import Any

from analysis.load import Dataset
from runner.errors import UserError


def _job_map(ds: Dataset, key: str) -> dict[int, Any]:
    """job -> the value of an override key or dotted config key (a group gives its name)."""
    return {j.index: j.value(key) for j in ds.jobs}


def with_keys(ds: Dataset, df, **keys: str):
    """Add columns (name=key) from each job's override/config value, replacing any column of that name."""
    df = df.copy()
    for col, key in keys.items():
        df[col] = df["job"].map(_job_map(ds, key))
    return df


def required(frame, what: str, path: Any):
    """`frame`, or a one-line error when the experiment left none."""
    if frame is None or len(frame) == 0:
        raise UserError(f"{path}: no {what} here; run the experiment first (scripts/figures.sh)")
    return frame


def update_index(df):
    """A global update index per job: step × updates_per_step + update."""
    per = int(df["update"].max()) + 1 if "update" in df.columns else 1
    return df["step"].astype(int) * per + (df["update"].astype(int) if "update" in df.columns else 0)


def world_of(ds: Dataset) -> str:
    """The policy world the experiment ran in (policy.name of its jobs): bigram | mlp | transformer."""
    names = {str(j.value("policy.name") or "bigram") for j in ds.jobs}
    if len(names) != 1:
        raise UserError(
            f"{ds.path}: the jobs ran in {len(names)} worlds ({', '.join(sorted(names))}); a claim's "
            "experiment runs in one"
        )
    return names.pop()


def objective_series(g, summary: dict | None = None):
    """One job's evaluated J, one value per evaluated step in step order (the objective column repeats J on
    every update of its step and is empty between evaluations), with its Monte Carlo SE where logged. With the
    job's summary.json, J after the last step (final_objective, evaluated at the end of every run) is added at
    step = steps_run when metrics.csv has no evaluation there (a run whose length is not a multiple of
    train.objective_every), with the mean SE of the others."""
    import math

    import pandas as pd

    cols = ["objective"] + (["objective_se"] if "objective_se" in g.columns else [])
    ev = g.dropna(subset=["objective"]).groupby("step", sort=True)[cols].first()
    if "objective_se" not in ev.columns:
        ev["objective_se"] = float("nan")
    ev = ev.astype(float) if len(ev) else pd.DataFrame(columns=["objective", "objective_se"], dtype=float)
    if summary:
        try:
            last, final = int(summary.get("steps_run")), float(summary.get("final_objective"))
        except (TypeError, ValueError):
            return ev
        if math.isfinite(final) and (not len(ev) or last > ev.index.max()) and not summary.get("nonfinite_params"):
            ev.loc[last] = [final, float(ev["objective_se"].mean()) if len(ev) else float("nan")]
    return ev


def run_frame(ds: Dataset, **keys: str):
    """One row per training job: the given key columns (name=override or config key), and
    - from summary.json: collapsed (0/1), collapse_step, collapse_kind (drop | spike | nan), nan_params,
      initial (J₀), skipped and updates;
    - from metrics.csv: peak (the highest evaluated J) and peak_step, final (mean J over the last quarter of the
      evaluations), drop (relative_drop(peak, final)), j_se (the mean Monte Carlo SE of J; NaN where J is
      exact), evaluations, ess, rejected (token_masked_fraction), seq_rejected, clamped, kl_k3 (the engine's
      measured per-token mismatch), each a mean over updates (ess over the updates whose gradient is not
      exactly 0: where θ does not move, ESS ≡ 1 says nothing about stability), max_grad_norm,
      grad_norm_early (the median of the first 20 positive finite norms), spikes (stats.spikes_of),
      nonfinite (updates with a NaN/inf loss or gradient), zero_grad (the fraction of updates whose
      gradient is exactly 0: summary.json's zero_grad_fraction, or grad_norm = 0 where it is missing),
      steps (the last step logged);
    - low, high: the correction's band (NaN where a side is open, and both for a preset with no weight and no
      filter, which uses none)."""
    import math

    import numpy as np
    import pandas as pd

    from analysis.claims.stats import as_float, collapse_kind, final_of, relative_drop, spikes_of

    df = required(ds.metrics, "training metrics (metrics.csv)", ds.path)
    summ = {j.index: (j.summary or {}) for j in ds.jobs}
    # a band counts only where the preset uses one (a weight or a filter): plain PPO ignores correction.low/high
    uses = {
        j.index: str(j.value("correction.weight")) != "none" or str(j.value("correction.filter")) != "none"
        for j in ds.jobs
    }
    band = {
        j.index: (as_float(j.value("correction.low")), as_float(j.value("correction.high")))
        if uses[j.index]
        else (math.nan, math.nan)
        for j in ds.jobs
    }
    values = {col: _job_map(ds, key) for col, key in keys.items()}
    df = df.assign(_t=update_index(df)).sort_values(["job", "_t"])

    def mean_of(g, col):
        return float(g[col].astype(float).mean()) if col in g.columns else math.nan

    rows = []
    for job, g in df.groupby("job", sort=True):
        s = summ.get(job, {})
        ev = objective_series(g, s)
        peak = float(ev["objective"].max()) if len(ev) else math.nan
        peak_step = float(ev["objective"].idxmax()) if len(ev) and ev["objective"].notna().any() else math.nan
        final = final_of(ev["objective"])
        g = g[g["reward"].notna()] if "reward" in g.columns else g  # the updates: not the final row (J only)
        gn = g["grad_norm"].astype(float)
        early = gn[np.isfinite(gn) & (gn > 0)].head(20)
        moving = g[gn != 0]  # updates whose gradient is not exactly 0
        bad = (g.get("nonfinite_loss", 0) + g.get("nonfinite_grad", 0)) > 0
        step = s.get("collapse_step")
        row = {
            "job": job,
            **{col: values[col].get(job) for col in keys},
            "collapsed": float(bool(s.get("collapsed", False))),
            "collapse_step": as_float(step) if step is not None else math.nan,
            "collapse_kind": collapse_kind(s.get("collapse_reason")),
            "nan_params": float(bool(s.get("nonfinite_params", False))),
            "initial": as_float(s.get("initial_objective", ev["objective"].iloc[0] if len(ev) else None)),
            "skipped": int(s.get("updates_skipped", 0) or 0),
            "updates": int(s.get("updates_run", len(g)) or 0),
            "peak": peak,
            "peak_step": peak_step,
            "final": final,
            "drop": relative_drop(peak, final),
            "j_se": float(ev["objective_se"].mean()) if ev["objective_se"].notna().any() else math.nan,
            "evaluations": len(ev),
            "ess": mean_of(moving, "ess"),
            "rejected": mean_of(g, "token_masked_fraction"),
            "seq_rejected": mean_of(g, "seq_masked_fraction"),
            "clamped": mean_of(g, "clamped_fraction"),
            "kl_k3": mean_of(g, "kl_k3"),
            "max_grad_norm": float(gn[np.isfinite(gn)].max()) if np.isfinite(gn).any() else math.nan,
            "grad_norm_early": float(early.median()) if len(early) else math.nan,
            "spikes": spikes_of(gn),
            "nonfinite": int(np.asarray(bad).sum()),
            "steps": int(g["step"].max()),
            "zero_grad": as_float(s.get("zero_grad_fraction", float((gn == 0).mean()) if len(gn) else math.nan)),
            "low": band[job][0],
            "high": band[job][1],
        }
        rows.append(row)
    return pd.DataFrame(rows)


def setting_label(row, cols) -> str:
    """'bf16 k=2 σ=0.5': the values of the setting columns that the experiment varied."""
    from analysis.load import fmt_value

    short = {"precision": "", "staleness": "k=", "noise": "σ=", "loss": "", "trust": "trust region: "}
    out = []
    for c in cols:
        v = row[c]
        out.append(f"{short.get(c, c + '=')}{fmt_value(float(v)) if isinstance(v, float) else v}")
    return " ".join(out)


def band_text(runs, setting_cols=()) -> tuple[str, list[str]]:
    """What each banded correction's band did at this world's mismatch: the fraction of tokens it rejected
    (mean over a run's updates, then over its seeds), the fraction it clamped where that is its action, and the
    engine's measured mismatch (kl_k3 per token) where it did so, as a range over the settings in
    `setting_cols`; a band that rejects ≥ DEGENERATE_REJECTED of the tokens in a setting makes that arm
    degenerate there, and is named so. Returns (text, the degenerate arms as 'preset (setting)')."""
    import math

    from analysis.claims.figures import ordered_presets
    from analysis.claims.stats import DEGENERATE_REJECTED, pct, sig

    if not {"correction", "low", "high"} <= set(runs.columns):
        return "", []
    banded = runs[runs["low"].notna() | runs["high"].notna()]
    parts, degenerate = [], []
    for name in ordered_presets(banded["correction"].unique()):
        cur = banded[banded["correction"] == name]
        cols = [c for c in setting_cols if c in cur.columns and c != "correction"]
        per = (
            cur.groupby(cols, dropna=False)[["rejected", "clamped", "kl_k3"]].mean()
            if cols
            else cur[["rejected", "clamped", "kl_k3"]].mean().to_frame().T
        )
        lo, hi = cur["low"].iloc[0], cur["high"].iloc[0]
        band = f"[{'—' if not math.isfinite(lo) else sig(lo, 4)}, {'—' if not math.isfinite(hi) else sig(hi, 4)}]"

        def span(col, fmt):
            a, b = per[col].min(), per[col].max()
            return fmt(a) if not math.isfinite(b) or abs(b - a) <= 1e-12 + 1e-3 * abs(b) else f"{fmt(a)}–{fmt(b)}"

        if not per["rejected"].notna().any():
            what = "rejection not logged"
        else:
            what = f"rejects {span('rejected', pct)}" if per["rejected"].max() > 0 else "rejects 0%"
        if per["clamped"].max() > 0:
            what += f", clamps {span('clamped', pct)}"
        text = f"{name} {band} {what} of tokens at kl_k3 {span('kl_k3', lambda v: sig(v, 2))}/token"
        deg = per[per["rejected"] >= DEGENERATE_REJECTED]
        if len(deg):
            where = []
            for idx in deg.index:
                vals = idx if isinstance(idx, tuple) else (idx,)
                where.append(setting_label(dict(zip(cols, vals)), cols) if cols else "")
            label = f"{name} ({', '.join(w for w in where if w) or 'every setting'})"
            degenerate.append(label)
            text += f": DEGENERATE where it rejects ≥ {pct(DEGENERATE_REJECTED)}" + (
                f" ({', '.join(w for w in where if w)})" if cols else ""
            )
        parts.append(text)
    return ("bands at this world's mismatch: " + "; ".join(parts)) if parts else "", degenerate
