"""Figures fit for a paper and figures that never mislead, checked on Figure objects drawn from real
outputs made here: a small sweep (three corrections × two upper thresholds × two staleness values ×
two seeds, 1 in 20 rollout log-probs 1000 nats off), runs that reject everything or meet injected
outliers, and two probes (one band per preset; several bands)."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest

from tests.helpers.cli import run_cli
from tests.helpers.figure_checks import draw, negative_ticks, panel_rows, problems, visible_axes

pytestmark = pytest.mark.slow  # each test draws figures from a sweep or run made by a module fixture

TINY = ["train.steps=6", "rollout.batch_size=2", "rollout.group_size=2", "log.quiet=true", "log.tokens_every=2"]
FAULTS = ["mismatch.outlier_rate=0.05"]
BUG = "openrlhf-bc71bb1/seq-mask-tis"
TRAIN_KINDS = ("training", "grad-norm", "stability", "mismatch", "masking")


def _ok(code, err):
    assert code == 0, err


@pytest.fixture(scope="module")
def cells(tmp_path_factory):
    """24 jobs: correction × correction.high × mismatch.staleness × seed (2 seeds)."""
    d = tmp_path_factory.mktemp("cells") / "s"
    _ok(
        *run_cli(
            "sweep",
            f"correction=none,tis,{BUG}",
            "correction.high=2,5",
            "mismatch.staleness=0,2",
            "seed=0,1",
            *TINY,
            *FAULTS,
            f"hydra.sweep.dir={d}",
        )[::2]
    )
    return d


@pytest.fixture(scope="module")
def one_seed(tmp_path_factory):
    """8 jobs, one seed: correction × correction.high × mismatch.staleness."""
    d = tmp_path_factory.mktemp("one") / "s"
    _ok(
        *run_cli(
            "sweep",
            "correction=tis,seq-mask-tis",
            "correction.high=2,5",
            "mismatch.staleness=0,2",
            "seed=0",
            *TINY,
            f"hydra.sweep.dir={d}",
        )[::2]
    )
    return d


@pytest.fixture(scope="module")
def rejects_all(tmp_path_factory):
    """geo-mask's ±0.1% band at staleness 2: every token of every update rejected, grad_norm = 0."""
    d = tmp_path_factory.mktemp("geo") / "r"
    _ok(*run_cli("run", "correction=geo-mask", "mismatch.staleness=2", *TINY, f"hydra.run.dir={d}")[::2])
    return d


@pytest.fixture(scope="module")
def outliers(tmp_path_factory):
    d = tmp_path_factory.mktemp("out") / "r"
    _ok(
        *run_cli(
            "run", "correction=tis", "mismatch=outliers", "mismatch.outlier_rate=0.05", *TINY, f"hydra.run.dir={d}"
        )[::2]
    )
    return d


@pytest.fixture(scope="module")
def probe_one_band(tmp_path_factory):
    """The default world, one band per preset: geo-mask masks ~96% of the tokens (degenerate)."""
    d = tmp_path_factory.mktemp("p1") / "p"
    _ok(
        *run_cli(
            "run",
            "study=probe",
            "probe.repeats=16",
            "probe.n_boot=100",
            "probe.presets=[tis,geo-mask,seq-tis]",
            "log.quiet=true",
            f"hydra.run.dir={d}",
        )[::2]
    )
    return d


@pytest.fixture(scope="module")
def probe_bands(tmp_path_factory):
    """Staleness 8: icepop's [0.8, 1.25] masks every token and has the lowest MSE (a zero update's)."""
    d = tmp_path_factory.mktemp("p3") / "p"
    _ok(
        *run_cli(
            "run",
            "study=probe",
            "probe.repeats=20",
            "probe.n_boot=100",
            "probe.presets=[tis,icepop]",
            "probe.bands=[[0.8,1.25],[0.5,2],[0.2,5]]",
            "mismatch.staleness=8",
            "log.quiet=true",
            f"hydra.run.dir={d}",
        )[::2]
    )
    return d


def _figures(path, kinds, style):
    from analysis import figures, load_dataset

    ds = load_dataset(path)
    return {k: figures.figure(k, ds, style) for k in kinds}


def _series(ax) -> list:
    return [ln for ln in ax.get_lines() if ln.get_gid() == "series"]


def _title(fig) -> str:
    return fig._suptitle.get_text() if fig._suptitle is not None else ""


# ------------------------------------------------------------------------------------ paper style
@pytest.mark.parametrize("style", ["paper", "default"])
def test_every_figure_fits_and_nothing_is_clipped_or_overlaps(cells, probe_one_band, probe_bands, style):
    """Paper: 3.3 in or 7 in wide, at most 3 rows of panels (a 2 × 2 facet grid of a 3-metric
    figure used to make 6 rows at 3.3 in). Both styles: no text beyond the figure's edge, no two
    titles overlapping, no two tick labels of a panel touching."""
    figs = {
        **_figures(cells, TRAIN_KINDS, style),
        **_figures(probe_one_band, ["presets"], style),
        **_figures(probe_bands, ["threshold"], style),
    }
    for kind, fig in figs.items():
        paper = style == "paper"
        found = problems(fig, widths=(3.3, 7.0) if paper else None, max_rows=3 if paper else None)
        assert not found, (kind, style, found)
    if style == "paper":
        assert figs["masking"].get_figwidth() == 7.0 and panel_rows(figs["masking"]) == 3  # 3 metrics × 4 facets
        assert (
            figs["stability"].get_figwidth() == 3.3 and panel_rows(figs["stability"]) == 2
        )  # 2 metrics × 2 thresholds
        assert figs["mismatch"].get_figwidth() == 7.0 and panel_rows(figs["mismatch"]) == 1
        # Facet titles name the key by its last part, so they fit a 1.6 in panel.
        titles = [ax.get_title() for ax in visible_axes(figs["training"]) if ax.get_title()]
        assert titles and all(t.startswith("high=") and "staleness=" in t for t in titles)


def test_size_follows_content(cells, probe_one_band):
    """Height grows with the rows drawn, not more: a default-style row is at most 3.1 in, and the
    per-preset figure grows with the presets."""
    from analysis import load_dataset
    from analysis.figures import probe

    for kind, fig in _figures(cells, TRAIN_KINDS, "default").items():
        rows = panel_rows(fig)
        # + title and x labels, and a legend's lines where it sits below the panels (one facet: issue 31)
        renderer = draw(fig)
        box = fig.legends[0].get_window_extent(renderer) if fig.legends else None
        below = box is not None and box.y1 < min(ax.get_window_extent(renderer).y0 for ax in visible_axes(fig))
        extra = box.height / fig.dpi + 0.3 if below else 0.0
        assert fig.get_figheight() <= 3.1 * rows + 1.6 + extra, (kind, rows, fig.get_size_inches())
        assert fig.get_figwidth() <= 17.5, (kind, fig.get_size_inches())
    for style, most in (("default", 4.5), ("paper", 3.0)):
        assert probe.presets_figure(load_dataset(probe_one_band), style).get_figheight() < most  # 3 presets


# ------------------------------------------------------------------------------ honest panels
def test_all_zero_panels_start_at_zero_and_say_so(one_seed, cells):
    """A panel whose data are all 0 (no NaN/inf update, no run collapsed) shows [0, 1.05] with no
    negative tick, and says so; a fraction that is 0 in every run (nothing masked or clamped here)
    is said once in the title instead of a row of flat panels; no fraction panel shows a negative
    tick, nor do J and the reward."""
    from analysis import figures, load_dataset
    from analysis.figures import training
    from analysis.tables import update_rows

    ds = load_dataset(one_seed)
    updates = update_rows(ds.metrics)  # not the final rows (J after the last update: no update cells)
    assert updates["token_masked_fraction"].eq(0).all() and updates["clamped_fraction"].eq(0).all()
    stab = training.stability_figure(ds)
    axes = visible_axes(stab)
    assert len(axes) == 4 and all(ax.get_ylim() == (0.0, 1.05) for ax in axes)
    notes = [t.get_text() for ax in axes for t in ax.texts]
    assert notes.count("no NaN/inf update in any run") == 2 and notes.count("no run collapsed") == 2
    assert not negative_ticks(stab, axes)
    fig = training.masking_figure(ds)
    assert [ax.get_ylabel().replace("\n", " ") for ax in visible_axes(fig)][:1] == ["ESS (fraction of tokens)"]
    assert len(visible_axes(fig)) == 4  # one row: ESS × 4 cells
    assert "no token masked or clamped in any run (panels left out)" in _title(fig).replace("\n", " ")
    for path in (one_seed, cells):
        for kind in ("masking", "training", "stability"):
            fig = figures.figure(kind, load_dataset(path))
            assert not negative_ticks(fig, visible_axes(fig)), (path, kind)


def test_ess_of_nan_weights_is_a_gap_with_marks(cells):
    """Where the as-shipped preset's weights are NaN/inf (an outlier in the mini-batch), its ESS is
    undefined. It used to be drawn at 0; it is a gap where every seed's is undefined, and a mark
    under the data at every step where some seed's is."""
    from analysis import load_dataset
    from analysis.figures import training
    from analysis.tables import update_rows

    ds = load_dataset(cells)
    fig = training.masking_figure(ds)
    m = update_rows(ds.metrics)  # the final rows (J after the last update) have no weights
    ess_panels = visible_axes(fig)[8:]  # the ESS row: panels 8–11 (3 metric rows × 4 facets)
    facet_jobs = [
        sorted(m.loc[(m["correction.high"] == h) & (m["mismatch.staleness"] == k), "job"].unique())
        for h in (2, 5)
        for k in (0, 2)
    ]
    gaps = 0
    for ax, jobs in zip(ess_panels, facet_jobs):
        rows = m[m["job"].isin(jobs) & (m["correction"] == BUG)]
        undefined = (~np.isfinite(rows["is_weight_mean"].astype(float))).groupby([rows["job"], rows["step"]]).all()
        by_step = undefined.groupby(level="step")
        (line,) = [ln for ln in _series(ax) if ln.get_label() == BUG]
        y = np.asarray(line.get_ydata(), dtype=float)
        steps = np.asarray(line.get_xdata(), dtype=float)
        all_undefined = by_step.all().reindex(steps).to_numpy()
        assert np.array_equal(np.isnan(y), all_undefined)
        assert not (y[np.isfinite(y)] == 0).any()
        marks = [ln for ln in ax.get_lines() if ln.get_gid() == "events"]
        some = sorted(by_step.any()[by_step.any()].index)
        assert sorted(marks[0].get_xdata()) == some if marks else some == []
        gaps += int(all_undefined.sum())
    assert gaps > 0  # the data do have steps with no defined ESS
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any("ESS undefined" in lab for lab in labels)


def test_zero_gradients_are_marked_not_a_silent_gap(rejects_all):
    from analysis import load_dataset
    from analysis.figures import training

    ds = load_dataset(rejects_all)
    fig = training.grad_norm_figure(ds)
    (ax,) = visible_axes(fig)
    zeros = [ln for ln in ax.get_lines() if ln.get_gid() == "zeros"]
    assert zeros and len(zeros[0].get_xdata()) == int((ds.metrics["grad_norm"] == 0).sum()) == 12
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any("gradient exactly 0 (every token rejected" in lab for lab in labels)


def test_off_scale_mismatch_tails_are_drawn_and_counted(outliers):
    """1 in 20 rollout log-probs 1000 nats off: the histogram's x range stops near the bulk, and
    the tokens beyond it are drawn at the edge at their count and named as injected outliers."""
    from analysis import load_dataset
    from analysis.figures import mismatch

    ds = load_dataset(outliers)
    tok = ds.tokens
    lr = (tok["old"] - tok["roll"]).to_numpy(dtype=float)
    n_outliers = int((np.abs(lr) > 50).sum())
    assert n_outliers > 0
    fig = mismatch.mismatch_figure(ds)
    hist = visible_axes(fig)[0]
    tails = [p for p in hist.patches if p.get_gid() == "tails"]
    R = max(float(np.max(p.get_data().edges)) for p in hist.patches if p.get_gid() == "series")
    beyond = int((lr > R).sum()) + int((lr < -R).sum())
    assert hist.get_xlim()[1] > R  # the overflow bins sit between the last bin and the edge
    assert sum(float(p.get_data().values.sum()) for p in tails) == beyond >= n_outliers
    note = " ".join(t.get_text() for t in hist.texts)
    assert f"{beyond:,} token(s)" in note and f"{n_outliers:,} of them\ninjected outliers" in note


# ---------------------------------------------------------------------------------- lines, colours
def test_identical_lines_are_distinguishable(cells):
    """none and tis mask nothing: their masked-fraction lines coincide. The one on top gets
    markers, the one underneath a wider rim, and the title says which is which."""
    from analysis import load_dataset
    from analysis.figures import training

    fig = training.masking_figure(load_dataset(cells))
    for ax in visible_axes(fig):
        lines = _series(ax)
        for i, a in enumerate(lines):
            for b in lines[i + 1 :]:
                same = np.array_equal(
                    np.asarray(a.get_ydata(), float), np.asarray(b.get_ydata(), float), equal_nan=True
                )
                if same and np.isfinite(np.asarray(a.get_ydata(), float)).any():
                    assert b.get_marker() not in (None, "None", "") and a.get_linewidth() > b.get_linewidth()
    assert "tis = none" in _title(fig)


def test_every_dimension_has_its_own_palette(cells):
    """Staleness groups (the mismatch figure) never take a correction's colour."""
    from analysis import load_dataset, style
    from analysis.figures import mismatch

    ds = load_dataset(cells)
    fig = mismatch.mismatch_figure(ds)
    hist = visible_axes(fig)[0]
    from matplotlib.colors import to_hex

    group_colours = {to_hex(p.get_edgecolor()).upper() for p in hist.patches if p.get_gid() == "series"}
    assert len(group_colours) == 2  # staleness 0 and 2
    assert not group_colours & style.correction_colors()
    assert style.dimension_colors("mismatch.staleness", [0, 2]) != style.dimension_colors("precision", ["fp32", "bf16"])


def test_no_legend_or_title_says_band_for_a_shaded_area(cells, probe_bands):
    """`band=` / correction.low/high are swept keys; the shaded areas say 'shaded'."""
    figs = {
        **_figures(cells, ("grad-norm", "training", "stability"), "default"),
        **_figures(probe_bands, ["threshold"], "default"),
    }
    for kind, fig in figs.items():
        words = _title(fig) + " ".join(t.get_text() for leg in fig.legends for t in leg.get_texts())
        assert not re.search(r"\bband:", words), (kind, words)
    assert "shaded: min–max" in _title(figs["grad-norm"])
    assert "shaded: 95% CI of the bias" in _title(figs["threshold"]).replace("\n", " ")


# ---------------------------------------------------------------------------------- seed counts
def test_captions_count_seeds_not_jobs(cells, one_seed):
    """Each point of the stability figure averages the seeds of one (threshold, correction, k)
    cell: 2 here, not the 4 jobs that share a correction and k; one seed says no 'mean over'."""
    from analysis import load_dataset
    from analysis.figures import training

    two = {
        k: _title(f) for k, f in _figures(cells, ("stability", "training", "masking", "grad-norm"), "default").items()
    }
    assert "mean over 2 seeds" in two["stability"] and "4 seeds" not in two["stability"]
    assert "over 2 seeds" in two["training"] and "over 2 seeds" in two["masking"] and "over 2 seeds" in two["grad-norm"]
    one = {k: _title(f) for k, f in _figures(one_seed, ("stability", "training", "masking"), "default").items()}
    assert all("seeds" not in t for t in one.values()), one
    fig = training.stability_figure(load_dataset(cells))
    assert any("fraction of 2 seeds" in ax.get_ylabel().replace("\n", " ") for ax in visible_axes(fig))


# ------------------------------------------------------------------------------------- probe
def test_default_probe_plots_bias_variance_and_relative_mse_per_preset(probe_one_band, tmp_path):
    """`is-study plot` on a one-band probe draws the per-preset figure (it used to exit 2): a point
    per preset in each panel, relative MSE with the zero-update line at 1, geo-mask hollow and
    named degenerate."""
    code, out, err = run_cli("plot", str(probe_one_band), "-o", str(tmp_path))
    assert code == 0, err
    assert sorted(p.rsplit("/", 1)[-1] for p in out.split()) == ["presets.pdf", "presets.png"]
    from analysis import load_dataset
    from analysis.figures import probe

    fig = probe.presets_figure(load_dataset(probe_one_band))
    bias, var, rel = visible_axes(fig)
    assert "bias" in bias.get_xlabel() and "variance" in var.get_xlabel() and "MSE" in rel.get_xlabel()
    assert "/" in rel.get_xlabel() and "nabla J" in rel.get_xlabel()
    pr = pd.read_csv(probe_one_band / "probe.csv")
    for ax, col in ((bias, "bias_norm"), (var, "variance"), (rel, "rel_mse")):
        points = {ln.get_label(): float(ln.get_xdata()[0]) for ln in _series(ax)}
        assert set(points) == {"tis", "geo-mask", "seq-tis"}
        for name, x in points.items():
            assert x == pytest.approx(float(pr.loc[pr.preset == name, col].iloc[0]))
    assert any(ln.get_gid() == "reference" and list(ln.get_xdata()) == [1.0, 1.0] for ln in rel.get_lines())
    geo = [ln for ln in _series(rel) if ln.get_label() == "geo-mask"][0]
    assert geo.get_markerfacecolor() == "white"
    assert any(t.get_text().startswith(" degenerate (9") for t in rel.texts)
    assert [t.get_text() for t in bias.get_yticklabels()][:3] == [
        "tis [0.5, 5]",
        "seq-tis [—, 5]",
        "geo-mask [0.999, 1.001]",
    ]


def test_threshold_never_stars_a_degenerate_arm(probe_bands):
    """icepop at [0.8, 1.25] masks every token: its MSE is a zero update's, the lowest of icepop's
    bands, and it used to be starred. It is drawn hollow, and the star goes to the best band
    that learns; the MSE axis is relative (÷ ‖∇J‖²)."""
    from analysis import load_dataset
    from analysis.figures import probe

    pr = pd.read_csv(probe_bands / "probe.csv")
    ice = pr[pr.preset == "icepop"].set_index("high")
    assert ice.loc[1.25, "degenerate"] == 1 and ice.loc[1.25, "mse"] == ice["mse"].min()
    fig = probe.threshold_figure(load_dataset(probe_bands))
    rel = visible_axes(fig)[2]
    assert "nabla J" in rel.get_ylabel()
    stars = [(float(ln.get_xdata()[0]), float(ln.get_ydata()[0])) for ln in rel.get_lines() if ln.get_gid() == "best"]
    assert len(stars) == 2
    degenerate = {
        (float(h), float(v)) for h, v in zip(pr.loc[pr.degenerate == 1, "high"], pr.loc[pr.degenerate == 1, "rel_mse"])
    }
    assert not set(stars) & degenerate
    hollow = [ln for ln in rel.get_lines() if ln.get_gid() == "degenerate"]
    assert hollow and float(hollow[0].get_xdata()[0]) == 1.25
    assert any(ln.get_gid() == "reference" for ln in rel.get_lines())
    assert all(math.isfinite(y) for _, y in stars)


# ------------------------------------------------------------------------------- sparse objective
def test_objective_every_n_steps_is_one_connected_line(tmp_path):
    """The transformer and mlp worlds evaluate J every train.objective_every steps and leave the
    cells between empty; the training figure used to draw those NaNs as gaps, leaving no visible
    line at all. The line joins the evaluated steps (with markers, being sparse), and the reward,
    logged every step, keeps all of them."""
    from analysis import load_dataset
    from analysis.figures import training

    d = tmp_path / "r"
    _ok(*run_cli("run", "train.objective_every=3", *TINY, f"hydra.run.dir={d}")[::2])
    ds = load_dataset(d)
    evaluated = sorted(ds.metrics.loc[ds.metrics["objective"].notna(), "step"].unique())
    assert 2 <= len(evaluated) < ds.metrics["step"].nunique()
    objective, reward = visible_axes(training.training_figure(ds))
    (line,) = _series(objective)
    assert list(line.get_xdata()) == evaluated and np.isfinite(np.asarray(line.get_ydata(), float)).all()
    assert line.get_marker() == "o"
    (reward_line,) = _series(reward)
    # every update step's reward (the final row, step 6, holds J after the last update and no reward)
    y = np.asarray(reward_line.get_ydata(), float)
    assert list(np.asarray(reward_line.get_xdata())[np.isfinite(y)]) == list(range(6))


def test_threshold_ticks_name_both_thresholds_and_the_legend_keeps_off_the_title(probe_bands):
    """The bands [0.8, 1.25], [0.5, 2], [0.2, 5] change both thresholds; the x axis showed only the
    upper one (1, 2, 3, 4, 5). Each tick is a band now, the lower threshold beneath. One facet: the
    legend sits below the panels, never over the title's lines (issue 31)."""
    from tests.helpers.figure_checks import draw

    for style in ("default", "paper"):
        fig = _figures(probe_bands, ["threshold"], style)["threshold"]
        ax = visible_axes(fig)[0]
        assert [t.get_text() for t in ax.get_xticklabels()] == ["1.25\n(0.8)", "2\n(0.5)", "5\n(0.2)"]
        assert "lower" in ax.get_xlabel() or r"\rho_{\min}" in ax.get_xlabel()
        renderer = draw(fig)
        legend = fig.legends[0].get_window_extent(renderer)
        assert legend.y1 < min(a.get_window_extent(renderer).y0 for a in visible_axes(fig))
        if fig._suptitle is not None and fig._suptitle.get_text():
            assert not legend.overlaps(fig._suptitle.get_window_extent(renderer))


def test_a_band_without_a_lower_bound_is_one_band_at_its_upper_threshold():
    """TIS's band has no lower bound (low: null, NaN in the frame). Every run's NaN is a new float, and
    NaN never equals itself: as a key, each run was a band of its own, found by no lookup (its runs were
    dropped from the figure) and ordered by memory address (the figure changed between processes)."""
    import pandas as pd

    from analysis.figures.threshold_training import _band_positions, band_key

    per = pd.DataFrame({"low": [float("nan"), float("nan"), 0.5, 0.5], "high": [2.0, 2.0, 2.0, 5.0]})
    xs, where, log_x = _band_positions(per)
    assert xs == {(-math.inf, 2.0): 2.0, (0.5, 2.0): 2.0, (0.5, 5.0): 5.0}
    assert (where, log_x) == ("upper", False)
    assert [xs.get(band_key(lo, hi)) for lo, hi in zip(per["low"], per["high"])] == [2.0, 2.0, 2.0, 5.0]
    same_high = pd.DataFrame({"low": [float("nan"), 0.1, 0.5], "high": [2.0, 2.0, 2.0]})
    xs, where, log_x = _band_positions(same_high)
    assert where == "lower" and math.isnan(xs[(-math.inf, 2.0)]) and xs[(0.1, 2.0)] == 0.1
    assert log_x  # 0.1 … 0.5: a 5× span
