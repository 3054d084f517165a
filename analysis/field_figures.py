"""The figures a paper author or an issue reporter comes for (issue 15): the field's signatures drawn
from this project's runs, sweeps and probes. Built on analysis/plots.py (its layout, finishing and
colour rules); analysis/figures.py joins `FIGURES` below to the base kinds.

    mismatch-over-training  kl_k3, χ² per token, max|Δp| and the policy's entropy against step, one
                line per engine precision (the analogue of Qi et al. 2025, Fig. 3); log axes where
                the values span a decade or more
    survival    the fraction of seeds not yet collapsed (summary.json's collapse_step) against step,
                one line per correction, one panel per mismatch setting; below it ESS and grad norm
                in the steps before each collapse, aligned on its collapse step (the lead–lag)
    bias-split  a probe sweep over the response length T (rollout.seq_len): the direction of each
                preset's mean gradient (its cosine to ∇J), its size (‖E ĝ‖ / ‖∇J‖) and the relative
                bias ‖E ĝ − ∇J‖ / ‖∇J‖ against T; degenerate arms hollow, a Monte Carlo ∇J said so
    length-heatmap  a train sweep over T × correction: final J (mean over seeds) and the fraction of
                seeds that collapsed, one cell each
    threshold-training  a train sweep over the band [low, high]: final J (summary.json's, as per_job
                reads it), peak-to-final drop, masked fraction, ESS and NaN/inf events against the band,
                a line per correction, a row per other swept key (staleness, precision); an outcome that
                is 0 in every run is said, not drawn
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from analysis import style as st
from analysis.load import DEGENERATE_RULE, Dataset, fmt_value, per_job, probe_frame, update_rows
from analysis.plots import (LEGEND_WIDTH, TITLES, Grid, _as_float, _fit, _label, _legend_for, _line_kwargs,
                            _new_figure, _notes, _ordered, _seeds, _step_label, arm_spread, facets, finish,
                            floor_at_zero, keep_differing, keep_distinct, never_learned_note)

# Keys whose values are the engine's precision: the lines of mismatch-over-training, never its panels.
PRECISION_KEYS = ("mismatch.precision", "mismatch", "precision")
LENGTH_KEYS = ("rollout.seq_len",)
PROBE_BAND_KEYS = ("probe.bands", "probe.presets", "correction.high", "correction.low", "correction")


# ----------------------------------------------------------------------------------------- availability
def availability(ds: Dataset, base: dict[str, str | None]) -> dict[str, str | None]:
    """kind -> None when it can be drawn, else the reason (base: plots.availability's answers)."""
    out: dict[str, str | None] = {}
    df = ds.metrics
    out["mismatch-over-training"] = base["training"]
    if out["mismatch-over-training"] is None:
        missing = [c for c in ("kl_k3", "max_abs_prob_diff", "entropy", "precision") if c not in df.columns]
        if missing:
            out["mismatch-over-training"] = f"the metrics lack {', '.join(missing)} (log.metrics=false?)"
    out["survival"] = _survival_reason(ds, base["training"])
    out["length-heatmap"] = base["training"] or _lengths_reason(ds)
    out["bias-split"] = _bias_split_reason(ds)
    out["threshold-training"] = _band_reason(ds, base["training"])
    return out


def _survival_reason(ds: Dataset, base: str | None) -> str | None:
    if base is not None:
        return base
    summaries = [j.summary for j in ds.jobs]
    if not summaries or any(s is None or "collapsed" not in s for s in summaries):
        return "needs every run's summary.json (collapsed, collapse_step): an unfinished or older run lacks it"
    if len(summaries) < 2 and not any(s["collapsed"] for s in summaries):
        return "one run that did not collapse: a survival curve needs a sweep (several seeds) or a collapse"
    return None


def flat_reasons(ds: Dataset, avail: dict[str, str | None]) -> dict[str, str]:
    """kind -> why, for the field's kinds that can be drawn but would show only flat lines."""
    out = {}
    if avail.get("survival") is None:
        summaries = [j.summary for j in ds.jobs]
        if not any(s["collapsed"] for s in summaries):
            out["survival"] = (f"no run collapsed (of {len(summaries)}): every survival line would be flat at 1 "
                               "(--kind survival draws it anyway)")
    return out


def job_lengths(ds: Dataset) -> dict[int, float]:
    """{job: response length T}: the rollout.seq_len override, else the run's config."""
    out = {}
    for j in ds.jobs:
        v = j.value("rollout.seq_len")
        if v is not None:
            out[j.index] = float(v)
    if not out and ds.metrics is not None and "rollout.seq_len" in ds.metrics.columns:  # a bare sweep.csv
        firsts = ds.metrics.drop_duplicates("job")
        out = {int(j): float(t) for j, t in zip(firsts["job"], firsts["rollout.seq_len"]) if t == t}
    return out


def _lengths_reason(ds: Dataset) -> str | None:
    lengths = set(job_lengths(ds).values())
    if len(lengths) < 2:
        return ("needs train runs at ≥ 2 response lengths (a sweep over rollout.seq_len); "
                f"{ds.path} has {'T=' + fmt_value(lengths.pop()) if lengths else 'no rollout.seq_len'}")
    return None


def _bias_split_reason(ds: Dataset) -> str | None:
    pr = ds.probe
    if pr is None:
        return "no probe results here (probe.csv): run a probe sweep over rollout.seq_len"
    missing = [c for c in ("preset", "seq_len", "cosine", "norm_ratio") if c not in pr.columns]
    if missing:
        return f"probe.csv lacks {', '.join(missing)} (written before the probe logged them)"
    if pr["seq_len"].nunique() < 2:
        return (f"needs probes at ≥ 2 response lengths (e.g. `is-study sweep experiment=bigram/bias-variance-by-level`); "
                f"{ds.path} has only T={fmt_value(pr['seq_len'].iloc[0])}")
    if pr.groupby(["job", "preset"]).size().max() > 1:
        return "some preset was probed at several bands in one run: one band per preset, please (see --kind threshold)"
    return None


# ----------------------------------------------------------------------------------------- shared pieces
def _rows_grid(n_rows: int, n_cols: int, style: str, row_height: float, panel_width: float = 3.4):
    """Facets as rows, metrics as columns (the reverse of plots.Grid, so that four metrics stay in one
    row and a paper figure keeps ≤ 3 rows); each column shares its y axis, every panel its x axis."""
    paper = style == "paper"
    if paper:
        width = st.PAPER_WIDTH if n_cols <= 2 else st.PAPER_DOUBLE_WIDTH
    else:
        width = panel_width * n_cols + LEGEND_WIDTH
    fig = _new_figure((width, n_rows * row_height), style)
    fig._is_study_legend_room = 0.0 if paper else LEGEND_WIDTH
    fig._is_study_facets = n_rows  # a row per facet
    axes = fig.subplots(n_rows, n_cols, squeeze=False)
    for r in range(n_rows):
        for c in range(n_cols):
            if (r, c) != (0, 0):
                axes[r][c].sharex(axes[0][0])
            if r:
                axes[r][c].sharey(axes[0][c])
    return fig, axes


def _label_rows(fig, axes, xlabel: str, ylabels: Sequence[str], row_titles: Sequence[str], paper: bool) -> None:
    """x labels under the last row, a y label on every panel (each column is its own metric), the
    facet's name over the first panel of its row."""
    n_rows, n_cols = len(axes), len(axes[0])
    row_in = fig.get_figheight() / n_rows
    for r in range(n_rows):
        for c in range(n_cols):
            ax = axes[r][c]
            if r == n_rows - 1:
                ax.set_xlabel(xlabel)
            else:
                ax.tick_params(labelbottom=False)
            ax.set_ylabel(_fit(ylabels[c], row_in - 0.25, paper))
        if row_titles[r]:
            ax = axes[r][0]
            width = fig.get_figwidth() - (0 if paper else LEGEND_WIDTH) - 0.4
            ax.set_title(_fit(row_titles[r], width, paper), loc="left", fontsize="medium")


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
        return [10.0 ** k for k in range(first, math.ceil(math.log10(extreme)) + 1)] if extreme > c else []
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


def _seed_count(frame, by: Sequence[str]) -> tuple[int, int]:
    """(fewest, most) seeds behind one line: distinct seeds per `by` group (jobs where no seed column)."""
    col = "seed" if "seed" in frame.columns else "job"
    per = frame.groupby(list(by))[col].nunique()
    return (int(per.min()), int(per.max())) if len(per) else (0, 0)


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
    per = (df.groupby(["job", "step"], sort=False)
             .agg(precision=("precision", "first"), **seed, **agg).reset_index())
    fs = facets(ds, df, exclude=PRECISION_KEYS, by_correction=True, limit=None)
    limit = st.PAPER_MAX_ROWS if paper else 4
    if per["precision"].nunique() > 1:  # the lines are precisions: keep the panels where they differ most
        fs = keep_differing(fs, arm_spread(per, fs, metrics, arm="precision"), limit, arms="precisions")
    else:
        fs = keep_distinct(fs, _mismatch_profiles(per, fs, metrics), limit,
                           what="in their mismatch (median " + ", ".join(MOT_WORDS[m] for m in metrics) + ")")
    facet_of = {j: i for i, fc in enumerate(fs) for j in fc.jobs}
    per = per.assign(_facet=per["job"].map(facet_of)).dropna(subset=["_facet"])
    # A metric whose estimate changes sign (χ²: its sampling noise exceeds its size) is drawn as its
    # absolute value on a log axis, hollow where it was negative: a symlog axis made it flip every step.
    absolute = [m for m in metrics if m != "entropy" and _spread_scale(per[m].to_numpy(dtype=float)) == "symlog"]
    precisions = sorted(per["precision"].astype(str).unique(),
                        key=lambda p: (st.PRECISION_ORDER.index(p) if p in st.PRECISION_ORDER else 99, p))
    colors = st.dimension_colors("mismatch.precision", precisions)
    # A long run's per-step values are noisy (χ² most: its sampling noise can exceed it): the lines are
    # a centred mean over `window` steps of each run, the per-step median over seeds faint beneath.
    window = smoothing_window(per["step"].nunique())
    per = per.sort_values(["job", "step"])
    smooth = per.groupby("job", sort=False)[metrics].transform(
        lambda col: col.rolling(window, center=True, min_periods=1).mean())
    smoothed = per.assign(**{m: smooth[m] for m in metrics})
    stats = (smoothed.groupby(["_facet", "precision", "step"], sort=True)[metrics]
                     .agg(["median", "min", "max"]).reset_index())
    raw = per.groupby(["_facet", "precision", "step"], sort=True)[metrics].median().reset_index()
    n_jobs = per.groupby(["_facet", "precision"])["job"].nunique()
    fig, axes = _rows_grid(len(fs), len(metrics), style, row_height=1.45 if paper else 2.7)
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
                    ax.plot(cur_raw["step"], y_raw, color=colors[p], linewidth=0.4 if paper else 0.6,
                            alpha=0.3, gid="raw")
                ax.plot(cur["step"], y, color=colors[p], linewidth=1.0 if paper else 1.3, label=p, gid="series")
                if metric in absolute and negative.any():
                    ax.plot(cur["step"].to_numpy()[negative], y[negative], linestyle="none", marker="o",
                            markersize=2.2 if paper else 3, markerfacecolor="white", markeredgecolor=colors[p],
                            markeredgewidth=0.7, gid="negative", zorder=4)
                if metric in absolute:
                    continue  # a min–max band of a value that changes sign has no absolute value
                if n_jobs.get((f, p), 1) > 1:
                    ax.fill_between(cur["step"], cur[(metric, "min")], cur[(metric, "max")], color=colors[p],
                                    alpha=0.15, linewidth=0, gid="band")
                if metric != "entropy" and len(y) and np.all(y[np.isfinite(y)] == 0):
                    zero_lines.append(f"{p} {MOT_WORDS[metric]}")
    notes = []
    for m, metric in enumerate(metrics):
        column = [axes[f][m] for f in range(len(fs))]
        values = per[metric].to_numpy(dtype=float)
        scale = "linear" if metric == "entropy" else "log" if metric in absolute else _spread_scale(values)
        if metric in absolute:
            notes.append(f"{MOT_WORDS[metric]} changes sign (its sampling noise exceeds its size): drawn as "
                         f"|{MOT_WORDS[metric]}| on a log axis, hollow where negative")
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
    _label_rows(fig, axes, _step_label(style),
                [(MOT_ABS_YLABELS.get(m) or MOT_YLABELS[m])[paper] if m in absolute else MOT_YLABELS[m][paper]
                 for m in metrics], [fc.title(style) for fc in fs], paper)
    handles = [Line2D([], [], color=colors[p], linewidth=1.5) for p in precisions]
    labels = [f"engine precision {p}" for p in precisions]
    low, high = _seed_count(per, ("_facet", "precision"))
    seeds = f"median over {_seeds(low, high)}, shaded: min–max" if high > 1 else ""
    step_words = "per step: the mean over its updates (max|Δp|: their max)" + (
        f"; lines: centred mean over {window} steps, faint: per step" if window > 1 else "")
    return _finish(fig, "mismatch-over-training", ds, handles, labels, paper,
                   _notes(seeds, step_words, _medians_note(per, precisions) if len(fs) == 1 else "", *notes,
                          fs.note))


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


def _finish(fig, kind: str, ds: Dataset, handles, labels, paper: bool, note: str, legend_below: bool = False):
    finish(fig, TITLES[kind], ds, handles, labels, paper, note, legend_below=legend_below)
    return fig


# ----------------------------------------------------------------------------------------- survival
LEAD_STEPS = 20  # how far before a collapse the lead–lag panels look
LAG_STEPS = 5  # and how far after (a run stopped by NaN parameters has nothing after)
REASON_WORDS = (("non-finite parameters", "NaN parameters"), ("objective", "J drop"), ("grad_norm", "grad-norm spike"))


def collapse_kind(reason) -> str:
    """summary.json's collapse_reason in two words (its rule: runner/training/faults.py)."""
    text = str(reason or "")
    return next((word for key, word in REASON_WORDS if key in text), "other")


def survival_curve(event_steps, last_steps, horizon: float) -> tuple[list[float], list[float], list[float]]:
    """Kaplan–Meier: the fraction not yet collapsed after each step, as (x, y) for a steps-post line
    from (0, 1) to the horizon, and the steps where a run ended early without collapsing (censored:
    it counts as at risk up to its last step and not after). event_steps: the collapse step or NaN."""
    events = np.asarray(event_steps, dtype=float)
    last = np.asarray(last_steps, dtype=float)
    xs, ys, s = [0.0], [1.0], 1.0
    for t in sorted(set(events[np.isfinite(events)])):
        at_risk = int(((events >= t) | (~np.isfinite(events) & (last >= t))).sum())
        s *= 1 - int((events == t).sum()) / at_risk
        xs.append(t)
        ys.append(s)
    xs.append(max(horizon, xs[-1]))
    ys.append(s)
    censored = sorted(last[~np.isfinite(events) & (last < horizon)].tolist())
    return xs, ys, censored


def _horizon(ds: Dataset, last_steps) -> float:
    planned = [j.value("train.steps") for j in ds.jobs]
    planned = [float(p) - 1 for p in planned if isinstance(p, (int, float))]
    return max([*planned, *(float(x) for x in last_steps)])


def survival_figure(ds: Dataset, style: str = "default"):
    with st.using(style):
        return _survival(ds, style)


def _survival(ds: Dataset, style: str):
    from matplotlib.lines import Line2D

    paper = style == "paper"
    df = update_rows(ds.metrics)  # the final row (J only) is no update
    per = per_job(ds)
    per["last_step"] = per["job"].map(df.groupby("job")["step"].max())
    per["event"] = per["collapse_step"].astype(float).where(per["collapsed"] == 1)
    collapsed = per[per["event"].notna()]
    lead = not collapsed.empty
    n_metrics = 3 if lead else 1
    fs = facets(ds, df, limit=Grid.capacity(style, n_metrics))
    names = _ordered(per["correction"].unique())
    grid = Grid(len(fs), n_metrics, style, sharex=False)
    horizon = _horizon(ds, per["last_step"])
    n_censored = 0
    for f, facet in enumerate(fs):
        sub = per[per["job"].isin(facet.jobs)]
        ax = grid.ax(f, 0)
        for name in names:
            cur = sub[sub["correction"] == name]
            if cur.empty:
                continue
            xs, ys, censored = survival_curve(cur["event"], cur["last_step"], horizon)
            ax.plot(xs, ys, drawstyle="steps-post", **_line_kwargs(name))
            if censored:
                n_censored += len(censored)
                level = [ys[max(i for i, x in enumerate(xs) if x <= c)] for c in censored]
                ax.plot(censored, level, linestyle="none", marker="|", markersize=7, color=st.look(name).color,
                        gid="censored")
        ax.set_ylim(-0.03, 1.05)
        ax.set_xlim(0, horizon)
        if f:
            ax.sharex(grid.ax(0, 0))
    for ax in grid.metric_axes(0):
        for line in ax.get_lines():
            line.set_clip_on(False)  # a line at 1 or 0 sits on the axis, not under it
    reasons: dict[str, int] = {}
    if lead:
        _lead_lag(ds, grid, fs, names, per, paper)
        for r in collapsed["collapse_reason"]:
            reasons[collapse_kind(r)] = reasons.get(collapse_kind(r), 0) + 1
    low, high = _seed_count(per.assign(_facet=per["job"].map({j: i for i, fc in enumerate(fs) for j in fc.jobs})),
                            ("_facet", "correction"))
    ylabels = [_label(style, f"not yet collapsed (fraction of {_seeds(low, high)})", "not collapsed (frac.)")]
    xlabels = [_step_label(style)]
    if lead:
        ylabels += [_label(style, "ESS (fraction of tokens)", "ESS (frac.)"),
                    _label(style, r"gradient norm $\|\nabla_\theta L\|_2$ (unclipped)", r"$\|\nabla_\theta L\|$")]
        xlabels += [_label(style, "steps relative to the collapse step", "steps from collapse")] * 2
    grid.label(xlabels, ylabels, fs)
    extra = []
    if lead:
        extra.append((Line2D([], [], color="0.4", linestyle="--", linewidth=0.9), "collapse step (x = 0)"))
        if any(ln.get_gid() == "runs" for ax in grid.fig.axes for ln in ax.get_lines()):
            extra.append((Line2D([], [], color="0.5", linewidth=0.6, alpha=0.6), "one collapsed seed (thin)"))
        if any(ln.get_gid() == "events" for ax in grid.fig.axes for ln in ax.get_lines()):
            extra.append((Line2D([], [], linestyle="none", marker="|", color="0.25", markersize=6),
                          "NaN/inf gradient (top edge)"))
    if n_censored:
        extra.append((Line2D([], [], linestyle="none", marker="|", color="0.25", markersize=7),
                      "run ended early without collapse (censored)"))
    handles, labels = _legend_for(names, extra=extra)
    # The count beside each name: a curve at 1 can hide under another, its label cannot.
    counts = per.groupby("correction")["event"].agg(["count", "size"])
    labels = [f"{lab}: {counts.loc[lab, 'count']}/{counts.loc[lab, 'size']} collapsed" if lab in names else lab
              for lab in labels]
    what = ("lead–lag: per correction, the median over its collapsed seeds; "
            f"{len(collapsed)} collapse{'s' if len(collapsed) != 1 else ''} ("
            + ", ".join(f"{w} {n}" for w, n in sorted(reasons.items())) + ")") if lead else (
        "no run collapsed: no lead–lag panels")
    return grid.finish(TITLES["survival"], ds, handles, labels,
                       _notes(what, never_learned_note(per), fs.note))


def _lead_lag(ds: Dataset, grid, fs, names, per, paper: bool) -> None:
    """ESS and grad norm against (step − collapse step), per correction: the median over its
    collapsed runs, each run thin beneath when there are several."""
    df = update_rows(ds.metrics)  # the final row (J only) is no update
    n_upd = int(df["update"].max()) + 1 if "update" in df.columns else 1
    event = dict(zip(per["job"], per["event"]))
    rows = df[df["job"].map(event).notna()]
    x = rows["step"] + (rows["update"] / n_upd if "update" in rows.columns else 0) - rows["job"].map(event)
    weights_ok = np.isfinite(rows["is_weight_mean"].astype(float)) if "is_weight_mean" in rows.columns else True
    gn = rows["grad_norm"].astype(float)
    frame = rows.assign(x=x.round(6), ess=rows["ess"].where(weights_ok) if "ess" in rows.columns else np.nan,
                        gn=gn.where(np.isfinite(gn) & (gn > 0)), bad=~np.isfinite(gn))
    frame = frame[(frame["x"] >= -LEAD_STEPS) & (frame["x"] < LAG_STEPS + 1)]
    for f, facet in enumerate(fs):
        sub = frame[frame["job"].isin(facet.jobs)]
        for m, metric in ((1, "ess"), (2, "gn")):
            ax = grid.ax(f, m)
            if f or m == 2:
                ax.sharex(grid.ax(0, 1))
            ax.axvline(0.0, color="0.4", linestyle="--", linewidth=0.9, gid="collapse-line", zorder=1)
            if sub.empty:
                ax.text(0.5, 0.5, "no collapse", transform=ax.transAxes, ha="center", va="center",
                        fontsize="small", color="0.35", gid="note")
            for row, name in enumerate(n for n in names if n in set(sub["correction"])):
                cur = sub[sub["correction"] == name]
                table = cur.pivot_table(index="x", columns="job", values=metric, aggfunc="mean", dropna=False)
                kw = _line_kwargs(name)
                if table.shape[1] > 1:
                    for job in table.columns:
                        ax.plot(table.index, table[job], color=kw["color"], linewidth=0.5, alpha=0.45, gid="runs")
                values = table.to_numpy(dtype=float)
                median = np.full(len(table), np.nan)
                some = np.isfinite(values).any(axis=1)  # a step where every run's value is undefined: a gap
                median[some] = np.nanmedian(values[some], axis=1)
                ax.plot(table.index, median, linewidth=1.0 if paper else 1.4, marker="o",
                        markersize=1.8 if paper else 2.5, **kw)
                bad = np.sort(cur.loc[cur["bad"], "x"].unique())
                if metric == "gn" and len(bad):
                    ax.plot(bad, np.full(len(bad), 0.965 - 0.04 * row), linestyle="none", marker="|", markersize=6,
                            markeredgewidth=1.2, color=kw["color"], transform=ax.get_xaxis_transform(),
                            clip_on=False, gid="events")
        grid.ax(f, 2).set_yscale("log")
    if len(frame):  # the steps some collapse has data for, within the window
        grid.ax(0, 1).set_xlim(float(frame["x"].min()) - 0.5, max(float(frame["x"].max()), 0.0) + 0.5)
    ess_axes = grid.metric_axes(1)
    floor_at_zero(ess_axes, top_if_zero=1.0, ceiling=1.03)
    for ax in ess_axes:
        lo, hi = ax.get_ylim()
        ax.set_ylim(lo, max(hi, min(1.03, hi * 1.05)))


# ----------------------------------------------------------------------------------------- bias split
BIAS_SPLIT_METRICS = ("cosine", "norm_ratio", "rel_bias")
BIAS_SPLIT_YLABELS = {
    "cosine": (r"direction: $\cos(\mathbb{E}\,\hat g,\ \nabla J)$", r"$\cos(\mathbb{E}\hat g, \nabla J)$"),
    "norm_ratio": (r"size: $\|\mathbb{E}\,\hat g\|\ /\ \|\nabla J\|$", r"$\|\mathbb{E}\hat g\| / \|\nabla J\|$"),
    "rel_bias": (r"relative bias $\|\mathbb{E}\,\hat g - \nabla J\|\ /\ \|\nabla J\|$",
                 r"$\|\mathbb{E}\hat g - \nabla J\| / \|\nabla J\|$"),
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
    names = _ordered(pr["preset"].unique())
    grid = Grid(len(fs), len(metrics), style)
    has_ci = {"bias_norm_lo", "bias_norm_hi", "exact_grad_norm"} <= set(pr.columns)
    n_degenerate = 0
    for f, facet in enumerate(fs):
        sub = pr[pr["job"].isin(facet.jobs)]
        for name in names:
            cur = sub[sub["preset"] == name]
            if cur.empty:
                continue
            lk = st.look(name)
            cols = metrics + (["bias_norm_lo", "bias_norm_hi", "exact_grad_norm"] if has_ci else [])
            cur = cur.assign(**{c: cur[c].apply(_as_float) for c in cols})
            stats = cur.groupby("T").agg({**{c: "mean" for c in cols}, "degenerate": "max"}).reset_index()
            degenerate = stats["degenerate"].astype(bool)
            n_degenerate += int(degenerate.sum())
            for m, metric in enumerate(metrics):
                ax = grid.ax(f, m)
                ax.plot(stats["T"], stats[metric], color=lk.color, linestyle=lk.linestyle, marker=lk.marker,
                        markersize=3 if paper else 4, label=name, gid="series")
                if degenerate.any():  # hollow: this arm barely updates at that length
                    ax.plot(stats.loc[degenerate, "T"], stats.loc[degenerate, metric], linestyle="none",
                            marker=lk.marker, markersize=5.5 if paper else 7, markerfacecolor="white",
                            markeredgecolor=lk.color, markeredgewidth=1.1, gid="degenerate", zorder=4)
                if metric == "rel_bias" and has_ci and len(stats) > 1:
                    g = stats["exact_grad_norm"].where(stats["exact_grad_norm"] > 0)
                    ax.fill_between(stats["T"], stats["bias_norm_lo"] / g, stats["bias_norm_hi"] / g, color=lk.color,
                                    alpha=0.12, linewidth=0, gid="ci")
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
    grid.label(_label(style, r"response length $T$ (tokens)", r"response length $T$"),
               [BIAS_SPLIT_YLABELS[m][paper] for m in metrics], fs)
    if paper and len(fs) == 1:  # the short y labels are formulas: the panel titles say what each one is
        for m, metric in enumerate(metrics):
            grid.ax(0, m).set_title(BIAS_SPLIT_WORDS[metric], fontsize="medium")
    extra = [(Line2D([], [], color="0.45", linestyle=":"), "unbiased: cosine 1, size 1, bias 0")]
    if has_ci:
        extra.append((Line2D([], [], color="0.45", linewidth=4, alpha=0.25), _ci_words(pr)))
    if n_degenerate:
        extra.append((Line2D([], [], linestyle="none", marker="o", markersize=6, markerfacecolor="white",
                             markeredgecolor="0.3"), DEGENERATE_RULE))
    handles, labels = _legend_for(names, marker=True, extra=extra)
    low, high = _seed_count(pr.assign(_f=pr["job"].map({j: i for i, fc in enumerate(fs) for j in fc.jobs})),
                            ("_f", "preset", "T"))
    seeds = f"mean over {_seeds(low, high)}" if high > 1 else ""
    return grid.finish(TITLES["bias-split"], ds, handles, labels, _notes(_reference_note(ds, pr), seeds, fs.note))


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
    noise = (f"its own error ≈ {_percent(rel.min())}–{_percent(rel.max())} of its norm" if rel.nunique() > 1
             else f"its own error ≈ {_percent(rel.iloc[0])} of its norm") if rel.notna().any() else ""
    return f"∇J: a Monte Carlo reference ({how}; {noise}, in the CI), not exact"


def _percent(fraction: float) -> str:
    """0.034 -> '3.4%', 1.04 -> '104%'."""
    pct = 100 * float(fraction)
    return f"{pct:.2g}%" if pct < 10 else f"{pct:.0f}%"


# ----------------------------------------------------------------------------------------- length heatmap
def length_heatmap_figure(ds: Dataset, style: str = "default"):
    with st.using(style):
        return _length_heatmap(ds, style)


def length_cells(ds: Dataset, facet_jobs: Sequence[int] | None = None, per=None):
    """One row per (correction, T): seeds, final_J (mean over the seeds whose J is defined), undefined
    (seeds that ended with NaN parameters), collapsed and never_learned (counts), from summary.json
    via per_job (`per`: its table, when the caller has it)."""
    per = per_job(ds) if per is None else per
    # A run that ended with NaN parameters has no final J (per_job's falls back to the last finite one)
    per = per.assign(T=per["job"].map(job_lengths(ds)),
                     final_objective=per["final_objective"].where(per["nonfinite_params"] != 1))
    if facet_jobs is not None:
        per = per[per["job"].isin(facet_jobs)]
    seeds = "seed" if "seed" in per.columns else "job"
    cells = (per.groupby(["correction", "T"])
                .agg(seeds=(seeds, "nunique"), final_J=("final_objective", "mean"),
                     undefined=("final_objective", lambda s: int(s.isna().sum())),
                     collapsed=("collapsed", lambda s: int((s == 1).sum())),
                     never_learned=("learned", lambda s: int((s == 0).sum())))
                .reset_index())
    return cells


def _length_heatmap(ds: Dataset, style: str):
    from matplotlib import colormaps

    paper = style == "paper"
    per = per_job(ds)
    lengths = job_lengths(ds)
    fs = facets(ds, ds.metrics, exclude=LENGTH_KEYS, limit=st.PAPER_MAX_ROWS if paper else 4)
    names = _ordered(per["correction"].unique())
    Ts = sorted(set(lengths.values()))
    n_c, n_t = len(names), len(Ts)
    row_h = max(n_c * (0.16 if paper else 0.3) + (0.45 if paper else 0.7), 1.1 if paper else 1.8)
    width = st.PAPER_DOUBLE_WIDTH if paper else 2 * max(0.62 * n_t + 0.8, 3.0) + 2.6
    fig = _new_figure((width, row_h * len(fs)), style)
    axes = fig.subplots(len(fs), 2, squeeze=False)
    all_cells = [length_cells(ds, fc.jobs, per) for fc in fs]
    finals = np.concatenate([c["final_J"].to_numpy(dtype=float) for c in all_cells])
    finals = finals[np.isfinite(finals)]
    j_lo, j_hi = (float(finals.min()), float(finals.max())) if len(finals) else (0.0, 1.0)
    if j_hi - j_lo < 1e-9:
        j_lo, j_hi = j_lo - 0.05, j_hi + 0.05
    images = {}
    cell_in = (fig.get_figwidth() - (1.8 if paper else 4.4)) / 2 / n_t  # inches a cell is wide
    annotate = cell_in >= (0.26 if paper else 0.34)
    flat_marked = nan_marked = 0
    digits = max(2, 1 - math.floor(math.log10(max(j_hi - j_lo, 1e-9))))  # enough to tell the colours apart
    for f, cells in enumerate(all_cells):
        grid_j = np.full((n_c, n_t), np.nan)
        grid_c = np.full((n_c, n_t), np.nan)
        text_c: dict[tuple[int, int], str] = {}
        text_j: dict[tuple[int, int], str] = {}
        for _, r in cells.iterrows():
            i, t = names.index(str(r["correction"])), Ts.index(float(r["T"]))
            grid_j[i, t] = r["final_J"]
            grid_c[i, t] = r["collapsed"] / r["seeds"] if r["seeds"] else np.nan
            dagger = "†" if r["never_learned"] and not r["collapsed"] else ""
            flat_marked += bool(dagger)
            text_c[(i, t)] = f"{int(r['collapsed'])}/{int(r['seeds'])}{dagger}"
            some_nan = 0 < r["undefined"] < r["seeds"]
            nan_marked += bool(some_nan)
            text_j[(i, t)] = "NaN" if r["undefined"] == r["seeds"] else f"{r['final_J']:.{digits}f}" + (
                "‡" if some_nan else "")
        for p, (grid, cmap, lo, hi) in enumerate(((grid_j, "viridis", j_lo, j_hi), (grid_c, "OrRd", 0.0, 1.0))):
            ax = axes[f][p]
            # a cell without a value (no J: NaN parameters) is grey, not the axes' white
            im = ax.imshow(np.ma.masked_invalid(grid), cmap=colormaps[cmap].with_extremes(bad="0.85"), vmin=lo,
                           vmax=hi, aspect="auto", interpolation="nearest")
            im.set_gid("final-J" if p == 0 else "collapse")
            images.setdefault(p, []).append((im, ax))
            if annotate:
                for i in range(n_c):
                    for t in range(n_t):
                        v = grid[i, t]
                        words = (text_j if p == 0 else text_c).get((i, t), "—")
                        shade = im.cmap(im.norm(v)) if np.isfinite(v) else (0.85, 0.85, 0.85, 1)
                        dark = 0.299 * shade[0] + 0.587 * shade[1] + 0.114 * shade[2] < 0.5
                        ax.text(t, i, words, ha="center", va="center", fontsize=5.5 if paper else 7.5,
                                color="white" if dark else "black", gid="cell")
            ax.set_xticks(range(n_t), [fmt_value(int(t) if float(t).is_integer() else t) for t in Ts])
            ax.set_yticks(range(n_c), names if p == 0 else [""] * n_c)
            ax.tick_params(axis="both", length=0)
            ax.grid(False)
            for spine in ax.spines.values():
                spine.set_visible(False)
            if p == 0:
                for tick, name in zip(ax.get_yticklabels(), names):
                    tick.set_color(st.look(name).color)
            if f == len(fs) - 1:
                ax.set_xlabel(_label(style, r"response length $T$ (tokens)", r"response length $T$"))
            if fs[f].label:
                ax.set_title(_fit(fs[f].title(style), cell_in * n_t, paper), fontsize="medium", loc="left")
    labels = (_label(style, "final J (mean over seeds)", "final J"),
              _label(style, "collapse rate (fraction of seeds)", "collapsed (frac.)"))
    for p, entries in images.items():
        cbar = fig.colorbar(entries[0][0], ax=[ax for _, ax in entries], shrink=0.95, aspect=18 if paper else 14,
                            pad=0.02)
        cbar.set_label(labels[p])
        cbar.ax.tick_params(labelsize=6 if paper else 8)
    per_T = per.assign(T=per["job"].map(lengths))
    low, high = _seed_count(per_T, ("correction", "T"))
    notes = [f"cells: final J (mean over {_seeds(low, high)}) and collapsed / seeds"]
    if flat_marked:
        notes.append("†: no collapse, but some seed never learned (J never rose above its start)")
    if nan_marked:
        notes.append("‡: mean over the seeds whose parameters stayed finite (NaN: none did)")
    if "objective_se" in ds.metrics.columns and ds.metrics["objective_se"].astype(float).gt(0).any():
        evaluated = ds.metrics.dropna(subset=["objective_se"])
        se = float(evaluated.groupby("job")["objective_se"].last().astype(float).median())
        notes.append(f"J by Monte Carlo (s.e. ≈ {se:.2g} per run)")
    notes.append("the task, and so J's scale, changes with T: compare corrections within a column")
    return _finish(fig, "length-heatmap", ds, [], [], paper, _notes(*notes, fs.note), legend_below=True)


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
    runs = df.assign(_ess=df["ess"].where(weights_ok) if "ess" in df.columns else np.nan).groupby("job").agg(
        masked=("token_masked_fraction", "mean") if "token_masked_fraction" in df.columns else ("step", lambda s: np.nan),
        ess=("_ess", "mean"))
    for key in ("low", "high"):
        if key in df.columns:
            per[key] = per["job"].map(df.groupby("job")[key].first().astype(float))
        else:
            per[key] = per["job"].map({j.index: _as_float(j.value(f"correction.{key}")) for j in ds.jobs})
    per["final_J"] = per["final_objective"].astype(float).where(per["nonfinite_params"] != 1)
    per["drop"] = (per["best_objective"].astype(float) - per["final_objective"].astype(float)).clip(lower=0)
    per["masked"] = per["job"].map(runs["masked"])
    per["ess"] = per["job"].map(runs["ess"])
    return per


def _band_reason(ds: Dataset, base: str | None) -> str | None:
    if base is not None:
        return base
    per = band_frame(ds)
    if per[["low", "high"]].isna().all().all():
        return "the runs record no correction.low / correction.high (a correction without a band)"
    bands = per.groupby("correction")[["low", "high"]].apply(lambda g: len(g.drop_duplicates()))
    if not len(bands) or bands.max() < 2:
        return ("needs train runs at ≥ 2 bands of one correction (a sweep over correction.high, correction.low or "
                "an experiment's band key, e.g. experiment=bigram/threshold-tradeoff)")
    return None


def threshold_training_figure(ds: Dataset, style: str = "default"):
    with st.using(style):
        return _threshold_training(ds, style)


def _band_positions(per) -> tuple[dict, str, bool]:
    """{(low, high): x}, the x label and whether x is a log axis: a band sits at its upper threshold
    when the upper ones differ, else at its lower one."""
    pairs = sorted({(lo, hi) for lo, hi in zip(per["low"], per["high"])}, key=lambda p: (p[1], -p[0]))
    highs = {hi for _, hi in pairs if np.isfinite(hi)}
    by_high = len(highs) >= 2
    xs = {p: (p[1] if by_high else p[0]) for p in pairs}
    vals = np.array([v for v in xs.values() if np.isfinite(v)])
    log = len(vals) > 1 and (vals > 0).all() and vals.max() / vals.min() >= 4
    where = "upper" if by_high else "lower"
    return xs, where, bool(log)


def _threshold_training(ds: Dataset, style: str):
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, NullLocator

    paper = style == "paper"
    per = band_frame(ds)
    xs, where, log_x = _band_positions(per)
    per["_x"] = [xs.get((lo, hi), np.nan) for lo, hi in zip(per["low"], per["high"])]
    per = per.dropna(subset=["_x"])
    metrics = [m for m in BAND_METRICS if per[m].notna().any()]
    empty = [m for m in metrics if m in BAND_EMPTY and per[m].fillna(0).eq(0).all()]
    metrics = [m for m in metrics if m not in empty]
    fs = facets(ds, per, exclude=BAND_KEYS, limit=None)
    fs = keep_differing(fs, arm_spread(per, fs, ["final_J"], x="_x"), st.PAPER_MAX_ROWS if paper else 4, what="final J")
    names = _ordered(per["correction"].unique())
    fig, axes = _rows_grid(len(fs), len(metrics), style, row_height=1.45 if paper else 2.6, panel_width=3.0)
    for f, facet in enumerate(fs):
        sub = per[per["job"].isin(facet.jobs)]
        for name in names:
            cur = sub[sub["correction"] == name]
            if cur.empty:
                continue
            lk = st.look(name)
            stats = cur.groupby("_x")[metrics].agg(["mean", "min", "max"]).sort_index()
            for m, metric in enumerate(metrics):
                ax = axes[f][m]
                x = stats.index.to_numpy(dtype=float)
                ax.plot(x, stats[(metric, "mean")], color=lk.color, linestyle=lk.linestyle, marker=lk.marker,
                        markersize=3.2 if paper else 4.5, label=name, gid="series")
                if cur.groupby("_x").size().max() > 1:
                    ax.vlines(x, stats[(metric, "min")], stats[(metric, "max")], color=lk.color, linewidth=1.0,
                              alpha=0.6, gid="range")
    bands = sorted(xs.items(), key=lambda kv: kv[1])
    named = {}
    if "band" in per.columns:
        named = {(lo, hi): str(b) for b, lo, hi in zip(per["band"], per["low"], per["high"])}
    ticks = [x for _, x in bands]
    labels = [_band_label(p, named.get(p), paper) for p, _ in bands]
    for f in range(len(fs)):
        for m, metric in enumerate(metrics):
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
    _label_rows(fig, axes, xlabel, [BAND_YLABELS[m][paper] for m in metrics], [fc.title(style) for fc in fs], paper)
    for ax in axes[-1]:
        ax.tick_params(axis="x", labelsize=6 if paper else 8)
    handles, labels = _legend_for(names, marker=True)
    low, high = _seed_count(per.assign(_f=per["job"].map({j: i for i, fc in enumerate(fs) for j in fc.jobs})),
                            ("_f", "correction", "_x"))
    seeds = f"mean over {_seeds(low, high)}, bars: min–max" if high > 1 else "one seed per point"
    seeds += (f"; final J: summary.json's final_objective; a band sits at its {where} threshold"
              + (" (log axis)" if log_x else ""))
    gone = "; ".join(BAND_EMPTY[m] for m in empty)
    return _finish(fig, "threshold-training", ds, handles, labels, paper,
                   _notes(seeds, f"{gone} (panel{'s' if len(empty) > 1 else ''} left out)" if empty else "",
                          never_learned_note(per), fs.note))


def _band_label(pair, name: str | None, paper: bool) -> str:
    lo, hi = pair
    text = f"{'—' if not np.isfinite(lo) else f'{lo:g}'}–{'—' if not np.isfinite(hi) else f'{hi:g}'}"
    return f"{name}\n{text}" if name else text


FIGURES = {
    "mismatch-over-training": mismatch_over_training_figure,
    "survival": survival_figure,
    "bias-split": bias_split_figure,
    "length-heatmap": length_heatmap_figure,
    "threshold-training": threshold_training_figure,
}
