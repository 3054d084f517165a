"""What every claim's figure shares: panels with room for a headline and a legend, the headline (the claim,
its source and the verdict with its numbers), one legend under the panels, and the presets' colours and order
from analysis.style. Figures are matplotlib Figure objects, no pyplot."""

from __future__ import annotations

import textwrap

from analysis import style as st
from analysis.claims.stats import Verdict


def new_figure(
    ncols: int,
    nrows: int = 1,
    style: str = "default",
    panel: tuple[float, float] | None = None,
    sharey: bool | str = False,
):
    """Panels plus room for the headline (top) and the legend (bottom)."""
    from matplotlib.figure import Figure

    if style == "paper":  # two columns of a two-column paper; the verdict's numbers belong in the caption
        width = st.PAPER_WIDTH * (2 if ncols > 1 else 1) + 0.2
        fig = Figure(figsize=(width, 2.0 * nrows + 0.9), layout="constrained")
    else:
        w, h = panel or (3.9, 3.0)
        fig = Figure(figsize=(w * ncols + 0.4, h * nrows + 1.7), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=sharey)
    return fig, axes


def headline(fig, title: str, source: str, verdict: Verdict, style: str, note: str = "") -> None:
    """Title: the claim and its source; then the verdict with its key numbers, wrapped to the figure's width;
    then `note`, a sentence on what the panels leave out (in the paper style on a line under the verdict)."""
    paper = style == "paper"
    width = fig.get_figwidth()
    if paper:  # one line: the claim and the verdict; the numbers go in the caption (VERDICTS.md)
        n = f" ({verdict.n_text()})" if verdict.n_text() else ""
        line = textwrap.fill(f"{title}: {verdict.verdict}{n}", max(int(width * 17), 50), break_on_hyphens=False)
        fig.suptitle(line + (f"\n{note}" if note else ""), x=0.01, ha="left", fontsize=8)
        for ax in fig.axes:
            ax.title.set_fontsize(7)
            ax.xaxis.label.set_fontsize(7)
            ax.yaxis.label.set_fontsize(7)
        return
    chars = max(int(width * 13.5), 50)
    head = textwrap.fill(f"{title} ({source})", chars, break_on_hyphens=False)
    # the key numbers; every number behind the verdict is in figures/VERDICTS.md
    numbers = (
        f"{verdict.key}{'. ' + note if note else ''} (all numbers: VERDICTS.md)"
        if verdict.key
        else " ".join(x for x in (verdict.statement, note) if x)
    )
    n = f" ({verdict.n_text()})" if verdict.n_text() else ""
    body = textwrap.fill(f"Verdict: {verdict.verdict.upper()}{n}. {numbers}", chars, break_on_hyphens=False)
    fig.suptitle(f"{head}\n{body}", x=0.01, ha="left", fontsize=9.5)


def legend_below(fig, handles, labels, style: str, ncol: int | None = None) -> None:
    """One legend under the panels, so the headline above can use the figure's whole width."""
    if not handles:
        return
    most = 3 if style == "paper" else 5
    fig.legend(
        handles,
        labels,
        loc="outside lower center",
        ncol=ncol or min(len(labels), most, columns_that_fit(fig, labels)),
        handlelength=2.6,
        columnspacing=1.6,
    )


def columns_that_fit(fig, labels) -> int:
    """The most legend columns whose entries fit the figure's width side by side (a one-panel figure's legend
    otherwise runs past both edges). An entry's width is estimated from its label's length at the legend's
    font size: the handle, about 0.55 em a character, and the spacing between columns."""
    import matplotlib as mpl
    from matplotlib.font_manager import FontProperties

    em = FontProperties(size=mpl.rcParams["legend.fontsize"]).get_size_in_points() / 72
    widths = sorted(((2.6 + 0.8 + 1.6 + 0.55 * len(str(label))) * em for label in labels), reverse=True)
    room = fig.get_figwidth() - 0.2
    n = 1
    while n < len(widths) and sum(widths[: n + 1]) <= room:
        n += 1
    return n


def line_handle(name: str, marker: bool = False):
    """A legend entry in the preset's colour and line style."""
    from matplotlib.lines import Line2D

    lk = st.look(name)
    return Line2D(
        [],
        [],
        color=lk.color,
        linestyle=lk.linestyle,
        marker=lk.marker if marker else None,
        markersize=4 if marker else None,
    )


def ordered_presets(names) -> list[str]:
    """Preset names, once each, in the order every figure and table uses."""
    return sorted({str(n) for n in names}, key=st.preset_rank)
