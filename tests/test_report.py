"""`is-study report` on a sweep says what the data say and nothing more: a run that never learned
says so (not "no collapse"), the worst cell is named instead of pooled away, numbers sort as
numbers, seed counts count seeds, and the command is the one that was typed."""

from __future__ import annotations

import json
import re

import pytest

from tests.helpers.cli import run_cli

pytestmark = pytest.mark.slow  # each test reports on a sweep made by a module fixture

SMALL = ["train.steps=25", "rollout.batch_size=4", "rollout.group_size=4", "log.quiet=true"]
BUG = "openrlhf-bc71bb1/seq-mask-tis"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """tis and the as-shipped bug preset at staleness 2 and 10, two seeds, 25 steps; every mini-batch
    holds an outlier (rate 0.2), so the bug preset skips every update and J never leaves its start,
    while tis learns (J 0.25 → about 0.4)."""
    d = tmp_path_factory.mktemp("rep") / "s"
    code, _, err = run_cli(
        "sweep",
        f"correction=tis,{BUG}",
        "mismatch.staleness=2,10",
        "seed=0,1",
        *SMALL,
        "mismatch.outlier_rate=0.2",
        f"hydra.sweep.dir={d}",
    )
    assert code == 0, err
    return d


def _report(path, *args) -> str:
    code, out, err = run_cli("report", str(path), *args, "--out", "-")
    assert code == 0, err
    return out


def _verdict(text: str, name: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"- **{name}**:"))


def test_a_run_that_never_learned_says_so(sweep):
    from analysis.load import load_dataset
    from analysis.tables import per_job as per_job_frame

    per = per_job_frame(load_dataset(sweep))
    bug = per[per["correction"] == BUG]
    assert (bug["learned"] == 0).all() and (bug["collapsed"] == 0).all()  # summary.json: flat, not collapsed
    assert (bug["final_objective"] == bug["initial_objective"]).all()
    line = _verdict(_report(sweep), BUG)
    assert "**never learned** (J never rose above its start 0.25)" in line
    assert "no collapse" not in line
    tis = _verdict(_report(sweep), "tis")
    assert "no collapse" in tis and "never learned" not in tis
    from analysis.figures import training

    fig = training.stability_figure(load_dataset(sweep))
    title = fig._suptitle.get_text().replace("\n", " ")
    assert f"never learned (J never rose above its start; not a collapse): {BUG} (4 of 4 runs)" in title


def test_the_worst_cell_is_named_not_pooled(sweep):
    from analysis.load import load_dataset
    from analysis.tables import per_job as per_job_frame

    per = per_job_frame(load_dataset(sweep))
    tis = per[per["correction"] == "tis"]
    cells = tis.groupby("mismatch.staleness")["final_objective"].mean()
    worst = cells.idxmin()
    line = _verdict(_report(sweep), "tis")
    assert f"final J(θ) {cells.min():.3f} to {cells.max():.3f} across 2 cells" in line
    assert f"worst at mismatch.staleness={worst}: " in line
    assert f"{tis['final_objective'].mean():.3f} ± " not in line  # the pooled mean is gone


def test_tables_sort_numbers_as_numbers_and_count_seeds(sweep):
    text = _report(sweep)
    table = text.split("## Results", 1)[1].split("\n\n", 2)[1]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    head = [c.strip() for c in table.splitlines()[0].strip("|").split("|")]
    k, seeds, learned = head.index("mismatch.staleness"), head.index("seeds"), head.index("learned")
    assert [(r[0], r[k]) for r in rows] == [("tis", "2"), ("tis", "10"), (BUG, "2"), (BUG, "10")]  # 2 before 10
    assert all(r[seeds] == "2" for r in rows)
    assert [r[learned] for r in rows] == ["2/2", "2/2", "0/2", "0/2"]


def test_the_command_is_the_recorded_one(sweep, tmp_path):
    """sweep.json's recorded command line (with --jobs, --name, --launcher) is shown as typed, and so
    is the one `is-study sweep` records itself; without one, the overrides and the launcher are put
    back together."""
    import shutil

    copy = tmp_path / "s"
    shutil.copytree(sweep, copy)
    manifest = json.loads((copy / "sweep.json").read_text())
    typed = f"is-study sweep correction=tis,{BUG} 'mismatch.staleness=2,10' --launcher joblib --jobs 2 --name rep"
    (copy / "sweep.json").write_text(json.dumps({**manifest, "command": typed}))
    text = _report(copy)
    assert f"```bash\n{typed}\n```" in text and "(source: sweep.json (the command as typed))" in text
    recorded = manifest.get("command")
    if recorded:  # the sweep records its own command (is-study sweep writes `command`)
        assert recorded in _report(sweep)
    # A manifest written before the command was recorded: rebuilt from the overrides and the launcher.
    manifest = {k: v for k, v in manifest.items() if k not in ("command", "argv")}
    manifest["runs"] = [{k: v for k, v in run.items() if k not in ("command", "argv")} for run in manifest["runs"]]
    manifest["runs"][0]["launcher"] = "joblib"
    (copy / "sweep.json").write_text(json.dumps(manifest))
    text = _report(copy)
    assert re.search(r"is-study sweep correction=tis,\S+ mismatch\.staleness=2,10 .*--launcher joblib", text)


def test_the_reports_final_j_is_the_tables_last_j(sweep):
    """One final J: the report's final J(θ) cell is the mean of each run's last J in sweep.csv (J after the
    last update), not J at the start of the last step."""
    import pandas as pd

    table = pd.read_csv(sweep / "sweep.csv")
    last = table.dropna(subset=["objective"]).groupby("job").last()
    tis = last[(last["correction"] == "tis") & (last["staleness"] == 2)]["objective"]
    assert (last["step"] == 25).all()  # the final row: step = train.steps
    text = _report(sweep)
    row = next(ln for ln in text.splitlines() if ln.startswith("| tis") and "| 2 " in ln)
    assert f"{tis.mean():.3f} ± {tis.std():.3f}" in row
