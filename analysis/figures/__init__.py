"""The figures `is-study plot` draws. Each `*_figure(ds, style)` takes a `Dataset` (analysis.load)
and returns a matplotlib `Figure` (no pyplot, no global backend state: a `Figure` saves through
Agg), so tests can inspect axes, labels and lines before anything is written; `render` saves PNG
(150 dpi) and PDF. This package's modules:

    layout      the kit every figure uses: panel grids, titles and shared legends, axis helpers,
                the facet × correction loop, saving PNG + PDF
    facets      a sweep's small multiples: which swept keys make panels, which panels to keep
    availability  which kinds a dataset allows, and which would show only flat lines
    training    training, grad-norm, stability, masking (train runs against step or staleness)
    probe       presets, threshold, bias-split (the probe's bias, variance and MSE)
    mismatch    mismatch (tokens.csv), mismatch-over-training (the engines' gap against step)
    collapse    survival, length-heatmap (when and how often runs collapse)
    dose_response  dose-response (final J and collapses against the measured T·k3)
    threshold_training  threshold-training (train runs against the band [low, high])

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
    dose-response  a train sweep over T: final J and the collapse rate against the measured mismatch per
                response (T·k3, nats), a line per correction and engine precision in the order of T
    threshold-training  a train sweep over the band [low, high]: final J (summary.json's, as per_job
                reads it), peak-to-final drop, masked fraction, ESS and NaN/inf events against the band,
                a line per correction, a row per other swept key (staleness, precision); an outcome that
                is 0 in every run is said, not drawn

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

from collections.abc import Callable, Sequence
from pathlib import Path

from analysis import style as st
from analysis.figures import layout
from analysis.figures.availability import availability
from analysis.figures.collapse import length_heatmap_figure, survival_figure
from analysis.figures.dose_response import dose_response_figure
from analysis.figures.mismatch import mismatch_figure, mismatch_over_training_figure
from analysis.figures.probe import bias_split_figure, presets_figure, threshold_figure
from analysis.figures.threshold_training import threshold_training_figure
from analysis.figures.training import grad_norm_figure, masking_figure, stability_figure, training_figure
from analysis.load import Dataset
from runner.errors import UserError

# Every kind, in the order `is-study plot` draws them: the base kinds, then the field's.
FIGURES: dict[str, Callable] = {
    "training": training_figure,
    "grad-norm": grad_norm_figure,
    "stability": stability_figure,
    "presets": presets_figure,
    "threshold": threshold_figure,
    "mismatch": mismatch_figure,
    "masking": masking_figure,
    "mismatch-over-training": mismatch_over_training_figure,
    "survival": survival_figure,
    "bias-split": bias_split_figure,
    "length-heatmap": length_heatmap_figure,
    "dose-response": dose_response_figure,
    "threshold-training": threshold_training_figure,
}
KINDS = tuple(FIGURES)
TITLES = layout.TITLES


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


def render(
    ds: Dataset,
    out_dir: Path,
    kinds: Sequence[str] | None = None,
    style: str = "default",
    formats: Sequence[str] = ("png", "pdf"),
) -> tuple[dict[str, list[Path]], dict[str, str]]:
    """Draw and save; returns ({kind: [files]}, {skipped kind: reason})."""
    st.rc(style)  # validates the style name
    chosen, skipped = choose(ds, kinds)
    out_dir = layout.ensure_dir(out_dir)
    written = {}
    for kind in chosen:
        fig = figure(kind, ds, style)
        written[kind] = layout.save(fig, out_dir, kind, style, formats)
    return written, skipped
