"""The figures of probe runs: presets (bias, variance and relative MSE per preset at one band),
threshold (the same against the band's upper threshold) and bias-split (the direction and size of
each preset's bias against the response length T, a probe sweep over rollout.seq_len).

About 560 lines on purpose: the three kinds share the probe's frame, its bands and its error bars.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from analysis import style as st
from analysis.figures.collapse import LENGTH_KEYS
from analysis.figures.facets import facets, seed_count
from analysis.figures.layout import (
    TITLES,
    Grid,
    as_float,
    facet_arms,
    finish,
    floor_at_zero,
    join_notes,
    legend_for,
    new_figure,
    ordered,
    seeds_text,
    style_label,
)
from analysis.load import Dataset, fmt_value
from analysis.tables import DEGENERATE_RULE, probe_frame

# ----------------------------------------------------------------------------------------- probe
PROBE_YLABELS = {
    "bias_norm": (r"bias $\|\mathbb{E}\,\hat g - \nabla J\|_2$", r"bias $\|\mathbb{E}\hat g - \nabla J\|$"),
    "variance": (r"variance $\mathrm{tr}\,\mathrm{Cov}(\hat g)$", r"variance $\mathrm{tr\,Cov}(\hat g)$"),
    "rel_mse": (r"relative MSE $\mathbb{E}\,\|\hat g - \nabla J\|^2 / \|\nabla J\|^2$", r"MSE$\,/\,\|\nabla J\|^2$"),
    "mse": (r"MSE $\mathbb{E}\,\|\hat g - \nabla J\|_2^2$", r"MSE $\mathbb{E}\|\hat g - \nabla J\|^2$"),
}
ZERO_LINE_LABEL = "relative MSE 1: that of a zero update (ĝ = 0)"


def _probe_metrics(pr) -> list[str]:
    mse = "rel_mse" if "rel_mse" in pr.columns and pr["rel_mse"].notna().any() else "mse"
    return [m for m in ("bias_norm", "variance", mse) if m in pr.columns]


def _nonfinite_tags(pr, labels: list[str]) -> list[str]:
    """A NaN/inf estimate leaves gaps: say so where the name is."""
    if "nonfinite_rate" not in pr.columns:
        return labels
    worst = pr.groupby("preset")["nonfinite_rate"].max()

    def tag(lab):
        w = float(worst.get(lab, 0) or 0)
        if w >= 1:
            return f"{lab} (NaN/inf in every batch: not drawn)"
        return f"{lab} (NaN/inf in up to {100 * w:.2g}% of batches)" if w > 0 else lab

    return [tag(lab) for lab in labels]


def _ci_note(pr) -> str:
    """'95% CI of the bias' (the probe's ci_level)."""
    level = pr["ci_level"].iloc[0] if "ci_level" in pr.columns else None
    if "bias_norm_ci" in pr.columns or "bias_norm_lo" in pr.columns:
        return f"{fmt_value(float(level) * 100) + '% ' if level is not None else ''}CI of the bias"
    return ""


def threshold_figure(ds: Dataset, style: str = "default"):
    with st.using(style):
        return _threshold(ds, style)


def _threshold(ds: Dataset, style: str):
    from matplotlib.lines import Line2D

    pr = probe_frame(ds)
    pr = pr[np.isfinite(pr["high"].astype(float))].copy()
    metrics = _probe_metrics(pr)
    exclude = ("probe.bands", "correction.high", "correction.low", "correction")
    fs = facets(ds, pr, exclude=exclude, limit=Grid.capacity(style, len(metrics)))
    names = ordered(pr["preset"].unique())
    multi = pr.groupby("preset")["high"].nunique()
    grid = Grid(len(fs), len(metrics), style)
    n_degenerate = n_starred = 0
    for f, name, cur, lk in facet_arms(pr, fs, names, arm="preset"):
        agg = dict.fromkeys(metrics, "mean")
        agg["degenerate"] = "max"
        for c in ("bias_norm_ci", "bias_norm_lo", "bias_norm_hi"):
            if c in cur.columns:
                cur = cur.assign(**{c: cur[c].apply(as_float)})
                agg[c] = "mean"
        stats = cur.groupby("high").agg(agg).reset_index().sort_values("high")
        degenerate = stats["degenerate"].astype(bool)
        for m, metric in enumerate(metrics):
            ax = grid.ax(f, m)
            ax.plot(
                stats["high"],
                stats[metric],
                color=lk.color,
                linestyle=lk.linestyle,
                marker=lk.marker,
                markersize=3.5,
                label=name,
                gid="series",
            )
            if degenerate.any():  # hollow: this arm barely updates
                ax.plot(
                    stats.loc[degenerate, "high"],
                    stats.loc[degenerate, metric],
                    linestyle="none",
                    marker=lk.marker,
                    markersize=6,
                    markerfacecolor="white",
                    markeredgecolor=lk.color,
                    markeredgewidth=1.1,
                    gid="degenerate",
                    zorder=4,
                )
            if metric == "bias_norm" and len(stats) > 1:
                lo, hi = _ci(stats)
                if lo is not None:
                    ax.fill_between(stats["high"], lo, hi, color=lk.color, alpha=0.12, linewidth=0, gid="ci")
            if metric in ("rel_mse", "mse") and multi.get(name, 0) > 1:
                ok = stats[~degenerate & stats[metric].notna()]
                if len(ok):
                    best = ok.loc[ok[metric].idxmin()]
                    n_starred += 1
                    ax.plot(
                        [best["high"]],
                        [best[metric]],
                        linestyle="none",
                        marker="*",
                        markersize=10,
                        markerfacecolor=lk.color,
                        markeredgecolor="black",
                        markeredgewidth=0.6,
                        gid="best",
                        zorder=5,
                    )
        n_degenerate += int(degenerate.sum())
    highs = pr["high"].astype(float)
    log_x = (highs > 0).all() and highs.max() / max(highs.min(), 1e-300) >= 8
    values = sorted(highs.unique())
    # The band's lower threshold, where it changes with the upper one ([0.8, 1.25], [0.5, 2]): each
    # tick names both, the lower beneath in brackets (a band sits at its upper threshold).
    lows = pr.assign(_low=pr["low"].apply(as_float) if "low" in pr.columns else np.nan).groupby("high")["_low"]
    lower = {h: sorted({v for v in g if np.isfinite(v)}) for h, g in lows}
    both = len({v for vs in lower.values() for v in vs}) > 1 and len(values) <= (4 if style == "paper" else 6)
    for m, metric in enumerate(metrics):
        vals = pr[metric].astype(float)
        vals = vals[np.isfinite(vals)]
        log_y = len(vals) and (vals > 0).all() and vals.max() / vals.min() >= 20
        for f in range(len(fs)):
            ax = grid.ax(f, m)
            if log_x:
                ax.set_xscale("log")
                _threshold_ticks(ax, values, style)
            if both:
                _band_ticks(ax, values, lower)
            if log_y:
                ax.set_yscale("log")
            if metric == "rel_mse":
                ax.axhline(1.0, color="0.45", linestyle=":", linewidth=0.9, gid="reference", zorder=1)
        if not log_y:
            floor_at_zero(grid.metric_axes(m))
    xlabel = style_label(style, r"upper threshold $\rho_{\max}$ of the band (high)", r"upper threshold $\rho_{\max}$")
    if both:
        xlabel = style_label(
            style, r"band: upper threshold $\rho_{\max}$ (lower $\rho_{\min}$)", r"band: $\rho_{\max}$ ($\rho_{\min}$)"
        )
    grid.label(xlabel, [PROBE_YLABELS[m][style == "paper"] for m in metrics], fs)
    extra = []
    if n_starred:
        extra.append(
            (
                Line2D(
                    [],
                    [],
                    linestyle="none",
                    marker="*",
                    markersize=9,
                    markerfacecolor="0.6",
                    markeredgecolor="black",
                    markeredgewidth=0.6,
                ),
                "lowest MSE of the preset (non-degenerate)",
            )
        )
    if n_degenerate:
        extra.append(
            (
                Line2D(
                    [], [], linestyle="none", marker="o", markersize=6, markerfacecolor="white", markeredgecolor="0.3"
                ),
                DEGENERATE_RULE + " (never starred)",
            )
        )
    if "rel_mse" in metrics:
        extra.append((Line2D([], [], color="0.45", linestyle=":"), ZERO_LINE_LABEL))
    handles, labels = legend_for(names, marker=True, extra=extra)
    labels = _nonfinite_tags(pr, labels)
    ci = _ci_note(pr)
    return grid.finish(TITLES["threshold"], ds, handles, labels, join_notes(f"shaded: {ci}" if ci else "", fs.note))


def _threshold_ticks(ax, values: Sequence[float], style: str) -> None:
    """The probed thresholds as plain numbers (1.25, 2, 10, not 2×10⁰): all of them when few, else
    the decades."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator

    if len(values) <= (4 if style == "paper" else 6):
        ax.xaxis.set_major_locator(FixedLocator(list(values)))
        ax.xaxis.set_minor_locator(NullLocator())
    else:
        ax.xaxis.set_major_locator(LogLocator(base=10))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, pos: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _band_ticks(ax, values: Sequence[float], lower: dict) -> None:
    """A tick at each band's upper threshold, labelled with both thresholds: '1.25\n(0.8)'."""
    from matplotlib.ticker import FixedLocator, NullLocator

    ax.xaxis.set_major_locator(FixedLocator(list(values)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels(
        [
            f"{v:g}\n(" + ", ".join(f"{lo:g}" for lo in lower.get(v, [])) + ")" if lower.get(v) else f"{v:g}"
            for v in values
        ]
    )


def _ci(stats):
    """The bias CI as (low, high) arrays: bias_norm_lo/hi when the probe wrote them, else ± bias_norm_ci."""
    y = stats["bias_norm"].to_numpy(dtype=float)
    if {"bias_norm_lo", "bias_norm_hi"} <= set(stats.columns):
        lo, hi = stats["bias_norm_lo"].to_numpy(dtype=float), stats["bias_norm_hi"].to_numpy(dtype=float)
    elif "bias_norm_ci" in stats.columns:
        ci = stats["bias_norm_ci"].to_numpy(dtype=float)
        lo, hi = y - ci, y + ci
    else:
        return None, None
    if not np.isfinite(lo).any():
        return None, None
    floor = np.nanmin(y[y > 0]) * 0.1 if (y > 0).any() else 1e-12
    return np.clip(lo, floor, None), hi


def presets_figure(ds: Dataset, style: str = "default"):
    with st.using(style):
        return _presets(ds, style)


def _band_text(low, high) -> str:
    def one(v):
        v = as_float(v)
        return "—" if math.isnan(v) else f"{v:g}"

    return f"[{one(low)}, {one(high)}]"


def _presets(ds: Dataset, style: str):
    """One band per preset (the default probe): a row per preset, bias with its CI, variance and
    relative MSE side by side; degenerate arms hollow and named; a facet per other swept key."""
    from matplotlib.lines import Line2D

    paper = style == "paper"
    pr = probe_frame(ds)
    metrics = _probe_metrics(pr)
    exclude = ("probe.bands", "correction.high", "correction.low", "correction", "probe.presets")
    fs = facets(ds, pr, exclude=exclude, limit=st.PAPER_MAX_ROWS if paper else 4)
    names = ordered(pr["preset"].unique())
    bands = pr.drop_duplicates("preset").set_index("preset")
    rows = [
        f"{n} {_band_text(bands.loc[n, 'low'], bands.loc[n, 'high'])}" if {"low", "high"} <= set(pr.columns) else n
        for n in names
    ]
    n = len(names)
    row_in = 0.13 if paper else 0.2
    panel_h = max(n * row_in + 0.25, 1.2)
    width = st.PAPER_DOUBLE_WIDTH if paper else 3.2 * len(metrics) + 2.4
    fig = new_figure((width, panel_h * len(fs)), style)
    axes = fig.subplots(len(fs), len(metrics), squeeze=False, sharey=True)
    y = np.arange(n)[::-1]
    n_degenerate = 0
    for f, facet in enumerate(fs):
        sub = pr[pr["job"].isin(facet.jobs)].set_index("preset")
        for m, metric in enumerate(metrics):
            ax = axes[f][m]
            if f:
                ax.sharex(axes[0][m])
            for i, name in enumerate(names):
                if name not in sub.index:
                    continue
                r = sub.loc[name]
                lk = st.look(name)
                value = as_float(r[metric])
                degenerate = bool(r.get("degenerate", 0))
                if metric == "bias_norm":
                    lo, hi = as_float(r.get("bias_norm_lo")), as_float(r.get("bias_norm_hi"))
                    if math.isfinite(lo) and math.isfinite(hi):
                        ax.plot([lo, hi], [y[i], y[i]], color=lk.color, linewidth=1.4, solid_capstyle="butt", gid="ci")
                ax.plot(
                    [value],
                    [y[i]],
                    linestyle="none",
                    marker=lk.marker,
                    markersize=4.5 if paper else 6,
                    color=lk.color,
                    markerfacecolor="white" if degenerate else lk.color,
                    markeredgewidth=1.1,
                    label=name,
                    gid="series",
                )
                if not math.isfinite(value):
                    ax.text(
                        0.02,
                        y[i],
                        "NaN/inf in every batch",
                        transform=ax.get_yaxis_transform(),
                        va="center",
                        fontsize="x-small",
                        color="0.35",
                        gid="note",
                    )
                if degenerate and m == len(metrics) - 1:
                    n_degenerate += 1
                    why = (
                        f"{as_float(r.get('mean_masked_fraction')):.0%} masked"
                        if as_float(r.get("mean_masked_fraction")) >= 0.9
                        else "‖E ĝ‖ ≈ 0"
                    )
                    ax.annotate(
                        f" degenerate ({why})",
                        (value, y[i]),
                        xytext=(4, 0),
                        textcoords="offset points",
                        va="center",
                        fontsize="x-small",
                        color="0.3",
                        gid="note",
                    )
            if metric == "rel_mse":
                ax.axvline(1.0, color="0.45", linestyle=":", linewidth=0.9, gid="reference", zorder=1)
            vals = pr[metric].astype(float)
            vals = vals[np.isfinite(vals)]
            if len(vals) and (vals > 0).all() and vals.max() / vals.min() >= 30:
                ax.set_xscale("log")
            else:
                ax.set_xlim(left=0)
            if m == 0:  # the axes share y: one call labels them all
                ax.set_yticks(y, rows)
            else:
                ax.tick_params(labelleft=False)
            ax.set_ylim(-0.7, n - 0.3)
            ax.grid(axis="y", alpha=0.15)
            if f == len(fs) - 1:
                ax.set_xlabel(PROBE_YLABELS[metric][paper])
            else:
                ax.tick_params(labelbottom=False)
            if len(fs) > 1 and m == 0:
                ax.set_title(fs[f].title(style), loc="left", fontsize="medium")
        for ax in axes[f]:
            ax.tick_params(axis="y", length=0)
    for f in range(len(fs)):
        for tick, name in zip(axes[f][0].get_yticklabels(), names):
            tick.set_color(st.look(name).color if st.look(name).color != "#000000" else "black")
    extra = []
    if n_degenerate:
        extra.append(
            (
                Line2D(
                    [], [], linestyle="none", marker="o", markersize=5, markerfacecolor="white", markeredgecolor="0.3"
                ),
                DEGENERATE_RULE,
            )
        )
    if "rel_mse" in metrics:
        extra.append((Line2D([], [], color="0.45", linestyle=":"), ZERO_LINE_LABEL))
    if "bias_norm_lo" in pr.columns:
        extra.append((Line2D([], [], color="0.45", linewidth=1.4), _ci_note(pr)))
    handles = [h for h, _ in extra]
    labels = [lab for _, lab in extra]
    note = join_notes(_nonfinite_note(pr), fs.note)
    finish(fig, TITLES["presets"], ds, handles, labels, paper, note, legend_below=True)
    return fig


def _nonfinite_note(pr) -> str:
    if "nonfinite_rate" not in pr.columns:
        return ""
    rate = pr.groupby("preset")["nonfinite_rate"].max()
    bad = rate[rate > 0]
    if bad.empty:
        return ""
    return "NaN/inf estimates left out: " + ", ".join(f"{n} {100 * float(r):.2g}%" for n, r in bad.items())


PROBE_BAND_KEYS = ("probe.bands", "probe.presets", "correction.high", "correction.low", "correction")


def _integer_ticks(ax, values: Sequence[float], style: str) -> None:
    """Response lengths on a log-2 axis, labelled as plain numbers (2, 8, 64), all of them when few."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

    values = sorted(set(values))
    if len(values) > (7 if style == "paper" else 10):
        values = values[::2]
    ax.xaxis.set_major_locator(FixedLocator(values))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, pos: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


# ----------------------------------------------------------------------------------------- bias split
BIAS_SPLIT_METRICS = ("cosine", "norm_ratio", "rel_bias")
BIAS_SPLIT_YLABELS = {
    "cosine": (r"direction: $\cos(\mathbb{E}\,\hat g,\ \nabla J)$", r"$\cos(\mathbb{E}\hat g, \nabla J)$"),
    "norm_ratio": (r"size: $\|\mathbb{E}\,\hat g\|\ /\ \|\nabla J\|$", r"$\|\mathbb{E}\hat g\| / \|\nabla J\|$"),
    "rel_bias": (
        r"relative bias $\|\mathbb{E}\,\hat g - \nabla J\|\ /\ \|\nabla J\|$",
        r"$\|\mathbb{E}\hat g - \nabla J\| / \|\nabla J\|$",
    ),
}
BIAS_SPLIT_WORDS = {"cosine": "direction", "norm_ratio": "size", "rel_bias": "relative bias"}
UNBIASED = {"cosine": 1.0, "norm_ratio": 1.0, "rel_bias": 0.0}  # an unbiased estimator's value


def bias_split_figure(ds: Dataset, style: str = "default"):
    with st.using(style):
        return _bias_split(ds, style)


def _bias_split(ds: Dataset, style: str):
    from matplotlib.lines import Line2D

    paper = style == "paper"
    pr = probe_frame(ds)
    pr = pr.assign(T=pr["seq_len"].astype(float))
    metrics = [m for m in BIAS_SPLIT_METRICS if m in pr.columns]
    fs = facets(ds, pr, exclude=(*LENGTH_KEYS, *PROBE_BAND_KEYS), limit=Grid.capacity(style, len(metrics)))
    names = ordered(pr["preset"].unique())
    grid = Grid(len(fs), len(metrics), style)
    has_ci = {"bias_norm_lo", "bias_norm_hi", "exact_grad_norm"} <= set(pr.columns)
    n_degenerate = 0
    for f, name, cur, lk in facet_arms(pr, fs, names, arm="preset"):
        cols = metrics + (["bias_norm_lo", "bias_norm_hi", "exact_grad_norm"] if has_ci else [])
        cur = cur.assign(**{c: cur[c].apply(as_float) for c in cols})
        stats = cur.groupby("T").agg({**dict.fromkeys(cols, "mean"), "degenerate": "max"}).reset_index()
        degenerate = stats["degenerate"].astype(bool)
        n_degenerate += int(degenerate.sum())
        for m, metric in enumerate(metrics):
            ax = grid.ax(f, m)
            ax.plot(
                stats["T"],
                stats[metric],
                color=lk.color,
                linestyle=lk.linestyle,
                marker=lk.marker,
                markersize=3 if paper else 4,
                label=name,
                gid="series",
            )
            if degenerate.any():  # hollow: this arm barely updates at that length
                ax.plot(
                    stats.loc[degenerate, "T"],
                    stats.loc[degenerate, metric],
                    linestyle="none",
                    marker=lk.marker,
                    markersize=5.5 if paper else 7,
                    markerfacecolor="white",
                    markeredgecolor=lk.color,
                    markeredgewidth=1.1,
                    gid="degenerate",
                    zorder=4,
                )
            if metric == "rel_bias" and has_ci and len(stats) > 1:
                g = stats["exact_grad_norm"].where(stats["exact_grad_norm"] > 0)
                ax.fill_between(
                    stats["T"],
                    stats["bias_norm_lo"] / g,
                    stats["bias_norm_hi"] / g,
                    color=lk.color,
                    alpha=0.12,
                    linewidth=0,
                    gid="ci",
                )
    lengths = sorted(pr["T"].unique())
    log_x = lengths[0] > 0 and lengths[-1] / lengths[0] >= 4
    for m, metric in enumerate(metrics):
        for ax in grid.metric_axes(m):
            if log_x:
                ax.set_xscale("log", base=2)
            _integer_ticks(ax, lengths, style)
            ax.axhline(UNBIASED[metric], color="0.45", linestyle=":", linewidth=0.9, gid="reference", zorder=1)
        if metric != "cosine":
            floor_at_zero(grid.metric_axes(m))
    grid.label(
        style_label(style, r"response length $T$ (tokens)", r"response length $T$"),
        [BIAS_SPLIT_YLABELS[m][paper] for m in metrics],
        fs,
    )
    if paper and len(fs) == 1:  # the short y labels are formulas: the panel titles say what each one is
        for m, metric in enumerate(metrics):
            grid.ax(0, m).set_title(BIAS_SPLIT_WORDS[metric], fontsize="medium")
    extra = [(Line2D([], [], color="0.45", linestyle=":"), "unbiased: cosine 1, size 1, bias 0")]
    if has_ci:
        extra.append((Line2D([], [], color="0.45", linewidth=4, alpha=0.25), _ci_words(pr)))
    if n_degenerate:
        extra.append(
            (
                Line2D(
                    [], [], linestyle="none", marker="o", markersize=6, markerfacecolor="white", markeredgecolor="0.3"
                ),
                DEGENERATE_RULE,
            )
        )
    handles, labels = legend_for(names, marker=True, extra=extra)
    low, high = seed_count(
        pr.assign(_f=pr["job"].map({j: i for i, fc in enumerate(fs) for j in fc.jobs})), ("_f", "preset", "T")
    )
    seeds = f"mean over {seeds_text(low, high)}" if high > 1 else ""
    return grid.finish(TITLES["bias-split"], ds, handles, labels, join_notes(_reference_note(ds, pr), seeds, fs.note))


def _ci_words(pr) -> str:
    level = pr["ci_level"].iloc[0] if "ci_level" in pr.columns else None
    pct = f"{fmt_value(float(level) * 100)}% " if level is not None and level == level else ""
    return f"{pct}CI of the relative bias"


def _reference_note(ds: Dataset, pr) -> str:
    """Which ∇J the figures compare with: exact, or a Monte Carlo reference (with its own error, as a
    fraction of its norm, which the probe adds to the bias CI)."""
    if "reference" not in pr.columns or not (pr["reference"].astype(str) == "monte-carlo").any():
        return "∇J exact"
    mc = pr[pr["reference"].astype(str) == "monte-carlo"]
    rel = (mc["reference_noise"].astype(float) / mc["exact_grad_norm"].astype(float)).replace([np.inf], np.nan)
    rollouts = {ds.jobs[0].value("probe.reference_rollouts")} if ds.jobs else {None}
    n = next(iter(rollouts))
    how = f"{int(n):,} on-policy rollouts" if isinstance(n, (int, float)) else "on-policy rollouts"
    noise = (
        (
            f"its own error ≈ {_percent(rel.min())}–{_percent(rel.max())} of its norm"
            if rel.nunique() > 1
            else f"its own error ≈ {_percent(rel.iloc[0])} of its norm"
        )
        if rel.notna().any()
        else ""
    )
    return f"∇J: a Monte Carlo reference ({how}; {noise}, in the CI), not exact"


def _percent(fraction: float) -> str:
    """0.034 -> '3.4%', 1.04 -> '104%'."""
    pct = 100 * float(fraction)
    return f"{pct:.2g}%" if pct < 10 else f"{pct:.0f}%"
