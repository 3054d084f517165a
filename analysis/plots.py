"""The figures. Each `*_figure(ds, style)` takes a `Dataset` (analysis.load) and returns a
matplotlib `Figure` (no pyplot, no global backend state: a `Figure` saves through Agg), so tests can
inspect axes, labels and lines before anything is written; `render` saves PNG (150 dpi) and PDF.

Kinds (`is-study plot --kind`):

    training    objective J(θ) and batch reward against step, one line per correction: mean ± 1 s.d.
                over seeds; NaN/inf updates marked under the x axis
    grad-norm   ‖∇L‖ before clipping against step, log scale: median over seeds (band: min–max),
                spikes (> 5× the trailing median) and NaN/inf gradients marked
    stability   nonfinite-update rate and collapse rate against mismatch staleness, one line per
                correction (needs ≥ 2 staleness values: a sweep)
    threshold   probe results: bias (± CI), variance and MSE against the band's upper threshold,
                one line per preset; the lowest MSE of each preset starred (the U-shape)
    mismatch    tokens.csv: histogram of log-ratios, p_rollout against p_train, |Δp| binned by p
    masking     masked and clamped token fractions and the ESS against step

A sweep's other swept keys (everything but the correction and the seed) become small multiples,
one panel per combination. Data lines carry gid="series"; markers and bands carry other gids.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from analysis import style as st
from analysis.load import Dataset, describe, fmt_value, per_job
from runner.errors import UserError

KINDS = ("training", "grad-norm", "stability", "threshold", "mismatch", "masking")
TITLES = {
    "training": "Training curves",
    "grad-norm": "Gradient-norm traces",
    "stability": "Stability against staleness",
    "threshold": "Threshold trade-off (probe)",
    "mismatch": "Training–inference mismatch",
    "masking": "Masking over time",
}
SPIKE_FACTOR = 5.0  # a spike: grad norm above this many times the median of the trailing window
SPIKE_WINDOW = 20
MAX_FACETS = 12
MAX_GROUPS = 6
MAX_SCATTER = 4000
OUTLIER_NATS = 50.0  # |log-ratio| beyond this is a fault (e.g. an injected −1000 nats), not precision
SEED_KEYS = ("seed",)
CORRECTION_KEYS = ("correction",)
STEP_LABEL = "training step (rollout batches)"


def _label(style: str, long: str, short: str) -> str:
    """Axis labels: the paper style's panels are 1.3 in tall and 1.5–3 in wide."""
    return short if style == "paper" else long


def _step_label(style: str) -> str:
    return _label(style, STEP_LABEL, "training step")


# ----------------------------------------------------------------------------------------- layout
@dataclass
class Facet:
    label: str  # "" for the single facet of a run
    jobs: list[int]


class Facets(list):
    """The facets drawn; `total` counts them all (at most MAX_FACETS are drawn)."""

    total: int = 0

    @property
    def note(self) -> str:
        return f"first {len(self)} of {self.total} panels" if self.total > len(self) else ""


def facets(ds: Dataset, frame, exclude: Sequence[str] = ()) -> Facets:
    """One facet per combination of the swept keys other than correction, seed and `exclude`."""
    skip = set(SEED_KEYS) | set(CORRECTION_KEYS) | set(exclude)
    keys = [k for k in ds.swept if k not in skip and k in frame.columns]
    out = Facets()
    if not keys:
        out.append(Facet("", sorted(frame["job"].unique().tolist())))
    else:
        per_job = frame.drop_duplicates("job")[["job", *keys]]
        for values, grp in per_job.groupby(keys, sort=True, dropna=False):
            values = values if isinstance(values, tuple) else (values,)
            label = ", ".join(f"{k}={fmt_value(v)}" for k, v in zip(keys, values))
            out.append(Facet(label, grp["job"].tolist()))
    out.total = len(out)
    del out[MAX_FACETS:]
    return out


def _notes(*parts: str) -> str:
    return " · ".join(p for p in parts if p)


class Grid:
    """Panels: metrics × facets. One facet: metrics side by side (stacked in the paper style).
    Several: a block of metric rows per line of facets."""

    def __init__(self, n_facets: int, n_metrics: int, style: str, row_height: float | None = None,
                 sharey: bool = True, sharex: bool = True):
        from matplotlib.figure import Figure

        self.paper = style == "paper"
        self.n_facets, self.n_metrics = n_facets, n_metrics
        if n_facets == 1:
            self.ncols = 1 if self.paper else n_metrics
            self.nrows = n_metrics if self.paper else 1
        else:
            most = 2 if self.paper else 4
            self.ncols = math.ceil(n_facets / math.ceil(n_facets / most))  # balanced: 5 -> 3 + 2
            self.nrows = math.ceil(n_facets / self.ncols) * n_metrics
        if self.paper:
            width = st.PAPER_WIDTH
            height = self.nrows * (row_height or (1.45 if self.ncols == 1 else 1.25)) + 0.9
        else:
            width = st.DEFAULT_PANEL[0] * self.ncols + 1.8
            height = self.nrows * (row_height or (st.DEFAULT_PANEL[1] if n_facets == 1 else 2.3)) + 0.8
        self.fig = Figure(figsize=(width, height), layout="constrained")
        self.axes = self.fig.subplots(self.nrows, self.ncols, squeeze=False)
        used = {self.pos(f, m) for f in range(n_facets) for m in range(n_metrics)}
        for r in range(self.nrows):
            for c in range(self.ncols):
                if (r, c) not in used:
                    self.axes[r][c].set_visible(False)
        if sharex:
            first = self.ax(0, 0)
            for f in range(n_facets):
                for m in range(n_metrics):
                    if (f, m) != (0, 0):
                        self.ax(f, m).sharex(first)
        if sharey and n_facets > 1:
            for m in range(n_metrics):
                for f in range(1, n_facets):
                    self.ax(f, m).sharey(self.ax(0, m))

    def pos(self, f: int, m: int) -> tuple[int, int]:
        if self.n_facets == 1:
            return (m, 0) if self.paper else (0, m)
        return ((f // self.ncols) * self.n_metrics + m, f % self.ncols)

    def ax(self, f: int, m: int):
        r, c = self.pos(f, m)
        return self.axes[r][c]

    def label(self, xlabels: Sequence[str] | str, ylabels: Sequence[str], facet_labels: Sequence[str] = ()):
        """x labels on the lowest panel of each column, y labels on the first column, facet titles."""
        if isinstance(xlabels, str):
            xlabels = [xlabels] * self.n_metrics
        lowest: dict[int, int] = {}
        for f in range(self.n_facets):
            for m in range(self.n_metrics):
                r, c = self.pos(f, m)
                lowest[c] = max(lowest.get(c, -1), r)
        for f in range(self.n_facets):
            for m in range(self.n_metrics):
                ax = self.ax(f, m)
                r, c = self.pos(f, m)
                if self.n_facets == 1 and not self.paper or len(set(xlabels)) > 1 or lowest[c] == r:
                    ax.set_xlabel(xlabels[m])
                elif m != self.n_metrics - 1:  # tick labels on the last metric row of every block
                    ax.tick_params(labelbottom=False)
                if c == 0 or self.n_facets == 1:
                    ax.set_ylabel(ylabels[m])
                if facet_labels and facet_labels[f] and m == 0:
                    ax.set_title(facet_labels[f], fontsize="medium")

    def finish(self, title: str, ds: Dataset, handles, labels, note: str = ""):
        finish(self.fig, title, ds, handles, labels, self.paper, note)
        return self.fig


def _tidy_log_axes(fig) -> None:
    """Log axes: label only the decades when two or more are in view; otherwise label 2× and 5×
    as well (matplotlib's default labels every minor tick there, and they pile up)."""
    from matplotlib.ticker import LogFormatterSciNotation, LogLocator, NullFormatter

    for ax in fig.axes:
        for axis, scale, lim in ((ax.yaxis, ax.get_yscale(), ax.get_ylim()), (ax.xaxis, ax.get_xscale(), ax.get_xlim())):
            lo, hi = sorted(lim)
            if scale != "log" or lo <= 0:
                continue
            decades = math.floor(math.log10(hi)) - math.ceil(math.log10(lo)) + 1
            if decades >= 2:
                axis.set_minor_formatter(NullFormatter())
            else:
                axis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
                axis.set_minor_formatter(LogFormatterSciNotation(labelOnlyBase=False, minor_thresholds=(10, 10)))


def finish(fig, title: str, ds: Dataset, handles, labels, paper: bool, note: str = ""):
    """The title (figure kind + the config it came from) and one legend outside the axes."""
    _tidy_log_axes(fig)
    # Left-aligned, wrapped short of the legend column (the right ≈2.2 in of a default figure).
    width = fig.get_figwidth() - (0.1 if paper else 2.4)
    config = describe(ds) + (f" · {note}" if note else "")
    wrapped = textwrap.fill(config, width=max(int(width * (15 if paper else 12.5)), 40),
                            break_long_words=True, break_on_hyphens=False)
    fig.suptitle(f"{title}\n{wrapped}", fontsize="medium" if not paper else 7.5, x=0.01, ha="left")
    if handles:
        if paper:  # two columns when the labels fit in half of the 3.3 in
            ncol = 2 if len(labels) > 1 and max(len(lab) for lab in labels) <= 30 else 1
            fig.legend(handles, labels, loc="outside lower center", ncol=ncol, handlelength=2.6, columnspacing=1.2)
        else:
            fig.legend(handles, labels, loc="outside right upper", handlelength=3.0)


def _mean_and_band(ax, stats, metric: str, kw: dict, alpha: float) -> None:
    """The mean over seeds as a line, and ± 1 s.d. as a band where there is more than one seed."""
    mean, sd = stats[f"{metric}_mean"], stats[f"{metric}_std"]
    ax.plot(stats["step"], mean, **kw)
    if stats[f"{metric}_count"].max() > 1:
        ax.fill_between(stats["step"], mean - sd, mean + sd, color=kw["color"], alpha=alpha, linewidth=0, gid="band")


def _line_kwargs(name: str) -> dict:
    lk = st.look(name)
    return {"color": lk.color, "linestyle": lk.linestyle, "label": str(name), "gid": "series"}


def _legend_for(names: Sequence[str], marker: bool = False, extra: Sequence = ()) -> tuple[list, list]:
    from matplotlib.lines import Line2D

    handles, labels = [], []
    for n in names:
        lk = st.look(n)
        handles.append(Line2D([], [], color=lk.color, linestyle=lk.linestyle, marker=lk.marker if marker else None,
                              markersize=4 if marker else None))
        labels.append(str(n))
    for h, lab in extra:
        handles.append(h)
        labels.append(lab)
    return handles, labels


def _ordered(names) -> list[str]:
    return sorted({str(n) for n in names}, key=st.preset_rank)


def _seed_note(frame, fs: Sequence[Facet] = ()) -> str:
    """'mean ± 1 s.d. over N seeds' when lines average several jobs."""
    if "job" not in frame.columns or "correction" not in frame.columns:
        return ""
    facet_of = {j: i for i, fc in enumerate(fs) for j in fc.jobs}
    per = frame.assign(_facet=frame["job"].map(facet_of).fillna(-1)).groupby(["_facet", "correction"])["job"].nunique()
    if per is None or per.max() <= 1:
        return ""
    n = int(per.max())
    return f"mean ± 1 s.d. over {n} seeds" if per.min() == per.max() else f"mean ± 1 s.d. over up to {n} seeds"


# ----------------------------------------------------------------------------------------- availability
def _need_metrics(ds: Dataset, cols: Sequence[str]) -> str | None:
    df = ds.metrics
    if df is None:
        return "no training metrics here (metrics.csv / sweep.csv): it is not a train run or sweep"
    missing = [c for c in cols if c not in df.columns]
    if missing:
        return f"the metrics lack {', '.join(missing)} (log.metrics=false?)"
    return None


def availability(ds: Dataset) -> dict[str, str | None]:
    """kind -> None when the figure can be drawn from `ds`, else the reason it cannot."""
    out: dict[str, str | None] = {}
    out["training"] = _need_metrics(ds, ("step", "objective", "reward"))
    out["grad-norm"] = _need_metrics(ds, ("step", "grad_norm"))
    out["masking"] = _need_metrics(ds, ("step", "token_masked_fraction", "clamped_fraction", "ess"))
    reason = _need_metrics(ds, ("staleness", "nonfinite_loss", "nonfinite_grad"))
    if reason is None and ds.metrics["staleness"].nunique() < 2:
        reason = (f"needs runs at ≥ 2 staleness values (a sweep over mismatch.staleness); "
                  f"{ds.path} has only k={fmt_value(ds.metrics['staleness'].iloc[0])}")
    out["stability"] = reason
    pr = ds.probe
    if pr is None:
        out["threshold"] = "no probe results here (probe.csv): run `is-study run study=probe`"
    elif not {"preset", "high", "bias_norm"} <= set(pr.columns):
        out["threshold"] = "probe.csv lacks preset / high / bias_norm"
    else:
        highs = pr.dropna(subset=["high"]).groupby("preset")["high"].nunique()
        out["threshold"] = None if len(highs) and highs.max() >= 2 else (
            "every preset was probed at a single upper threshold; give probe.bands several [low, high] pairs")
    out["mismatch"] = None if ds.tokens is not None else (
        "no tokens.csv here (per-token trainer and rollout log-probs, written by the train study)")
    return out


# ----------------------------------------------------------------------------------------- helpers
def _bands(per_job, fs: Sequence[Facet], x: str, ys: Sequence[str]) -> dict:
    """{(facet, correction): DataFrame x, <y>_mean, <y>_std, <y>_count} across the facet's jobs,
    in one groupby (a 100-job sweep has hundreds of (facet, correction) lines)."""
    facet_of = {j: i for i, fc in enumerate(fs) for j in fc.jobs}
    frame = per_job.assign(_facet=per_job["job"].map(facet_of))
    stats = frame.groupby(["_facet", "correction", x], sort=True)[list(ys)].agg(["mean", "std", "count"])
    stats.columns = [f"{a}_{b}" for a, b in stats.columns]
    stats = stats.reset_index()
    for y in ys:
        stats[f"{y}_std"] = stats[f"{y}_std"].fillna(0.0)
    return {(int(f), str(c)): g for (f, c), g in stats.groupby(["_facet", "correction"], sort=False)}


def _event_marks(ax, xs, row: int, color: str, marker: str = "x"):
    """Markers on the x axis (in the margin just above it), one row per correction."""
    if len(xs) == 0:
        return
    y = 0.025 + 0.045 * row
    ax.plot(xs, np.full(len(xs), y), linestyle="none", marker=marker, color=color, markersize=4,
            markeredgewidth=1.0, transform=ax.get_xaxis_transform(), clip_on=False, gid="events", zorder=4)


def _room_for_marks(ax, rows: int):
    """Lower the y axis so that `rows` rows of event marks sit under the data, not on it."""
    lo, hi = ax.dataLim.intervaly
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return
    span = (hi - lo) or max(abs(hi), 1.0) * 0.1
    band = (0.035 + 0.045 * rows) if rows else 0.0
    pad = 0.04 * span
    bottom = lo - pad - band / (1 - band) * (hi - lo + 2 * pad) if rows else lo - pad
    ax.set_ylim(bottom, hi + pad)


def _event_handle(label: str = "NaN/inf loss or gradient"):
    from matplotlib.lines import Line2D

    return Line2D([], [], linestyle="none", marker="x", color="0.25", markersize=5), label


# ----------------------------------------------------------------------------------------- training
def training_figure(ds: Dataset, style: str = "default"):
    with st.using(style):
        return _training(ds, style)


def _training(ds: Dataset, style: str):
    df = ds.metrics
    per = (df.assign(_bad=(df["nonfinite_loss"].fillna(0) + df["nonfinite_grad"].fillna(0)) > 0
                     if "nonfinite_loss" in df.columns else False)
             .groupby(["job", "step"], sort=False)
             .agg(objective=("objective", "first"), reward=("reward", "mean"), bad=("_bad", "max"),
                  correction=("correction", "first"))
             .reset_index())
    fs = facets(ds, df)
    names = _ordered(per["correction"].unique())
    grid = Grid(len(fs), 2, style)
    metrics = ("objective", "reward")
    flagged = _ordered(per.loc[per["bad"].astype(bool), "correction"].unique())
    bands = _bands(per, fs, "step", metrics)
    bad = per[per["bad"].astype(bool)]
    for f, facet in enumerate(fs):
        bad_f = bad[bad["job"].isin(facet.jobs)]
        for name in names:
            stats = bands.get((f, name))
            if stats is None:
                continue
            kw = _line_kwargs(name)
            bad_steps = np.sort(bad_f.loc[bad_f["correction"] == name, "step"].unique())
            for m, metric in enumerate(metrics):
                ax = grid.ax(f, m)
                _mean_and_band(ax, stats, metric, kw, alpha=0.18)
                if len(bad_steps):
                    _event_marks(ax, bad_steps, flagged.index(name), kw["color"])
    for f in range(len(fs)):
        for m in range(2):
            _room_for_marks(grid.ax(f, m), len(flagged))
    any_events = bool(flagged)
    grid.label(_step_label(style), [_label(style, r"objective $J(\theta)$ (expected reward)", r"objective $J(\theta)$"),
                                    _label(style, "batch mean reward", "reward")], [fc.label for fc in fs])
    extra = [_event_handle("NaN/inf update (marks on the x axis)")] if any_events else []
    handles, labels = _legend_for(names, extra=extra)
    return grid.finish(TITLES["training"], ds, handles, labels, _notes(_seed_note(per, fs), fs.note))


# ----------------------------------------------------------------------------------------- grad norm
def grad_norm_figure(ds: Dataset, style: str = "default"):
    with st.using(style):
        return _grad_norm(ds, style)


def _grad_norm(ds: Dataset, style: str):
    from matplotlib.lines import Line2D

    df = ds.metrics
    n_updates = int(df["update"].max()) + 1 if "update" in df.columns else 1
    x = df["step"] + (df["update"] / n_updates if "update" in df.columns else 0)
    frame = df[["job", "correction", "grad_norm"]].assign(x=x)
    fs = facets(ds, df)
    names = _ordered(frame["correction"].unique())
    grid = Grid(len(fs), 1, style, row_height=None if len(fs) > 1 else (1.9 if style == "paper" else 3.4))
    n_spikes = n_bad = 0
    top = None
    vals = frame["grad_norm"].astype(float)
    frame = frame.assign(gn=vals.where(np.isfinite(vals) & (vals > 0)), bad=~np.isfinite(vals))
    ref = frame.groupby("job", sort=False)["gn"].transform(
        lambda s: s.shift(1).rolling(SPIKE_WINDOW, min_periods=3).median())
    frame["spike"] = (frame["gn"] > SPIKE_FACTOR * ref) & (ref > 0)
    facet_of = {j: i for i, fc in enumerate(fs) for j in fc.jobs}
    frame["_facet"] = frame["job"].map(facet_of)
    stats_all = frame.groupby(["_facet", "correction", "x"], sort=True)["gn"].agg(["median", "min", "max"]).reset_index()
    njobs = frame.groupby(["_facet", "correction"])["job"].nunique()
    for f, facet in enumerate(fs):
        ax = grid.ax(f, 0)
        sub_stats = stats_all[stats_all["_facet"] == f]
        sub = frame[frame["_facet"] == f]
        for name in names:
            stats = sub_stats[sub_stats["correction"] == name]
            if stats.empty:
                continue
            kw = _line_kwargs(name)
            ax.plot(stats["x"], stats["median"], linewidth=1.0, **kw)
            if njobs.get((f, name), 1) > 1:
                ax.fill_between(stats["x"], stats["min"], stats["max"], color=kw["color"], alpha=0.15, linewidth=0,
                                gid="band")
            cur = sub[sub["correction"] == name]
            spk = cur[cur["spike"]]
            if len(spk):
                n_spikes += len(spk)
                ax.plot(spk["x"], spk["gn"], linestyle="none", marker="o", markersize=5, markerfacecolor="none",
                        markeredgecolor=kw["color"], markeredgewidth=1.2, gid="spikes")
            bad = np.sort(cur.loc[cur["bad"], "x"].unique())
            if len(bad):
                n_bad += len(bad)
                ax.plot(bad, np.full(len(bad), 0.965), linestyle="none", marker="|", markersize=6,
                        markeredgewidth=1.2, color=kw["color"], transform=ax.get_xaxis_transform(), clip_on=False,
                        gid="events")
        ax.set_yscale("log")
        if f == 0:
            top = ax
    if top is not None:
        for f in range(len(fs)):  # headroom for the NaN/inf markers at the top
            ax = grid.ax(f, 0)
            lo, hi = ax.get_ylim()
            if n_bad and np.isfinite(hi) and hi > 0 and lo > 0:
                ax.set_ylim(lo, hi * (hi / lo) ** 0.12)
    grid.label(_step_label(style), [_label(style, r"gradient norm $\|\nabla_\theta L\|_2$ before clipping",
                                           r"$\|\nabla_\theta L\|_2$ (unclipped)")], [fc.label for fc in fs])
    extra = []
    if n_spikes:
        extra.append((Line2D([], [], linestyle="none", marker="o", markerfacecolor="none", markeredgecolor="0.25",
                             markersize=5), f"spike (> {SPIKE_FACTOR:g}× trailing median)"))
    if n_bad:
        extra.append((Line2D([], [], linestyle="none", marker="|", color="0.25", markersize=6, markeredgewidth=1.2),
                      "NaN/inf gradient (top edge)"))
    handles, labels = _legend_for(names, extra=extra)
    note = "median over seeds, band: min–max" if njobs.max() > 1 else ""
    return grid.finish(TITLES["grad-norm"], ds, handles, labels, _notes(note, fs.note))


# ----------------------------------------------------------------------------------------- stability
def stability_figure(ds: Dataset, style: str = "default"):
    with st.using(style):
        return _stability(ds, style)


def _stability(ds: Dataset, style: str):
    per = per_job(ds)
    fs = facets(ds, ds.metrics, exclude=("mismatch.staleness", "staleness"))
    names = _ordered(per["correction"].unique())
    ks = sorted(per["staleness"].unique())
    pos = {k: i for i, k in enumerate(ks)}
    width = 0.6
    offsets = {n: (i - (len(names) - 1) / 2) * (width / max(len(names), 1)) for i, n in enumerate(names)}
    grid = Grid(len(fs), 2, style, sharex=True)
    for f, facet in enumerate(fs):
        sub = per[per["job"].isin(facet.jobs)]
        for name in names:
            cur = sub[sub["correction"] == name]
            if cur.empty:
                continue
            lk = st.look(name)
            for m, metric in enumerate(("nonfinite", "collapsed")):
                ax = grid.ax(f, m)
                stats = cur.groupby("staleness")[metric].agg(["mean", "min", "max", "count"]).reset_index()
                stats = stats.dropna(subset=["mean"])
                if stats.empty:
                    continue
                xs = stats["staleness"].map(pos).to_numpy(dtype=float) + offsets[name]
                ax.plot(xs, stats["mean"], color=lk.color, linestyle=lk.linestyle, marker=lk.marker, markersize=4.5,
                        label=name, gid="series")
                if metric == "nonfinite" and stats["count"].max() > 1:
                    ax.vlines(xs, stats["min"], stats["max"], color=lk.color, linewidth=1.0, alpha=0.6, gid="band")
    for f in range(len(fs)):
        for m in range(2):
            ax = grid.ax(f, m)
            ax.set_xticks(range(len(ks)), [fmt_value(k) for k in ks])
            ax.set_xlim(-0.6, len(ks) - 0.4)
            ax.set_ylim(-0.05, 1.05)
    seeds = per.groupby(["correction", "staleness"])["job"].nunique().max()
    grid.label(_label(style, r"staleness $k$ (optimizer steps behind)", r"staleness $k$ (steps)"),
               [_label(style, "updates with NaN/inf loss or grad (fraction)", "NaN/inf (frac.)"),
                _label(style, f"collapse rate (fraction of {seeds} seed{'s' if seeds != 1 else ''})",
                       "collapsed (frac.)")], [fc.label for fc in fs])
    handles, labels = _legend_for(names, marker=True)
    note = f"mean over {seeds} seeds, bars: min–max" if seeds > 1 else ""
    return grid.finish(TITLES["stability"], ds, handles, labels, _notes(note, fs.note))


# ----------------------------------------------------------------------------------------- threshold
def threshold_figure(ds: Dataset, style: str = "default"):
    with st.using(style):
        return _threshold(ds, style)


def _threshold(ds: Dataset, style: str):
    from matplotlib.lines import Line2D

    pr = ds.probe
    pr = pr[np.isfinite(pr["high"].astype(float))].copy()
    metrics = [m for m in ("bias_norm", "variance", "mse") if m in pr.columns]
    ylabels = {"bias_norm": r"bias $\|\mathbb{E}\,\hat g - \nabla J\|_2$",
               "variance": r"variance $\mathrm{tr}\,\mathrm{Cov}(\hat g)$",
               "mse": r"MSE $\mathbb{E}\,\|\hat g - \nabla J\|_2^2$"}
    exclude = ("probe.bands", "correction.high", "correction.low", "correction")
    fs = facets(ds, pr, exclude=exclude)
    names = _ordered(pr["preset"].unique())
    multi = pr.groupby("preset")["high"].nunique()
    grid = Grid(len(fs), len(metrics), style)
    for f, facet in enumerate(fs):
        sub = pr[pr["job"].isin(facet.jobs)]
        for name in names:
            cur = sub[sub["preset"] == name]
            if cur.empty:
                continue
            lk = st.look(name)
            agg = {m: "mean" for m in metrics}
            for c in ("bias_norm_ci", "bias_norm_lo", "bias_norm_hi"):
                if c in cur.columns:
                    cur = cur.assign(**{c: cur[c].apply(_as_float)})
                    agg[c] = "mean"
            stats = cur.groupby("high").agg(agg).reset_index().sort_values("high")
            # Presets often coincide where the band does not bind: earlier ones are drawn wider, so
            # each shows as a rim around the ones drawn over it.
            rim = (len(names) - 1 - names.index(name)) / max(len(names) - 1, 1)
            width = plt_linewidth(style) * (1 + 1.6 * rim)
            for m, metric in enumerate(metrics):
                ax = grid.ax(f, m)
                ax.plot(stats["high"], stats[metric], color=lk.color, linestyle=lk.linestyle, marker=lk.marker,
                        markersize=3.0 + 2.5 * rim, linewidth=width, label=name, gid="series")
                if metric == "bias_norm" and len(stats) > 1:
                    lo, hi = _ci(stats)
                    if lo is not None:
                        ax.fill_between(stats["high"], lo, hi, color=lk.color, alpha=0.12, linewidth=0, gid="band")
                if metric == "mse" and multi.get(name, 0) > 1 and stats["mse"].notna().any():
                    best = stats.loc[stats["mse"].idxmin()]
                    ax.plot([best["high"]], [best["mse"]], linestyle="none", marker="*", markersize=10,
                            markerfacecolor=lk.color, markeredgecolor="black", markeredgewidth=0.6, gid="best",
                            zorder=5)
    highs = pr["high"].astype(float)
    log_x = (highs > 0).all() and highs.max() / max(highs.min(), 1e-300) >= 8
    for f in range(len(fs)):
        for m, metric in enumerate(metrics):
            ax = grid.ax(f, m)
            vals = pr[metric].astype(float)
            vals = vals[np.isfinite(vals)]
            if log_x:
                ax.set_xscale("log")
            if len(vals) and (vals > 0).all() and vals.max() / vals.min() >= 20:
                ax.set_yscale("log")
    grid.label(_label(style, r"upper threshold $\rho_{\max}$ of the band (high)", r"upper threshold $\rho_{\max}$"),
               [ylabels[m] for m in metrics], [fc.label for fc in fs])
    extra = []
    if "mse" in metrics and (multi > 1).any():
        extra.append((Line2D([], [], linestyle="none", marker="*", markersize=9, markerfacecolor="0.6",
                             markeredgecolor="black", markeredgewidth=0.6), "lowest MSE of the preset"))
    handles, labels = _legend_for(names, marker=True, extra=extra)
    if "nonfinite_rate" in pr.columns:  # a NaN/inf estimate leaves gaps: say so where the name is
        worst = pr.groupby("preset")["nonfinite_rate"].max()
        def tag(lab):
            w = float(worst.get(lab, 0) or 0)
            if w >= 1:
                return f"{lab} (NaN/inf in every batch: not drawn)"
            return f"{lab} (NaN/inf in up to {100 * w:.2g}% of batches)" if w > 0 else lab
        labels = [tag(lab) for lab in labels]
    level = pr["ci_level"].iloc[0] if "ci_level" in pr.columns else None
    note = ""
    if "bias_norm_ci" in pr.columns or "bias_norm_lo" in pr.columns:
        note = f"bias band: {fmt_value(float(level) * 100) + '% ' if level is not None else ''}CI"
    return grid.finish(TITLES["threshold"], ds, handles, labels, _notes(note, fs.note))


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


def plt_linewidth(style: str) -> float:
    return float(st.rc(style)["lines.linewidth"])


def _as_float(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


# ----------------------------------------------------------------------------------------- mismatch
def mismatch_figure(ds: Dataset, style: str = "default"):
    with st.using(style):
        return _mismatch(ds, style)


def _token_groups(ds: Dataset, tokens) -> tuple[str | None, list]:
    """Split tokens by the swept key that changes the engine (precision first), else one group."""
    prefer = ["mismatch.precision", "mismatch", "precision", "mismatch.logit_noise", "mismatch.staleness",
              "mismatch.outlier_rate"]
    keys = [k for k in prefer if k in ds.swept and k in tokens.columns]
    keys += [k for k in ds.swept if k not in keys and k not in SEED_KEYS and k in tokens.columns]
    if not keys:
        return None, [("all tokens", tokens)]
    key = keys[0]
    groups = [(f"{key}={fmt_value(v)}", g) for v, g in tokens.groupby(key, sort=True)]
    return key, groups[:MAX_GROUPS]


def _mismatch(ds: Dataset, style: str):
    from matplotlib.lines import Line2D

    tok = ds.tokens
    old = tok["old"].to_numpy(dtype=float)
    roll = tok["roll"].to_numpy(dtype=float)
    ok = np.isfinite(old) & np.isfinite(roll)
    tok = tok[ok]
    key, groups = _token_groups(ds, tok)
    paper = style == "paper"
    grid = Grid(1, 3, style, row_height=1.6 if paper else 3.1, sharex=False, sharey=False)
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
    beyond_total = 0
    pt_min = 1.0
    for i, (label, g) in enumerate(groups):
        color = st.group_color(i) if len(groups) > 1 else "#0072B2"
        lr = (g["old"] - g["roll"]).to_numpy(dtype=float)
        beyond = np.abs(lr) > R
        beyond_total += int(beyond.sum())
        counts, _ = np.histogram(lr[~beyond], bins=edges)
        ax_h.stairs(np.where(counts > 0, counts, np.nan), edges, color=color, linewidth=1.2, gid="series",
                    label=label, baseline=None)
        p_t, p_r = np.exp(g["old"].to_numpy(dtype=float)), np.exp(g["roll"].to_numpy(dtype=float))
        pt_min = min(pt_min, float(np.min(p_t)) if len(p_t) else 1.0)
        idx = np.arange(len(g))
        if len(idx) > MAX_SCATTER:
            idx = rng.choice(idx, MAX_SCATTER, replace=False)
        ax_s.scatter(np.clip(p_t[idx], floor, 1), np.clip(p_r[idx], floor, 1), s=4 if not paper else 2, alpha=0.35,
                     color=color, linewidths=0, gid="series", rasterized=True, label=label)
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
    if symlog:
        ax_h.set_xscale("symlog", linthresh=c, linscale=0.5)
        # Decade ticks from 10·c outwards (ticks inside the linear region collide around 0).
        decades = 10.0 ** np.arange(math.ceil(math.log10(c)) + 1, math.floor(math.log10(R)) + 1)
        ax_h.set_xticks([*(-decades[::-1]), 0.0, *decades])
        ax_h.minorticks_off()
    if beyond_total:
        ax_h.text(0.02, 0.97, f"not shown: {beyond_total:,} token(s)\nbeyond ±{R:.2g} nats",
                  transform=ax_h.transAxes, va="top", ha="left", fontsize="small", color="0.3", zorder=6,
                  bbox=dict(facecolor="white", edgecolor="none", alpha=0.85, pad=1.5))
    lo = max(min(pt_min, 1.0) * 0.5, floor)
    for ax in (ax_s,):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.plot([floor, 1], [floor, 1], color="0.4", linestyle="--", linewidth=0.8, gid="diagonal")
        ax.set_xlim(lo, 1.5)
        clipped = int((tok["roll"] < math.log(floor)).sum())
        ax.set_ylim(floor * 0.5 if (tok["roll"] < math.log(lo)).any() else lo, 1.5)
        if clipped:
            ax.text(0.97, 0.03, f"{clipped:,} token(s) with $p_{{\\mathrm{{rollout}}}} < 10^{{-8}}$\ndrawn at $10^{{-8}}$",
                    transform=ax.transAxes, va="bottom", ha="right", fontsize="small", color="0.3", zorder=6,
                    bbox=dict(facecolor="white", edgecolor="none", alpha=0.85, pad=1.5))
    ax_b.set_xscale("log")
    if ax_b.get_lines() and all(np.nanmin(line.get_ydata()) > 0 for line in ax_b.get_lines()
                                if len(line.get_ydata())):
        ax_b.set_yscale("log")
    ax_h.set_xlabel(r"log-ratio $\log \pi_{\mathrm{train}} - \log \pi_{\mathrm{rollout}}$ (nats"
                    + (", symlog)" if symlog else ")"))
    ax_h.set_ylabel("tokens (count)")
    ax_s.set_xlabel(r"$p_{\mathrm{train}}$ (trainer, fp32)")
    ax_s.set_ylabel(r"$p_{\mathrm{rollout}}$ (engine)")
    ax_b.set_xlabel(r"token probability $p_{\mathrm{train}}$ (log bins)")
    ax_b.set_ylabel(r"$|p_{\mathrm{train}} - p_{\mathrm{rollout}}|$ (probability)")
    handles += [Line2D([], [], color="0.3", linestyle=":"), Line2D([], [], color="0.4", linestyle="--")]
    labels += ["|Δp| per bin: median (solid), 90th pct. (dotted)", "p_rollout = p_train"]
    note = f"{len(tok):,} tokens" + (f", by {key}" if key else "")
    return grid.finish(TITLES["mismatch"], ds, handles, labels, note)


# ----------------------------------------------------------------------------------------- masking
def masking_figure(ds: Dataset, style: str = "default"):
    with st.using(style):
        return _masking(ds, style)


def _masking(ds: Dataset, style: str):
    df = ds.metrics
    metrics = ("token_masked_fraction", "clamped_fraction", "ess")
    ylabels = ("masked tokens (fraction)", "clamped tokens (fraction)", "ESS (fraction of tokens)") if style != "paper" \
        else ("masked (frac.)", "clamped (frac.)", "ESS (frac.)")
    per = df.groupby(["job", "step"], sort=False).agg(
        correction=("correction", "first"), **{m: (m, "mean") for m in metrics}).reset_index()
    fs = facets(ds, df)
    names = _ordered(per["correction"].unique())
    grid = Grid(len(fs), 3, style, row_height=(1.25 if style == "paper" else None))
    bands = _bands(per, fs, "step", metrics)
    for f in range(len(fs)):
        for name in names:
            stats = bands.get((f, name))
            if stats is None:
                continue
            kw = _line_kwargs(name)
            for m, metric in enumerate(metrics):
                ax = grid.ax(f, m)
                _mean_and_band(ax, stats, metric, kw, alpha=0.15)
    for f in range(len(fs)):
        for m in range(3):
            ax = grid.ax(f, m)
            lo, hi = ax.get_ylim()
            ax.set_ylim(max(lo, -0.03), min(max(hi, 0.05), 1.03))
    grid.label(_step_label(style), list(ylabels), [fc.label for fc in fs])
    handles, labels = _legend_for(names)
    return grid.finish(TITLES["masking"], ds, handles, labels, _notes(_seed_note(per, fs), fs.note))


# ----------------------------------------------------------------------------------------- render
FIGURES: dict[str, Callable] = {
    "training": training_figure,
    "grad-norm": grad_norm_figure,
    "stability": stability_figure,
    "threshold": threshold_figure,
    "mismatch": mismatch_figure,
    "masking": masking_figure,
}


def figure(kind: str, ds: Dataset, style: str = "default"):
    if kind not in FIGURES:
        raise UserError(f"unknown --kind {kind!r}; valid: {', '.join(KINDS)}")
    return FIGURES[kind](ds, style)


def save(fig, out_dir: Path, name: str, style: str = "default", formats: Sequence[str] = ("png", "pdf")) -> list[Path]:
    """Write NAME.png (150 dpi) and NAME.pdf; returns the paths."""
    out_dir = Path(out_dir)
    paths = []
    with st.using(style):
        for i, ext in enumerate(formats):
            path = out_dir / f"{name}.{ext}"
            try:
                fig.savefig(path, dpi=150)
            except OSError as exc:
                raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None
            if i == 0:  # the layout is solved: later formats reuse it instead of solving it again
                fig.set_layout_engine("none")
            paths.append(path)
    return paths


def ensure_dir(out_dir: Path) -> Path:
    """Create `out_dir` and prove it is writable; a one-line UserError otherwise."""
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".is-study-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise UserError(f"cannot write to --out {out_dir}: {exc.strerror or exc}") from None
    return out_dir


def choose(ds: Dataset, kinds: Sequence[str] | None) -> tuple[list[str], dict[str, str]]:
    """The kinds to draw and, for the ones left out, why. An explicit kind that cannot be drawn, or
    nothing drawable at all, is a UserError."""
    for k in kinds or ():
        if k not in FIGURES:
            raise UserError(f"unknown --kind {k!r}; valid: {', '.join(KINDS)}")
    avail = availability(ds)
    if kinds:
        for k in kinds:
            if avail[k] is not None:
                raise UserError(f"--kind {k}: {avail[k]}")
        return list(dict.fromkeys(kinds)), {}
    chosen = [k for k in KINDS if avail[k] is None]
    if not chosen:
        raise UserError(f"{ds.path}: nothing to plot (" + "; ".join(f"{k}: {r}" for k, r in avail.items()) + ")")
    return chosen, {k: r for k, r in avail.items() if r is not None}


def render(ds: Dataset, out_dir: Path, kinds: Sequence[str] | None = None, style: str = "default",
           formats: Sequence[str] = ("png", "pdf")) -> tuple[dict[str, list[Path]], dict[str, str]]:
    """Draw and save; returns ({kind: [files]}, {skipped kind: reason})."""
    st.rc(style)  # validates the style name
    chosen, skipped = choose(ds, kinds)
    out_dir = ensure_dir(out_dir)
    written = {}
    for kind in chosen:
        fig = figure(kind, ds, style)
        written[kind] = save(fig, out_dir, kind, style, formats)
    return written, skipped
