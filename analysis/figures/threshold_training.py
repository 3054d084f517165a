"""The threshold-training figure: a train sweep over the band [low, high], with final J, the
peak-to-final drop, the masked fraction, the ESS and NaN/inf events against the band, a line per
correction and a row per other swept key.
"""

from __future__ import annotations

import numpy as np

from analysis import style as st
from analysis.figures.facets import arm_spread, facets, keep_differing, seed_count
from analysis.figures.layout import (
    as_float,
    facet_arms,
    finish_kind,
    floor_at_zero,
    join_notes,
    label_rows,
    legend_for,
    never_learned_note,
    ordered,
    rows_grid,
    seeds_text,
)
from analysis.load import Dataset
from analysis.tables import per_job

# ----------------------------------------------------------------------------------------- threshold (training)
BAND_KEYS = ("band", "correction.low", "correction.high")  # swept keys that set a correction's [low, high]
BAND_METRICS = ("final_J", "drop", "masked", "ess", "nonfinite_events")
BAND_YLABELS = {
    "final_J": (r"final $J(\theta)$", r"final $J(\theta)$"),
    "drop": ("peak-to-final drop of J", "peak − final J"),
    "masked": ("masked tokens (mean fraction over the run)", "masked (frac.)"),
    "ess": ("ESS (mean fraction over the run)", "ESS (frac.)"),
    "nonfinite_events": ("NaN/inf loss or gradient events per run", "NaN/inf events"),
}
BAND_EMPTY = {
    "drop": "J never fell from its peak in any run (drop 0)",
    "masked": "no token masked in any run",
    "nonfinite_events": "no NaN/inf event in any run",
}


def band_frame(ds: Dataset):
    """One row per train job: correction, the band (low, high, and its name where a `band` key was
    swept) and the outcomes drawn against it: final_J (summary.json's final_objective, as per_job
    reads it), drop (peak − final J), masked and ess (means over the run's updates; ESS only where
    the weights were finite) and nonfinite_events."""
    df = ds.metrics
    per = per_job(ds)
    weights_ok = np.isfinite(df["is_weight_mean"].astype(float)) if "is_weight_mean" in df.columns else True
    runs = (
        df.assign(_ess=df["ess"].where(weights_ok) if "ess" in df.columns else np.nan)
        .groupby("job")
        .agg(
            masked=("token_masked_fraction", "mean")
            if "token_masked_fraction" in df.columns
            else ("step", lambda s: np.nan),
            ess=("_ess", "mean"),
        )
    )
    for key in ("low", "high"):
        if key in df.columns:
            per[key] = per["job"].map(df.groupby("job")[key].first().astype(float))
        else:
            per[key] = per["job"].map({j.index: as_float(j.value(f"correction.{key}")) for j in ds.jobs})
    per["final_J"] = per["final_objective"].astype(float).where(per["nonfinite_params"] != 1)
    per["drop"] = (per["best_objective"].astype(float) - per["final_objective"].astype(float)).clip(lower=0)
    per["masked"] = per["job"].map(runs["masked"])
    per["ess"] = per["job"].map(runs["ess"])
    return per


def threshold_training_figure(ds: Dataset, style: str = "default"):
    with st.using(style):
        return _threshold_training(ds, style)


def band_key(lo, hi) -> tuple[float, float]:
    """(low, high) as a key: an absent bound (NaN in the frame) is −inf / +inf. NaN cannot be a key:
    it never equals itself, so every row's NaN would be a band of its own, in an order set by memory
    addresses."""
    lo, hi = float(lo), float(hi)
    return (-np.inf if np.isnan(lo) else lo, np.inf if np.isnan(hi) else hi)


def _band_positions(per) -> tuple[dict, str, bool]:
    """{(low, high): x}, the x label and whether x is a log axis: a band sits at its upper threshold
    when the upper ones differ, else at its lower one; a band whose bound there is absent has no x."""
    pairs = sorted({band_key(lo, hi) for lo, hi in zip(per["low"], per["high"])}, key=lambda p: (p[1], -p[0]))
    highs = {hi for _, hi in pairs if np.isfinite(hi)}
    by_high = len(highs) >= 2
    xs = {p: (p[1] if by_high else p[0]) for p in pairs}
    xs = {p: (x if np.isfinite(x) else np.nan) for p, x in xs.items()}
    vals = np.array([v for v in xs.values() if np.isfinite(v)])
    log = len(vals) > 1 and (vals > 0).all() and vals.max() / vals.min() >= 4
    where = "upper" if by_high else "lower"
    return xs, where, bool(log)


def _threshold_training(ds: Dataset, style: str):
    from matplotlib.ticker import FixedLocator, NullLocator

    paper = style == "paper"
    per = band_frame(ds)
    xs, where, log_x = _band_positions(per)
    per["_x"] = [xs.get(band_key(lo, hi), np.nan) for lo, hi in zip(per["low"], per["high"])]
    per = per.dropna(subset=["_x"])
    metrics = [m for m in BAND_METRICS if per[m].notna().any()]
    empty = [m for m in metrics if m in BAND_EMPTY and per[m].fillna(0).eq(0).all()]
    metrics = [m for m in metrics if m not in empty]
    fs = facets(ds, per, exclude=BAND_KEYS, limit=None)
    fs = keep_differing(fs, arm_spread(per, fs, ["final_J"], x="_x"), st.PAPER_MAX_ROWS if paper else 4, what="final J")
    names = ordered(per["correction"].unique())
    fig, axes = rows_grid(len(fs), len(metrics), style, row_height=1.45 if paper else 2.6, panel_width=3.0)
    for f, name, cur, lk in facet_arms(per, fs, names):
        stats = cur.groupby("_x")[metrics].agg(["mean", "min", "max"]).sort_index()
        for m, metric in enumerate(metrics):
            ax = axes[f][m]
            x = stats.index.to_numpy(dtype=float)
            ax.plot(
                x,
                stats[(metric, "mean")],
                color=lk.color,
                linestyle=lk.linestyle,
                marker=lk.marker,
                markersize=3.2 if paper else 4.5,
                label=name,
                gid="series",
            )
            if cur.groupby("_x").size().max() > 1:
                ax.vlines(
                    x,
                    stats[(metric, "min")],
                    stats[(metric, "max")],
                    color=lk.color,
                    linewidth=1.0,
                    alpha=0.6,
                    gid="range",
                )
    bands = sorted(((p, x) for p, x in xs.items() if np.isfinite(x)), key=lambda kv: kv[1])
    named = {}
    if "band" in per.columns:
        named = {band_key(lo, hi): str(b) for b, lo, hi in zip(per["band"], per["low"], per["high"])}
    ticks = [x for _, x in bands]
    labels = [_band_label(p, named.get(p), paper) for p, _ in bands]
    for f in range(len(fs)):
        for m in range(len(metrics)):
            ax = axes[f][m]
            if log_x:
                ax.set_xscale("log")
            ax.xaxis.set_major_locator(FixedLocator(ticks))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticklabels(labels if f == len(fs) - 1 else [""] * len(labels))
            if log_x:
                lo, hi = min(ticks), max(ticks)
                ax.set_xlim(lo / (hi / lo) ** 0.12, hi * (hi / lo) ** 0.12)
    for m, metric in enumerate(metrics):
        column = [axes[f][m] for f in range(len(fs))]
        if metric in ("masked", "ess"):
            floor_at_zero(column, top_if_zero=1.0, ceiling=1.03)
        elif metric in ("drop", "nonfinite_events"):
            floor_at_zero(column)
    xlabel = "band [low, high]"
    label_rows(fig, axes, xlabel, [BAND_YLABELS[m][paper] for m in metrics], [fc.title(style) for fc in fs], paper)
    for ax in axes[-1]:
        ax.tick_params(axis="x", labelsize=6 if paper else 8)
    handles, labels = legend_for(names, marker=True)
    low, high = seed_count(
        per.assign(_f=per["job"].map({j: i for i, fc in enumerate(fs) for j in fc.jobs})), ("_f", "correction", "_x")
    )
    seeds = f"mean over {seeds_text(low, high)}, bars: min–max" if high > 1 else "one seed per point"
    seeds += f"; final J: summary.json's final_objective; a band sits at its {where} threshold" + (
        " (log axis)" if log_x else ""
    )
    gone = "; ".join(BAND_EMPTY[m] for m in empty)
    return finish_kind(
        fig,
        "threshold-training",
        ds,
        handles,
        labels,
        paper,
        join_notes(
            seeds,
            f"{gone} (panel{'s' if len(empty) > 1 else ''} left out)" if empty else "",
            never_learned_note(per),
            fs.note,
        ),
    )


def _band_label(pair, name: str | None, paper: bool) -> str:
    lo, hi = pair
    text = f"{'—' if not np.isfinite(lo) else f'{lo:g}'}–{'—' if not np.isfinite(hi) else f'{hi:g}'}"
    return f"{name}\n{text}" if name else text
