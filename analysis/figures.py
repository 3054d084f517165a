"""Every kind `is-study plot` draws, in one registry: the base kinds (analysis/plots.py) and the
field's (analysis/field_figures.py, which builds on plots.py). This module sits above both, so the
two never import each other in a circle; the CLI and the report ask it what can be drawn and draw.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from analysis import field_figures, plots
from analysis import style as st
from analysis.load import Dataset
from runner.errors import UserError

KINDS = plots.KINDS + tuple(field_figures.FIGURES)
FIGURES: dict[str, Callable] = {**plots.FIGURES, **field_figures.FIGURES}

def availability(ds: Dataset, flat: bool = True) -> dict[str, str | None]:
    """kind -> None when the figure can be drawn from `ds`, else the reason it cannot (or, with
    `flat`, the reason it would show nothing: every line flat, e.g. no run collapsed)."""
    out = plots.availability(ds)
    out.update(field_figures.availability(ds, out))
    if flat:
        out.update(plots.flat_reasons(ds, out))
        out.update(field_figures.flat_reasons(ds, out))
    return out


def figure(kind: str, ds: Dataset, style: str = "default"):
    if kind not in FIGURES:
        raise UserError(f"unknown --kind {kind!r}; valid: {', '.join(KINDS)}")
    return FIGURES[kind](ds, style)


def choose(ds: Dataset, kinds: Sequence[str] | None) -> tuple[list[str], dict[str, str]]:
    """The kinds to draw and, for the ones left out, why. An explicit kind that cannot be drawn, or
    nothing drawable at all, is a UserError."""
    for k in kinds or ():
        if k not in FIGURES:
            raise UserError(f"unknown --kind {k!r}; valid: {', '.join(KINDS)}")
    avail = availability(ds, flat=not kinds)  # a kind asked for by name is drawn even if flat
    if kinds:
        for k in kinds:
            if avail[k] is not None:
                raise UserError(f"--kind {k}: {avail[k]}")
        return list(dict.fromkeys(kinds)), {}
    chosen = [k for k in KINDS if avail[k] is None]
    if not chosen:
        raise UserError(f"{ds.path}: nothing to plot (" + "; ".join(f"{k}: {r}" for k, r in avail.items()) + ")")
    return chosen, {k: r for k, r in avail.items() if r is not None}


def default_dir(ds: Dataset, style: str = "default") -> Path:
    """Where `is-study plot` puts a style's figures: PATH/figures, the paper style's in
    PATH/figures/paper, so that drawing one style never overwrites the other (the report embeds
    the default style's)."""
    return ds.path / "figures" / ("paper" if style == "paper" else "")


def render(ds: Dataset, out_dir: Path, kinds: Sequence[str] | None = None, style: str = "default",
           formats: Sequence[str] = ("png", "pdf")) -> tuple[dict[str, list[Path]], dict[str, str]]:
    """Draw and save; returns ({kind: [files]}, {skipped kind: reason})."""
    st.rc(style)  # validates the style name
    chosen, skipped = choose(ds, kinds)
    out_dir = plots.ensure_dir(out_dir)
    written = {}
    for kind in chosen:
        fig = figure(kind, ds, style)
        written[kind] = plots.save(fig, out_dir, kind, style, formats)
    return written, skipped
