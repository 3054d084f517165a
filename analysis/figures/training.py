"""The figures of train runs: training (J and reward against step), grad-norm (‖∇L‖ against step,
spikes and NaN/inf marked), stability (NaN/inf-update and collapse rates against staleness) and
masking (masked and clamped fractions and the ESS against step).

About 530 lines on purpose: the four kinds share the per-step frame, the step axis and the spike marks.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from analysis import style as st
from analysis import zero_grad
from analysis.figures.facets import (
    Facet,
    arm_spread,
    drop_flat,
    facet_bands,
    facets,
    keep_differing,
    percent_text,
    seed_counts,
)
from analysis.figures.layout import (
    TITLES,
    Grid,
    facet_arms,
    floor_at_zero,
    hide_negative_ticks,
    is_paper,
    join_notes,
    legend_for,
    line_kwargs,
    mark_events,
    never_learned_note,
    ordered,
    seed_note,
    seeds_text,
    step_label,
    style_label,
)
from analysis.load import Dataset, fmt_value
from analysis.tables import per_job, update_rows

SPIKE_FACTOR = 5.0  # a spike: grad norm above this many times the median of the trailing window
SPIKE_WINDOW = 20


def _mean_and_band(ax, stats, metric: str, kw: dict, alpha: float, steps=None) -> None:
    """The mean over seeds as a line, and ± 1 s.d. shaded where there is more than one seed.
    `steps`: draw only these (the steps where a metric was measured at all), so that a metric taken
    every N steps is one connected line, not N − 1 gaps between isolated, invisible points."""
    if steps is not None:
        stats = stats[stats["step"].isin(steps)]
    mean, sd = stats[f"{metric}_mean"], stats[f"{metric}_std"]
    sparse = steps is not None and 1 < len(stats) <= 60
    ax.plot(stats["step"], mean, **kw, **({"marker": "o", "markersize": 2.5} if sparse else {}))
    if stats[f"{metric}_count"].max() > 1:
        ax.fill_between(stats["step"], mean - sd, mean + sd, color=kw["color"], alpha=alpha, linewidth=0, gid="band")


def _event_marks(ax, xs, row: int, color: str, marker: str = "x"):
    """Markers in a strip under the data (see _room_for_marks), one row per correction."""
    if len(xs) == 0:
        return
    y = 0.025 + 0.045 * row
    paper = is_paper(ax.figure)
    ax.plot(
        xs,
        np.full(len(xs), y),
        linestyle="none",
        marker=marker,
        color=color,
        markersize=2.6 if paper else 4,
        markeredgewidth=0.7 if paper else 1.0,
        transform=ax.get_xaxis_transform(),
        clip_on=False,
        gid="events",
        zorder=4,
    )


def _room_for_marks(axes: Sequence, rows: int, low: float | None = None) -> None:
    """Lower the shared y axis of `axes` so that `rows` rows of event marks sit under the data of
    every one of them, not on it (the limits come from all of them: they share y). `low`: where the
    data's range starts (0 for a fraction), if not at the data's minimum."""
    lows, highs = [] if low is None else [low], []
    for ax in axes:
        lo, hi = ax.dataLim.intervaly
        if np.isfinite(lo) and np.isfinite(hi) and ax.has_data():
            lows.append(lo)
            highs.append(hi)
    if not highs:
        return
    lo, hi = min(lows), max(highs)
    span = (hi - lo) or max(abs(hi), 1.0) * 0.1
    band = (0.035 + 0.045 * rows) if rows else 0.0
    pad = 0.04 * span
    bottom = lo - pad - band / (1 - band) * (hi - lo + 2 * pad) if rows else lo - pad
    for ax in axes:
        ax.set_ylim(bottom, hi + pad)


def _event_handle(label: str = "NaN/inf loss or gradient", marker: str = "x"):
    from matplotlib.lines import Line2D

    return Line2D([], [], linestyle="none", marker=marker, color="0.25", markersize=5), label


# ----------------------------------------------------------------------------------------- training
def training_figure(ds: Dataset, style: str = "default"):
    with st.using(style):
        return _training(ds, style)


def _training(ds: Dataset, style: str):
    df = ds.metrics
    per = (
        df.assign(
            _bad=(df["nonfinite_loss"].fillna(0) + df["nonfinite_grad"].fillna(0)) > 0
            if "nonfinite_loss" in df.columns
            else False
        )
        .groupby(["job", "step"], sort=False)
        .agg(
            objective=("objective", "first"),
            reward=("reward", "mean"),
            bad=("_bad", "max"),
            correction=("correction", "first"),
            **({"seed": ("seed", "first")} if "seed" in df.columns else {}),
            **({"se": ("objective_se", "first")} if "objective_se" in df.columns else {}),
        )
        .reset_index()
    )
    # A Monte Carlo J (the transformer world) wobbles by its standard error: say how much, so that a
    # reader does not take a 0.04 dip for a drop; bars of ±2 s.e. where a line is one run.
    se = per["se"].astype(float) if "se" in per.columns else None
    monte_carlo = se is not None and bool((se > 0).any())
    metrics = ("objective", "reward")
    fs = facets(ds, df, limit=None)
    # A cut keeps the panels where the corrections' J differ most (the batch reward is too noisy to rank by).
    fs = keep_differing(fs, arm_spread(per, fs, ["objective"]), Grid.capacity(style, len(metrics)), what="J")
    names = ordered(per["correction"].unique())
    grid = Grid(len(fs), 2, style)
    flagged = ordered(per.loc[per["bad"].astype(bool), "correction"].unique())
    bands = facet_bands(per, fs, "step", metrics)
    bad = per[per["bad"].astype(bool)]
    # J is evaluated every train.objective_every steps (empty cells between): its line joins those steps
    evaluated = {"objective": set(per.loc[per["objective"].notna(), "step"]), "reward": None}
    if len(evaluated["objective"]) == per["step"].nunique():
        evaluated["objective"] = None
    drew_bars = shaded = False
    for f, facet in enumerate(fs):
        bad_f = bad[bad["job"].isin(facet.jobs)]
        for name in names:
            stats = bands.get((f, name))
            if stats is None:
                continue
            kw = line_kwargs(name)
            bad_steps = np.sort(bad_f.loc[bad_f["correction"] == name, "step"].unique())
            for m, metric in enumerate(metrics):
                ax = grid.ax(f, m)
                _mean_and_band(ax, stats, metric, kw, alpha=0.18, steps=evaluated[metric])
                shaded |= zero_grad.shade(
                    ax, df[df["job"].isin(facet.jobs) & (df["correction"] == name)], kw["color"], x="step"
                )
                if metric == "objective" and monte_carlo and stats["objective_count"].max() == 1:
                    runs = per[per["job"].isin(facet.jobs) & (per["correction"] == name) & per["se"].notna()]
                    ax.errorbar(
                        runs["step"],
                        runs["objective"],
                        yerr=2 * runs["se"].astype(float),
                        fmt="none",
                        ecolor=kw["color"],
                        elinewidth=0.6,
                        capsize=0,
                        alpha=0.6,
                    )
                    drew_bars = True
                if len(bad_steps):
                    _event_marks(ax, bad_steps, flagged.index(name), kw["color"])
    for m in range(2):
        axes = grid.metric_axes(m)
        _room_for_marks(axes, len(flagged))
        for ax in axes:
            hide_negative_ticks(ax)  # J and the reward are ≥ 0; the marks' strip may reach below
    grid.label(
        step_label(style),
        [
            style_label(style, r"objective $J(\theta)$ (expected reward)", r"objective $J(\theta)$"),
            style_label(style, "batch mean reward", "reward"),
        ],
        fs,
    )
    extra = [_event_handle("NaN/inf update (marks under the data)")] if flagged else []
    extra += [zero_grad.handle()] if shaded else []
    handles, labels = legend_for(names, extra=extra)
    mc_note = ""
    if monte_carlo:
        mc_note = f"J: a Monte Carlo estimate, s.e. ≈ {float(se[se > 0].mean()):.2g} per evaluation" + (
            " (bars: ±2 s.e.)" if drew_bars else ""
        )
    return grid.finish(TITLES["training"], ds, handles, labels, join_notes(seed_note(per, fs), mc_note, fs.note))


# ----------------------------------------------------------------------------------------- grad norm
def grad_norm_figure(ds: Dataset, style: str = "default"):
    with st.using(style):
        return _grad_norm(ds, style)


def _grad_norm(ds: Dataset, style: str):
    from matplotlib.lines import Line2D

    df = update_rows(ds.metrics)  # the final row (J only) is no update
    n_updates = int(df["update"].max()) + 1 if "update" in df.columns else 1
    x = df["step"] + (df["update"] / n_updates if "update" in df.columns else 0)
    cols = ["job", "correction", "grad_norm"] + [c for c in ("seed", "all_rejected") if c in df.columns]
    frame = df[cols].assign(x=x)
    fs = facets(ds, df, limit=Grid.capacity(style, 1))
    names = ordered(frame["correction"].unique())
    grid = Grid(len(fs), 1, style, row_height=None if len(fs) > 1 else (1.9 if style == "paper" else 3.4))
    n_spikes = n_bad = n_zero = 0
    shaded = False
    vals = frame["grad_norm"].astype(float)
    frame = frame.assign(gn=vals.where(np.isfinite(vals) & (vals > 0)), bad=~np.isfinite(vals), zero=vals == 0)
    ref = frame.groupby("job", sort=False)["gn"].transform(
        lambda s: s.shift(1).rolling(SPIKE_WINDOW, min_periods=3).median()
    )
    frame["spike"] = (frame["gn"] > SPIKE_FACTOR * ref) & (ref > 0)
    facet_of = {j: i for i, fc in enumerate(fs) for j in fc.jobs}
    frame["_facet"] = frame["job"].map(facet_of)
    frame = frame[frame["_facet"].notna()]
    stats_all = (
        frame.groupby(["_facet", "correction", "x"], sort=True)["gn"].agg(["median", "min", "max"]).reset_index()
    )
    njobs = frame.groupby(["_facet", "correction"])["job"].nunique()
    zero_rejected = 0
    for f, _facet in enumerate(fs):
        ax = grid.ax(f, 0)
        sub_stats = stats_all[stats_all["_facet"] == f]
        sub = frame[frame["_facet"] == f]
        for name in names:
            stats = sub_stats[sub_stats["correction"] == name]
            if stats.empty:
                continue
            kw = line_kwargs(name)
            ax.plot(stats["x"], stats["median"], linewidth=1.0, **kw)
            if njobs.get((f, name), 1) > 1:
                ax.fill_between(
                    stats["x"], stats["min"], stats["max"], color=kw["color"], alpha=0.15, linewidth=0, gid="band"
                )
            cur = sub[sub["correction"] == name]
            shaded |= zero_grad.shade(ax, cur, kw["color"], x="x")
            spk = cur[cur["spike"]]
            if len(spk):
                n_spikes += len(spk)
                ax.plot(
                    spk["x"],
                    spk["gn"],
                    linestyle="none",
                    marker="o",
                    markersize=5,
                    markerfacecolor="none",
                    markeredgecolor=kw["color"],
                    markeredgewidth=1.2,
                    gid="spikes",
                )
            bad = np.sort(cur.loc[cur["bad"], "x"].unique())
            if len(bad):
                n_bad += len(bad)
                mark_events(ax, bad, kw["color"])
            zeros = cur[cur["zero"]]
            if len(zeros):  # a log axis has no 0: say where the gradient was exactly 0 instead of a silent gap
                n_zero += len(zeros)
                if "all_rejected" in zeros.columns:
                    zero_rejected += int((zeros["all_rejected"].fillna(0) > 0).sum())
                xs = np.sort(zeros["x"].unique())
                ax.plot(
                    xs,
                    np.full(len(xs), 0.035),
                    linestyle="none",
                    marker="v",
                    markersize=4,
                    markerfacecolor="none",
                    markeredgewidth=1.0,
                    color=kw["color"],
                    transform=ax.get_xaxis_transform(),
                    clip_on=False,
                    gid="zeros",
                )
        ax.set_yscale("log")
    # Headroom for the marks on the edges, from each panel's limits before any is widened: the panels
    # share y, and widening them one after another from the limits the last one left compounded
    # (9 panels stretched the axis down to 1e-7 and squashed the data into its top third).
    limits = [grid.ax(f, 0).get_ylim() for f in range(len(fs))]
    for f, (lo, hi) in enumerate(limits):
        if (n_bad or n_zero) and np.isfinite(hi) and hi > 0 and lo > 0:
            grid.ax(f, 0).set_ylim(lo / (hi / lo) ** (0.12 if n_zero else 0), hi * (hi / lo) ** (0.12 if n_bad else 0))
    grid.label(
        step_label(style),
        [
            style_label(
                style, r"gradient norm $\|\nabla_\theta L\|_2$ before clipping", r"$\|\nabla_\theta L\|_2$ (unclipped)"
            )
        ],
        fs,
    )
    extra = []
    if n_spikes:
        extra.append(
            (
                Line2D(
                    [], [], linestyle="none", marker="o", markerfacecolor="none", markeredgecolor="0.25", markersize=5
                ),
                f"spike (> {SPIKE_FACTOR:g}× trailing median)",
            )
        )
    if n_bad:
        extra.append(
            (
                Line2D([], [], linestyle="none", marker="|", color="0.25", markersize=6, markeredgewidth=1.2),
                "NaN/inf gradient (top edge)",
            )
        )
    if n_zero:
        why = (
            "every token rejected"
            if zero_rejected == n_zero
            else ("every token rejected or no signal" if zero_rejected else "no signal in the batch")
        )
        extra.append(
            (
                Line2D([], [], linestyle="none", marker="v", markerfacecolor="none", color="0.25", markersize=4),
                f"gradient exactly 0 ({why}; bottom edge)",
            )
        )
    extra += [zero_grad.handle()] if shaded else []
    handles, labels = legend_for(names, extra=extra)
    low, high = seed_counts(frame, fs)
    note = f"median over {seeds_text(low, high)}, shaded: min–max" if high > 1 else ""
    return grid.finish(TITLES["grad-norm"], ds, handles, labels, join_notes(note, fs.note))


# ----------------------------------------------------------------------------------------- stability
def stability_figure(ds: Dataset, style: str = "default"):
    with st.using(style):
        return _stability(ds, style)


def _stability(ds: Dataset, style: str):
    per = per_job(ds)
    fs = facets(ds, ds.metrics, exclude=("mismatch.staleness", "staleness"), limit=Grid.capacity(style, 2))
    names = ordered(per["correction"].unique())
    ks = sorted(per["staleness"].unique())
    # A numeric axis (k = 0, 2, 8 are not evenly spaced); the corrections' points sit side by side
    # around each k, a few percent of the axis apart, so that equal values do not hide each other.
    span = float(ks[-1] - ks[0]) or 1.0
    offsets = {n: (i - (len(names) - 1) / 2) * 0.025 * span for i, n in enumerate(names)}
    grid = Grid(len(fs), 2, style, sharex=True)
    for f, name, cur, lk in facet_arms(per, fs, names):
        for m, metric in enumerate(("nonfinite", "collapsed")):
            ax = grid.ax(f, m)
            stats = cur.groupby("staleness")[metric].agg(["mean", "min", "max", "count"]).reset_index()
            stats = stats.dropna(subset=["mean"])
            if stats.empty:
                continue
            xs = stats["staleness"].to_numpy(dtype=float) + offsets[name]
            ax.plot(
                xs,
                stats["mean"],
                color=lk.color,
                linestyle=lk.linestyle,
                marker=lk.marker,
                markersize=3.2 if style == "paper" else 4.5,
                label=name,
                gid="series",
            )
            if metric == "nonfinite" and stats["count"].max() > 1:
                ax.vlines(xs, stats["min"], stats["max"], color=lk.color, linewidth=1.0, alpha=0.6, gid="range")
    from matplotlib.ticker import FixedLocator

    for f in range(len(fs)):
        for m in range(2):
            ax = grid.ax(f, m)
            ax.xaxis.set_major_locator(FixedLocator([float(k) for k in ks]))
            ax.set_xticklabels([fmt_value(k) for k in ks])
            ax.set_xlim(ks[0] - 0.08 * span, ks[-1] + 0.08 * span)
    for m, nothing in enumerate(("no NaN/inf update in any run", "no run collapsed")):
        axes = grid.metric_axes(m)  # fractions: [0, 1], the points at 0 drawn over the axis
        floor_at_zero(axes, top_if_zero=1.05, zero_note=nothing)
        for ax in axes:
            ax.set_ylim(0, 1.05)
    low, high = seed_counts(per, fs, by=("staleness",))
    grid.label(
        style_label(style, r"staleness $k$ (optimizer steps behind)", r"staleness $k$ (steps)"),
        [
            style_label(style, "updates with NaN/inf loss or grad (fraction)", "NaN/inf (frac.)"),
            style_label(style, f"collapse rate (fraction of {seeds_text(low, high)})", "collapsed (frac.)"),
        ],
        fs,
    )
    handles, labels = legend_for(names, marker=True)
    note = (
        f"mean over {seeds_text(low, high)}, bars: min–max" if high > 1 else ("one seed per point" if high == 1 else "")
    )
    return grid.finish(
        TITLES["stability"],
        ds,
        handles,
        labels,
        join_notes(note, never_learned_note(per), fs.note, zero_grad.note(ds.metrics, ("correction", "staleness"))),
    )


# ----------------------------------------------------------------------------------------- masking
def masking_figure(ds: Dataset, style: str = "default"):
    with st.using(style):
        return _masking(ds, style)


def _masking(ds: Dataset, style: str):
    df = update_rows(ds.metrics)  # the final row (J only) is no update
    metrics = ("token_masked_fraction", "clamped_fraction", "ess")
    ylabels = (
        ("masked tokens (fraction)", "clamped tokens (fraction)", "ESS (fraction of tokens)")
        if style != "paper"
        else ("masked (frac.)", "clamped (frac.)", "ESS (frac.)")
    )
    # The ESS of NaN/inf weights is undefined, not 0 (the metric writes 0): a gap and a mark.
    weights_ok = np.isfinite(df["is_weight_mean"].astype(float)) if "is_weight_mean" in df.columns else True
    frame = df.assign(
        ess=df["ess"].where(weights_ok), _undefined=~weights_ok if "is_weight_mean" in df.columns else False
    )
    extra_cols = {"seed": ("seed", "first")} if "seed" in df.columns else {}
    per = (
        frame.groupby(["job", "step"], sort=False)
        .agg(
            correction=("correction", "first"),
            undefined=("_undefined", "all"),
            **extra_cols,
            **{m: (m, "mean") for m in metrics},
        )
        .reset_index()
    )
    # Size follows content: a fraction that is 0 in every run is said once, not drawn as flat panels.
    flat = [m for m in metrics[:2] if per[m].fillna(0).eq(0).all()]
    metrics = tuple(m for m in metrics if m not in flat)
    ylabels = tuple(
        lab for m, lab in zip(("token_masked_fraction", "clamped_fraction", "ess"), ylabels) if m in metrics
    )
    fs = facets(ds, df, limit=None)
    fs = drop_flat(fs, *_flat_masking(per, fs, metrics))
    fs = keep_differing(fs, arm_spread(per, fs, metrics), Grid.capacity(style, len(metrics)))
    names = ordered(per["correction"].unique())
    grid = Grid(len(fs), len(metrics), style, row_height=(1.2 if style == "paper" else None))
    bands = facet_bands(per, fs, "step", metrics)
    undefined = per[per["undefined"].astype(bool)]
    flagged = ordered(undefined["correction"].unique())
    for f, facet in enumerate(fs):
        und_f = undefined[undefined["job"].isin(facet.jobs)]
        for name in names:
            stats = bands.get((f, name))
            if stats is None:
                continue
            kw = line_kwargs(name)
            for m, metric in enumerate(metrics):
                ax = grid.ax(f, m)
                _mean_and_band(ax, stats, metric, kw, alpha=0.15)
            steps = np.sort(und_f.loc[und_f["correction"] == name, "step"].unique())
            if len(steps):
                _event_marks(grid.ax(f, len(metrics) - 1), steps, flagged.index(name), kw["color"])
    for m, metric in enumerate(metrics):
        axes = grid.metric_axes(m)
        floor_at_zero(axes, top_if_zero=1.0, ceiling=1.03)
        if metric == "ess" and flagged:
            _room_for_marks(axes, len(flagged), low=0.0)
            for ax in axes:
                lo, hi = ax.get_ylim()
                ax.set_ylim(lo, min(max(hi, 1.0), 1.03))
                hide_negative_ticks(ax)
    grid.label(step_label(style), list(ylabels), fs)
    extra = [_event_handle("ESS undefined: NaN/inf weights (marks under the data)")] if flagged else []
    handles, labels = legend_for(names, extra=extra)
    words = {"token_masked_fraction": "masked", "clamped_fraction": "clamped"}
    gone = (
        (f"no token {' or '.join(words[m] for m in flat)} in any run (panel{'s' if len(flat) > 1 else ''} left out)")
        if flat
        else ""
    )
    return grid.finish(TITLES["masking"], ds, handles, labels, join_notes(seed_note(per, fs), gone, fs.note))


FLAT_FRACTION = (
    0.02  # of a [0, 1] axis: a masked or clamped fraction this small, or an ESS this close to 1, reads as flat
)


def _flat_masking(per, fs: Sequence[Facet], metrics: Sequence[str]) -> tuple[list[bool], str]:
    """Which facets show nothing (every correction's mean line: masked and clamped fractions at most
    FLAT_FRACTION, ESS at least 1 − FLAT_FRACTION, no undefined ESS), and the note's words for them."""
    facet_of = {j: i for i, fc in enumerate(fs) for j in fc.jobs}
    framed = per.assign(_facet=per["job"].map(facet_of))
    means = framed.groupby(["_facet", "correction", "step"])[list(metrics)].mean().groupby(level="_facet")
    worst = {m: (means[m].min() if m == "ess" else means[m].max()) for m in metrics}
    undefined = framed.groupby("_facet")["undefined"].any()
    flat = []
    for f in range(len(fs)):
        ok = not bool(undefined.get(f, False))
        for m in metrics:
            v = float(worst[m].get(f, np.nan))
            ok = ok and np.isfinite(v) and (v >= 1 - FLAT_FRACTION if m == "ess" else v <= FLAT_FRACTION)
        flat.append(ok)
    words = {"token_masked_fraction": "masked", "clamped_fraction": "clamped"}
    parts = []
    for m in (m for m in metrics if m in words and any(flat)):
        top = max(float(worst[m].get(f)) for f in range(len(fs)) if flat[f])
        parts.append(f"nothing {words[m]}" if top == 0 else f"{words[m]} ≤ {percent_text(top)}")
    if "ess" in metrics and any(flat):
        parts.append(f"ESS ≥ {min(float(worst['ess'].get(f)) for f in range(len(fs)) if flat[f]):.3g}")
    return flat, "flat (" + ", ".join(parts) + " in every step)"
