"""The figures of a replay dir (`is-study replay`), drawn by `is-study plot REPLAY_DIR`:

    replay-mismatch   tokens.csv: p_train against p_rollout (a 2-D density, log colour scale, log axes),
                      the token log-ratio histogram with each token-level banded preset's band drawn on it,
                      and |Δ log p| by p_train bins (median and 99th percentile)
    replay-bands      the per-sequence statistics the sequence- and geometric-level presets judge (L_i and
                      G_i), each histogram with those presets' bands
    replay-masking    masked token fraction, clamped fraction and ESS per preset against step (replay.csv)

Styles as every figure's (analysis/style.py): default for a screen, paper for a two-column paper.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from analysis import style as st
from analysis.figures import layout
from analysis.replay import LEVELS, band_of, read_replay, read_tokens, statistics
from runner.errors import UserError

KINDS = ("replay-mismatch", "replay-bands", "replay-masking")
MAX_BAND_LINES = 8  # bands drawn on one histogram; more presets are named in the note


def _config(path: Path, tokens) -> str:
    n = "" if tokens is None else f", {len(tokens):,} tokens"
    return f"replay of {path}{n}"


def _hist_log(ax, values: np.ndarray, color: str, bins: int = 80) -> tuple[float, float]:
    finite = values[np.isfinite(values)]
    lo, hi = (float(np.quantile(finite, 0.0005)), float(np.quantile(finite, 0.9995))) if len(finite) else (-1.0, 1.0)
    pad = max(hi - lo, 1e-6) * 0.15
    lo, hi = lo - pad, hi + pad
    ax.hist(np.clip(finite, lo, hi), bins=bins, range=(lo, hi), color=color, alpha=0.75, gid="series")
    ax.set_yscale("log")
    return lo, hi


def _draw_bands(ax, bands, lo: float, hi: float) -> tuple[list, list, int]:
    """Dashed lines at each distinct band's edges (presets sharing a band share a line), the x range widened
    to hold them; returns legend handles, labels and how many distinct bands were left out."""
    from matplotlib.lines import Line2D

    shared: dict[tuple, list] = {}
    for band in bands:
        shared.setdefault((band.low, band.high), []).append(band)
    handles, labels = [], []
    groups = list(shared.values())
    for group in groups[:MAX_BAND_LINES]:
        look = st.look(group[0].preset)
        for edge in (group[0].low, group[0].high):
            if edge is not None and np.isfinite(edge):
                ax.axvline(edge, color=look.color, linestyle="--", linewidth=1.1, gid="band")
                lo, hi = min(lo, edge), max(hi, edge)
        names = ", ".join(b.preset for b in group[:2]) + (f" +{len(group) - 2}" if len(group) > 2 else "")
        handles.append(Line2D([], [], color=look.color, linestyle="--"))
        labels.append(f"{names} {group[0].text()}")
    pad = (hi - lo) * 0.04
    ax.set_xlim(lo - pad, hi + pad)
    return handles, labels, max(len(groups) - MAX_BAND_LINES, 0)


def _bands(replay) -> dict[str, list]:
    out = {level: [] for level in LEVELS}
    for preset in dict.fromkeys(replay["preset"]):
        band = band_of(preset)
        if band is not None and band.level in out:
            out[band.level].append(band)
    return out


def _needs_ratios(path: Path, tokens) -> None:
    if tokens is None:
        raise UserError(f"{path}: no tokens.csv (replayed with --no-tokens)")
    if not np.isfinite(tokens["log_ratio"].to_numpy(dtype=float)).any():
        raise UserError(f"{path}: the dump holds no trainer log-probs, so there are no log-ratios to draw")


def mismatch_figure(path: Path, replay, tokens, style: str):
    from matplotlib.colors import LogNorm

    _needs_ratios(path, tokens)
    paper = style == "paper"
    train = (tokens["old"] if tokens["old"].notna().any() else tokens["lp"]).to_numpy(dtype=float)
    roll = tokens["roll"].to_numpy(dtype=float)
    lr = tokens["log_ratio"].to_numpy(dtype=float)
    ok = np.isfinite(train) & np.isfinite(roll)
    grid = layout.Grid(1, 3, style, row_height=1.9 if paper else 3.1, sharex=False, sharey=False)
    ax_d, ax_h, ax_b = grid.ax(0, 0), grid.ax(0, 1), grid.ax(0, 2)
    floor = -12.0  # log10 p below 1e-12 is drawn at the edge
    x, y = np.maximum(roll[ok] / np.log(10), floor), np.maximum(train[ok] / np.log(10), floor)
    low = float(min(x.min(), y.min())) if ok.any() else floor
    edges = np.linspace(low, 0.0, 60)
    *_, image = ax_d.hist2d(x, y, bins=[edges, edges], norm=LogNorm(), cmap="viridis", gid="series")
    ax_d.plot([low, 0], [low, 0], color="0.4", linewidth=0.8, linestyle=":")
    ax_d.set_xlabel("log10 p_rollout")
    ax_d.set_ylabel("log10 p_train")
    grid.fig.colorbar(image, ax=ax_d, label="tokens per cell", pad=0.02)

    lo, hi = _hist_log(ax_h, lr, "#0072B2")
    handles, labels, left_out = _draw_bands(ax_h, _bands(replay)["token"], lo, hi)
    ax_h.set_xlabel("log-ratio old − roll (nats)")
    ax_h.set_ylabel("tokens")

    p = np.exp(train[ok])
    gap = np.abs(lr[ok])
    bins = np.logspace(np.log10(max(p.min(), 1e-12)), 0, 13) if len(p) else np.array([1e-3, 1.0])
    which = np.clip(np.digitize(p, bins) - 1, 0, len(bins) - 2)
    centers, med, q99 = [], [], []
    for b in range(len(bins) - 1):
        sel = gap[which == b]
        if len(sel) >= 5:
            centers.append(np.sqrt(bins[b] * bins[b + 1]))
            med.append(np.median(sel))
            q99.append(np.quantile(sel, 0.99))
    ax_b.plot(centers, med, marker="o", color="#0072B2", label="median", gid="series")
    ax_b.plot(centers, q99, marker="s", color="#D55E00", label="99th percentile", gid="series")
    ax_b.set_xscale("log")
    if any(v > 0 for v in med + q99):
        ax_b.set_yscale("log")
    ax_b.set_xlabel("p_train (bins)")
    ax_b.set_ylabel("|Δ log p| (nats)")
    ax_b.legend(fontsize="small", loc="best")
    note = f"{left_out} more bands not drawn" if left_out else ""
    if not handles:
        note = layout.join_notes(note, "no token-level banded preset replayed")
    layout.finish(
        grid.fig, "replay: where the mismatch lives", None, handles, labels, paper, note, config=_config(path, tokens)
    )
    return grid.fig


def bands_figure(path: Path, replay, tokens, style: str):
    _needs_ratios(path, tokens)
    paper = style == "paper"
    stats = statistics(tokens)
    bands = _bands(replay)
    grid = layout.Grid(1, 2, style, row_height=2.0 if paper else 3.1, sharex=False, sharey=False)
    handles, labels, notes = [], [], []
    for m, (level, xlabel) in enumerate(
        (
            ("sequence", "sequence log-ratio L_i = Σ_t lr_t (nats)"),
            ("geometric", "geometric log-ratio G_i = L_i / |y_i| (nats)"),
        )
    ):
        ax = grid.ax(0, m)
        lo, hi = _hist_log(ax, stats[level], "#009E73", bins=50)
        h, lab, left_out = _draw_bands(ax, bands[level], lo, hi)
        handles += h
        labels += lab
        ax.set_xlabel(xlabel)
        ax.set_ylabel("sequences")
        if left_out:
            notes.append(f"{left_out} more {level}-level bands not drawn")
        if not bands[level]:
            notes.append(f"no {level}-level banded preset replayed")
    layout.finish(
        grid.fig,
        "replay: the sequence statistics the bands judge",
        None,
        handles,
        labels,
        paper,
        layout.join_notes(*notes),
        config=_config(path, tokens),
    )
    return grid.fig


def masking_figure(path: Path, replay, tokens, style: str):
    from matplotlib.lines import Line2D

    paper = style == "paper"
    applied = replay[replay["applies"] == 1]
    if applied.empty:
        raise UserError(f"{path}: no preset applied to any step (the dump holds no trainer log-probs)")
    grid = layout.Grid(1, 3, style, row_height=1.9 if paper else 3.0, sharex=True, sharey=False)
    metrics = (
        ("token_masked_fraction", "masked token fraction"),
        ("clamped_fraction", "clamped fraction"),
        ("ess", "ESS (fraction)"),
    )
    handles, labels = [], []
    for preset, rows in applied.groupby("preset", sort=False):
        look = st.look(preset)
        for m, (column, _) in enumerate(metrics):
            grid.ax(0, m).plot(
                rows["step"],
                rows[column],
                color=look.color,
                linestyle=look.linestyle,
                marker=look.marker,
                markersize=3,
                gid="series",
                label=str(preset),
            )
        handles.append(Line2D([], [], color=look.color, linestyle=look.linestyle, marker=look.marker, markersize=3))
        labels.append(str(preset))
    for m, (_, ylabel) in enumerate(metrics):
        ax = grid.ax(0, m)
        ax.set_xlabel("logged step")
        ax.set_ylabel(ylabel)
        ax.set_ylim(-0.03, 1.03)
    layout.finish(
        grid.fig,
        "replay: what each preset would have masked, clamped and kept",
        None,
        handles,
        labels,
        paper,
        "",
        config=_config(path, tokens),
    )
    return grid.fig


FIGURES = {"replay-mismatch": mismatch_figure, "replay-bands": bands_figure, "replay-masking": masking_figure}


def render(
    path: Path, out_dir: Path | None, kinds: Sequence[str] | None, style: str
) -> tuple[dict[str, list[Path]], dict[str, str]]:
    """Draw and save a replay dir's figures; ({kind: files}, {skipped kind: reason}). A kind named with --kind
    that cannot be drawn is a UserError; by default the ones that cannot are skipped with their reason."""
    for kind in kinds or ():
        if kind not in FIGURES:
            raise UserError(f"unknown --kind {kind!r} for a replay dir; valid: {', '.join(KINDS)}")
    path = Path(path)
    replay, tokens = read_replay(path), read_tokens(path)
    out_dir = layout.ensure_dir(
        out_dir if out_dir is not None else path / "figures" / ("paper" if style == "paper" else "")
    )
    written, skipped = {}, {}
    for kind in kinds or KINDS:
        try:
            with st.using(style):
                fig = FIGURES[kind](path, replay, tokens, style)
        except UserError as exc:
            if kinds:
                raise
            skipped[kind] = str(exc).split(": ", 1)[-1]
            continue
        written[kind] = layout.save(fig, out_dir, kind, style)
    if not written:
        raise UserError(f"{path}: nothing to plot (" + "; ".join(f"{k}: {r}" for k, r in skipped.items()) + ")")
    return written, skipped
