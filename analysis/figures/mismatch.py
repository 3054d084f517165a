"""The figures of the engines' mismatch: mismatch (tokens.csv: the log-ratios' histogram, p_rollout
against p_train, |Δp| by p) and mismatch-over-training (kl_k3, χ² per token, max|Δp| and the
entropy against step, a line per engine precision: the analogue of Qi et al. 2025, Fig. 3).

About 520 lines on purpose: both kinds draw the mismatch per engine precision, with one colour and axis
scheme.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from analysis import style as st
from analysis.figures.facets import SEED_KEYS, arm_spread, facets, keep_differing, keep_distinct, seed_count
from analysis.figures.layout import (
    TITLES,
    Grid,
    finish_kind,
    floor_at_zero,
    join_notes,
    label_rows,
    rows_grid,
    seeds_text,
    step_label,
    style_label,
)
from analysis.load import Dataset, fmt_value
from analysis.tables import update_rows

MAX_GROUPS = 6
MAX_SCATTER = 4000
OUTLIER_NATS = 50.0  # |log-ratio| beyond this is a fault (e.g. an injected −1000 nats), not precision


# ----------------------------------------------------------------------------------------- mismatch
def mismatch_figure(ds: Dataset, style: str = "default"):
    with st.using(style):
        return _mismatch(ds, style)


def _token_groups(ds: Dataset, tokens) -> tuple[str | None, list]:
    """Split tokens by the swept key that changes the engine (precision first), else one group."""
    prefer = [
        "mismatch.precision",
        "mismatch",
        "precision",
        "mismatch.logit_noise",
        "mismatch.staleness",
        "mismatch.outlier_rate",
    ]
    keys = [k for k in prefer if k in ds.swept and k in tokens.columns]
    keys += [k for k in ds.swept if k not in keys and k not in SEED_KEYS and k in tokens.columns]
    if not keys:
        return None, [("all tokens", None, tokens)]
    key = keys[0]
    groups = [(f"{key}={fmt_value(v)}", v, g) for v, g in tokens.groupby(key, sort=True)]
    return key, groups[:MAX_GROUPS]


def _mismatch(ds: Dataset, style: str):
    from matplotlib.lines import Line2D

    tok = ds.tokens
    old = tok["old"].to_numpy(dtype=float)
    roll = tok["roll"].to_numpy(dtype=float)
    ok = np.isfinite(old) & np.isfinite(roll)
    tok = tok[ok]
    key, groups = _token_groups(ds, tok)
    colors = st.dimension_colors(key or "", [v for _, v, _ in groups]) if key else {None: "#0072B2"}
    paper = style == "paper"
    grid = Grid(1, 3, style, row_height=1.8 if paper else 3.1, sharex=False, sharey=False)
    ax_h, ax_s, ax_b = grid.ax(0, 0), grid.ax(0, 1), grid.ax(0, 2)
    lr_all = np.abs((tok["old"] - tok["roll"]).to_numpy(dtype=float))
    core = lr_all[lr_all <= OUTLIER_NATS]
    q = np.quantile(core, 0.999) if len(core) else 0.0
    R = float(q) * 1.1 if q > 0 else 1e-6
    # Precision alone moves log-probs by ~1e-3 nats, staleness by whole nats: when both are present a
    # linear axis hides the first in one bin, so the axis turns symlog (linear within ±c).
    nonzero = core[core > 0]
    c = float(np.quantile(nonzero, 0.25)) if len(nonzero) else R
    symlog = len(nonzero) > 0 and R / max(c, 1e-12) > 100
    if symlog:
        c = max(c, R * 1e-6)
        t = np.linspace(-1, 1, 49) * np.log10(1 + R / c)
        edges = np.sign(t) * c * (10 ** np.abs(t) - 1)
    else:
        edges = np.linspace(-R, R, 49)
    floor = 1e-8
    handles, labels = [], []
    rng = np.random.default_rng(0)
    beyond_total = outliers_total = 0
    tails = []
    pt_min = 1.0
    for _gi, (label, value, g) in enumerate(groups):
        color = colors[value]
        lr = (g["old"] - g["roll"]).to_numpy(dtype=float)
        below, above = lr < -R, lr > R
        beyond_total += int(below.sum() + above.sum())
        outliers_total += int((np.abs(lr) > OUTLIER_NATS).sum())
        counts, _ = np.histogram(lr[~(below | above)], bins=edges)
        ax_h.stairs(
            np.where(counts > 0, counts, np.nan),
            edges,
            color=color,
            linewidth=1.2,
            gid="series",
            label=label,
            baseline=None,
        )
        # The tails: an overflow bin at each end, from the last bin to the axis's edge, at the count of
        # the tokens beyond it (dotted, so it does not read as one more bin of the same width).
        tails.append((color, int(below.sum()), int(above.sum())))
        p_t, p_r = np.exp(g["old"].to_numpy(dtype=float)), np.exp(g["roll"].to_numpy(dtype=float))
        pt_min = min(pt_min, float(np.min(p_t)) if len(p_t) else 1.0)
        idx = np.arange(len(g))
        if len(idx) > MAX_SCATTER:
            idx = rng.choice(idx, MAX_SCATTER, replace=False)
        ax_s.scatter(
            np.clip(p_t[idx], floor, 1),
            np.clip(p_r[idx], floor, 1),
            s=4 if not paper else 2,
            alpha=0.35,
            color=color,
            linewidths=0,
            gid="series",
            rasterized=True,
            label=label,
        )
        dp = np.abs(p_t - p_r)
        lo = max(float(np.min(p_t[p_t > 0])) if (p_t > 0).any() else 1e-6, 1e-6)
        bins = np.geomspace(lo, 1.0, 13)
        which = np.clip(np.digitize(p_t, bins) - 1, 0, len(bins) - 2)
        centers, median, p90 = [], [], []
        for b in range(len(bins) - 1):
            sel = dp[which == b]
            if len(sel):
                centers.append(math.sqrt(bins[b] * bins[b + 1]))
                median.append(float(np.median(sel)))
                p90.append(float(np.quantile(sel, 0.9)))
        ax_b.plot(centers, median, color=color, marker="o", markersize=3.5, gid="series", label=label)
        ax_b.plot(centers, p90, color=color, linestyle=":", linewidth=1.0, gid="p90")
        handles.append(Line2D([], [], color=color, marker="o", markersize=3.5))
        labels.append(f"{label} ({len(g):,} tokens)")
    ax_h.set_yscale("log")
    edge = R * (2.5 if symlog else 1.25) if beyond_total else R
    if symlog:
        ax_h.set_xscale("symlog", linthresh=c, linscale=0.5)
        from matplotlib.ticker import FixedLocator

        panel_in = (grid.fig.get_figwidth() - getattr(grid.fig, "_is_study_legend_room", 0.0)) / 3 - 0.6
        decades = symlog_decades(c, R, edge, panel_in, paper)
        ax_h.xaxis.set_major_locator(FixedLocator([*(-decades[::-1]), 0.0, *decades]))
        ax_h.minorticks_off()
    for color, n_below, n_above in tails:
        for n_side, span in ((n_below, [-edge, -R]), (n_above, [R, edge])):
            if n_side:
                ax_h.stairs([n_side], span, color=color, linewidth=2.0, linestyle=":", gid="tails", baseline=None)
    ax_h.set_xlim(-edge, edge)
    if beyond_total:
        text = f"dotted end bins: beyond ±{R:.2g} nats,\n{beyond_total:,} token(s)"
        if outliers_total:
            text += f", {outliers_total:,} of them\ninjected outliers (|lr| > {OUTLIER_NATS:g} nats)"
        ax_h.text(
            0.03,
            0.97,
            text,
            transform=ax_h.transAxes,
            va="top",
            ha="left",
            fontsize="x-small",
            color="0.3",
            zorder=6,
            gid="note",
            bbox=dict(facecolor="white", edgecolor="none", alpha=0.85, pad=1.5),
        )
        lo, hi = ax_h.get_ylim()  # headroom on the log axis: the note sits above the histogram, not on it
        if lo > 0 and hi > lo:
            ax_h.set_ylim(lo, hi * (hi / lo) ** (0.12 * (text.count("\n") + 1)))
    lo = max(min(pt_min, 1.0) * 0.5, floor)
    ax_s.set_xscale("log")
    ax_s.set_yscale("log")
    ax_s.plot([floor, 1], [floor, 1], color="0.4", linestyle="--", linewidth=0.8, gid="diagonal")
    ax_s.set_xlim(lo, 1.5)
    clipped = int((tok["roll"] < math.log(floor)).sum())
    ax_s.set_ylim(floor * 0.5 if (tok["roll"] < math.log(lo)).any() else lo, 1.5)
    if clipped:
        ax_s.text(
            0.97,
            0.03,
            f"{clipped:,} token(s) with $p_{{\\mathrm{{rollout}}}} < 10^{{-8}}$\ndrawn at $10^{{-8}}$",
            transform=ax_s.transAxes,
            va="bottom",
            ha="right",
            fontsize="x-small",
            color="0.3",
            zorder=6,
            gid="note",
            bbox=dict(facecolor="white", edgecolor="none", alpha=0.85, pad=1.5),
        )
    ax_b.set_xscale("log")
    if ax_b.get_lines() and all(np.nanmin(line.get_ydata()) > 0 for line in ax_b.get_lines() if len(line.get_ydata())):
        ax_b.set_yscale("log")
    ax_h.set_xlabel(
        style_label(
            style,
            r"log-ratio $\log \pi_{\mathrm{train}} - \log \pi_{\mathrm{rollout}}$ (nats"
            + (", symlog)" if symlog else ")"),
            r"$\log \pi_{\mathrm{train}} - \log \pi_{\mathrm{rollout}}$",
        )
    )
    ax_h.set_ylabel("tokens (count)")
    ax_s.set_xlabel(style_label(style, r"$p_{\mathrm{train}}$ (trainer, fp32)", r"$p_{\mathrm{train}}$"))
    ax_s.set_ylabel(style_label(style, r"$p_{\mathrm{rollout}}$ (engine)", r"$p_{\mathrm{rollout}}$"))
    ax_b.set_xlabel(
        style_label(style, r"token probability $p_{\mathrm{train}}$ (log bins)", r"$p_{\mathrm{train}}$ (log bins)")
    )
    ax_b.set_ylabel(style_label(style, r"$|p_{\mathrm{train}} - p_{\mathrm{rollout}}|$ (probability)", r"$|\Delta p|$"))
    handles += [Line2D([], [], color="0.3", linestyle=":"), Line2D([], [], color="0.4", linestyle="--")]
    labels += ["|Δp| per bin: median (solid), 90th pct. (dotted)", r"$p_{\mathrm{rollout}} = p_{\mathrm{train}}$"]
    note = f"{len(tok):,} tokens" + (f", by {key}" if key else "")
    return grid.finish(TITLES["mismatch"], ds, handles, labels, note)


SYMLOG_LINSCALE = 0.5


def symlog_decades(c: float, R: float, edge: float, panel_in: float, paper: bool) -> np.ndarray:
    """The positive decade ticks of a symlog x axis (linear within ±c, drawn to ±edge) that fit a
    panel `panel_in` wide: from the outermost decade ≤ R inwards, every `step`-th, so that two labels
    ("−10⁻³", about 0.4 in, 0.3 in in the paper style) never touch, and none so close to 0 that it
    runs into the "0"."""
    decades = 10.0 ** np.arange(math.ceil(math.log10(c)) + 1, math.floor(math.log10(R)) + 1)
    if not len(decades):
        return decades
    linear = SYMLOG_LINSCALE / (1 - 1 / 10)  # the linear stretch per side, in decades (matplotlib's rule)
    units = 2 * (linear + math.log10(max(edge, R) / c))  # the axis's width in decades
    per_unit = max(panel_in, 0.5) / units  # inches a decade takes
    label = (0.3 if paper else 0.4) * 1.3  # a label's width, with a gap
    step = max(1, math.ceil(label / per_unit))
    kept = decades[::-1][::step][::-1]
    at = linear + np.log10(kept / c)  # distance from 0, in decades
    return kept[at * per_unit >= 0.75 * label]


# Keys whose values are the engine's precision: the lines of mismatch-over-training, never its panels.
PRECISION_KEYS = ("mismatch.precision", "mismatch", "precision")


def _spread_scale(values: np.ndarray) -> str:
    """log when the values are positive and span a decade or more; symlog when they also take the
    other sign and their magnitudes span two decades (an estimate whose noise exceeds it); else linear."""
    v = values[np.isfinite(values)]
    if not len(v):
        return "linear"
    if (v < 0).any():
        mag = np.abs(v[v != 0])
        return "symlog" if len(mag) and mag.max() / mag.min() >= 100 else "linear"
    pos = v[v > 0]
    return "log" if len(pos) >= 2 and pos.max() / pos.min() >= 10 else "linear"


def _symlog(ax, values: np.ndarray, height_in: float) -> None:
    """A symmetric log axis: linear within ±c, c the decade of the smaller magnitudes (10th
    percentile); ticks at 0 and at decades from 10·c outwards (inside that the linear stretch is too
    short for labels), thinned to what the panel's height holds."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    v = values[np.isfinite(values)]
    mag = np.abs(v[v != 0])
    c = 10.0 ** math.floor(math.log10(np.quantile(mag, 0.1)))
    ax.set_yscale("symlog", linthresh=c, linscale=0.4)
    first = int(round(math.log10(c))) + 1

    def decades(extreme: float) -> list[float]:
        return [10.0**k for k in range(first, math.ceil(math.log10(extreme)) + 1)] if extreme > c else []

    pos, neg = decades(float(v.max())), decades(float(-v.min()))
    # Keep a tick only a label's height (≈ 0.2 in) from the last one kept, on the axis's own scale,
    # walking outwards from 0: the decades near the linear stretch are the ones that crowd.
    where = ax.yaxis.get_transform().transform
    span = float(where(np.array([v.max()]))[0] - where(np.array([v.min()]))[0]) or 1.0
    gap = span * 0.2 / max(height_in, 0.5)

    def thinned(side: list[float]) -> list[float]:
        kept, last = [], float(where(np.array([0.0]))[0])
        for t in side:
            at = float(where(np.array([t]))[0])
            if abs(at - last) >= gap:
                kept.append(t)
                last = at
        return kept

    ticks = [*(-t for t in thinned(neg)[::-1]), 0.0, *thinned(pos)]
    ticks = sorted(ticks)
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_minor_locator(NullLocator())

    def fmt(value, pos):
        if value == 0:
            return "0"
        e = int(round(math.log10(abs(value))))
        return ("$-10^{%d}$" if value < 0 else "$10^{%d}$") % e

    ax.yaxis.set_major_formatter(FuncFormatter(fmt))
    ax.axhline(0.0, color="0.5", linewidth=0.6, zorder=1, gid="zero")


# ----------------------------------------------------------------------------------------- mismatch over training
MOT_METRICS = ("kl_k3", "chi2_token", "max_abs_prob_diff", "entropy")
MOT_YLABELS = {
    "kl_k3": (r"KL$(\pi_{\mathrm{rollout}}\,\|\,\pi_{\mathrm{train}})$ per token ($k_3$)", r"KL per token ($k_3$)"),
    "chi2_token": (r"$\chi^2$ per token (mean $\rho^2 - 1$)", r"$\chi^2$ per token"),
    "max_abs_prob_diff": (r"max $|p_{\mathrm{train}} - p_{\mathrm{rollout}}|$ in the step", r"max $|\Delta p|$"),
    "entropy": (r"entropy of $\pi_\theta$ (nats per token)", "entropy (nats)"),
}
MOT_WORDS = {"kl_k3": "kl_k3", "chi2_token": "χ²", "max_abs_prob_diff": "max|Δp|", "entropy": "entropy"}
MOT_ABS_YLABELS = {"chi2_token": (r"$|\chi^2|$ per token (|mean $\rho^2 - 1$|)", r"$|\chi^2|$ per token")}


def _mismatch_profiles(per, fs: Sequence, metrics: Sequence[str]) -> list[list[float]]:
    """Per facet, its typical mismatch: the median of each metric over its rows (log10 of the size for
    all but the entropy), for telling apart panels that have one line each."""
    facet_of = {j: i for i, fc in enumerate(fs) for j in fc.jobs}
    framed = per.assign(_facet=per["job"].map(facet_of))
    out = []
    for f in range(len(fs)):
        rows = framed[framed["_facet"] == f]
        vec = []
        for m in metrics:
            v = rows[m].astype(float)
            v = v if m == "entropy" else np.log10(v.abs().where(v.abs() > 0))
            vec.append(float(v.median()) if v.notna().any() else 0.0)
        out.append(vec)
    return out


def mismatch_over_training_figure(ds: Dataset, style: str = "default"):
    with st.using(style):
        return _mismatch_over_training(ds, style)


def _mismatch_over_training(ds: Dataset, style: str):
    from matplotlib.lines import Line2D

    paper = style == "paper"
    df = update_rows(ds.metrics)  # the final row (J only) is no update
    metrics = [m for m in MOT_METRICS if m in df.columns and df[m].notna().any()]
    # A step's value: the mean over its updates (max|Δp|: the largest of them, as its name says).
    agg = {m: (m, "max" if m == "max_abs_prob_diff" else "mean") for m in metrics}
    seed = {"seed": ("seed", "first")} if "seed" in df.columns else {}
    per = df.groupby(["job", "step"], sort=False).agg(precision=("precision", "first"), **seed, **agg).reset_index()
    fs = facets(ds, df, exclude=PRECISION_KEYS, by_correction=True, limit=None)
    limit = st.PAPER_MAX_ROWS if paper else 4
    if per["precision"].nunique() > 1:  # the lines are precisions: keep the panels where they differ most
        fs = keep_differing(fs, arm_spread(per, fs, metrics, arm="precision"), limit, arms="precisions")
    else:
        fs = keep_distinct(
            fs,
            _mismatch_profiles(per, fs, metrics),
            limit,
            what="in their mismatch (median " + ", ".join(MOT_WORDS[m] for m in metrics) + ")",
        )
    facet_of = {j: i for i, fc in enumerate(fs) for j in fc.jobs}
    per = per.assign(_facet=per["job"].map(facet_of)).dropna(subset=["_facet"])
    # A metric whose estimate changes sign (χ²: its sampling noise exceeds its size) is drawn as its
    # absolute value on a log axis, hollow where it was negative: a symlog axis made it flip every step.
    absolute = [m for m in metrics if m != "entropy" and _spread_scale(per[m].to_numpy(dtype=float)) == "symlog"]
    precisions = sorted(
        per["precision"].astype(str).unique(),
        key=lambda p: (st.PRECISION_ORDER.index(p) if p in st.PRECISION_ORDER else 99, p),
    )
    colors = st.dimension_colors("mismatch.precision", precisions)
    # A long run's per-step values are noisy (χ² most: its sampling noise can exceed it): the lines are
    # a centred mean over `window` steps of each run, the per-step median over seeds faint beneath.
    window = smoothing_window(per["step"].nunique())
    per = per.sort_values(["job", "step"])
    smooth = per.groupby("job", sort=False)[metrics].transform(
        lambda col: col.rolling(window, center=True, min_periods=1).mean()
    )
    smoothed = per.assign(**{m: smooth[m] for m in metrics})
    stats = (
        smoothed.groupby(["_facet", "precision", "step"], sort=True)[metrics]
        .agg(["median", "min", "max"])
        .reset_index()
    )
    raw = per.groupby(["_facet", "precision", "step"], sort=True)[metrics].median().reset_index()
    n_jobs = per.groupby(["_facet", "precision"])["job"].nunique()
    fig, axes = rows_grid(len(fs), len(metrics), style, row_height=1.45 if paper else 2.7)
    zero_lines: list[str] = []
    for f in range(len(fs)):
        for p in precisions:
            cur = stats[(stats["_facet"] == f) & (stats["precision"].astype(str) == p)]
            if cur.empty:
                continue
            cur_raw = raw[(raw["_facet"] == f) & (raw["precision"].astype(str) == p)]
            for m, metric in enumerate(metrics):
                ax = axes[f][m]
                y = cur[(metric, "median")].to_numpy(dtype=float)
                y_raw = cur_raw[metric].to_numpy(dtype=float)
                if metric in absolute:
                    negative = y < 0
                    y, y_raw = np.abs(y), np.abs(y_raw)
                if window > 1:
                    ax.plot(
                        cur_raw["step"], y_raw, color=colors[p], linewidth=0.4 if paper else 0.6, alpha=0.3, gid="raw"
                    )
                ax.plot(cur["step"], y, color=colors[p], linewidth=1.0 if paper else 1.3, label=p, gid="series")
                if metric in absolute and negative.any():
                    ax.plot(
                        cur["step"].to_numpy()[negative],
                        y[negative],
                        linestyle="none",
                        marker="o",
                        markersize=2.2 if paper else 3,
                        markerfacecolor="white",
                        markeredgecolor=colors[p],
                        markeredgewidth=0.7,
                        gid="negative",
                        zorder=4,
                    )
                if metric in absolute:
                    continue  # a min–max band of a value that changes sign has no absolute value
                if n_jobs.get((f, p), 1) > 1:
                    ax.fill_between(
                        cur["step"],
                        cur[(metric, "min")],
                        cur[(metric, "max")],
                        color=colors[p],
                        alpha=0.15,
                        linewidth=0,
                        gid="band",
                    )
                if metric != "entropy" and len(y) and np.all(y[np.isfinite(y)] == 0):
                    zero_lines.append(f"{p} {MOT_WORDS[metric]}")
    notes = []
    for m, metric in enumerate(metrics):
        column = [axes[f][m] for f in range(len(fs))]
        values = per[metric].to_numpy(dtype=float)
        scale = "linear" if metric == "entropy" else "log" if metric in absolute else _spread_scale(values)
        if metric in absolute:
            notes.append(
                f"{MOT_WORDS[metric]} changes sign (its sampling noise exceeds its size): drawn as "
                f"|{MOT_WORDS[metric]}| on a log axis, hollow where negative"
            )
        if scale == "log":
            for ax in column:
                ax.set_yscale("log")
        elif scale == "symlog":
            _symlog(column[0], values, fig.get_figheight() / len(fs) - 0.5)
            notes.append(f"{MOT_WORDS[metric]} changes sign: its sampling noise exceeds its size (symlog axis)")
        elif metric == "entropy":
            _readable_span(column, values)
        elif (values[np.isfinite(values)] >= 0).all():
            floor_at_zero(column)
    if zero_lines:
        notes.append("exactly 0, not drawn on a log axis: " + ", ".join(dict.fromkeys(zero_lines)))
    label_rows(
        fig,
        axes,
        step_label(style),
        [
            (MOT_ABS_YLABELS.get(m) or MOT_YLABELS[m])[paper] if m in absolute else MOT_YLABELS[m][paper]
            for m in metrics
        ],
        [fc.title(style) for fc in fs],
        paper,
    )
    handles = [Line2D([], [], color=colors[p], linewidth=1.5) for p in precisions]
    labels = [f"engine precision {p}" for p in precisions]
    low, high = seed_count(per, ("_facet", "precision"))
    seeds = f"median over {seeds_text(low, high)}, shaded: min–max" if high > 1 else ""
    step_words = "per step: the mean over its updates (max|Δp|: their max)" + (
        f"; lines: centred mean over {window} steps, faint: per step" if window > 1 else ""
    )
    return finish_kind(
        fig,
        "mismatch-over-training",
        ds,
        handles,
        labels,
        paper,
        join_notes(seeds, step_words, _medians_note(per, precisions) if len(fs) == 1 else "", *notes, fs.note),
    )


ENTROPY_MIN_SPAN = 0.05  # nats: a flatter entropy is drawn flat, not as noise blown up to the panel's height


def _readable_span(axes, values: np.ndarray) -> None:
    """Plain tick labels (no '1e-5 + 2.7724' offset), and at least ENTROPY_MIN_SPAN of y range, so
    an entropy that does not move reads as flat."""
    v = values[np.isfinite(values)]
    for ax in axes:
        ax.ticklabel_format(axis="y", useOffset=False, style="plain")
    if not len(v):
        return
    lo, hi = float(v.min()), float(v.max())
    if hi - lo < ENTROPY_MIN_SPAN:
        mid = (lo + hi) / 2
        axes[0].set_ylim(mid - ENTROPY_MIN_SPAN / 2 * 1.1, mid + ENTROPY_MIN_SPAN / 2 * 1.1)


def smoothing_window(n_steps: int) -> int:
    """Steps per centred mean: none up to 40 steps, then an odd window of about n/20 (11 for 200)."""
    return 2 * (n_steps // 40) + 1


def _medians_note(per, precisions: Sequence[str]) -> str:
    """The typical size of each precision's mismatch over the whole run, in words."""
    parts = []
    for metric in ("kl_k3", "max_abs_prob_diff"):
        if metric not in per.columns:
            continue
        meds = [(p, float(per.loc[per["precision"].astype(str) == p, metric].median())) for p in precisions]
        meds = [(p, v) for p, v in meds if math.isfinite(v)]
        if meds:
            parts.append(f"{MOT_WORDS[metric]} " + ", ".join(f"{p} {v:.2g}" for p, v in meds))
    return ("median over the run: " + "; ".join(parts)) if parts and len(precisions) > 0 else ""
