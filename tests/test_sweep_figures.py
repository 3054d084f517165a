"""The figures of a threshold sweep show what it found (issue 31, §4), on a small real one: the shipped
threshold-tradeoff experiment at 20 steps, tis and icepop × tight, mid and loose bands × staleness 0, 2, 8
× 2 seeds. At staleness 0 every band gives byte-identical runs (the ratios are exactly 1); at 8 the tight
band makes icepop mask a large share of the tokens and fall behind, the one result of the sweep."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.helpers.cli import run_cli
from tests.helpers.figure_checks import problems, visible_axes

pytestmark = pytest.mark.slow  # each test draws figures from a sweep or run made by a module fixture

SIZE = ["train.steps=20", "log.quiet=true", "log.tokens_every=0"]


@pytest.fixture(scope="module")
def bands(tmp_path_factory):
    """36 jobs: correction=tis,icepop × band=tight,mid,loose × mismatch.staleness=0,2,8 × seed=0,1."""
    d = tmp_path_factory.mktemp("bands") / "s"
    code, _, err = run_cli(
        "sweep",
        "experiment=bigram/threshold-tradeoff",
        "correction=tis,icepop",
        "seed=0,1",
        *SIZE,
        f"hydra.sweep.dir={d}",
    )
    assert code == 0, err
    return d


@pytest.fixture(scope="module")
def ds(bands):
    from analysis import load_dataset

    return load_dataset(bands)


def _title(fig) -> str:
    return fig._suptitle.get_text().replace("\n", " ") if fig._suptitle is not None else ""


def _panel_titles(fig) -> list[str]:
    """The panels' titles, centred (layout.Grid) or on the left (the field's rows of panels)."""
    return [
        ax.get_title() or ax.get_title(loc="left")
        for ax in visible_axes(fig)
        if ax.get_title() or ax.get_title(loc="left")
    ]


def _per(ds):
    from analysis.tables import per_job

    return per_job(ds)


def test_the_sweep_has_its_one_result(ds):
    """The premise of the tests below, in numbers: icepop's final J at the tight band and k = 8 is
    below tis's there, and every correction gives the same J at k = 0."""
    per = _per(ds)
    cell = per.groupby(["correction", "band", "mismatch.staleness"])["final_objective"].mean()
    assert cell[("icepop", "tight", 8)] < cell[("tis", "tight", 8)] - 0.01
    for band in ("tight", "mid", "loose"):
        assert cell[("icepop", band, 0)] == cell[("tis", band, 0)]


# ------------------------------------------------------------------------------ which panels a cut keeps
def test_paper_training_keeps_the_panels_where_the_corrections_differ(ds):
    """Paper style holds 4 panels of 9. It kept the first 4 (loose k=0, 2, 8, mid k=0: lines that
    coincide) and dropped tight k=8; it keeps the panels where J differs, and names the others."""
    from analysis import figures

    fig = figures.figure("training", ds, "paper")
    titles = _panel_titles(fig)
    assert "band=tight, staleness=8" in titles
    assert all("staleness=0" not in t for t in titles)  # J of tis and icepop coincide at k = 0
    note = _title(fig)
    assert "first 4 of 9" not in note
    assert f"{len(titles)} of 9 panels drawn, those where the corrections differ most in J" in note
    assert "left out: " in note and "band=loose, staleness=0" in note.split("left out: ", 1)[1]
    assert not problems(fig, widths=(3.3, 7.0), max_rows=3)


def test_arm_spread_ranks_facets_by_the_gap_between_corrections(ds):
    """arm_spread is the largest gap between two corrections' mean lines, as a fraction of the
    figure's range: 0 where they coincide (k = 0), largest at tight k = 8."""
    from analysis.figures import facets

    per = (
        ds.metrics.groupby(["job", "step"])
        .agg(objective=("objective", "first"), correction=("correction", "first"))
        .reset_index()
    )
    fs = facets.facets(ds, ds.metrics, limit=None)
    spread = dict(zip([f.title("paper") for f in fs], facets.arm_spread(per, fs, ["objective"])))
    assert all(spread[f"band={b}, staleness=0"] == 0 for b in ("tight", "mid", "loose"))
    assert max(spread, key=spread.get) == "band=tight, staleness=8"
    # by hand: the largest gap over steps between the two corrections' means over seeds, over J's range
    cell = per[per["job"].isin(next(f for f in fs if f.title("paper") == "band=tight, staleness=8").jobs)]
    means = cell.groupby(["correction", "step"])["objective"].mean().unstack(0)
    expected = (means.max(axis=1) - means.min(axis=1)).max() / (
        per.groupby(["correction", "step"])["objective"].mean().max() - per["objective"].min()
    )
    assert spread["band=tight, staleness=8"] == pytest.approx(expected, rel=0.05)


def test_mismatch_over_training_cut_is_said_not_first_n(ds):
    """27 panels of one precision each: the cut keeps the ones most unlike each other (their
    staleness differs), not the first 3, and says so."""
    from analysis import figures

    fig = figures.figure("mismatch-over-training", ds, "paper")
    note = _title(fig)
    assert "first 3 of" not in note and "3 of 18 panels drawn, the ones most unlike each other" in note
    stale = {t.rsplit("staleness=", 1)[1] for t in _panel_titles(fig) if "staleness=" in t}
    assert {"0", "8"} <= stale


# ------------------------------------------------------------------------------ flat panels
def test_masking_leaves_out_the_facets_that_show_nothing(ds):
    """At k = 0 nothing is masked or clamped and the ESS is 1: those facets are named in one line,
    not drawn (27 panels, most of them flat at 0, before)."""
    from analysis import figures

    for style in ("default", "paper"):
        fig = figures.figure("masking", ds, style)
        titles = _panel_titles(fig)
        assert titles and all("staleness=0" not in t for t in titles), (style, titles)
        assert any("band=tight" in t and "staleness=8" in t for t in titles)
        note = _title(fig)
        assert "left out, flat (" in note and "band=tight, staleness=0" in note, note


def test_flat_figures_are_skipped_with_a_reason_but_drawn_when_asked(ds):
    """No run has a NaN/inf update or collapses: stability would be flat lines at 0 and survival at 1.
    The default choice skips them and says why; --kind draws them."""
    from analysis import figures

    chosen, skipped = figures.choose(ds, None)
    assert "stability" not in chosen and "survival" not in chosen
    assert skipped["stability"].startswith("no NaN/inf update and no collapse in any of the 36 runs")
    assert skipped["survival"].startswith("no run collapsed (of 36)")
    assert figures.choose(ds, ["stability", "survival"])[0] == ["stability", "survival"]
    code, out, err = run_cli("plot", str(ds.path), "-o", str(ds.path / "flat-check"))
    assert code == 0 and "skipped stability: no NaN/inf update" in " ".join(err.split())
    assert not (ds.path / "flat-check" / "stability.png").exists()


def test_a_run_without_masking_skips_the_masking_figure(tmp_path):
    """One run at staleness 0: nothing masked or clamped, ESS ≈ 1 in every step. The masking figure
    was one flat ESS panel; the default choice skips it with the numbers, --kind still draws it."""
    from analysis import figures, load_dataset

    d = tmp_path / "r"
    code, _, err = run_cli(
        "run", "correction=icepop", "mismatch.staleness=0", "train.steps=4", "log.quiet=true", f"hydra.run.dir={d}"
    )
    assert code == 0, err
    ds = load_dataset(d)
    updates = ds.metrics[ds.metrics["reward"].notna()]  # metrics.csv's final row holds J only
    assert len(updates) == 8 and updates["token_masked_fraction"].eq(0).all() and updates["ess"].min() > 0.98
    chosen, skipped = figures.choose(ds, None)
    assert "masking" not in chosen and skipped["masking"].startswith("flat in every run")
    assert figures.choose(ds, ["masking"])[0] == ["masking"]


# ------------------------------------------------------------------------------ outcome against the band
def test_threshold_training_draws_outcomes_against_the_band(ds):
    """A row per staleness, a column per outcome that is not 0 in every run, a line per correction
    over the three bands; each point is the mean over seeds of summary.json's final J (as per_job
    reads it). The peak-to-final drop and NaN/inf events are 0 in every run: said, not drawn."""
    from analysis import figures
    from analysis.figures import layout

    assert "threshold-training" in figures.KINDS
    avail = figures.availability(ds)
    assert avail["threshold-training"] is None and "--kind threshold-training" in avail["threshold"]
    per = _per(ds)
    for style in ("default", "paper"):
        fig = figures.figure("threshold-training", ds, style)
        axes = visible_axes(fig)
        assert len(axes) == 3 * 3  # staleness 0, 2, 8 × final J, masked fraction, ESS
        note = _title(fig)
        assert "J never fell from its peak in any run (drop 0); no NaN/inf event in any run" in note
        for ax in axes:
            series = [ln for ln in ax.get_lines() if ln.get_gid() == "series"]
            assert sorted(ln.get_label() for ln in series) == ["icepop", "tis"]
            assert all(len(ln.get_xdata()) == 3 for ln in series)
        assert not problems(
            fig, widths=(3.3, 7.0) if style == "paper" else None, max_rows=3 if style == "paper" else None
        ), style
    fig = figures.figure("threshold-training", ds)
    k8 = [ax for ax in visible_axes(fig) if ax.get_title(loc="left") == "mismatch.staleness=8"][0]
    icepop = next(ln for ln in k8.get_lines() if ln.get_label() == "icepop")
    x, y = np.asarray(icepop.get_xdata(), dtype=float), np.asarray(icepop.get_ydata(), dtype=float)
    expected = (
        per[(per["correction"] == "icepop") & (per["mismatch.staleness"] == 8)]
        .groupby("band")["final_objective"]
        .mean()
    )
    assert x.tolist() == [1.25, 2.0, 5.0]  # each band at its upper threshold
    assert y.tolist() == pytest.approx([expected["tight"], expected["mid"], expected["loose"]], abs=1e-12)
    assert [t.get_text() for t in k8.get_xticklabels()] == ["tight\n0.8–1.25", "mid\n0.5–2", "loose\n0.2–5"]
    assert k8.get_xscale() == "log"
    assert layout.TITLES["threshold-training"]


# ------------------------------------------------------------------------------ layout
def test_training_y_labels_do_not_run_into_each_other(ds):
    """6 rows of panels at 1.8 in: the two y labels of each row pair stacked into one string (the
    label with maths was never wrapped). They are wrapped to their row now."""
    from analysis import figures
    from tests.helpers.figure_checks import draw

    fig = figures.figure("training", ds)
    found = problems(fig)
    assert not found, found
    renderer = draw(fig)
    boxes = sorted(
        (ax.yaxis.label.get_window_extent(renderer) for ax in visible_axes(fig) if ax.get_ylabel()), key=lambda b: b.y0
    )
    gaps = [(b.y0 - a.y1) / fig.dpi for a, b in zip(boxes, boxes[1:])]
    assert len(gaps) == 5 and min(gaps) >= 0.25, gaps  # inches between one label and the next (it was 0.05)


def test_the_title_keeps_the_config_to_one_line(tmp_path):
    """A run with many overrides: the title's config is cut to two lines (the whole config is in
    the file's metadata); it ran to a third and fourth."""
    from analysis import figures, load_dataset

    d = tmp_path / "r"
    overrides = [
        "correction=seq-mask-tis",
        "train.steps=4",
        "rollout.batch_size=2",
        "rollout.group_size=2",
        "correction.high=3",
        "correction.low=0.4",
        "mismatch.staleness=2",
        "train.lr=0.05",
        "train.updates_per_step=1",
        "train.grad_clip=2.0",
        "rollout.seq_len=8",
        "rollout.vocab_size=12",
        "log.quiet=true",
    ]
    code, _, err = run_cli("run", *overrides, f"hydra.run.dir={d}")
    assert code == 0, err
    ds = load_dataset(d)
    fig = figures.figure("training", ds)
    lines = fig._suptitle.get_text().split("\n")
    assert lines[0] == "Training curves" and lines[2].endswith("…") and len(lines) == 3
    assert "rollout.vocab_size=12" in fig._is_study_meta["Subject"]
    # one row of panels: the legend goes below it, and the figure keeps no room for it on the right
    found = problems(fig)
    assert not found, found
    from tests.helpers.figure_checks import draw

    renderer = draw(fig)
    legend = fig.legends[0].get_window_extent(renderer)
    lowest = min(ax.get_window_extent(renderer).y0 for ax in visible_axes(fig))
    rightmost = max(ax.get_window_extent(renderer).x1 for ax in visible_axes(fig))
    assert legend.y1 < lowest and fig.bbox.width - rightmost < 0.1 * fig.bbox.width


def test_stability_spaces_staleness_by_its_value(bands):
    """Staleness 0, 2, 8 on a numeric axis (it was spaced 0, 1, 2 as if categorical)."""
    from analysis import load_dataset
    from analysis.figures import training

    fig = training.stability_figure(load_dataset(bands))
    ax = visible_axes(fig)[-1]  # the lowest row carries the tick labels
    ticks = [(round(float(t.get_position()[0]), 6), t.get_text()) for t in ax.get_xticklabels()]
    assert ticks == [(0.0, "0"), (2.0, "2"), (8.0, "8")]
    for line in (ln for ln in ax.get_lines() if ln.get_gid() == "series"):
        xs = np.asarray(line.get_xdata(), dtype=float)
        assert np.allclose(np.round(xs), [0, 2, 8], atol=0.5)  # each point near its k, side by side


def test_chi2_that_changes_sign_is_drawn_as_its_absolute_value(ds):
    """χ² per token changes sign step to step at k = 0 (its noise exceeds it); a symlog axis made it
    flip. It is |χ²| on a log axis now, with hollow marks where it was negative, and the label says so."""
    from analysis import figures

    fig = figures.figure("mismatch-over-training", ds)
    chi = [ax for ax in visible_axes(fig) if "chi" in ax.get_ylabel()]
    assert chi and all(ax.get_yscale() == "log" and "|" in ax.get_ylabel() for ax in chi)
    for ax in chi:
        for ln in ax.get_lines():
            if ln.get_gid() == "series":
                y = np.asarray(ln.get_ydata(), dtype=float)
                assert (y[np.isfinite(y)] >= 0).all()
    assert any(ln.get_gid() == "negative" for ax in chi for ln in ax.get_lines())
    assert "drawn as |χ²| on a log axis, hollow where negative" in _title(fig)


def test_symlog_decades_fit_the_panel():
    """The transformer histogram's axis (linear within ±1e-5, to ±0.15) on a 1.7 in paper panel held
    −10⁻¹ −10⁻² −10⁻³ side by side; the decades kept are at least a label's width apart, and the
    widest panel keeps more of them."""
    from analysis.figures.mismatch import SYMLOG_LINSCALE, symlog_decades

    c, R = 1e-5, 0.15
    for width, paper in ((1.7, True), (3.5, False)):
        kept = symlog_decades(c, R, R, width, paper)
        linear = SYMLOG_LINSCALE / 0.9
        per_decade = width / (2 * (linear + math.log10(R / c)))
        at = linear + np.log10(kept / c)
        assert len(kept) >= 1 and kept[-1] == 0.1
        assert np.all(np.diff(at) * per_decade >= (0.3 if paper else 0.4))
    assert len(symlog_decades(c, R, R, 1.7, True)) < len(symlog_decades(c, R, R, 6.0, True))


# ------------------------------------------------------------------------------ where each style goes
def test_paper_style_keeps_its_own_folder_and_the_report_embeds_the_default(bands, tmp_path):
    """`plot --style paper` wrote into PATH/figures/, over the default figures, and report.md embedded
    whichever was drawn last. The paper style goes to PATH/figures/paper/; the report embeds the
    default style's, and redraws a paper-style PNG it finds in PATH/figures/."""
    from analysis.figures import layout

    code, out, err = run_cli("plot", str(bands), "-k", "training", "--style", "paper")
    assert code == 0, err
    paper = bands / "figures" / "paper" / "training.png"
    assert str(paper) in out.split() and layout.drawn_style(paper) == "paper"
    assert not (bands / "figures" / "training.png").exists()
    code, out, err = run_cli("plot", str(bands), "-k", "training")
    assert code == 0, err
    assert layout.drawn_style(bands / "figures" / "training.png") == "default"
    assert layout.drawn_style(paper) == "paper"  # untouched
    # an older `plot --style paper` left a paper PNG in figures/: the report draws the default over it
    code, _, err = run_cli("plot", str(bands), "-k", "masking", "--style", "paper", "-o", str(bands / "figures"))
    assert code == 0, err
    assert layout.drawn_style(bands / "figures" / "masking.png") == "paper"
    code, out, err = run_cli("report", str(bands), "--out", str(tmp_path / "r.md"))
    assert code == 0, err
    text = (tmp_path / "r.md").read_text()
    assert "figures/training.png" in text and "figures/paper/" not in text
    assert "figures/threshold-training.png" in text  # the sweep's one result, in the report too
    assert layout.drawn_style(bands / "figures" / "masking.png") == "default"


def test_zero_gradient_marks_do_not_stretch_a_shared_log_axis(tmp_path):
    """geo-mask rejects every token at staleness ≥ 1 (gradient exactly 0, marked on the bottom edge).
    The panels share y, and the room for the marks was added once per panel, each time from the limits
    the previous one left: 4 panels gave the data 58% of the log axis (9 panels: down to 1e-7). Added
    once, the data keep over 75% of it."""
    from analysis import figures, load_dataset

    d = tmp_path / "z"
    code, _, err = run_cli(
        "sweep",
        "correction=tis,geo-mask",
        "mismatch.staleness=0,1,2,4",
        "seed=0",
        "train.steps=6",
        "rollout.batch_size=2",
        "rollout.group_size=2",
        "log.quiet=true",
        "log.tokens_every=0",
        f"hydra.sweep.dir={d}",
    )
    assert code == 0, err
    ds = load_dataset(d)
    assert (ds.metrics["grad_norm"] == 0).any() and (ds.metrics["grad_norm"] > 0).any()
    for style in ("default", "paper"):
        fig = figures.figure("grad-norm", ds, style)
        axes = visible_axes(fig)
        assert len(axes) == 4 and any(ln.get_gid() == "zeros" for ax in axes for ln in ax.get_lines())
        vals = np.concatenate(
            [
                np.asarray(ln.get_ydata(), dtype=float)
                for ax in axes
                for ln in ax.get_lines()
                if ln.get_gid() == "series"
            ]
        )
        vals = vals[np.isfinite(vals) & (vals > 0)]
        lo, hi = axes[0].get_ylim()
        share = math.log10(vals.max() / vals.min()) / math.log10(hi / lo)
        assert share > 0.75, (style, lo, hi, share)
