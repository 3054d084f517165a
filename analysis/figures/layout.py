"""The layout kit every figure module uses: panel grids (`Grid`, `rows_grid`), titles that fit and
shared legends (`finish`), the facet × correction loop (`facet_arms`), axis helpers (log and linear
ticks, y ranges from zero, lines that coincide drawn as rims), and saving PNG + PDF with the style
and config in their metadata.

One module of ~640 lines on purpose: `Grid`, `finish` and the legend and tick helpers call each
other, and split apart each piece would import the rest back.
"""

from __future__ import annotations

import math
import re
import textwrap
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from analysis import style as st
from analysis.figures.facets import MAX_FACETS, Facet, seed_counts
from analysis.load import Dataset
from analysis.provenance import describe
from runner.errors import UserError

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
    "dose-response": "Dose-response: outcomes against the measured mismatch per response (T·k3)",
    "threshold-training": "Threshold trade-off (training): outcomes against the band",
}
STEP_LABEL = "training step (rollout batches)"
LEGEND_WIDTH = 2.6  # inches the default style keeps on the right for the legend (finish() then fits it)
LEGEND_CHAR = 0.068  # inches a legend character takes in the default style (8.5 pt)
TITLE_CHARS_PER_INCH = 10.5  # of the default style's title (9.5 pt DejaVu Sans)
CONFIG_LINES = 2  # lines of config in a default-style title at most
ONE_ROW_MIN_WIDTH = 6.8  # inches: a single panel with its legend below keeps the width it had with the legend beside
LINE_HEIGHT = {"default": 0.19, "paper": 0.125}  # inches per line of title or legend text


def style_label(style: str, long: str, short: str) -> str:
    """Axis labels: the paper style's panels are 1.3 in tall and 1.5–3 in wide."""
    return short if style == "paper" else long


def step_label(style: str) -> str:
    return style_label(style, STEP_LABEL, "training step")


def join_notes(*parts: str) -> str:
    return " · ".join(p for p in parts if p)


class Grid:
    """Panels: metrics × facets.

    One facet: the metrics side by side (the paper style stacks one or two and puts three side by
    side at the double-column width). Several facets: a block of metric rows per line of facets, at
    most 4 facets a line. The paper style is 3.3 in wide for one or two columns and 7 in beyond, and
    never more than 3 rows: `capacity` says how many facets fit."""

    def __init__(
        self,
        n_facets: int,
        n_metrics: int,
        style: str,
        row_height: float | None = None,
        sharey: bool = True,
        sharex: bool = True,
    ):
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
            panel_w, panel_h = st.DEFAULT_PANEL if n_facets > 1 else (4.2, 3.0)
            width = panel_w * self.ncols + LEGEND_WIDTH
            row = row_height or panel_h
            if self.nrows > 3:  # many rows: less height each (down to 1.5 in), so the figure stays on a screen
                row = max(1.5, min(row, 11.0 / self.nrows))
            height = self.nrows * row
        self.fig = new_figure((width, height), style)
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
                    ax.set_ylabel(fit(ylabels[m], self.fig.get_figheight() / self.nrows - 0.2, self.paper))
                elif self.sharey:  # the same scale as the first column's: its numbers say it once
                    ax.tick_params(labelleft=False)
                if fs and fs[f].label and m == 0:
                    panel_w = (self.fig.get_figwidth() - (0 if self.paper else LEGEND_WIDTH)) / self.ncols
                    ax.set_title(fit(fs[f].title(self.style), panel_w - 0.3, self.paper), fontsize="medium")

    def finish(self, title: str, ds: Dataset, handles, labels, note: str = ""):
        finish(self.fig, title, ds, handles, labels, self.paper, note)
        return self.fig


def _visible_length(text: str) -> int:
    """Characters as drawn: a TeX command (\\theta) is one glyph; $, braces, ^ and _ are none."""
    return len(re.sub(r"[${}^_]", "", re.sub(r"\\[A-Za-z]+\s?", "x", text)))


def fit(text: str, inches: float, paper: bool) -> str:
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


def new_figure(size: tuple[float, float], style: str):
    """A constrained-layout Figure that remembers its style (the finishing steps depend on it)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    fig._is_study_style = style
    return fig


def is_paper(fig) -> bool:
    return getattr(fig, "_is_study_style", "default") == "paper"


# ----------------------------------------------------------------------------------------- finishing
def _tidy_log_axes(fig) -> None:
    """Log axes: label only the decades when two or more are in view; otherwise label 2× and 5×
    as well (matplotlib's default labels every minor tick there, and they pile up)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogFormatterSciNotation, LogLocator, NullFormatter

    for ax in fig.axes:
        for axis, scale, lim in (
            (ax.yaxis, ax.get_yscale(), ax.get_ylim()),
            (ax.xaxis, ax.get_xscale(), ax.get_xlim()),
        ):
            lo, hi = sorted(lim)
            if scale != "log" or lo <= 0:
                continue
            if isinstance(axis.get_major_locator(), FixedLocator) or isinstance(
                axis.get_major_formatter(), FuncFormatter
            ):
                continue  # the figure chose its ticks
            decades = math.floor(math.log10(hi)) - math.ceil(math.log10(lo)) + 1
            if decades >= 2:
                axis.set_minor_formatter(NullFormatter())
                if decades > 4:  # every other decade on a narrow panel
                    axis.set_major_locator(LogLocator(base=10, numticks=4 if is_paper(fig) else 7))
            else:
                axis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
                axis.set_minor_formatter(LogFormatterSciNotation(labelOnlyBase=False, minor_thresholds=(10, 10)))


def _tidy_linear_ticks(fig) -> None:
    """Linear axes: as many ticks as the panel's width holds (about one per 0.45 in in the paper
    style), so that tick labels never touch."""
    from matplotlib.ticker import FixedLocator, MaxNLocator

    paper = is_paper(fig)
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        if ax.get_xscale() == "linear" and not isinstance(ax.xaxis.get_major_locator(), FixedLocator):
            width = fig.get_figwidth() * ax.get_position().width
            ax.xaxis.set_major_locator(
                MaxNLocator(nbins=max(int(width / (0.45 if paper else 0.6)), 3), steps=[1, 2, 2.5, 5, 10])
            )
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
        values = (
            np.concatenate([_on_scale(ax, np.asarray(ln.get_ydata(), dtype=float)) for ln in lines])
            if lines
            else np.array([])
        )
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
            size = 2.8 if is_paper(fig) else 3.5
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
    shown = [
        f"{b} = {a}" + ("" if n == panels else f" ({n} panel{'s' if n != 1 else ''})")
        for (a, b), n in list(pairs.items())[:4]
    ]
    more = f", +{len(pairs) - 4} more" if len(pairs) > 4 else ""
    return "markers: a line on top of another: " + ", ".join(shown) + more


def finish(
    fig,
    title: str,
    ds: Dataset,
    handles,
    labels,
    paper: bool,
    note: str = "",
    config: str | None = None,
    legend_below: bool = False,
):
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
    note = join_notes(note, _identical_note(pairs, panels))
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
            config_lines[-1] = config_lines[-1][: chars - 1].rstrip() + "…"
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


def line_kwargs(name: str) -> dict:
    lk = st.look(name)
    return {"color": lk.color, "linestyle": lk.linestyle, "label": str(name), "gid": "series"}


def legend_for(names: Sequence[str], marker: bool = False, extra: Sequence = ()) -> tuple[list, list]:
    from matplotlib.lines import Line2D

    handles, labels = [], []
    for n in names:
        lk = st.look(n)
        handles.append(
            Line2D(
                [],
                [],
                color=lk.color,
                linestyle=lk.linestyle,
                marker=lk.marker if marker else None,
                markersize=4 if marker else None,
            )
        )
        labels.append(str(n))
    for h, lab in extra:
        handles.append(h)
        labels.append(lab)
    return handles, labels


def ordered(names) -> list[str]:
    return sorted({str(n) for n in names}, key=st.preset_rank)


def seeds_text(low: int, high: int) -> str:
    return f"{high} seed{'s' if high != 1 else ''}" if low == high else f"{low}–{high} seeds"


def seed_note(frame, fs: Sequence[Facet] = (), what: str = "mean ± 1 s.d.") -> str:
    """'mean ± 1 s.d. over N seeds' when lines average several seeds."""
    low, high = seed_counts(frame, fs)
    return f"{what} over {seeds_text(low, high)}" if high > 1 else ""


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
            ax.text(
                0.5,
                0.5,
                zero_note,
                transform=ax.transAxes,
                ha="center",
                va="center",
                fontsize="small",
                color="0.35",
                gid="note",
            )


def hide_negative_ticks(ax) -> None:
    """Tick labels for a quantity that cannot be negative, when room for marks under the data
    stretched the axis below 0: no label below 0."""
    from matplotlib.ticker import FuncFormatter

    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, pos: "" if v < -1e-12 else f"{v:g}"))


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
    parts = [
        f"{name} ({len(g)} of {int(counts[name])} runs)"
        for name, g in sorted(flat.groupby("correction"), key=lambda kv: st.preset_rank(kv[0]))
    ]
    return "never learned (J never rose above its start; not a collapse): " + ", ".join(parts)


def as_float(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def _metadata(fig, ext: str) -> dict:
    meta = getattr(fig, "_is_study_meta", None) or {}
    if ext == "png":
        return {
            "Title": meta.get("Title", ""),
            "Description": meta.get("Subject", ""),
            "Software": "is-study",
            "Style": getattr(fig, "_is_study_style", "default"),
        }
    if ext == "pdf":
        # no CreationDate: the same runs give byte-identical PDFs, so regenerated figures diff only when drawn differently
        return {
            "Title": meta.get("Title", ""),
            "Subject": meta.get("Subject", ""),
            "Creator": "is-study",
            "CreationDate": None,
        }
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


# ----------------------------------------------------------------------------------------- shared pieces
def rows_grid(n_rows: int, n_cols: int, style: str, row_height: float, panel_width: float = 3.4):
    """Facets as rows, metrics as columns (the reverse of Grid, so that four metrics stay in one
    row and a paper figure keeps ≤ 3 rows); each column shares its y axis, every panel its x axis."""
    paper = style == "paper"
    if paper:
        width = st.PAPER_WIDTH if n_cols <= 2 else st.PAPER_DOUBLE_WIDTH
    else:
        width = panel_width * n_cols + LEGEND_WIDTH
    fig = new_figure((width, n_rows * row_height), style)
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


def label_rows(fig, axes, xlabel: str, ylabels: Sequence[str], row_titles: Sequence[str], paper: bool) -> None:
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
            ax.set_ylabel(fit(ylabels[c], row_in - 0.25, paper))
        if row_titles[r]:
            ax = axes[r][0]
            width = fig.get_figwidth() - (0 if paper else LEGEND_WIDTH) - 0.4
            ax.set_title(fit(row_titles[r], width, paper), loc="left", fontsize="medium")


def finish_kind(fig, kind: str, ds: Dataset, handles, labels, paper: bool, note: str, legend_below: bool = False):
    finish(fig, TITLES[kind], ds, handles, labels, paper, note, legend_below=legend_below)
    return fig


def facet_arms(frame, fs: Sequence[Facet], names: Sequence[str], arm: str = "correction"):
    """(facet index, arm name, the arm's rows in that facet, its look) for every facet of `fs` and
    every arm of `names` that has rows there, in that order: the loop of every small-multiples
    figure, whose panels are facets and whose lines are arms."""
    for f, facet in enumerate(fs):
        sub = frame[frame["job"].isin(facet.jobs)]
        for name in names:
            cur = sub[sub[arm] == name]
            if cur.empty:
                continue
            yield f, name, cur, st.look(name)


def mark_events(ax, steps, color, height: float = 0.965) -> None:
    """NaN/inf events as short ticks along the top of a step axis (`height` in axes coordinates), drawn
    outside the clip box so a tick at the last step shows; gid "events" is what the legends look for."""
    ax.plot(
        steps,
        np.full(len(steps), height),
        linestyle="none",
        marker="|",
        markersize=6,
        markeredgewidth=1.2,
        color=color,
        transform=ax.get_xaxis_transform(),
        clip_on=False,
        gid="events",
    )
