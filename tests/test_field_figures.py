"""The field's figures (analysis/figures/: mismatch-over-training, survival, bias-split,
length-heatmap) and the report's peak-to-final table, on real tiny outputs made here: a bigram sweep
where the as-shipped OpenRLHF preset meets NaN/inf and some runs collapse, an mlp sweep over the
engine's precision, a transformer sweep with a tiny SFT warm start (its J by Monte Carlo), and probe
sweeps over the response length (bigram: exact ∇J; transformer: a Monte Carlo reference)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.tables import update_rows
from tests.helpers.cli import run_cli
from tests.helpers.figure_checks import problems, visible_axes

pytestmark = pytest.mark.slow  # each test draws figures from a sweep or run made by a module fixture

BUG = "openrlhf-bc71bb1/seq-mask-tis"
TINY = ["rollout.batch_size=2", "rollout.group_size=2", "log.quiet=true"]
# lr 1.0 and relative collapse rules scaled to 16 steps, and 1 in 250 rollout log-probs 1000 nats off
# with NaN/inf updates applied: the as-shipped preset's parameters go NaN at different steps, and
# one tis run falls 10% below its peak (seeds 0, 1; checked below, not assumed).
COLLAPSING = [
    "train.steps=16",
    "train.lr=1.0",
    "mismatch.outlier_rate=0.004",
    "train.on_nonfinite=apply",
    "train.collapse.window=3",
    "train.collapse.drop=0.1",
    "train.collapse.min_history=4",
]


def _ok(code, out, err):
    assert code == 0, err
    return out


@pytest.fixture(scope="module")
def field(tmp_path_factory):
    """16 bigram jobs: correction × rollout.seq_len (4, 8) × mismatch.staleness (0, 8) × seed (0, 1)."""
    d = tmp_path_factory.mktemp("field") / "s"
    _ok(
        *run_cli(
            "sweep",
            f"correction=tis,{BUG}",
            "rollout.seq_len=4,8",
            "mismatch.staleness=0,8",
            "seed=0,1",
            *COLLAPSING,
            *TINY,
            "log.tokens_every=4",
            f"hydra.sweep.dir={d}",
        )
    )
    return d


@pytest.fixture(scope="module")
def precisions(tmp_path_factory):
    """6 mlp jobs: the engine in bf16, fp16 and fp8 × 2 seeds, 8 steps."""
    d = tmp_path_factory.mktemp("mlp") / "s"
    _ok(
        *run_cli(
            "sweep",
            "policy=mlp",
            "mismatch.precision=bf16,fp16,fp8",
            "seed=0,1",
            "train.steps=8",
            "rollout.seq_len=8",
            "train.objective_every=2",
            *TINY,
            f"hydra.sweep.dir={d}",
        )
    )
    return d


@pytest.fixture(scope="module")
def transformer(tmp_path_factory):
    """The transformer world, tiny (1 layer, d_model 16, a 30-step SFT warm start cached in a temporary
    folder), its engine in bf16 and fp16, 6 steps, J by Monte Carlo every 2 steps."""
    cache = tmp_path_factory.mktemp("sft-cache")
    d = tmp_path_factory.mktemp("transformer") / "s"
    _ok(
        *run_cli(
            "sweep",
            "policy=transformer",
            "mismatch.precision=bf16,fp16",
            "policy.n_layer=1",
            "policy.d_model=16",
            "policy.n_head=2",
            "task.values=6",
            "task.partial_credit=true",
            "rollout.seq_len=6",
            "train.steps=6",
            "train.objective_samples=16",
            "train.objective_every=2",
            "policy.sft.steps=30",
            "policy.sft.eval_samples=32",
            f"policy.sft.cache_dir={cache}",
            "device=cpu",
            "log.tokens_every=2",
            *TINY,
            f"hydra.sweep.dir={d}",
        )
    )
    return d


@pytest.fixture(scope="module")
def lengths_probe(tmp_path_factory):
    """The shipped bias-variance-by-level probe at T = 2, 4, 8, 20 batches (bigram: ∇J exact)."""
    d = tmp_path_factory.mktemp("bvl") / "s"
    _ok(
        *run_cli(
            "sweep",
            "experiment=bigram/bias-variance-by-level",
            "rollout.seq_len=2,4,8",
            "probe.repeats=20",
            "probe.n_boot=100",
            "log.quiet=true",
            f"hydra.sweep.dir={d}",
        )
    )
    return d


def _series(ax) -> list:
    return [ln for ln in ax.get_lines() if ln.get_gid() == "series"]


def _title(fig) -> str:
    return fig._suptitle.get_text().replace("\n", " ") if fig._suptitle is not None else ""


def _summaries(path: Path) -> pd.DataFrame:
    rows = []
    for job in sorted(p for p in path.iterdir() if (p / "summary.json").is_file()):
        s = json.loads((job / "summary.json").read_text())
        overrides = (job / ".hydra" / "overrides.yaml").read_text()
        T = int(re.search(r"rollout\.seq_len=(\d+)", overrides).group(1)) if "rollout.seq_len" in overrides else None
        rows.append({**s, "T": T, "job_dir": job})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------- mismatch over training
def test_mismatch_over_training_one_line_per_precision(precisions):
    """mlp world, 8 steps (no smoothing): each panel holds one line per precision, the median over
    the 2 seeds of the per-step mean over updates; the precisions' KL differs by decades, so that
    axis is logarithmic, and the title quotes each precision's median."""
    from analysis import figures, load_dataset

    ds = load_dataset(precisions)
    fig = figures.figure("mismatch-over-training", ds)
    axes = visible_axes(fig)
    assert len(axes) == 4
    kl, chi2, dp, entropy = axes
    assert "KL" in kl.get_ylabel() and "chi" in chi2.get_ylabel() and "p_" in dp.get_ylabel()
    assert "entropy" in entropy.get_ylabel() and all("step" in ax.get_xlabel() for ax in axes)
    for ax in axes:
        assert [ln.get_label() for ln in _series(ax)] == ["fp16", "bf16", "fp8"]  # most mantissa bits first
    m = update_rows(ds.metrics)  # the final rows hold J only
    per_step = (
        m.groupby(["job", "step"])
        .agg(precision=("precision", "first"), kl_k3=("kl_k3", "mean"), dp=("max_abs_prob_diff", "max"))
        .reset_index()
    )
    for ln in _series(kl):
        want = per_step[per_step["precision"] == ln.get_label()].groupby("step")["kl_k3"].median()
        assert np.allclose(ln.get_ydata(), want.to_numpy(), rtol=1e-9) and list(ln.get_xdata()) == list(want.index)
    for ln in _series(dp):
        want = per_step[per_step["precision"] == ln.get_label()].groupby("step")["dp"].median()
        assert np.allclose(ln.get_ydata(), want.to_numpy(), rtol=1e-9)
    kl_med = per_step.groupby("precision")["kl_k3"].median()
    assert kl_med["fp16"] * 10 < kl_med["bf16"] and kl_med["bf16"] * 10 < kl_med["fp8"]  # decades apart
    assert kl.get_yscale() == "log" and entropy.get_yscale() == "linear"
    assert f"bf16 {kl_med['bf16']:.2g}" in _title(fig) and "median over 2 seeds" in _title(fig)
    # χ² (mean ρ² − 1) changes sign at this mismatch: its noise exceeds it, and the figure says so. A
    # symlog axis made the line flip every step (issue 31): it is |χ²| on a log axis, hollow where negative.
    assert (m["chi2_token"] < 0).any() and (m["chi2_token"] > 0).any()
    assert chi2.get_yscale() == "log" and "|" in chi2.get_ylabel() and "changes sign" in _title(fig)
    assert all((np.asarray(ln.get_ydata(), dtype=float) >= 0).all() for ln in _series(chi2))
    from matplotlib.colors import to_hex

    from analysis import style

    colours = {to_hex(ln.get_color()).upper() for ln in _series(kl)}
    assert len(colours) == 3 and not colours & style.correction_colors()


def test_mismatch_over_training_in_the_transformer_world(transformer, tmp_path):
    """A tiny transformer with a 30-step SFT warm start: both precisions drawn in both styles,
    every panel's lines the data's per-step medians, PNG and PDF written by the command."""
    from analysis import figures, load_dataset

    ds = load_dataset(transformer)
    summaries = _summaries(transformer)
    assert (summaries["policy"] == "transformer").all() and summaries["world"].map(
        lambda w: w["warm_start"]["sft_steps"]
    ).eq(30).all()
    for style in ("default", "paper"):
        fig = figures.figure("mismatch-over-training", ds, style)
        axes = visible_axes(fig)
        assert len(axes) == 4 and all(len(_series(ax)) == 2 for ax in axes)
        ent = {ln.get_label(): np.asarray(ln.get_ydata(), float) for ln in _series(axes[3])}
        want = update_rows(ds.metrics).groupby(["precision", "step"])["entropy"].mean()
        assert np.allclose(ent["bf16"], want["bf16"].to_numpy()) and np.allclose(ent["fp16"], want["fp16"].to_numpy())
    code, out, err = run_cli("plot", str(transformer), "-k", "mismatch-over-training,mismatch", "-o", str(tmp_path))
    assert code == 0, err
    files = sorted(Path(p).name for p in out.split())
    assert files == ["mismatch-over-training.pdf", "mismatch-over-training.png", "mismatch.pdf", "mismatch.png"]
    assert (tmp_path / "mismatch-over-training.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "mismatch-over-training.pdf").read_bytes()[:5] == b"%PDF-"


def test_a_monte_carlo_objective_is_drawn_with_its_standard_error(transformer):
    """The transformer's J is a Monte Carlo estimate: each evaluation of a one-seed line gets a bar of
    ±2 s.e. (objective_se of that step), and the title gives the mean s.e., so that a dip within the
    noise is not read as a drop."""
    from analysis import figures, load_dataset

    ds = load_dataset(transformer)
    fig = figures.figure("training", ds)
    m = ds.metrics.dropna(subset=["objective_se"]).groupby(["precision", "step"]).first().reset_index()
    se = m["objective_se"].mean()
    assert f"J: a Monte Carlo estimate, s.e. ≈ {se:.2g} per evaluation (bars: ±2 s.e.)" in _title(fig)
    objective_axes = [ax for ax in visible_axes(fig) if "objective" in ax.get_ylabel() or ax.containers]
    bars = [c for ax in objective_axes for c in ax.containers]
    assert len(bars) == 2  # one line per precision panel
    halves = sorted(float(abs(seg[1][1] - seg[0][1]) / 2) for c in bars for seg in c.lines[2][0].get_segments())
    assert halves == pytest.approx(sorted(2 * m["objective_se"]), rel=1e-6)


def test_a_long_run_is_smoothed_and_says_so():
    from analysis.figures.mismatch import smoothing_window

    assert smoothing_window(8) == smoothing_window(39) == 1
    assert smoothing_window(200) == 11 and smoothing_window(40) == 3


# ----------------------------------------------------------------------------------------- survival
def test_survival_curve_counts_seeds_and_censors_early_ends():
    """Kaplan–Meier by hand: a run that ended early without collapsing (censored at step 5) is at
    risk until then and not after."""
    from analysis.figures.collapse import survival_curve

    xs, ys, censored = survival_curve([2, np.nan, np.nan], [15, 5, 15], horizon=15)
    assert xs == [0, 2, 15] and ys == pytest.approx([1, 2 / 3, 2 / 3]) and censored == [5]
    xs, ys, censored = survival_curve([2, np.nan, 8], [2, 5, 8], horizon=15)
    assert xs == [0, 2, 8, 15] and ys == pytest.approx([1, 2 / 3, 0, 0]) and censored == [5]
    xs, ys, _ = survival_curve([0, np.nan], [0, 9], horizon=9)
    assert ys == pytest.approx([1, 0.5, 0.5])  # a collapse at step 0 drops the curve at once


def test_survival_figure(field):
    """One survival panel per (T, staleness) cell with a line per correction: after each step, the
    fraction of its 2 seeds whose summary.json has no collapse by then; beneath, ESS and grad norm
    aligned on each collapse step (the median over a correction's collapsed runs), and the NaN
    gradient that made the parameters NaN marked on the top edge."""
    from analysis import figures, load_dataset
    from analysis.figures.collapse import LAG_STEPS, LEAD_STEPS, collapse_kind

    ds = load_dataset(field)
    summ = _summaries(field)
    collapsed = summ[summ["collapsed"]]
    assert len(collapsed) >= 3 and (collapsed["correction"] == "tis").any() and collapsed["nonfinite_params"].any()
    fig = figures.figure("survival", ds)
    axes = visible_axes(fig)
    assert len(axes) == 12  # 4 cells × (survival, ESS, grad norm): rows of 4 panels
    surv, ess, gn = axes[0:4], axes[4:8], axes[8:12]
    cells = [(4, 0), (4, 8), (8, 0), (8, 8)]
    assert [ax.get_title() for ax in surv] == [f"rollout.seq_len={T}, mismatch.staleness={k}" for T, k in cells]
    assert "fraction of 2 seeds" in surv[0].get_ylabel().replace("\n", " ")
    assert "ESS" in ess[0].get_ylabel() and "nabla" in gn[0].get_ylabel() and gn[0].get_yscale() == "log"
    assert all("relative to the collapse step" in ax.get_xlabel() for ax in ess + gn)
    m = ds.metrics
    n_upd = int(m["update"].max()) + 1
    job_of = {j.path: j.index for j in ds.jobs}
    seen_nan = False
    for ax_s, ax_e, ax_g, (T, k) in zip(surv, ess, gn, cells):
        lines = {ln.get_label(): ln for ln in _series(ax_s)}
        assert set(lines) == {"tis", BUG}
        for name, ln in lines.items():
            cell = summ[(summ["correction"] == name) & (summ["staleness"] == k) & (summ["T"] == T)]
            assert len(cell) == 2 and (cell["collapsed"] | (cell["steps_run"] == 16)).all()  # nothing censored
            steps = cell.loc[cell["collapsed"], "collapse_step"]
            x, y = np.asarray(ln.get_xdata(), float), np.asarray(ln.get_ydata(), float)
            assert (x[0], y[0], x[-1]) == (0, 1, 15)
            assert np.allclose(y[1:], [1 - (steps <= xi).sum() / 2 for xi in x[1:]])
        runs = collapsed[(collapsed["staleness"] == k) & (collapsed["T"] == T)]
        if runs.empty:
            assert [t.get_text() for t in ax_e.texts] == ["no collapse"] and not _series(ax_e)
            continue
        assert {ln.get_label() for ln in _series(ax_e)} == set(runs["correction"])
        nan_grads = set()
        for ln in _series(ax_e):
            columns = []
            for _, r in runs[runs["correction"] == ln.get_label()].iterrows():
                rows = m[m["job"] == job_of[r["job_dir"]]]
                x = (rows["step"] + rows["update"] / n_upd - r["collapse_step"]).round(6)
                window = ((x >= -LEAD_STEPS) & (x < LAG_STEPS + 1)).to_numpy()
                values = rows["ess"].where(np.isfinite(rows["is_weight_mean"])).set_axis(x)
                columns.append(values[window])
                nan_grads |= set(x[window & ~np.isfinite(rows["grad_norm"].to_numpy(float))])
            want = pd.concat(columns, axis=1).sort_index().median(axis=1)
            assert np.allclose(ln.get_xdata(), want.index) and np.allclose(ln.get_ydata(), want, equal_nan=True)
        assert any(ln.get_gid() == "collapse-line" and list(ln.get_xdata()) == [0, 0] for ln in ax_e.get_lines())
        marked = {float(x) for ln in ax_g.get_lines() if ln.get_gid() == "events" for x in ln.get_xdata()}
        assert marked == nan_grads
        seen_nan |= bool(nan_grads)
    assert seen_nan  # some run's parameters went NaN within its window: the update that did it is marked
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    for name in ("tis", BUG):  # each correction's collapses over all its runs, in its legend label
        runs_of = summ[summ["correction"] == name]
        assert f"{name}: {int(runs_of['collapsed'].sum())}/{len(runs_of)} collapsed" in legend
    reasons = collapsed["collapse_reason"].map(collapse_kind).value_counts()
    assert f"{len(collapsed)} collapses (" in _title(fig)
    for word, n in reasons.items():
        assert f"{word} {n}" in _title(fig)


# ----------------------------------------------------------------------------------------- length heatmap
def test_length_heatmap(field):
    """T × correction cells per staleness: the final J averaged over the seeds whose parameters
    stayed finite (NaN where none did), and collapsed / seeds, both from summary.json."""
    from analysis import figures, load_dataset

    fig = figures.figure("length-heatmap", load_dataset(field))
    axes = visible_axes(fig)
    panels = [ax for ax in axes if ax.images]
    assert len(panels) == 4  # 2 staleness rows × (final J, collapse rate)
    summ = _summaries(field)
    summ["final"] = summ["final_objective"].astype(float)
    for row, k in enumerate((0, 8)):
        j_ax, c_ax = panels[2 * row], panels[2 * row + 1]
        assert [t.get_text() for t in j_ax.get_xticklabels()] == ["4", "8"]
        assert [t.get_text() for t in j_ax.get_yticklabels()] == ["tis", BUG]
        j_img, c_img = j_ax.images[0].get_array(), c_ax.images[0].get_array()
        for i, name in enumerate(("tis", BUG)):
            for t, T in enumerate((4, 8)):
                cell = summ[(summ["correction"] == name) & (summ["T"] == T) & (summ["staleness"] == k)]
                finals = cell.loc[~cell["nonfinite_params"], "final"]
                if len(finals):
                    assert float(j_img[i, t]) == pytest.approx(finals.mean())
                else:
                    assert np.ma.is_masked(j_img[i, t])
                assert float(c_img[i, t]) == pytest.approx(cell["collapsed"].mean())
                texts = {(round(tx.get_position()[0]), round(tx.get_position()[1])): tx.get_text() for tx in c_ax.texts}
                assert texts[(t, i)].startswith(f"{int(cell['collapsed'].sum())}/{len(cell)}")
    labels = [ax.get_ylabel() for ax in fig.axes if not ax.images and ax.get_ylabel()]
    assert "final J (mean over seeds)" in labels and "collapse rate (fraction of seeds)" in labels


# ----------------------------------------------------------------------------------------- bias split
def test_bias_split(lengths_probe):
    """Direction, size and relative bias of each arm against T: the values of probe.csv, geo-mask
    hollow (degenerate at every T), ∇J said to be exact."""
    from analysis import figures, load_dataset

    ds = load_dataset(lengths_probe)
    fig = figures.figure("bias-split", ds)
    cos_ax, size_ax, bias_ax = visible_axes(fig)
    assert "cos" in cos_ax.get_ylabel() and "direction" in cos_ax.get_ylabel()
    assert "size" in size_ax.get_ylabel() and "relative bias" in bias_ax.get_ylabel()
    assert all("response length" in ax.get_xlabel() for ax in (cos_ax, size_ax, bias_ax))
    pr = pd.concat([pd.read_csv(p) for p in sorted(lengths_probe.glob("*/probe.csv"))])
    names = ["seq-tis", "seq-mis", "geo-mask", "seq-is", "token-is"]
    for ax, col in ((cos_ax, "cosine"), (size_ax, "norm_ratio"), (bias_ax, "rel_bias")):
        lines = {ln.get_label(): ln for ln in _series(ax)}
        assert sorted(lines) == sorted(names)
        for name, ln in lines.items():
            want = pr[pr["preset"] == name].sort_values("seq_len")
            assert list(ln.get_xdata()) == [2, 4, 8]
            assert np.allclose(np.asarray(ln.get_ydata(), float), want[col].to_numpy())
        assert any(ln.get_gid() == "reference" for ln in ax.get_lines())
    hollow = [ln for ln in cos_ax.get_lines() if ln.get_gid() == "degenerate"]
    assert len(hollow) == 1 and list(hollow[0].get_xdata()) == [2, 4, 8]  # geo-mask's ±0.1% band, all T
    assert (pr.loc[pr["preset"] == "geo-mask", "degenerate"] == 1).all()
    assert "∇J exact" in _title(fig) and cos_ax.get_xscale() == "log"
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any(lab.startswith("degenerate") for lab in labels)


def test_bias_split_says_when_the_reference_is_monte_carlo(tmp_path):
    from analysis import figures, load_dataset

    d = tmp_path / "s"
    _ok(
        *run_cli(
            "sweep",
            "study=probe",
            "policy=transformer",
            "policy.sft.steps=0",
            "policy.n_layer=1",
            "policy.d_model=16",
            "policy.n_head=2",
            "rollout.seq_len=4,6",
            "task.values=6",
            "task.partial_credit=true",
            "rollout.batch_size=2",
            "rollout.group_size=4",
            "probe.repeats=4",
            "probe.n_boot=100",
            "probe.pretrain_steps=0",
            "probe.reference_rollouts=64",
            "mismatch.staleness=1",
            "probe.presets=[none,tis]",
            "device=cpu",
            "log.quiet=true",
            f"hydra.sweep.dir={d}",
        )
    )
    pr = pd.concat([pd.read_csv(p) for p in sorted(d.glob("*/probe.csv"))])
    assert (pr["reference"] == "monte-carlo").all()
    rel = pr["reference_noise"] / pr["exact_grad_norm"]
    fig = figures.figure("bias-split", load_dataset(d))
    title = _title(fig)
    assert "∇J: a Monte Carlo reference (64 on-policy rollouts" in title and "not exact" in title
    low, high = (f"{100 * v:.2g}%" if 100 * v < 10 else f"{100 * v:.0f}%" for v in (rel.min(), rel.max()))
    assert f"its own error ≈ {low}–{high} of its norm" in title
    assert [t.get_text() for t in visible_axes(fig)[0].get_xticklabels()] == ["4", "6"]


# ----------------------------------------------------------------------------------------- every kind
@pytest.mark.parametrize("style", ["default", "paper"])
def test_every_new_figure_fits_and_nothing_is_clipped_or_overlaps(field, precisions, transformer, lengths_probe, style):
    from analysis import figures, load_dataset

    figs = [
        (k, figures.figure(k, load_dataset(path), style))
        for path, kinds in (
            (field, ("mismatch-over-training", "survival", "length-heatmap", "dose-response")),
            (precisions, ("mismatch-over-training",)),
            (transformer, ("mismatch-over-training", "mismatch")),
            (lengths_probe, ("bias-split",)),
        )
        for k in kinds
    ]
    for kind, fig in figs:
        paper = style == "paper"
        found = problems(fig, widths=(3.3, 7.0) if paper else None, max_rows=3 if paper else None)
        assert not found, (kind, style, found)
        assert fig.get_figwidth() <= (7.0 if paper else 17.5), (kind, fig.get_size_inches())
    if style == "paper":  # 4 cells of a 3-metric figure: 4 columns × 3 rows, at the double width
        survival = dict(figs)["survival"]
        assert survival.get_figwidth() == 7.0


def test_plot_offers_the_new_kinds_where_the_data_allows(field, lengths_probe, tmp_path):
    """A train sweep over T and staleness gets mismatch-over-training, survival, length-heatmap and dose-response
    by default, and bias-split is skipped with its reason; a probe sweep over T gets bias-split; asking
    for a kind the data cannot give is a one-line error."""
    code, out, err = run_cli("plot", str(field), "-o", str(tmp_path / "train"))
    assert code == 0, err
    written = {Path(p).name for p in out.split()}
    for kind in ("mismatch-over-training", "survival", "length-heatmap", "dose-response"):
        assert {f"{kind}.png", f"{kind}.pdf"} <= written
        assert (tmp_path / "train" / f"{kind}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (tmp_path / "train" / f"{kind}.pdf").read_bytes()[:5] == b"%PDF-"
    assert "skipped bias-split" in err
    code, out, err = run_cli("plot", str(lengths_probe), "-o", str(tmp_path / "probe"))
    assert code == 0, err
    assert {"bias-split.png", "bias-split.pdf"} <= {Path(p).name for p in out.split()}
    cases = [
        ((str(field), "--kind", "bias-split"), "probe"),
        ((str(lengths_probe), "--kind", "survival"), "training metrics"),
        ((str(field / "00"), "--kind", "length-heatmap"), "response lengths"),
        ((str(field / "00"), "--kind", "dose-response"), "response lengths"),
    ]
    for args, msg in cases:
        code, _, err = run_cli("plot", *args)
        assert code == 2 and msg in err and len(err.strip().splitlines()) == 1, (args, err)


# ----------------------------------------------------------------------------------------- report table
def _markdown_table(text: str, header_start: str) -> pd.DataFrame:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return pd.DataFrame(rows[2:], columns=rows[0])


def test_report_peak_to_final_drop_table(field):
    """precision × staleness × correction (× T, swept too) → mean peak − final J over seeds, the seed
    count, the worst seed, and the runs that ended with NaN parameters counted apart."""
    code, out, err = run_cli("report", str(field), "--out", "-")
    assert code == 0, err
    section = out.split("## Peak-to-final drop of J", 1)[1].split("\n## ", 1)[0]
    table = _markdown_table(section, "| precision")
    assert list(table.columns[:4]) == ["precision", "staleness", "correction", "rollout.seq_len"]
    assert len(table) == 8 and set(table["precision"]) == {"bf16"} and (table["seeds"] == "2").all()
    summ = _summaries(field)
    summ["drop"] = summ["peak_objective"] - summ["final_objective"].astype(float)
    for _, row in table.iterrows():
        cell = summ[
            (summ["correction"] == row["correction"])
            & (summ["staleness"] == int(row["staleness"]))
            & (summ["T"] == int(row["rollout.seq_len"]))
        ]
        ok = cell[~cell["nonfinite_params"]]
        assert row["NaN parameters"] == f"{int(cell['nonfinite_params'].sum())}/{len(cell)}"
        if len(ok) == 0:
            assert row["peak − final"] == "nan" and row["worst seed"] == "—"
            continue
        mean = float(ok["drop"].mean())
        assert row["peak − final"].startswith(f"{mean:.3f}")
        worst = ok.loc[ok["drop"].idxmax()]
        assert row["worst seed"] == f"seed {worst['seed']}: {worst['drop']:.3f}"
    best = summ[~summ["nonfinite_params"]].groupby(["correction", "staleness", "T"])["drop"].mean().max()
    assert f"Largest mean drop: **{best:.3f}**" in section
    assert "ended with NaN parameters has no final J: it is left out of the drop" in section


def test_report_drop_table_names_the_monte_carlo_noise(transformer):
    code, out, err = run_cli("report", str(transformer), "--out", "-")
    assert code == 0, err
    section = out.split("## Peak-to-final drop of J", 1)[1].split("\n## ", 1)[0]
    table = _markdown_table(section, "| precision")
    assert list(table["precision"]) == ["fp16", "bf16"]  # by mantissa bits
    m = pd.read_csv(transformer / "sweep.csv")
    se = m.dropna(subset=["objective_se"]).groupby("precision")["objective_se"].mean()
    assert list(table["J s.e."]) == [f"{se['fp16']:.2g}", f"{se['bf16']:.2g}"]
    assert "a drop within ~2 s.e. is noise" in section


def test_no_drop_table_for_a_single_run(field):
    code, out, err = run_cli("report", str(field / "00"), "--out", "-")
    assert code == 0, err
    assert "Peak-to-final drop" not in out


def test_a_run_that_collapsed_before_it_learned_is_a_collapse_not_a_flat_run():
    """The survival figure counts a run whose parameters went NaN at step 0 as a collapse; the
    never-learned note (whose runs did "not collapse") must not name it too."""
    from analysis.figures.layout import never_learned_note

    per = pd.DataFrame({"correction": ["tis", "tis", BUG, BUG], "learned": [1, 0, 0, 0], "collapsed": [0, 0, 1, 0]})
    assert never_learned_note(per) == (
        f"never learned (J never rose above its start; not a collapse): tis (1 of 2 runs), {BUG} (1 of 2 runs)"
    )
    assert never_learned_note(per.assign(collapsed=[0, 1, 1, 1])) == ""
