"""analysis/: loading, every figure kind, `is-study plot` and `is-study report`, on real outputs
made here: a tiny train run, a tiny sweep (is-study sweep), a tiny probe run, a shipped case file."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import run_cli

pytestmark = pytest.mark.slow  # each test reads a run, a sweep or a probe made by a module fixture

REPO = Path(__file__).resolve().parent.parent
TINY = ["train.steps=6", "rollout.batch_size=2", "rollout.group_size=2", "log.quiet=true", "log.tokens_every=2"]
# 5% of rollout log-probs shifted by −1000 nats: the as-shipped OpenRLHF preset meets NaN/inf in a few steps.
FAULTS = ["mismatch.outlier_rate=0.05"]
BUG = "openrlhf-bc71bb1/seq-mask-tis"


_cli = run_cli


def _run(run_dir: Path, *overrides: str) -> Path:
    code, _, err = _cli("run", *TINY, *overrides, f"hydra.run.dir={run_dir}")
    assert code == 0, err
    return run_dir


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("run") / "r", f"correction={BUG}", *FAULTS)


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    """correction × staleness × seed = 8 jobs, with `is-study sweep` (sweep.csv by its aggregator)."""
    d = tmp_path_factory.mktemp("sweep") / "s"
    code, _, err = _cli(
        "sweep", f"correction=tis,{BUG}", "mismatch.staleness=0,2", "seed=0,1", *TINY, *FAULTS, f"hydra.sweep.dir={d}"
    )
    assert code == 0, err
    assert (d / "sweep.csv").is_file()
    return d


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory):
    from runner.studies import STUDIES

    if "probe" not in STUDIES:
        pytest.skip("the probe study is not in this checkout")
    d = tmp_path_factory.mktemp("probe") / "p"
    code, _, err = _cli(
        "run",
        "study=probe",
        "probe.repeats=16",
        "probe.n_boot=100",
        "probe.pretrain_steps=0",
        f"probe.presets=[tis,seq-tis,{BUG}]",
        "probe.bands=[[0.5,1.5],[0.5,4],[0.5,40]]",
        "rollout.batch_size=2",
        "rollout.group_size=4",
        "rollout.seq_len=8",
        "mismatch.staleness=2",
        "log.quiet=true",
        f"hydra.run.dir={d}",
    )
    assert code == 0, err
    return d


# ----------------------------------------------------------------------------------------- loading
def test_load_run_is_tidy_with_override_columns(run_dir):
    from analysis import load

    df = load(run_dir)
    assert len(df) == 6 * 2 + 1  # steps × train.updates_per_step, then the final row (J after the last update)
    assert {"job", "step", "update", "objective", "grad_norm", "correction", "train.steps"} <= set(df.columns)
    assert set(df["correction"]) == {BUG} and set(df["train.steps"]) == {6}
    assert df.attrs["kind"] == "run" and df.attrs["swept"] == [] and "correction" in df.attrs["keys"]


def test_load_sweep_reads_keys_from_hydra_files(sweep_dir, tmp_path):
    from analysis import load, load_dataset

    df = load(sweep_dir)
    assert df.attrs["swept"] == ["correction", "mismatch.staleness", "seed"]
    assert len(df) == 8 * (6 * 2 + 1) and df["job"].nunique() == 8
    per_job = df.groupby("job")[["correction", "mismatch.staleness", "seed"]].nunique()
    assert (per_job == 1).all().all()
    # The same table from the job dirs alone (no sweep.csv), and the keys never come from dir names.
    ds = load_dataset(sweep_dir)
    alone = tmp_path / "renamed"
    alone.mkdir()
    for i, job in enumerate(ds.jobs):
        os.symlink(job.path, alone / f"job-{chr(97 + i)}")
    df2 = load(alone)
    cols = ["correction", "mismatch.staleness", "seed", "step", "update", "objective"]
    a = df[cols].astype(str).sort_values(cols).reset_index(drop=True)
    b = df2[cols].astype(str).sort_values(cols).reset_index(drop=True)
    assert a.equals(b)


def test_per_job_counts_updates_not_the_final_row(sweep_dir):
    """metrics.csv's final row (J after the last update) is no update: per_job still counts 6 steps × 2
    updates, its NaN/inf fraction is over those 12, and its final J is the table's last J."""
    import pandas as pd

    from analysis.load import load_dataset
    from analysis.tables import per_job

    ds = load_dataset(sweep_dir)
    per = per_job(ds).set_index("job")
    assert (per["updates"] == 6 * 2).all()
    df = ds.metrics
    bad = ((df["nonfinite_loss"].fillna(0) + df["nonfinite_grad"].fillna(0)) > 0).groupby(df["job"]).sum()
    pd.testing.assert_series_equal(per["nonfinite"], bad / 12, check_names=False)
    last_j = df.dropna(subset=["objective"]).groupby("job")["objective"].last()
    assert (per["final_objective"] == last_j).all()


def test_a_bare_sweep_csv_gets_both_short_keys_back(sweep_dir, tmp_path):
    """sweep.csv names the keys staleness and precision as metrics.csv does; read alone, it gets their
    config names back, so figures facet as with the job dirs."""
    from analysis import load

    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(sweep_dir / "sweep.csv", bare / "sweep.csv")
    df = load(bare / "sweep.csv")
    assert (df["mismatch.staleness"] == df["staleness"]).all() and (df["mismatch.precision"] == df["precision"]).all()
    assert "mismatch.staleness" in df.attrs["swept"] and "mismatch.precision" not in df.attrs["swept"]


def test_load_probe_one_row_per_cell(probe_dir):
    from analysis import load

    df = load(probe_dir)
    assert len(df) == 3 * 3  # presets × bands
    assert {"preset", "low", "high", "bias_norm", "variance", "mse", "job"} <= set(df.columns)


def test_load_errors_are_one_line(tmp_path):
    from analysis import load
    from runner.errors import UserError

    with pytest.raises(UserError, match="no such file"):
        load(tmp_path / "missing")
    with pytest.raises(UserError, match="no run dirs"):
        load(tmp_path)


def test_no_torch_in_analysis_and_no_pandas_in_the_cli():
    code = (
        "import sys, analysis, analysis.load, analysis.style, analysis.figures\n"
        "import analysis.reports.dataset, analysis.reports.case_card\n"
        "assert 'torch' not in sys.modules, 'analysis imported torch'\n"
        "import runner.cli\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
    code = (
        "import sys, runner.cli\n"
        "bad = [m for m in ('pandas', 'matplotlib', 'torch') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


# ----------------------------------------------------------------------------------------- figures
def _series(ax) -> list:
    return [ln for ln in ax.get_lines() if ln.get_gid() == "series"]


def _visible_axes(fig) -> list:
    return [ax for ax in fig.axes if ax.get_visible()]


def _check_common(fig, n_axes: int, title_bit: str) -> None:
    axes = _visible_axes(fig)
    assert len(axes) == n_axes
    assert all(ax.get_ylabel() for ax in axes if ax.get_subplotspec().is_first_col())
    assert any(ax.get_xlabel() for ax in axes)
    assert title_bit in fig._suptitle.get_text()
    assert fig.legends and fig.legends[0].get_texts()


def test_training_figure(sweep_dir):
    from analysis import load_dataset
    from analysis.figures import training

    fig = training.training_figure(load_dataset(sweep_dir))
    _check_common(fig, 2 * 2, "correction × mismatch.staleness × seed")  # objective, reward × 2 staleness panels
    for ax in _visible_axes(fig):
        assert len(_series(ax)) == 2  # tis and the bug preset, each the mean over 2 seeds
        assert {ln.get_label() for ln in _series(ax)} == {"tis", BUG}
        assert any(c.get_gid() == "band" for c in ax.collections)  # ± 1 s.d. over seeds
    marks = [ln for ax in fig.axes for ln in ax.get_lines() if ln.get_gid() == "events"]
    assert marks, "the bug preset's NaN/inf updates are marked on the x axis"
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[:2] == ["tis", BUG] and any("NaN/inf" in lab for lab in labels)
    assert "objective" in fig.axes[0].get_ylabel() and "step" in _visible_axes(fig)[-1].get_xlabel()


def test_grad_norm_figure(run_dir):
    from analysis import load_dataset
    from analysis.figures import training

    fig = training.grad_norm_figure(load_dataset(run_dir))
    _check_common(fig, 1, f"correction={BUG}")
    (ax,) = _visible_axes(fig)
    assert ax.get_yscale() == "log" and "norm" in ax.get_ylabel()
    assert len(_series(ax)) == 1
    assert any(ln.get_gid() == "events" for ln in ax.get_lines())  # NaN/inf gradients on the top edge


def test_stability_figure(sweep_dir):
    from analysis import load_dataset
    from analysis.figures import training

    fig = training.stability_figure(load_dataset(sweep_dir))
    _check_common(fig, 2, "mismatch.staleness")
    nonfinite, collapse = _visible_axes(fig)
    assert "NaN/inf" in nonfinite.get_ylabel() and "collapse" in collapse.get_ylabel()
    assert "staleness" in nonfinite.get_xlabel() or "staleness" in collapse.get_xlabel()
    assert [t.get_text() for t in nonfinite.get_xticklabels()] == ["0", "2"]
    lines = {ln.get_label(): ln for ln in _series(nonfinite)}
    assert set(lines) == {"tis", BUG}
    assert max(lines[BUG].get_ydata()) > 0 and max(lines["tis"].get_ydata()) == 0


def test_threshold_figure(probe_dir):
    from analysis import load_dataset
    from analysis.figures import probe

    fig = probe.threshold_figure(load_dataset(probe_dir))
    _check_common(fig, 3, "study=probe")
    bias, var, mse = _visible_axes(fig)
    assert "bias" in bias.get_ylabel() and "variance" in var.get_ylabel() and "MSE" in mse.get_ylabel()
    assert "threshold" in mse.get_xlabel() and mse.get_xscale() == "log"
    for ax in (bias, var, mse):
        assert {ln.get_label() for ln in _series(ax)} == {"tis", "seq-tis", BUG}
        assert all(len(ln.get_xdata()) == 3 for ln in _series(ax))  # one point per band
    assert any(ln.get_gid() == "best" for ln in mse.get_lines())  # the lowest MSE is starred


def test_mismatch_figure(run_dir):
    from analysis import load_dataset
    from analysis.figures import mismatch

    ds = load_dataset(run_dir)
    assert ds.tokens is not None and {"step", "seq", "pos", "token", "old", "roll"} <= set(ds.tokens.columns)
    fig = mismatch.mismatch_figure(ds)
    _check_common(fig, 3, f"correction={BUG}")
    hist, scatter, binned = _visible_axes(fig)
    assert "log-ratio" in hist.get_xlabel() and "nats" in hist.get_xlabel()
    assert scatter.get_xscale() == scatter.get_yscale() == "log" and "rollout" in scatter.get_ylabel()
    assert "token probability" in binned.get_xlabel() and len(_series(binned)) == 1
    assert any(p.get_gid() == "series" for p in hist.patches)


def test_masking_figure(run_dir):
    from analysis import load_dataset
    from analysis.figures import training

    fig = training.masking_figure(load_dataset(run_dir))
    _check_common(fig, 2, "is-study run")  # the as-shipped preset never clamps: no clamped panel
    labels = [ax.get_ylabel() for ax in _visible_axes(fig)]
    assert "masked" in labels[0] and "ESS" in labels[1]
    assert "no token clamped in any run (panel left out)" in fig._suptitle.get_text().replace("\n", " ")
    assert all(len(_series(ax)) == 1 for ax in _visible_axes(fig))


def test_colours_are_fixed_per_preset(run_dir, sweep_dir):
    from analysis import load_dataset, style
    from analysis.figures import training

    colour = {}
    for fig in (
        training.training_figure(load_dataset(sweep_dir)),
        training.stability_figure(load_dataset(sweep_dir)),
        training.masking_figure(load_dataset(run_dir)),
    ):
        for ax in fig.axes:
            for ln in _series(ax):
                colour.setdefault(ln.get_label(), set()).add(ln.get_color())
    assert all(len(c) == 1 for c in colour.values()), colour
    assert colour["tis"] != colour[BUG]
    looks = [style.look(e) for e in ("tis", "seq-mask-tis", BUG, "some-inline-arm")]
    assert looks[1].color != looks[2].color and looks[1].linestyle != looks[2].linestyle
    assert style.look("some-inline-arm") == looks[3]  # unknown names: stable


def test_paper_style_is_single_column(sweep_dir):
    from analysis import load_dataset
    from analysis.figures import training

    fig = training.training_figure(load_dataset(sweep_dir), style="paper")
    assert abs(fig.get_figwidth() - 3.3) < 1e-6
    for ax in _visible_axes(fig):  # the paper style draws what the default one draws
        assert sorted(ln.get_label() for ln in _series(ax)) == sorted(["tis", BUG])


# ----------------------------------------------------------------------------------------- plot command
def _is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _is_pdf(path: Path) -> bool:
    return path.read_bytes()[:5] == b"%PDF-"


def _saved_figures(monkeypatch) -> dict:
    """kind → the figure `is-study plot` saved under that name (analysis.figures.layout.save, wrapped), so
    a command test can check what was drawn, not only that a file was written."""
    from analysis.figures import layout

    saved, save = {}, layout.save

    def recording_save(fig, out_dir, name, *args, **kwargs):
        saved[name] = fig
        return save(fig, out_dir, name, *args, **kwargs)

    monkeypatch.setattr(layout, "save", recording_save)
    return saved


def _series_labels(fig) -> list[list[str]]:
    return [sorted(ln.get_label() for ln in _series(ax)) for ax in _visible_axes(fig)]


def test_plot_command_writes_png_and_pdf(sweep_dir, tmp_path, monkeypatch):
    saved = _saved_figures(monkeypatch)
    code, out, err = _cli("plot", str(sweep_dir), "--out", str(tmp_path / "figs"))
    assert code == 0, err
    files = [Path(line) for line in out.split()]
    kinds = {f.stem for f in files}
    assert {"training", "grad-norm", "stability", "masking", "mismatch"} <= kinds
    assert "threshold" in err  # skipped, with the reason
    for f in files:
        assert f.is_file() and (_is_png(f) if f.suffix == ".png" else _is_pdf(f))
    from PIL import Image

    with Image.open(tmp_path / "figs" / "training.png") as im:
        dpi = im.info.get("dpi", (0, 0))[0]
        pixels = im.size
    assert abs(dpi - 150) < 1
    training = saved["training"]
    assert pixels == (round(training.get_figwidth() * 150), round(training.get_figheight() * 150))
    # what the command drew: 2 presets (each the mean of 2 seeds) in each of 4 panels, staleness 0 and 2
    assert _series_labels(training) == [sorted(["tis", BUG])] * 4
    assert [t.get_text() for t in _visible_axes(saved["stability"])[0].get_xticklabels()] == ["0", "2"]


def test_plot_command_kinds_and_paper_style(probe_dir, run_dir, tmp_path, monkeypatch):
    saved = _saved_figures(monkeypatch)
    code, out, err = _cli("plot", str(probe_dir), "--kind", "threshold", "--style", "paper", "-o", str(tmp_path))
    assert code == 0, err
    assert sorted(Path(p).name for p in out.split()) == ["threshold.pdf", "threshold.png"]
    assert sorted(saved) == ["threshold"]
    assert all(labels == sorted(["tis", "seq-tis", BUG]) for labels in _series_labels(saved["threshold"]))
    code, out, err = _cli("plot", str(run_dir), "-k", "training,masking", "-o", str(tmp_path / "two"))
    assert code == 0 and len(out.split()) == 4
    assert sorted(saved) == ["masking", "threshold", "training"]
    # masked and ESS, the one run each: its clamped fraction is 0 in every run (the unclamped seed bug),
    # which the figure says in its title instead of drawing a flat row
    assert _series_labels(saved["masking"]) == [[BUG]] * 2


def test_plot_command_errors_exit_2(run_dir, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    cases = [
        ((str(tmp_path / "missing"),), "no such file"),
        ((str(tmp_path / "empty"),), "no run dirs"),
        ((str(run_dir), "--kind", "nope"), "unknown --kind"),
        ((str(run_dir), "--kind", "stability"), "staleness"),
        ((str(run_dir), "--kind", "threshold"), "probe"),
        ((str(run_dir), "--out", str(tmp_path / "file" / "sub")), "cannot write to --out"),
        ((str(run_dir), "--style", "poster"), "unknown --style"),
    ]
    for args, msg in cases:
        code, _, err = _cli("plot", *args)
        assert code == 2 and msg in err and len(err.strip().splitlines()) == 1, (args, err)


def test_bare_sweep_csv_plots(sweep_dir, tmp_path, monkeypatch):
    """A sweep.csv copied away from its job dirs still plots (its key columns name the jobs)."""
    import shutil

    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(sweep_dir / "sweep.csv", bare / "sweep.csv")
    saved = _saved_figures(monkeypatch)
    code, out, err = _cli("plot", str(bare / "sweep.csv"), "-k", "training,stability", "-o", str(tmp_path / "f"))
    assert code == 0, err
    from analysis import load

    assert load(bare / "sweep.csv")["job"].nunique() == 8
    assert _series_labels(saved["training"]) == [sorted(["tis", BUG])] * 4  # the lines of the full sweep dir


# ----------------------------------------------------------------------------------------- report
LINK = re.compile(r"!?\[[^\]]*\]\(([^)]+)\)")


def _links_exist(text: str, base: Path) -> list[str]:
    links = LINK.findall(text)
    assert all((base / link).is_file() for link in links), [x for x in links if not (base / x).is_file()]
    return links


def test_report_run(run_dir):
    code, out, err = _cli("report", str(run_dir))
    assert code == 0, err
    report = Path(out.strip())
    assert report == run_dir / "report.md"
    text = report.read_text()
    assert f"is-study run {' '.join(TINY)} correction={BUG}" in text
    assert "| correction" in text and "NaN/inf events" in text  # the results table
    assert "| `train.steps`" in text and "| 200 " in text  # the diff from the defaults
    assert f"**{BUG}**: **" in text and "nonfinite event" in text
    links = _links_exist(text, report.parent)
    assert "figures/training.png" in links and "figures/mismatch.png" in links


def test_report_sweep_and_filters(sweep_dir, tmp_path):
    out_file = tmp_path / "notes" / "sweep.md"
    code, _, err = _cli("report", str(sweep_dir), "--out", str(out_file))
    assert code == 0, err
    text = out_file.read_text()
    assert f"is-study sweep correction=tis,{BUG} mismatch.staleness=0,2 seed=0,1" in text
    assert "**tis**: finite in all 4 runs" in text
    assert re.search(rf"\*\*{re.escape(BUG)}\*\*: \*\*\d+ nonfinite events\*\*", text)
    assert "| correction" in text and "| mismatch.staleness" in text and "(swept)" in text
    links = _links_exist(text, out_file.parent)
    assert any(link.endswith("stability.png") for link in links)
    # Filters pick jobs by their keys; the figures of a filtered report go to their own folder.
    code, out, err = _cli("report", str(sweep_dir), "correction=tis", "--out", "-")
    assert code == 0, err
    assert BUG not in out.split("## Command")[0] and "**tis**" in out
    assert _links_exist(out, Path.cwd())
    code, _, err = _cli("report", str(sweep_dir), "correction=nope")
    assert code == 2 and "no job" in err


def test_report_probe(probe_dir):
    code, out, err = _cli("report", str(probe_dir), "-o", "-")
    assert code == 0, err
    assert "| preset" in out and "bias_norm" in out and "lowest relative MSE" in out and "rel_mse" in out
    assert "threshold.png" in out and _links_exist(out, Path.cwd())


def test_report_case_card():
    code, out, err = _cli("report", "openrlhf-seq-mask-tis", f"correction={BUG}", "--out", "-")
    assert code == 0, err
    assert (
        "**Verdict: BROKEN.** Invariant 1 (finite loss and gradient) fails in accepted-extreme, rejected-extreme; invariant 2"
        in out
    )
    assert "## Expected vs actual" in out and "match the file's expected results" in out
    assert re.search(r"\| rejected-extreme +\| loss +\| nan +\| nan +\| ✓", out)  # expected vs actual
    assert "| -2.402585092994046 " in out  # the inputs, at full precision
    code, out, err = _cli("report", "openrlhf-seq-mask-tis", "correction=seq-mask-tis", "-o", "-")
    assert code == 0 and "**Verdict: OK.** Checked: invariant 1 in all 3 cases, invariant 2 in 1 of 3" in out
    assert "expected results match in all 3 cases" in out and "✗" not in out
    code, _, err = _cli("report", "no-such-case-file")
    assert code == 2 and "no such file" in err


def test_report_case_file_covers_its_expect_list(tmp_path, monkeypatch):
    """`is-study report FILE` without correction= reports on every preset of the file's expect: list,
    in the file runs/reports/NAME-report.md under the current directory (it says where; runs/ is
    ignored by git, a file loose in a checkout's root is not), never with a verdict it did not
    check: the bug presets are BROKEN, `none` is OK with invariant 2 said to be n/a."""
    monkeypatch.chdir(tmp_path)
    case = REPO / "conf" / "cases" / "openrlhf-seq-mask-tis.yaml"
    code, out, err = _cli("report", str(case))
    assert code == 0, err
    dest = tmp_path / "runs" / "reports" / "openrlhf-seq-mask-tis-report.md"
    assert out.strip() == str(dest) and [p.name for p in tmp_path.iterdir()] == ["runs"]
    assert "runs/" in (REPO / ".gitignore").read_text().splitlines()
    text = dest.read_text()
    import yaml

    presets = [e["preset"] for e in yaml.safe_load(case.read_text())["expect"]]
    assert len(presets) == 13
    for preset in presets:
        assert f"## correction={preset}\n" in text and f"| `{preset}` " in text
    rows = dict(re.findall(r"\| `([^`]+)` +\| \*\*(\w+)\*\*", text))
    assert rows[BUG] == rows["openrlhf-bc71bb1/icepop"] == rows["openrlhf-0.11/seq-mask"] == "BROKEN"
    assert rows["seq-mask-tis"] == rows["none"] == "OK"
    assert "invariant 2 n/a (no filter and no veto: nothing is rejected)" in text
    # A file without an expect: list and no correction= asks for one.
    bare = tmp_path / "bare.yaml"
    bare.write_text(
        "cases:\n  - {log_probs: [[0.0]], old_log_probs: [[0.0]], rollout_log_probs: [[0.0]], advantages: [[1.0]]}\n"
    )
    code, _, err = _cli("report", str(bare))
    assert code == 2 and "correction=" in err and len(err.strip().splitlines()) == 1
    # A preset without an expect entry is OK on its invariants only, and says so.
    code, out, err = _cli("report", str(bare), "correction=tis", "-o", "-")
    assert code == 0 and "not compared with expected results (bare.yaml has no `expect:` list)" in out


def test_report_unwritable_out(run_dir, tmp_path):
    (tmp_path / "f").write_text("x")
    code, _, err = _cli("report", str(run_dir), "--out", str(tmp_path / "f" / "r.md"))
    assert code == 2 and "cannot write --out" in err


def test_tokens_over_the_budget_are_spread_over_the_whole_run(run_dir, tmp_path, monkeypatch):
    """A tokens.csv longer than the loader's row budget is thinned evenly over all of its rows: every logged
    step keeps its share, the last one too (reading the head alone kept the early steps only, so claim 3's
    late window of a long run was its middle)."""
    import importlib

    import pandas as pd

    from analysis.load import load_dataset

    long_run = tmp_path / "long"
    shutil.copytree(run_dir, long_run)
    one = pd.read_csv(run_dir / "tokens.csv")
    # 20 logging rounds of the run's own tokens: a run 20 times as long, each round its own steps
    rounds = [one.assign(step=one["step"] + 100 * r) for r in range(20)]
    pd.concat(rounds, ignore_index=True).to_csv(long_run / "tokens.csv", index=False)
    full = load_dataset(long_run).tokens
    assert len(full) == 20 * len(one) > 3000
    monkeypatch.setattr(importlib.import_module("analysis.load"), "MAX_TOKEN_ROWS", 1000)
    thinned = load_dataset(long_run).tokens
    assert len(thinned) == 1000
    assert sorted(thinned["step"].unique()) == sorted(full["step"].unique())
    share = thinned["step"].value_counts(normalize=True).sort_index()
    assert (share - full["step"].value_counts(normalize=True).sort_index()).abs().max() < 0.01
    # the rows kept are the file's own, unchanged: its first and last among them
    assert thinned.iloc[0].equals(full.iloc[0]) and thinned.iloc[-1].equals(full.iloc[-1])
