"""The figures. Each `*_figure(ds, style)` takes a `Dataset` (analysis.load) and returns a
matplotlib `Figure` (no pyplot, no global backend state: a `Figure` saves through Agg), so tests can
inspect axes, labels and lines before anything is written; `render` saves PNG (150 dpi) and PDF.

Kinds (`is-study plot --kind`):

    training    objective J(θ) and batch reward against step, one line per correction: mean ± 1 s.d.
                over seeds; NaN/inf updates marked under the data
    grad-norm   ‖∇L‖ before clipping against step, log scale: median over seeds (shaded: min–max),
                spikes (> 5× the trailing median) marked, NaN/inf gradients on the top edge and exactly
                zero gradients (every token rejected) on the bottom edge
    stability   nonfinite-update rate and collapse rate against mismatch staleness, one line per
                correction (needs ≥ 2 staleness values: a sweep)
    presets     probe results at one band per preset (the default probe): bias (95% CI), variance and
                relative MSE per preset, degenerate arms hollow and named
    threshold   probe results at several bands: bias (CI shaded), variance and relative MSE against
                the band's upper threshold, one line per preset; the lowest relative MSE of each preset
                starred, never at a degenerate arm
    mismatch    tokens.csv: histogram of log-ratios (off-scale tails drawn at the edges and counted),
                p_rollout against p_train, |Δp| binned by p
    masking     masked and clamped token fractions and the ESS against step (ESS of NaN/inf weights is
                a gap with a mark, not 0)

The field's figures (analysis/field_figures.py, drawn from the same data):

    mismatch-over-training  kl_k3, χ² per token, max|Δp| and the policy's entropy against step, one line
                per engine precision (Qi et al. 2025, Fig. 3)
    survival    the fraction of seeds not yet collapsed against step, one line per correction, one
                panel per mismatch setting; below, ESS and grad norm in the steps before each
                collapse, aligned on its collapse step
    bias-split  a probe sweep over the response length T: the direction (cosine of E ĝ to ∇J), the
                size (‖E ĝ‖ / ‖∇J‖) and the relative bias of each preset's gradient against T
    length-heatmap  a train sweep over T × correction: final J and the collapse rate per cell

A sweep's other swept keys (everything but the correction and the seed) become small multiples,
one panel per combination. Panels that show nothing (masking: nothing masked or clamped, ESS ≈ 1) are
named in one line instead; when a figure holds fewer panels than there are (the paper style), it keeps
those where the corrections differ most (`arm_spread`, `keep_differing`) and names the others; a
figure whose every line would be flat is skipped by the default choice (`flat_reasons`). Data lines carry gid="series"; markers and shaded areas carry other gids.

Two styles: `default` (for a screen: the kind and the config in the title, the legend on the right)
and `paper` (3.3 in, one column of a two-column paper, or 7 in, both columns, when the panels need
it; at most 3 rows of panels; STIX text; the config goes into the files' metadata, and the title
line keeps only what a reader needs to read the panels, e.g. "mean ± 1 s.d. over 3 seeds").
Lines that coincide exactly are drawn as rims (the one underneath wider) with markers, and the
title says which.
"""

from __future__ import annotations

import math
import re
import textwrap
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from analysis import style as st
from analysis import zero_grad
from analysis.load import DEGENERATE_RULE, Dataset, describe, fmt_value, per_job, probe_frame, update_rows
from runner.errors import UserError

# The base kinds; analysis/figures.py adds the field's (analysis/field_figures.py) and dispatches.
KINDS = ("training", "grad-norm", "stability", "presets", "threshold", "mismatch", "masking")
TITLES = {
    "training": "Training curves",
    "grad-norm": "Gradient-norm traces",
    "stability": "Stability against staleness",
    "presets": "Bias, variance and MSE per preset (probe)",
    "threshold": "Threshold trade-off (probe)",
    "mismatch": "Training–inference mismatch",
    "masking": "Masking over time",
    "mismatch-over-training": "Training–inference mismatch over training",
    "survival": "Survival: seeds not yet collapsed",
    "bias-split": "Bias split into direction and size, against the response length (probe)",
    "length-heatmap": "Response length × correction",
    "threshold-training": "Threshold trade-off (training): outcomes against the band",
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
LEGEND_WIDTH = 2.6  # inches the default style keeps on the right for the legend (finish() then fits it)
LEGEND_CHAR = 0.068  # inches a legend character takes in the default style (8.5 pt)
TITLE_CHARS_PER_INCH = 10.5  # of the default style's title (9.5 pt DejaVu Sans)
CONFIG_LINES = 2  # lines of config in a default-style title at most
ONE_ROW_MIN_WIDTH = 6.8  # inches: a single panel with its legend below keeps the width it had with the legend beside
LINE_HEIGHT = {"default": 0.19, "paper": 0.125}  # inches per line of title or legend text


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
    items: list[tuple[str, object]] = field(default_factory=list)  # (key, value) pairs

    def title(self, style: str) -> str:
        """The panel title; the paper style names a key by its last part (staleness=8)."""
        if style != "paper":
            return self.label
        return ", ".join(f"{k.rsplit('.', 1)[-1]}={fmt_value(v)}" for k, v in self.items)


class Facets(list):
    """The facets drawn; `total` counts them all (at most `limit` are drawn). `left_out` and `why`:
    the facets a figure chose not to draw (see `keep_differing` and `drop_flat`), and why, in words."""

    total: int = 0
    left_out: list = []
    why: str = ""
    flat: list = []
    flat_why: str = ""

    @property
    def note(self) -> str:
        parts = []
        if self.flat:
            parts.append(f"{_count(len(self.flat), 'panel')} left out, {self.flat_why}: {_facet_list(self.flat)}")
        if self.left_out:
            parts.append(f"{len(self)} of {self.total} panels drawn, {self.why}; "
                         f"left out: {_facet_list(self.left_out)}")
        elif self.total > len(self) + len(self.flat):
            parts.append(f"first {len(self)} of {self.total} panels")
        return " · ".join(parts)


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def _facet_list(fs: Sequence[Facet], most: int = 8) -> str:
    """'band=loose, staleness=0; band=mid, staleness=0' (keys by their last part), or 'the other 23'
    when there are more than `most`."""
    names = [f.title("paper") or "the only panel" for f in fs]
    return "; ".join(names) if len(names) <= most else f"the other {len(names)}"


def _copy_facets(fs: Facets, keep: Sequence[int]) -> Facets:
    out = Facets(fs[i] for i in keep)
    out.total, out.left_out, out.why, out.flat, out.flat_why = fs.total, list(fs.left_out), fs.why, list(fs.flat), \
        fs.flat_why
    return out


def arm_spread(frame, fs: Sequence[Facet], cols: Sequence[str], arm: str = "correction", x: str = "step") -> list[float]:
    """Per facet, how far apart its arms are: the largest gap, at any x, between two arms' means over
    seeds, as a fraction of that metric's range over the whole figure (the largest over `cols`).
    0 for a facet with one arm."""
    facet_of = {j: i for i, fc in enumerate(fs) for j in fc.jobs}
    framed = frame.assign(_facet=frame["job"].map(facet_of)).dropna(subset=["_facet"])
    means = framed.groupby(["_facet", arm, x], sort=False)[list(cols)].mean()
    gaps = means.groupby(level=["_facet", x]).agg(lambda s: s.max() - s.min()).groupby(level="_facet").max()
    out = np.zeros(len(fs))
    for col in cols:
        span = float(means[col].max() - means[col].min())
        if span > 0 and np.isfinite(span):
            for f, gap in gaps[col].items():
                if np.isfinite(gap):
                    out[int(f)] = max(out[int(f)], float(gap) / span)
    return out.tolist()


def keep_differing(fs: Facets, scores: Sequence[float], limit: int, arms: str = "corrections",
                   what: str = "") -> Facets:
    """At most `limit` facets: the ones whose arms differ most (`scores`, from arm_spread), in their
    order; the note names the others and how close their arms are."""
    if len(fs) <= limit:
        return fs
    order = sorted(range(len(fs)), key=lambda i: (-scores[i], i))
    if any(scores):  # a cut never spends a panel on arms that coincide while others differ
        order = [i for i in order if scores[i] > 0] + [i for i in order if scores[i] <= 0]
        limit = min(limit, sum(1 for v in scores if v > 0))
    keep, drop = sorted(order[:limit]), sorted(order[limit:])
    out = _copy_facets(fs, keep)
    out.left_out = [fs[i] for i in drop]
    worst = max(scores[i] for i in drop)
    out.why = (f"those where the {arms} differ most{' in ' + what if what else ''} (elsewhere their lines "
               + ("coincide)" if worst == 0 else f"are within {_pct(worst)} of the axis of each other)"))
    return out


def keep_distinct(fs: Facets, profiles: Sequence[Sequence[float]], limit: int, what: str = "") -> Facets:
    """At most `limit` facets, for panels of one line each (nothing to compare within a panel): the
    ones most unlike each other. The first is the one with the largest first value (e.g. the largest
    KL), then each next the farthest from those kept (every value scaled by its range over the facets)."""
    if len(fs) <= limit:
        return fs
    p = np.asarray(profiles, dtype=float)
    span = np.ptp(p, axis=0)
    p = (p - p.min(axis=0)) / np.where(span > 0, span, 1.0)
    keep = [int(np.argmax(p[:, 0]))]
    while len(keep) < limit:
        dist = np.min(np.linalg.norm(p[:, None, :] - p[None, keep, :], axis=2), axis=1)
        dist[keep] = -1
        keep.append(int(np.argmax(dist)))
    keep = sorted(keep)
    out = _copy_facets(fs, keep)
    out.left_out = [fc for i, fc in enumerate(fs) if i not in keep]
    out.why = f"the ones most unlike each other{' ' + what if what else ''}"
    return out


def _pct(fraction: float) -> str:
    pct = 100 * float(fraction)
    return "0" if pct == 0 else f"{pct:.2g}%" if pct < 10 else f"{pct:.0f}%"


def drop_flat(fs: Facets, flat: Sequence[bool], why: str) -> Facets:
    """The facets that show something: those marked `flat` are named in one line of the note
    instead of drawn (unless every facet is flat: then they stay, and say it themselves)."""
    if not any(flat) or all(flat):
        return fs
    out = _copy_facets(fs, [i for i, f in enumerate(flat) if not f])
    out.flat = [fc for fc, f in zip(fs, flat) if f]
    out.flat_why = why
    return out


def facets(ds: Dataset, frame, exclude: Sequence[str] = (), limit: int | None = MAX_FACETS,
           by_correction: bool = False) -> Facets:
    """One facet per combination of the swept keys other than seed and `exclude`, and other than the
    correction unless `by_correction` (a figure whose lines are something else, e.g. precision)."""
    skip = set(SEED_KEYS) | set(exclude) | (set() if by_correction else set(CORRECTION_KEYS))
    keys = [k for k in ds.swept if k not in skip and k in frame.columns]
    out = Facets()
    if not keys:
        out.append(Facet("", sorted(frame["job"].unique().tolist())))
    else:
        per = frame.drop_duplicates("job")[["job", *keys]]
        for values, grp in per.groupby(keys, sort=True, dropna=False):
            values = values if isinstance(values, tuple) else (values,)
            label = ", ".join(f"{k}={fmt_value(v)}" for k, v in zip(keys, values))
            out.append(Facet(label, grp["job"].tolist(), list(zip(keys, values))))
    out.total = len(out)
    if limit is not None:
        del out[limit:]
    return out


def _notes(*parts: str) -> str:
    return " · ".join(p for p in parts if p)


class Grid:
    """Panels: metrics × facets.

    One facet: the metrics side by side (the paper style stacks one or two and puts three side by
    side at the double-column width). Several facets: a block of metric rows per line of facets, at
    most 4 facets a line. The paper style is 3.3 in wide for one or two columns and 7 in beyond, and
    never more than 3 rows: `capacity` says how many facets fit."""

    def __init__(self, n_facets: int, n_metrics: int, style: str, row_height: float | None = None,
                 sharey: bool = True, sharex: bool = True):
        self.style = style
        self.paper = style == "paper"
        self.sharey = sharey and n_facets > 1
        self.n_facets, self.n_metrics = n_facets, n_metrics
        if n_facets == 1:
            side_by_side = not self.paper or n_metrics >= 3
            self.ncols, self.nrows = (n_metrics, 1) if side_by_side else (1, n_metrics)
        else:
            blocks = math.ceil(n_facets / st.PAPER_MAX_COLS)
            self.ncols = math.ceil(n_facets / blocks)  # balanced: 5 -> 3 + 2
            self.nrows = blocks * n_metrics
        if self.paper:
            width = st.PAPER_WIDTH if self.ncols <= 2 else st.PAPER_DOUBLE_WIDTH
            height = self.nrows * (row_height or (1.45 if self.ncols == 1 else 1.3))
        else:
            panel_w, panel_h = (st.DEFAULT_PANEL if n_facets > 1 else (4.2, 3.0))
            width = panel_w * self.ncols + LEGEND_WIDTH
            row = row_height or panel_h
            if self.nrows > 3:  # many rows: less height each (down to 1.5 in), so the figure stays on a screen
                row = max(1.5, min(row, 11.0 / self.nrows))
            height = self.nrows * row
        self.fig = _new_figure((width, height), style)
        self.fig._is_study_legend_room = 0.0 if self.paper else LEGEND_WIDTH
        self.fig._is_study_facets = n_facets
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

    @staticmethod
    def capacity(style: str, n_metrics: int) -> int:
        """How many facets a figure of this style draws."""
        if style != "paper":
            return MAX_FACETS
        return st.PAPER_MAX_COLS * max(1, st.PAPER_MAX_ROWS // max(n_metrics, 1))

    def pos(self, f: int, m: int) -> tuple[int, int]:
        if self.n_facets == 1:
            return (0, m) if self.ncols == self.n_metrics else (m, 0)
        return ((f // self.ncols) * self.n_metrics + m, f % self.ncols)

    def ax(self, f: int, m: int):
        r, c = self.pos(f, m)
        return self.axes[r][c]

    def metric_axes(self, m: int) -> list:
        return [self.ax(f, m) for f in range(self.n_facets)]

    def label(self, xlabels: Sequence[str] | str, ylabels: Sequence[str], fs: Sequence[Facet] = ()):
        """x labels on the lowest panel of each column, y labels on the first column, facet titles."""
        if isinstance(xlabels, str):
            xlabels = [xlabels] * self.n_metrics
        lowest: dict[int, int] = {}
        for f in range(self.n_facets):
            for m in range(self.n_metrics):
                r, c = self.pos(f, m)
                lowest[c] = max(lowest.get(c, -1), r)
        side_by_side = self.n_facets == 1 and self.ncols == self.n_metrics
        for f in range(self.n_facets):
            for m in range(self.n_metrics):
                ax = self.ax(f, m)
                r, c = self.pos(f, m)
                if side_by_side or len(set(xlabels)) > 1 or lowest[c] == r:
                    ax.set_xlabel(xlabels[m])
                elif m != self.n_metrics - 1:  # tick labels on the last metric row of every block
                    ax.tick_params(labelbottom=False)
                if c == 0 or side_by_side:
                    ax.set_ylabel(_fit(ylabels[m], self.fig.get_figheight() / self.nrows - 0.2, self.paper))
                elif self.sharey:  # the same scale as the first column's: its numbers say it once
                    ax.tick_params(labelleft=False)
                if fs and fs[f].label and m == 0:
                    panel_w = (self.fig.get_figwidth() - (0 if self.paper else LEGEND_WIDTH)) / self.ncols
                    ax.set_title(_fit(fs[f].title(self.style), panel_w - 0.3, self.paper), fontsize="medium")

    def finish(self, title: str, ds: Dataset, handles, labels, note: str = ""):
        finish(self.fig, title, ds, handles, labels, self.paper, note)
        return self.fig


def _visible_length(text: str) -> int:
    """Characters as drawn: a TeX command (\\theta) is one glyph; $, braces, ^ and _ are none."""
    return len(re.sub(r"[${}^_]", "", re.sub(r"\\[A-Za-z]+\s?", "x", text)))


def _fit(text: str, inches: float, paper: bool) -> str:
    """Wrap a panel title to its panel's width, or a y label to its height (about half an em a
    character), at spaces outside maths ($J(\\theta)$ stays whole)."""
    chars = max(int(inches * 72 / ((8 if paper else 10) * 0.5)), 12)
    if "$" not in text:
        return textwrap.fill(text, chars, break_long_words=False, break_on_hyphens=False)
    words, depth, cur = [], 0, ""
    for ch in text:
        if ch == "$":
            depth ^= 1
        if ch == " " and not depth:
            words.append(cur)
            cur = ""
        else:
            cur += ch
    words.append(cur)
    lines = [""]
    for w in words:
        joined = f"{lines[-1]} {w}" if lines[-1] else w
        if lines[-1] and _visible_length(joined) > chars:
            lines.append(w)
        else:
            lines[-1] = joined
    return "\n".join(lines)


def _new_figure(size: tuple[float, float], style: str):
    """A constrained-layout Figure that remembers its style (the finishing steps depend on it)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    fig._is_study_style = style
    return fig


def _is_paper(fig) -> bool:
    return getattr(fig, "_is_study_style", "default") == "paper"


# ----------------------------------------------------------------------------------------- finishing
def _tidy_log_axes(fig) -> None:
    """Log axes: label only the decades when two or more are in view; otherwise label 2× and 5×
    as well (matplotlib's default labels every minor tick there, and they pile up)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogFormatterSciNotation, LogLocator, NullFormatter

    for ax in fig.axes:
        for axis, scale, lim in ((ax.yaxis, ax.get_yscale(), ax.get_ylim()), (ax.xaxis, ax.get_xscale(), ax.get_xlim())):
            lo, hi = sorted(lim)
            if scale != "log" or lo <= 0:
                continue
            if isinstance(axis.get_major_locator(), FixedLocator) or isinstance(axis.get_major_formatter(), FuncFormatter):
                continue  # the figure chose its ticks
            decades = math.floor(math.log10(hi)) - math.ceil(math.log10(lo)) + 1
            if decades >= 2:
                axis.set_minor_formatter(NullFormatter())
                if decades > 4:  # every other decade on a narrow panel
                    axis.set_major_locator(LogLocator(base=10, numticks=4 if _is_paper(fig) else 7))
            else:
                axis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
                axis.set_minor_formatter(LogFormatterSciNotation(labelOnlyBase=False, minor_thresholds=(10, 10)))


def _tidy_linear_ticks(fig) -> None:
    """Linear axes: as many ticks as the panel's width holds (about one per 0.45 in in the paper
    style), so that tick labels never touch."""
    from matplotlib.ticker import FixedLocator, MaxNLocator

    paper = _is_paper(fig)
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        if ax.get_xscale() == "linear" and not isinstance(ax.xaxis.get_major_locator(), FixedLocator):
            width = fig.get_figwidth() * ax.get_position().width
            ax.xaxis.set_major_locator(MaxNLocator(nbins=max(int(width / (0.45 if paper else 0.6)), 3),
                                                   steps=[1, 2, 2.5, 5, 10]))
        if ax.get_yscale() == "linear" and not isinstance(ax.yaxis.get_major_locator(), FixedLocator):
            height = fig.get_figheight() * ax.get_position().height
            ax.yaxis.set_major_locator(MaxNLocator(nbins=max(int(height / (0.3 if paper else 0.4)), 3)))


def _on_scale(ax, y: np.ndarray) -> np.ndarray:
    """y as the axis draws it (log10 on a log axis), so 'the same' means the same on screen."""
    if ax.get_yscale() in ("log", "symlog"):
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log10(np.where(y > 0, y, np.nan))
    return y


def _same_data(ax, a, b, tolerance: float) -> bool:
    """a and b share x and, at every point, lie within `tolerance` of each other on the axis's scale
    (NaN where the other is NaN): one hides the other."""
    xa, xb = np.asarray(a.get_xdata(), dtype=float), np.asarray(b.get_xdata(), dtype=float)
    ya = _on_scale(ax, np.asarray(a.get_ydata(), dtype=float))
    yb = _on_scale(ax, np.asarray(b.get_ydata(), dtype=float))
    if xa.shape != xb.shape or ya.shape != yb.shape or not np.isfinite(ya).any():
        return False
    if not np.array_equal(xa, xb, equal_nan=True) or not np.array_equal(np.isnan(ya), np.isnan(yb)):
        return False
    ok = np.isfinite(ya)
    return bool(np.all(np.abs(ya[ok] - yb[ok]) <= tolerance))


def distinguish_identical(fig) -> Counter:
    """Lines that coincide (within 1% of the panel's range at every point, on its scale) hide
    each other. Per panel, the lines of each such group are drawn as rims (the one underneath
    widest) and all but the first get their preset's markers, staggered. Returns
    {(first, other): panels}."""
    pairs: Counter = Counter()
    for ax in fig.axes:
        lines = [ln for ln in ax.get_lines() if ln.get_gid() == "series"]
        values = np.concatenate([_on_scale(ax, np.asarray(ln.get_ydata(), dtype=float)) for ln in lines]) \
            if lines else np.array([])
        values = values[np.isfinite(values)]
        tolerance = 0.01 * (values.max() - values.min()) if len(values) else 0.0
        groups: list[list] = []
        for ln in lines:
            for g in groups:
                if _same_data(ax, g[0], ln, tolerance):
                    g.append(ln)
                    break
            else:
                groups.append([ln])
        for g in groups:
            if len(g) < 2:
                continue
            n = len(g)
            points = len(g[0].get_xdata())
            every = max(points // 8, 1)
            size = 2.8 if _is_paper(fig) else 3.5
            for rank, ln in enumerate(g):
                ln.set_linewidth(ln.get_linewidth() * (1 + 0.8 * (n - 1 - rank) / (n - 1)))
                if rank:
                    ln.set_marker(st.look(ln.get_label()).marker)
                    ln.set_markersize(size)
                    ln.set_markevery((min(rank * every // n, points - 1), every) if points > 1 else None)
                    pairs[(g[0].get_label(), ln.get_label())] += 1
    return pairs


def _identical_note(pairs: Counter, panels: int) -> str:
    """Which lines coincide: 'tis = none' (tis drawn with markers over none)."""
    if not pairs:
        return ""
    shown = [f"{b} = {a}" + ("" if n == panels else f" ({n} panel{'s' if n != 1 else ''})")
             for (a, b), n in list(pairs.items())[:4]]
    more = f", +{len(pairs) - 4} more" if len(pairs) > 4 else ""
    return "markers: a line on top of another: " + ", ".join(shown) + more


def finish(fig, title: str, ds: Dataset, handles, labels, paper: bool, note: str = "", config: str | None = None,
           legend_below: bool = False):
    """The title, one legend outside the axes, and the figure's height grown to hold them.

    Default style: the kind, the config it came from and the notes. Paper style: the notes only (the
    kind and the config go into the files' metadata; the caption is the paper's)."""
    _tidy_log_axes(fig)
    _tidy_linear_ticks(fig)
    panels = sum(1 for ax in fig.axes if ax.get_visible())
    pairs = distinguish_identical(fig)
    marked = {b for _, b in pairs}
    for h, lab in zip(handles, labels):
        if lab in marked and hasattr(h, "set_marker"):
            h.set_marker(st.look(lab).marker)
            h.set_markersize(3.5)
    note = _notes(note, _identical_note(pairs, panels))
    config = describe(ds) if config is None else config
    fig._is_study_meta = {"Title": title, "Subject": config}
    style = "paper" if paper else "default"
    width = fig.get_figwidth()
    grow = 0.0
    room = getattr(fig, "_is_study_legend_room", 0.0)  # inches the figure kept on the right for a legend
    if not paper and room:
        if legend_below or getattr(fig, "_is_study_facets", 2) <= 1 or not handles:
            # One facet (a single run): a legend beside its panels took a third of the width; below, one
            # line. A single narrow panel keeps some of the room, for the title and the legend's entries.
            legend_below = True
            width = max(width - room, min(width, ONE_ROW_MIN_WIDTH))
        else:  # as wide as its longest entry needs, no wider than the room kept
            width += min(max(len(str(lab)) for lab in labels) * LEGEND_CHAR + 0.8, room) - room
    if paper:
        text = note
        if text:
            wrapped = textwrap.fill(text, width=max(int(width * 19), 40), break_on_hyphens=False)
            fig.suptitle(wrapped, fontsize=6.5, x=0.01, ha="left", color="0.2")
            grow += (wrapped.count("\n") + 1) * LINE_HEIGHT[style] + 0.08
    else:
        # The title: the kind, then the config on one line (in full in the files' metadata), then the
        # notes; wrapped to the panels' width (the legend on the right starts at the top, beside it).
        legend_w = 0.0 if legend_below or not handles else width - (fig.get_figwidth() - room)
        chars = max(int((width - legend_w) * TITLE_CHARS_PER_INCH), 40)
        config_lines = textwrap.wrap(config, width=chars, break_long_words=True, break_on_hyphens=False) or [""]
        if len(config_lines) > CONFIG_LINES:  # the rest is in the files' metadata
            config_lines = config_lines[:CONFIG_LINES]
            config_lines[-1] = config_lines[-1][:chars - 1].rstrip() + "…"
        lines = [title, *config_lines]
        if note:
            lines.append(textwrap.fill(note, width=chars, break_long_words=True, break_on_hyphens=False))
        text = "\n".join(lines)
        fig.suptitle(text, fontsize="medium", x=0.01, ha="left")
        grow += (text.count("\n") + 1) * LINE_HEIGHT[style] + 0.15
    if handles:
        if paper or legend_below:
            ncol = _legend_columns(labels, width, 0.048 if paper else 0.075)
            fig.legend(handles, labels, loc="outside lower center", ncol=ncol, handlelength=2.4, columnspacing=1.0)
            grow += math.ceil(len(labels) / ncol) * LINE_HEIGHT[style] + 0.12 + (0 if paper else 0.1)
        else:
            fig.legend(handles, labels, loc="outside right upper", handlelength=3.0)
            need = len(labels) * LINE_HEIGHT[style] + 0.3
            grow += max(need - fig.get_figheight() - grow, 0)
    grow += 0.45 if paper else 0.6  # tick labels and axis labels of the lowest row
    fig.set_size_inches(width, fig.get_figheight() + grow)


def _legend_columns(labels: Sequence[str], width: float, per_char: float = 0.048) -> int:
    """As many columns as the longest label allows (`per_char` inches a character, plus the handle)."""
    longest = max(len(str(lab)) for lab in labels) * per_char + 0.45
    return max(1, min(len(labels), int((width - 0.1) // longest)))


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


def seed_counts(frame, fs: Sequence[Facet] = (), by: Sequence[str] = ()) -> tuple[int, int]:
    """(fewest, most) seeds behind one drawn line (or point): distinct seed values per facet,
    correction and `by`, not jobs (two jobs of one seed that differ in a key pooled into one line
    are one seed)."""
    if "job" not in frame.columns or "correction" not in frame.columns:
        return 0, 0
    facet_of = {j: i for i, fc in enumerate(fs) for j in fc.jobs}
    col = "seed" if "seed" in frame.columns else "job"
    per = (frame.assign(_facet=frame["job"].map(facet_of).fillna(-1))
                .groupby(["_facet", "correction", *by])[col].nunique())
    if per.empty:
        return 0, 0
    return int(per.min()), int(per.max())


def _seeds(low: int, high: int) -> str:
    return f"{high} seed{'s' if high != 1 else ''}" if low == high else f"{low}–{high} seeds"


def _seed_note(frame, fs: Sequence[Facet] = (), what: str = "mean ± 1 s.d.") -> str:
    """'mean ± 1 s.d. over N seeds' when lines average several seeds."""
    low, high = seed_counts(frame, fs)
    return f"{what} over {_seeds(low, high)}" if high > 1 else ""


# ----------------------------------------------------------------------------------------- y ranges
def _series_values(ax) -> np.ndarray:
    vals = [np.asarray(ln.get_ydata(), dtype=float) for ln in ax.get_lines() if ln.get_gid() == "series"]
    vals = np.concatenate(vals) if vals else np.array([])
    return vals[np.isfinite(vals)]


def floor_at_zero(axes: Sequence, top_if_zero: float = 1.0, ceiling: float | None = None, zero_note: str = "") -> None:
    """Axes of a quantity that cannot be negative (a fraction, a norm, a variance) start at 0, never
    below; an all-zero panel shows [0, top_if_zero] with the zero line on the axis, and `zero_note`.
    The data lines are left unclipped so a line at exactly 0 is drawn over the spine."""
    vals = np.concatenate([_series_values(ax) for ax in axes]) if axes else np.array([])
    if len(vals) and vals.min() < 0:
        return
    hi = float(vals.max()) if len(vals) else 0.0
    top = top_if_zero if hi <= 0 else hi * 1.06
    if ceiling is not None:
        top = min(top, ceiling)
    for ax in axes:
        for ln in ax.get_lines():
            if ln.get_gid() == "series":
                ln.set_clip_on(False)
        ax.set_ylim(0.0, top)
        if hi <= 0 and zero_note and len(_series_values(ax)):
            ax.text(0.5, 0.5, zero_note, transform=ax.transAxes, ha="center", va="center", fontsize="small",
                    color="0.35", gid="note")


def hide_negative_ticks(ax) -> None:
    """Tick labels for a quantity that cannot be negative, when room for marks under the data
    stretched the axis below 0: no label below 0."""
    from matplotlib.ticker import FuncFormatter

    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, pos: "" if v < -1e-12 else f"{v:g}"))


# ----------------------------------------------------------------------------------------- availability
def _need_metrics(ds: Dataset, cols: Sequence[str]) -> str | None:
    df = ds.metrics
    if df is None:
        return "no training metrics here (metrics.csv / sweep.csv): it is not a train run or sweep"
    missing = [c for c in cols if c not in df.columns]
    if missing:
        return f"the metrics lack {', '.join(missing)} (log.metrics=false?)"
    return None


def _bands_per_preset(pr) -> "object":
    """Distinct upper thresholds per preset and facet-free (a sweep of probes: per job)."""
    return pr.dropna(subset=["high"]).groupby(["job", "preset"])["high"].nunique()


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
        out["threshold"] = out["presets"] = "no probe results here (probe.csv): run `is-study run study=probe`"
        if ds.metrics is not None:
            out["threshold"] += " (training runs against the band: --kind threshold-training)"
    elif not {"preset", "bias_norm"} <= set(pr.columns):
        out["threshold"] = out["presets"] = "probe.csv lacks preset / bias_norm"
    else:
        rows = pr.groupby(["job", "preset"]).size()
        out["presets"] = None if len(rows) and rows.max() == 1 else (
            "some preset was probed at several bands in one run: see --kind threshold")
        highs = _bands_per_preset(pr) if "high" in pr.columns else None
        out["threshold"] = None if highs is not None and len(highs) and highs.max() >= 2 else (
            "needs several upper thresholds per preset (probe.bands with several [low, high] pairs); "
            "one band per preset: see --kind presets")
    out["mismatch"] = None if ds.tokens is not None else (
        "no tokens.csv here (per-token trainer and rollout log-probs, written by the train study)")
    return out


def flat_reasons(ds: Dataset, avail: dict[str, str | None]) -> dict[str, str]:
    """kind -> why, for the kinds that can be drawn (`avail`) but would show only flat lines: left out
    of the default choice with that reason, drawn when asked for by name."""
    out = {}
    if avail.get("masking") is None:
        df = update_rows(ds.metrics)  # the final row (J after the last update) has no weights
        per = df.groupby(["job", "step"]).agg(
            masked=("token_masked_fraction", "mean"), clamped=("clamped_fraction", "mean"), ess=("ess", "mean"),
            bad=("is_weight_mean", lambda v: bool((~np.isfinite(v.astype(float))).any()))
            if "is_weight_mean" in df.columns else ("ess", lambda v: False))
        if (per["masked"].fillna(0).max() <= FLAT_FRACTION and per["clamped"].fillna(0).max() <= FLAT_FRACTION
                and per["ess"].min() >= 1 - FLAT_FRACTION and not per["bad"].any()):
            out["masking"] = (f"flat in every run: masked and clamped fractions ≤ {FLAT_FRACTION:g}, ESS ≥ "
                              f"{per['ess'].min():.3g} in every step (--kind masking draws it anyway)")
    if avail.get("stability") is None:
        per = per_job(ds)
        if per["nonfinite"].fillna(0).eq(0).all() and per["collapsed"].fillna(0).eq(0).all():
            out["stability"] = (f"no NaN/inf update and no collapse in any of the {len(per)} runs: every line "
                                "would be flat at 0 (--kind stability draws it anyway)")
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
    """Markers in a strip under the data (see _room_for_marks), one row per correction."""
    if len(xs) == 0:
        return
    y = 0.025 + 0.045 * row
    paper = _is_paper(ax.figure)
    ax.plot(xs, np.full(len(xs), y), linestyle="none", marker=marker, color=color, markersize=2.6 if paper else 4,
            markeredgewidth=0.7 if paper else 1.0, transform=ax.get_xaxis_transform(), clip_on=False, gid="events",
            zorder=4)


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
    per = (df.assign(_bad=(df["nonfinite_loss"].fillna(0) + df["nonfinite_grad"].fillna(0)) > 0
                     if "nonfinite_loss" in df.columns else False)
             .groupby(["job", "step"], sort=False)
             .agg(objective=("objective", "first"), reward=("reward", "mean"), bad=("_bad", "max"),
                  correction=("correction", "first"), **({"seed": ("seed", "first")} if "seed" in df.columns else {}),
                  **({"se": ("objective_se", "first")} if "objective_se" in df.columns else {}))
             .reset_index())
    # A Monte Carlo J (the transformer world) wobbles by its standard error: say how much, so that a
    # reader does not take a 0.04 dip for a drop; bars of ±2 s.e. where a line is one run.
    se = per["se"].astype(float) if "se" in per.columns else None
    monte_carlo = se is not None and bool((se > 0).any())
    metrics = ("objective", "reward")
    fs = facets(ds, df, limit=None)
    # A cut keeps the panels where the corrections' J differ most (the batch reward is too noisy to rank by).
    fs = keep_differing(fs, arm_spread(per, fs, ["objective"]), Grid.capacity(style, len(metrics)), what="J")
    names = _ordered(per["correction"].unique())
    grid = Grid(len(fs), 2, style)
    flagged = _ordered(per.loc[per["bad"].astype(bool), "correction"].unique())
    bands = _bands(per, fs, "step", metrics)
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
            kw = _line_kwargs(name)
            bad_steps = np.sort(bad_f.loc[bad_f["correction"] == name, "step"].unique())
            for m, metric in enumerate(metrics):
                ax = grid.ax(f, m)
                _mean_and_band(ax, stats, metric, kw, alpha=0.18, steps=evaluated[metric])
                shaded |= zero_grad.shade(ax, df[df["job"].isin(facet.jobs) & (df["correction"] == name)], kw["color"], x="step")
                if metric == "objective" and monte_carlo and stats["objective_count"].max() == 1:
                    runs = per[per["job"].isin(facet.jobs) & (per["correction"] == name) & per["se"].notna()]
                    ax.errorbar(runs["step"], runs["objective"], yerr=2 * runs["se"].astype(float), fmt="none",
                                ecolor=kw["color"], elinewidth=0.6, capsize=0, alpha=0.6)
                    drew_bars = True
                if len(bad_steps):
                    _event_marks(ax, bad_steps, flagged.index(name), kw["color"])
    for m in range(2):
        axes = grid.metric_axes(m)
        _room_for_marks(axes, len(flagged))
        for ax in axes:
            hide_negative_ticks(ax)  # J and the reward are ≥ 0; the marks' strip may reach below
    grid.label(_step_label(style), [_label(style, r"objective $J(\theta)$ (expected reward)", r"objective $J(\theta)$"),
                                    _label(style, "batch mean reward", "reward")], fs)
    extra = [_event_handle("NaN/inf update (marks under the data)")] if flagged else []
    extra += [zero_grad.handle()] if shaded else []
    handles, labels = _legend_for(names, extra=extra)
    mc_note = ""
    if monte_carlo:
        mc_note = (f"J: a Monte Carlo estimate, s.e. ≈ {float(se[se > 0].mean()):.2g} per evaluation"
                   + (" (bars: ±2 s.e.)" if drew_bars else ""))
    return grid.finish(TITLES["training"], ds, handles, labels, _notes(_seed_note(per, fs), mc_note, fs.note))


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
    names = _ordered(frame["correction"].unique())
    grid = Grid(len(fs), 1, style, row_height=None if len(fs) > 1 else (1.9 if style == "paper" else 3.4))
    n_spikes = n_bad = n_zero = 0
    shaded = False
    vals = frame["grad_norm"].astype(float)
    frame = frame.assign(gn=vals.where(np.isfinite(vals) & (vals > 0)), bad=~np.isfinite(vals), zero=vals == 0)
    ref = frame.groupby("job", sort=False)["gn"].transform(
        lambda s: s.shift(1).rolling(SPIKE_WINDOW, min_periods=3).median())
    frame["spike"] = (frame["gn"] > SPIKE_FACTOR * ref) & (ref > 0)
    facet_of = {j: i for i, fc in enumerate(fs) for j in fc.jobs}
    frame["_facet"] = frame["job"].map(facet_of)
    frame = frame[frame["_facet"].notna()]
    stats_all = frame.groupby(["_facet", "correction", "x"], sort=True)["gn"].agg(["median", "min", "max"]).reset_index()
    njobs = frame.groupby(["_facet", "correction"])["job"].nunique()
    zero_rejected = 0
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
            shaded |= zero_grad.shade(ax, cur, kw["color"], x="x")
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
            zeros = cur[cur["zero"]]
            if len(zeros):  # a log axis has no 0: say where the gradient was exactly 0 instead of a silent gap
                n_zero += len(zeros)
                if "all_rejected" in zeros.columns:
                    zero_rejected += int((zeros["all_rejected"].fillna(0) > 0).sum())
                xs = np.sort(zeros["x"].unique())
                ax.plot(xs, np.full(len(xs), 0.035), linestyle="none", marker="v", markersize=4,
                        markerfacecolor="none", markeredgewidth=1.0, color=kw["color"],
                        transform=ax.get_xaxis_transform(), clip_on=False, gid="zeros")
        ax.set_yscale("log")
    # Headroom for the marks on the edges, from each panel's limits before any is widened: the panels
    # share y, and widening them one after another from the limits the last one left compounded
    # (9 panels stretched the axis down to 1e-7 and squashed the data into its top third).
    limits = [grid.ax(f, 0).get_ylim() for f in range(len(fs))]
    for f, (lo, hi) in enumerate(limits):
        if (n_bad or n_zero) and np.isfinite(hi) and hi > 0 and lo > 0:
            grid.ax(f, 0).set_ylim(lo / (hi / lo) ** (0.12 if n_zero else 0), hi * (hi / lo) ** (0.12 if n_bad else 0))
    grid.label(_step_label(style), [_label(style, r"gradient norm $\|\nabla_\theta L\|_2$ before clipping",
                                           r"$\|\nabla_\theta L\|_2$ (unclipped)")], fs)
    extra = []
    if n_spikes:
        extra.append((Line2D([], [], linestyle="none", marker="o", markerfacecolor="none", markeredgecolor="0.25",
                             markersize=5), f"spike (> {SPIKE_FACTOR:g}× trailing median)"))
    if n_bad:
        extra.append((Line2D([], [], linestyle="none", marker="|", color="0.25", markersize=6, markeredgewidth=1.2),
                      "NaN/inf gradient (top edge)"))
    if n_zero:
        why = "every token rejected" if zero_rejected == n_zero else (
            "every token rejected or no signal" if zero_rejected else "no signal in the batch")
        extra.append((Line2D([], [], linestyle="none", marker="v", markerfacecolor="none", color="0.25",
                             markersize=4), f"gradient exactly 0 ({why}; bottom edge)"))
    extra += [zero_grad.handle()] if shaded else []
    handles, labels = _legend_for(names, extra=extra)
    low, high = seed_counts(frame, fs)
    note = f"median over {_seeds(low, high)}, shaded: min–max" if high > 1 else ""
    return grid.finish(TITLES["grad-norm"], ds, handles, labels, _notes(note, fs.note))


# ----------------------------------------------------------------------------------------- stability
def stability_figure(ds: Dataset, style: str = "default"):
    with st.using(style):
        return _stability(ds, style)


def _stability(ds: Dataset, style: str):
    per = per_job(ds)
    fs = facets(ds, ds.metrics, exclude=("mismatch.staleness", "staleness"), limit=Grid.capacity(style, 2))
    names = _ordered(per["correction"].unique())
    ks = sorted(per["staleness"].unique())
    # A numeric axis (k = 0, 2, 8 are not evenly spaced); the corrections' points sit side by side
    # around each k, a few percent of the axis apart, so that equal values do not hide each other.
    span = float(ks[-1] - ks[0]) or 1.0
    offsets = {n: (i - (len(names) - 1) / 2) * 0.025 * span for i, n in enumerate(names)}
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
                xs = stats["staleness"].to_numpy(dtype=float) + offsets[name]
                ax.plot(xs, stats["mean"], color=lk.color, linestyle=lk.linestyle, marker=lk.marker,
                        markersize=3.2 if style == "paper" else 4.5, label=name, gid="series")
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
    grid.label(_label(style, r"staleness $k$ (optimizer steps behind)", r"staleness $k$ (steps)"),
               [_label(style, "updates with NaN/inf loss or grad (fraction)", "NaN/inf (frac.)"),
                _label(style, f"collapse rate (fraction of {_seeds(low, high)})", "collapsed (frac.)")], fs)
    handles, labels = _legend_for(names, marker=True)
    note = f"mean over {_seeds(low, high)}, bars: min–max" if high > 1 else (
        "one seed per point" if high == 1 else "")
    return grid.finish(TITLES["stability"], ds, handles, labels, _notes(note, never_learned_note(per), fs.note,
                                                                        zero_grad.note(ds.metrics, ("correction", "staleness"))))


def never_learned_note(per) -> str:
    """A run that never learned did not collapse either: say which, so 0 collapses does not read
    as stable."""
    if "learned" not in per.columns:
        return ""
    flat = per[per["learned"] == 0]
    if "collapsed" in per.columns:  # a run that collapsed before it learned (NaN at step 0) is a collapse
        flat = flat[flat["collapsed"] != 1]
    if flat.empty:
        return ""
    counts = per.groupby("correction")["learned"].count()
    parts = [f"{name} ({len(g)} of {int(counts[name])} runs)" for name, g in
             sorted(flat.groupby("correction"), key=lambda kv: st.preset_rank(kv[0]))]
    return "never learned (J never rose above its start; not a collapse): " + ", ".join(parts)


# ----------------------------------------------------------------------------------------- probe
PROBE_YLABELS = {
    "bias_norm": (r"bias $\|\mathbb{E}\,\hat g - \nabla J\|_2$", r"bias $\|\mathbb{E}\hat g - \nabla J\|$"),
    "variance": (r"variance $\mathrm{tr}\,\mathrm{Cov}(\hat g)$", r"variance $\mathrm{tr\,Cov}(\hat g)$"),
    "rel_mse": (r"relative MSE $\mathbb{E}\,\|\hat g - \nabla J\|^2 / \|\nabla J\|^2$",
                r"MSE$\,/\,\|\nabla J\|^2$"),
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
    names = _ordered(pr["preset"].unique())
    multi = pr.groupby("preset")["high"].nunique()
    grid = Grid(len(fs), len(metrics), style)
    n_degenerate = n_starred = 0
    for f, facet in enumerate(fs):
        sub = pr[pr["job"].isin(facet.jobs)]
        for name in names:
            cur = sub[sub["preset"] == name]
            if cur.empty:
                continue
            lk = st.look(name)
            agg = {m: "mean" for m in metrics}
            agg["degenerate"] = "max"
            for c in ("bias_norm_ci", "bias_norm_lo", "bias_norm_hi"):
                if c in cur.columns:
                    cur = cur.assign(**{c: cur[c].apply(_as_float)})
                    agg[c] = "mean"
            stats = cur.groupby("high").agg(agg).reset_index().sort_values("high")
            degenerate = stats["degenerate"].astype(bool)
            for m, metric in enumerate(metrics):
                ax = grid.ax(f, m)
                ax.plot(stats["high"], stats[metric], color=lk.color, linestyle=lk.linestyle, marker=lk.marker,
                        markersize=3.5, label=name, gid="series")
                if degenerate.any():  # hollow: this arm barely updates
                    ax.plot(stats.loc[degenerate, "high"], stats.loc[degenerate, metric], linestyle="none",
                            marker=lk.marker, markersize=6, markerfacecolor="white", markeredgecolor=lk.color,
                            markeredgewidth=1.1, gid="degenerate", zorder=4)
                if metric == "bias_norm" and len(stats) > 1:
                    lo, hi = _ci(stats)
                    if lo is not None:
                        ax.fill_between(stats["high"], lo, hi, color=lk.color, alpha=0.12, linewidth=0, gid="ci")
                if metric in ("rel_mse", "mse") and multi.get(name, 0) > 1:
                    ok = stats[~degenerate & stats[metric].notna()]
                    if len(ok):
                        best = ok.loc[ok[metric].idxmin()]
                        n_starred += 1
                        ax.plot([best["high"]], [best[metric]], linestyle="none", marker="*", markersize=10,
                                markerfacecolor=lk.color, markeredgecolor="black", markeredgewidth=0.6, gid="best",
                                zorder=5)
            n_degenerate += int(degenerate.sum())
    highs = pr["high"].astype(float)
    log_x = (highs > 0).all() and highs.max() / max(highs.min(), 1e-300) >= 8
    values = sorted(highs.unique())
    # The band's lower threshold, where it changes with the upper one ([0.8, 1.25], [0.5, 2]): each
    # tick names both, the lower beneath in brackets (a band sits at its upper threshold).
    lows = pr.assign(_low=pr["low"].apply(_as_float) if "low" in pr.columns else np.nan).groupby("high")["_low"]
    lower = {h: sorted(set(v for v in g if np.isfinite(v))) for h, g in lows}
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
    xlabel = _label(style, r"upper threshold $\rho_{\max}$ of the band (high)", r"upper threshold $\rho_{\max}$")
    if both:
        xlabel = _label(style, r"band: upper threshold $\rho_{\max}$ (lower $\rho_{\min}$)",
                        r"band: $\rho_{\max}$ ($\rho_{\min}$)")
    grid.label(xlabel,
               [PROBE_YLABELS[m][style == "paper"] for m in metrics], fs)
    extra = []
    if n_starred:
        extra.append((Line2D([], [], linestyle="none", marker="*", markersize=9, markerfacecolor="0.6",
                             markeredgecolor="black", markeredgewidth=0.6), "lowest MSE of the preset (non-degenerate)"))
    if n_degenerate:
        extra.append((Line2D([], [], linestyle="none", marker="o", markersize=6, markerfacecolor="white",
                             markeredgecolor="0.3"), DEGENERATE_RULE + " (never starred)"))
    if "rel_mse" in metrics:
        extra.append((Line2D([], [], color="0.45", linestyle=":"), ZERO_LINE_LABEL))
    handles, labels = _legend_for(names, marker=True, extra=extra)
    labels = _nonfinite_tags(pr, labels)
    ci = _ci_note(pr)
    return grid.finish(TITLES["threshold"], ds, handles, labels, _notes(f"shaded: {ci}" if ci else "", fs.note))


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
    ax.set_xticklabels([f"{v:g}\n(" + ", ".join(f"{lo:g}" for lo in lower.get(v, [])) + ")" if lower.get(v) else f"{v:g}"
                        for v in values])


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


def _as_float(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def presets_figure(ds: Dataset, style: str = "default"):
    with st.using(style):
        return _presets(ds, style)


def _band_text(low, high) -> str:
    def one(v):
        v = _as_float(v)
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
    names = _ordered(pr["preset"].unique())
    bands = pr.drop_duplicates("preset").set_index("preset")
    rows = [f"{n} {_band_text(bands.loc[n, 'low'], bands.loc[n, 'high'])}" if {"low", "high"} <= set(pr.columns)
            else n for n in names]
    n = len(names)
    row_in = 0.13 if paper else 0.2
    panel_h = max(n * row_in + 0.25, 1.2)
    width = st.PAPER_DOUBLE_WIDTH if paper else 3.2 * len(metrics) + 2.4
    fig = _new_figure((width, panel_h * len(fs)), style)
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
                value = _as_float(r[metric])
                degenerate = bool(r.get("degenerate", 0))
                if metric == "bias_norm":
                    lo, hi = _as_float(r.get("bias_norm_lo")), _as_float(r.get("bias_norm_hi"))
                    if math.isfinite(lo) and math.isfinite(hi):
                        ax.plot([lo, hi], [y[i], y[i]], color=lk.color, linewidth=1.4, solid_capstyle="butt",
                                gid="ci")
                ax.plot([value], [y[i]], linestyle="none", marker=lk.marker, markersize=4.5 if paper else 6,
                        color=lk.color, markerfacecolor="white" if degenerate else lk.color, markeredgewidth=1.1,
                        label=name, gid="series")
                if not math.isfinite(value):
                    ax.text(0.02, y[i], "NaN/inf in every batch", transform=ax.get_yaxis_transform(),
                            va="center", fontsize="x-small", color="0.35", gid="note")
                if degenerate and m == len(metrics) - 1:
                    n_degenerate += 1
                    why = (f"{_as_float(r.get('mean_masked_fraction')):.0%} masked"
                           if _as_float(r.get("mean_masked_fraction")) >= 0.9 else "‖E ĝ‖ ≈ 0")
                    ax.annotate(f" degenerate ({why})", (value, y[i]), xytext=(4, 0), textcoords="offset points",
                                va="center", fontsize="x-small", color="0.3", gid="note")
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
        extra.append((Line2D([], [], linestyle="none", marker="o", markersize=5, markerfacecolor="white",
                             markeredgecolor="0.3"), DEGENERATE_RULE))
    if "rel_mse" in metrics:
        extra.append((Line2D([], [], color="0.45", linestyle=":"), ZERO_LINE_LABEL))
    if "bias_norm_lo" in pr.columns:
        extra.append((Line2D([], [], color="0.45", linewidth=1.4), _ci_note(pr)))
    handles = [h for h, _ in extra]
    labels = [lab for _, lab in extra]
    note = _notes(_nonfinite_note(pr), fs.note)
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
    for gi, (label, value, g) in enumerate(groups):
        color = colors[value]
        lr = (g["old"] - g["roll"]).to_numpy(dtype=float)
        below, above = lr < -R, lr > R
        beyond_total += int(below.sum() + above.sum())
        outliers_total += int((np.abs(lr) > OUTLIER_NATS).sum())
        counts, _ = np.histogram(lr[~(below | above)], bins=edges)
        ax_h.stairs(np.where(counts > 0, counts, np.nan), edges, color=color, linewidth=1.2, gid="series",
                    label=label, baseline=None)
        # The tails: an overflow bin at each end, from the last bin to the axis's edge, at the count of
        # the tokens beyond it (dotted, so it does not read as one more bin of the same width).
        tails.append((color, int(below.sum()), int(above.sum())))
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
        ax_h.text(0.03, 0.97, text, transform=ax_h.transAxes, va="top", ha="left", fontsize="x-small",
                  color="0.3", zorder=6, gid="note",
                  bbox=dict(facecolor="white", edgecolor="none", alpha=0.85, pad=1.5))
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
        ax_s.text(0.97, 0.03, f"{clipped:,} token(s) with $p_{{\\mathrm{{rollout}}}} < 10^{{-8}}$\ndrawn at $10^{{-8}}$",
                  transform=ax_s.transAxes, va="bottom", ha="right", fontsize="x-small", color="0.3", zorder=6,
                  gid="note", bbox=dict(facecolor="white", edgecolor="none", alpha=0.85, pad=1.5))
    ax_b.set_xscale("log")
    if ax_b.get_lines() and all(np.nanmin(line.get_ydata()) > 0 for line in ax_b.get_lines()
                                if len(line.get_ydata())):
        ax_b.set_yscale("log")
    ax_h.set_xlabel(_label(style, r"log-ratio $\log \pi_{\mathrm{train}} - \log \pi_{\mathrm{rollout}}$ (nats"
                           + (", symlog)" if symlog else ")"), r"$\log \pi_{\mathrm{train}} - \log \pi_{\mathrm{rollout}}$"))
    ax_h.set_ylabel("tokens (count)")
    ax_s.set_xlabel(_label(style, r"$p_{\mathrm{train}}$ (trainer, fp32)", r"$p_{\mathrm{train}}$"))
    ax_s.set_ylabel(_label(style, r"$p_{\mathrm{rollout}}$ (engine)", r"$p_{\mathrm{rollout}}$"))
    ax_b.set_xlabel(_label(style, r"token probability $p_{\mathrm{train}}$ (log bins)", r"$p_{\mathrm{train}}$ (log bins)"))
    ax_b.set_ylabel(_label(style, r"$|p_{\mathrm{train}} - p_{\mathrm{rollout}}|$ (probability)", r"$|\Delta p|$"))
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


# ----------------------------------------------------------------------------------------- masking
def masking_figure(ds: Dataset, style: str = "default"):
    with st.using(style):
        return _masking(ds, style)


def _masking(ds: Dataset, style: str):
    df = update_rows(ds.metrics)  # the final row (J only) is no update
    metrics = ("token_masked_fraction", "clamped_fraction", "ess")
    ylabels = ("masked tokens (fraction)", "clamped tokens (fraction)", "ESS (fraction of tokens)") if style != "paper" \
        else ("masked (frac.)", "clamped (frac.)", "ESS (frac.)")
    # The ESS of NaN/inf weights is undefined, not 0 (the metric writes 0): a gap and a mark.
    weights_ok = np.isfinite(df["is_weight_mean"].astype(float)) if "is_weight_mean" in df.columns else True
    frame = df.assign(ess=df["ess"].where(weights_ok), _undefined=~weights_ok if "is_weight_mean" in df.columns
                      else False)
    extra_cols = {"seed": ("seed", "first")} if "seed" in df.columns else {}
    per = frame.groupby(["job", "step"], sort=False).agg(
        correction=("correction", "first"), undefined=("_undefined", "all"), **extra_cols,
        **{m: (m, "mean") for m in metrics}).reset_index()
    # Size follows content: a fraction that is 0 in every run is said once, not drawn as flat panels.
    flat = [m for m in metrics[:2] if per[m].fillna(0).eq(0).all()]
    metrics = tuple(m for m in metrics if m not in flat)
    ylabels = tuple(lab for m, lab in zip(("token_masked_fraction", "clamped_fraction", "ess"), ylabels)
                    if m in metrics)
    fs = facets(ds, df, limit=None)
    fs = drop_flat(fs, *_flat_masking(per, fs, metrics))
    fs = keep_differing(fs, arm_spread(per, fs, metrics), Grid.capacity(style, len(metrics)))
    names = _ordered(per["correction"].unique())
    grid = Grid(len(fs), len(metrics), style, row_height=(1.2 if style == "paper" else None))
    bands = _bands(per, fs, "step", metrics)
    undefined = per[per["undefined"].astype(bool)]
    flagged = _ordered(undefined["correction"].unique())
    for f, facet in enumerate(fs):
        und_f = undefined[undefined["job"].isin(facet.jobs)]
        for name in names:
            stats = bands.get((f, name))
            if stats is None:
                continue
            kw = _line_kwargs(name)
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
    grid.label(_step_label(style), list(ylabels), fs)
    extra = [_event_handle("ESS undefined: NaN/inf weights (marks under the data)")] if flagged else []
    handles, labels = _legend_for(names, extra=extra)
    words = {"token_masked_fraction": "masked", "clamped_fraction": "clamped"}
    gone = (f"no token {' or '.join(words[m] for m in flat)} in any run (panel{'s' if len(flat) > 1 else ''} "
            f"left out)") if flat else ""
    return grid.finish(TITLES["masking"], ds, handles, labels, _notes(_seed_note(per, fs), gone, fs.note))


FLAT_FRACTION = 0.02  # of a [0, 1] axis: a masked or clamped fraction this small, or an ESS this close to 1, reads as flat


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
        parts.append(f"nothing {words[m]}" if top == 0 else f"{words[m]} ≤ {_pct(top)}")
    if "ess" in metrics and any(flat):
        parts.append(f"ESS ≥ {min(float(worst['ess'].get(f)) for f in range(len(fs)) if flat[f]):.3g}")
    return flat, "flat (" + ", ".join(parts) + " in every step)"


# ----------------------------------------------------------------------------------------- render
FIGURES: dict[str, Callable] = {
    "training": training_figure,
    "grad-norm": grad_norm_figure,
    "stability": stability_figure,
    "presets": presets_figure,
    "threshold": threshold_figure,
    "mismatch": mismatch_figure,
    "masking": masking_figure,
}


def _metadata(fig, ext: str) -> dict:
    meta = getattr(fig, "_is_study_meta", None) or {}
    if ext == "png":
        return {"Title": meta.get("Title", ""), "Description": meta.get("Subject", ""), "Software": "is-study",
                "Style": getattr(fig, "_is_study_style", "default")}
    if ext == "pdf":
        # no CreationDate: the same runs give byte-identical PDFs, so regenerated figures diff only when drawn differently
        return {"Title": meta.get("Title", ""), "Subject": meta.get("Subject", ""), "Creator": "is-study",
                "CreationDate": None}
    return {}


def save(fig, out_dir: Path, name: str, style: str = "default", formats: Sequence[str] = ("png", "pdf")) -> list[Path]:
    """Write NAME.png (150 dpi) and NAME.pdf; returns the paths."""
    out_dir = Path(out_dir)
    paths = []
    with st.using(style):
        for i, ext in enumerate(formats):
            path = out_dir / f"{name}.{ext}"
            try:
                fig.savefig(path, dpi=150, metadata=_metadata(fig, ext))
            except OSError as exc:
                raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None
            if i == 0:  # the layout is solved: later formats reuse it instead of solving it again
                fig.set_layout_engine("none")
            paths.append(path)
    return paths


def drawn_style(png: Path) -> str | None:
    """The style a PNG of ours was drawn in (its "Style" text chunk); None when it does not say
    (drawn before the chunk was written, or not by is-study)."""
    try:
        from PIL import Image

        with Image.open(png) as im:
            return im.text.get("Style")
    except (OSError, ValueError, AttributeError):
        return None


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
