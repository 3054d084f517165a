"""`is-study sweep` and `is-study aggregate`: Hydra multiruns on the basic, joblib, submitit-local and
ray launchers, resume after SIGKILL, dry-run counts, failure isolation, and the aggregated tables.

Every sweep here is tiny (3 steps of 2 prompts × 2 responses: 6 metrics rows per job) and runs with
log.timing=false, so a job's metrics.csv is byte-identical whichever launcher ran it.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner import registry
from runner.errors import UserError
from runner.hydra_app import app as hydra_app
from runner.hydra_app import launch
from runner.hydra_app import sweeper as project_sweeper
from runner.sweep import command as sweep
from tests.helpers.cli import kill_at_first_done, run_cli
from tests.helpers.repo import REPO

TINY = ["train.steps=3", "rollout.batch_size=2", "rollout.group_size=2", "log.quiet=true", "log.timing=false"]
ROWS_PER_JOB = 3 * 2 + 1  # steps × train.updates_per_step, then the final row (J after the last update)
GRID = ["correction=tis,icepop", "correction.high=2,5", "seed=0,1"]  # 2 × 2 × 2
GRID_KEYS = ["correction", "correction.high", "seed"]


def _read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _markers(sweep_dir: Path, name: str) -> list[Path]:
    return sorted(sweep_dir.glob(f"*/{name}"))


def _jobs_from_dry_run(out: str) -> int:
    match = re.search(r"^(\d+) jobs(, \d+ already done)? \(dry run", out, flags=re.M)
    assert match, out
    listed = [ln for ln in out.splitlines() if ln.startswith("#")]
    assert len(listed) == int(match.group(1))
    return int(match.group(1))


def _check_grid_sweep(sweep_dir: Path) -> None:
    assert len(_markers(sweep_dir, "DONE")) == 8
    assert not _markers(sweep_dir, "ERROR")
    rows = _read_csv(sweep_dir / "sweep.csv")
    assert len(rows) == 8 * ROWS_PER_JOB
    assert list(rows[0])[:4] == ["job", *GRID_KEYS]
    cells = {(r["correction"], r["correction.high"], r["seed"]) for r in rows}
    assert cells == {(c, h, s) for c in ("tis", "icepop") for h in ("2", "5") for s in ("0", "1")}
    per_job = {}
    for r in rows:
        per_job.setdefault(r["job"], []).append(r)
    assert sorted(per_job, key=int) == [str(i) for i in range(8)]
    assert all(len(v) == ROWS_PER_JOB for v in per_job.values())
    assert [r["step"] for r in per_job["0"]] == ["0", "0", "1", "1", "2", "2", "3"]
    summary = _read_csv(sweep_dir / "sweep_summary.csv")
    assert len(summary) == 8 and {r["status"] for r in summary} == {"done"}
    assert all(r["summary.status"] == "ok" and r["steps_run"] == "3" for r in summary)


@pytest.fixture(scope="module")
def basic_sweep(tmp_path_factory):
    """The 2×2×2 grid on the basic launcher, run once for the module."""
    sweep_dir = tmp_path_factory.mktemp("sweeps") / "basic"
    code, _, err = run_cli("sweep", *GRID, *TINY, f"hydra.sweep.dir={sweep_dir}")
    assert code == 0, err
    return sweep_dir


@pytest.mark.slow
def test_basic_launcher_grid(basic_sweep):
    _check_grid_sweep(basic_sweep)
    assert (basic_sweep / "multirun.yaml").is_file() and (basic_sweep / "sweep.json").is_file()
    assert not list(basic_sweep.glob(".*.tmp"))


@pytest.mark.slow
def test_joblib_two_workers_gives_the_same_table(basic_sweep, tmp_path, cli):
    d = tmp_path / "joblib"
    code, out, err = cli("sweep", *GRID, *TINY, "--launcher", "joblib", "--jobs", "2", f"hydra.sweep.dir={d}")
    assert code == 0, err
    assert out.strip().splitlines()[-1] == str(d)
    _check_grid_sweep(d)
    assert "n_jobs: 2" in (d / "00" / ".hydra" / "hydra.yaml").read_text()  # the preset, n_jobs from --jobs
    assert (d / "sweep.csv").read_bytes() == (basic_sweep / "sweep.csv").read_bytes()
    # each job composed exactly as on the basic launcher
    for job in sorted(p.name for p in basic_sweep.glob("0*")):
        for name in ("config.yaml", "overrides.yaml"):
            assert (d / job / ".hydra" / name).read_bytes() == (basic_sweep / job / ".hydra" / name).read_bytes()
    # the whole command line, as typed, for reports (issue 16)
    manifest = json.loads((d / "sweep.json").read_text())
    typed = ["sweep", *GRID, *TINY, "--launcher", "joblib", "--jobs", "2", f"hydra.sweep.dir={d}"]
    assert manifest["argv"] == ["is-study", *typed]
    assert manifest["command"] == "is-study " + " ".join(typed)
    assert [r["command"] for r in manifest["runs"]] == [manifest["command"]]


def test_the_command_of_a_sweep_not_typed_is_rebuilt_whole():
    req = sweep.Request(overrides=["seed=0,1", "x='a b'"], name="ladder", launcher="joblib", jobs=2, resume=True)
    assert (
        sweep.command_line(req.command())
        == "is-study sweep seed=0,1 'x='\"'\"'a b'\"'\"'' --launcher joblib --jobs 2 --name ladder --resume"
    )


@pytest.mark.slow
def test_job_dirs_are_zero_padded_and_sort(basic_sweep, tmp_path, cli):
    dirs = sorted(p.name for p in basic_sweep.iterdir() if p.is_dir())
    assert dirs == [f"{i:02d}" for i in range(8)]
    for name in dirs:
        assert f"num: {int(name)}\n" in (basic_sweep / name / ".hydra" / "hydra.yaml").read_text()
    assert json.loads((basic_sweep / "sweep.json").read_text())["job_dir_width"] == 2
    widths = {n: sweep.job_dir_width(tmp_path, n, resume=False) for n in (1, 12, 100, 101, 1000, 1001)}
    assert widths == {1: 2, 12: 2, 100: 2, 101: 3, 1000: 3, 1001: 4}

    # a sweep made before the dirs were padded keeps its dir names on --resume
    d = tmp_path / "legacy"
    args = ["seed=0,1", *TINY, f"hydra.sweep.dir={d}"]
    code, _, err = cli("sweep", *args)
    assert code == 0, err
    for name in ("00", "01"):
        (d / name).rename(d / name[1])
    manifest = json.loads((d / "sweep.json").read_text())
    del manifest["job_dir_width"]
    (d / "sweep.json").write_text(json.dumps(manifest))
    (d / "1" / "DONE").unlink()
    code, _, err = cli("sweep", *args, "--resume")
    assert code == 0, err
    assert sorted(p.name for p in d.iterdir() if p.is_dir()) == ["0", "1"]
    assert (d / "1" / "DONE").is_file() and len(_read_csv(d / "sweep.csv")) == 2 * ROWS_PER_JOB


@pytest.mark.slow
def test_submitit_local_completes(basic_sweep, tmp_path, cli):
    d = tmp_path / "submitit"
    code, _, err = cli("sweep", *GRID, *TINY, "--launcher", "submitit-local", "--jobs", "8", f"hydra.sweep.dir={d}")
    assert code == 0, err
    _check_grid_sweep(d)
    assert (d / ".submitit").is_dir()  # submitit ran each job in its own process
    assert (d / "sweep.csv").read_bytes() == (basic_sweep / "sweep.csv").read_bytes()


@pytest.mark.slow
def test_ray_local_cluster_gives_the_same_table(basic_sweep, tmp_path):
    """A local Ray (the plugin's in-process ray.init), started for the sweep and stopped with it: a
    fresh interpreter, as a user runs it. Needs the [ray] extra, which the [test] extra brings."""
    pytest.importorskip("hydra_plugins.hydra_ray_launcher", reason="the [ray] extra is not installed")
    d = tmp_path / "ray"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "runner",
            "sweep",
            *GRID,
            *TINY,
            "--launcher",
            "ray",
            "--jobs",
            "2",
            f"hydra.sweep.dir={d}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == str(d)
    _check_grid_sweep(d)
    assert (d / "sweep.csv").read_bytes() == (basic_sweep / "sweep.csv").read_bytes()
    hydra_yaml = (d / "00" / ".hydra" / "hydra.yaml").read_text()
    assert "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher" in hydra_yaml and "num_cpus: 2" in hydra_yaml
    assert "INFO" not in res.stderr and "WARNING" not in res.stderr  # Ray's own logging kept off the terminal


@pytest.mark.slow
def test_sigkill_then_resume_reruns_only_unfinished_jobs(tmp_path, cli):
    d = tmp_path / "killed"
    args = ["seed=range(0,8)", "train.steps=60", "log.quiet=true", "log.timing=false", f"hydra.sweep.dir={d}"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner", "sweep", *args], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    kill_at_first_done(proc, d)
    done_before = {p.parent.name: p.stat().st_mtime_ns for p in _markers(d, "DONE")}
    assert 1 <= len(done_before) < 8

    code, out, _ = cli("sweep", *args, "--resume", "--dry-run")
    assert code == 0 and f"8 jobs, {len(done_before)} already done (dry run" in out
    assert out.count("[done: skipped on --resume]") == len(done_before)
    time.sleep(0.05)  # a rerun job would get a visibly later mtime
    code, _, err = cli("sweep", *args, "--resume")
    assert code == 0, err
    assert f"({len(done_before)} already done before this run)" in err
    done_after = {p.parent.name: p.stat().st_mtime_ns for p in _markers(d, "DONE")}
    assert len(done_after) == 8
    for name, mtime in done_before.items():
        assert done_after[name] == mtime, f"job dir {name} was rerun"
    rows = _read_csv(d / "sweep.csv")
    assert len(rows) == 8 * (60 * 2 + 1)
    for job_dir in d.glob("*/.hydra"):  # no job holds rows of two attempts
        assert len(_read_csv(job_dir.parent / "metrics.csv")) == 60 * 2 + 1


@pytest.mark.slow
def test_resume_needs_the_same_overrides_and_a_fresh_sweep_refuses_an_old_dir(basic_sweep, cli):
    code, _, err = cli("sweep", *GRID, *TINY, f"hydra.sweep.dir={basic_sweep}")
    assert code == 2 and "already holds a sweep" in err and "--resume" in err
    code, _, err = cli(
        "sweep",
        "correction=tis,icepop",
        "correction.high=2,10",
        "seed=0,1",
        *TINY,
        f"hydra.sweep.dir={basic_sweep}",
        "--resume",
    )
    assert code == 2 and "overrides differ" in err, err
    code, _, err = cli("sweep", *GRID, "--resume")
    assert code == 2 and "--resume needs" in err


@pytest.mark.slow
def test_dry_run_counts_match_real_runs(basic_sweep, tmp_path, cli):
    code, out, _ = cli("sweep", *GRID, *TINY, "--dry-run", f"hydra.sweep.dir={tmp_path}/dry")
    assert code == 0 and _jobs_from_dry_run(out) == 8 == len(_markers(basic_sweep, "DONE"))
    assert "#7 correction=icepop correction.high=5 seed=1" in out
    assert not (tmp_path / "dry").exists()  # nothing ran, nothing was written

    code, out, _ = cli("sweep", "correction=tis,icepop,seq-tis", "seed=range(0,4)", "--dry-run")
    assert _jobs_from_dry_run(out) == 12
    assert _jobs_from_dry_run(cli("sweep", "experiment=bigram/threshold-tradeoff", "--dry-run")[1]) == 81
    assert _jobs_from_dry_run(cli("sweep", "experiment=bigram/staleness-ladder", "--dry-run")[1]) == 48

    # The experiment's own sweep (band: tight,mid,loose) narrowed on the command line, run for real.
    exp = ["experiment=bigram/threshold-tradeoff", "correction=tis", "mismatch.staleness=0", "seed=range(0,2)", *TINY]
    n = _jobs_from_dry_run(cli("sweep", *exp, "--dry-run")[1])
    assert n == 6
    d = tmp_path / "experiment"
    code, _, err = cli("sweep", *exp, f"hydra.sweep.dir={d}")
    assert code == 0, err
    assert len(_markers(d, "DONE")) == n
    rows = _read_csv(d / "sweep_summary.csv")
    assert {(r["band"], r["seed"]) for r in rows} == {(b, s) for b in ("tight", "mid", "loose") for s in ("0", "1")}
    assert all(r["experiment"] == "bigram/threshold-tradeoff" for r in rows)
    # a swept band preset gets numeric low / high columns; staleness is one column, not two (issue 16)
    bands = {"tight": ("0.8", "1.25"), "mid": ("0.5", "2.0"), "loose": ("0.2", "5.0")}
    assert {r["band"]: (r["low"], r["high"]) for r in rows} == bands
    table = _read_csv(d / "sweep.csv")
    assert len(table) == n * ROWS_PER_JOB
    assert {r["band"]: (r["low"], r["high"]) for r in table} == bands
    header = list(table[0])
    assert "mismatch.staleness" not in header
    assert header.count("staleness") == 1 and {r["staleness"] for r in table} == {"0"}
    assert header.index("low") < header.index("step")  # with the keys, before the metrics


VALID_CORRECTIONS = ", ".join(registry.group_options("correction"))


@pytest.mark.parametrize(
    "bad,message",
    [
        (
            ["correction=tis,icpop"],
            # the valid list is long enough that the line elides its middle: its head is checked
            f"config: unknown correction 'icpop'; did you mean icepop or nemo-rl/icepop? (valid: {VALID_CORRECTIONS[:40]}",
        ),
        (["correction.hihg=2,5"], "config: unknown key 'correction.hihg'; did you mean correction.high?"),
        (
            ["experiment=threshold-tradeof", "seed=0,1"],
            "config: unknown experiment 'threshold-tradeof'; did you mean bigram/threshold-tradeoff?",
        ),
    ],
)
@pytest.mark.parametrize("name", [None, "typo"])
def test_dry_run_refuses_what_the_sweep_refuses(tmp_path, cli, monkeypatch, bad, message, name):
    """The dry run composed nothing: `correction=tis,icpop` listed 2 jobs and exited 0, then the sweep
    exited 2 (issue 31). It now composes the jobs as the sweep does before launching, and fails with the
    sweep's own line; neither writes anything."""
    monkeypatch.chdir(tmp_path)
    named = ["--name", name] if name else []
    dry = cli("sweep", *bad, *TINY, *named, "--dry-run")
    real = cli("sweep", *bad, *TINY, *named)
    assert dry == real
    code, out, err = dry
    assert (code, out) == (2, "")
    assert err.startswith(f"is-study: error: {message}") and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_dry_run_refuses_a_dir_that_holds_another_sweep(basic_sweep, cli):
    args = [*GRID, *TINY, f"hydra.sweep.dir={basic_sweep}"]
    assert cli("sweep", *args, "--dry-run") == cli("sweep", *args)
    code, _, err = cli("sweep", *args, "--dry-run")
    assert (code, err) == (
        2,
        f"is-study: error: {basic_sweep} already holds a sweep: add --resume to finish it, or choose another --name\n",
    )
    other = ["correction=tis,icepop", "correction.high=2,10", "seed=0,1", *TINY, f"hydra.sweep.dir={basic_sweep}"]
    code, _, err = cli("sweep", *other, "--resume", "--dry-run")
    assert code == 2 and "--resume: the overrides differ" in err, err


def test_dry_run_names_the_sweep_dir_only_when_it_is_fixed(tmp_path, cli, monkeypatch):
    """Without --name the sweep dir is named when the sweep starts (the time then, a random suffix): the
    dry run printed a name (…19-06-09-ef89c2) that the sweep then did not use (…19-06-10-ad9857)."""
    monkeypatch.chdir(tmp_path)
    code, out, _ = cli("sweep", "seed=0,1", *TINY, "--dry-run")
    assert code == 0
    assert out.splitlines()[-1] == (
        "2 jobs (dry run: nothing ran; sweep dir named when the sweep starts: "
        "multirun/DATE_TIME-RANDOM; give --name NAME to fix it: multirun/NAME)"
    )
    for varying in ("runs/${now:%H-%M-%S}", "runs/${isstudy_uid:}"):
        code, out, _ = cli("sweep", "seed=0,1", *TINY, f"hydra.sweep.dir={varying}", "--dry-run")
        assert out.splitlines()[-1] == (
            "2 jobs (dry run: nothing ran; sweep dir named when the sweep starts "
            "(hydra.sweep.dir uses the time or a random suffix))"
        )
    code, out, _ = cli("sweep", "seed=0,1", *TINY, "--name", "fixed", "--dry-run")
    assert out.splitlines()[-1] == f"2 jobs (dry run: nothing ran; sweep dir {tmp_path / 'multirun' / 'fixed'})"
    assert list(tmp_path.iterdir()) == []
    code, out, err = cli("sweep", "seed=0,1", *TINY, "--name", "fixed")
    assert code == 0, err
    assert out.strip() == str(tmp_path / "multirun" / "fixed")  # the dir the dry run named


def test_a_sweep_dir_that_cannot_be_made_says_so(tmp_path, cli):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, out, err = cli("sweep", "seed=0,1", *TINY, f"hydra.sweep.dir={blocker / 'sweep'}")
    assert (code, out) == (2, "")
    assert err == (
        f"is-study: error: the sweep dir cannot be created or written: {blocker / 'sweep'} "
        f"(Not a directory); choose another --name or hydra.sweep.dir\n"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"]


def test_failing_jobs_do_not_lose_the_others_and_rerun_on_resume(tmp_path, cli, monkeypatch):
    from runner.studies import train

    real_run = train.run

    def flaky(cfg, run_dir):  # seed 1 raises after writing part of its metrics
        if cfg.seed == 1:
            (Path(run_dir) / "metrics.csv").write_text("step\n0\n")
            raise RuntimeError("boom in seed 1")
        return real_run(cfg, run_dir)

    d = tmp_path / "failing"
    # updates_per_step=5 > 2 × 2 sequences: those jobs fail in validation, with a one-line UserError
    args = ["train.updates_per_step=1,5", "seed=0,1", *TINY, f"hydra.sweep.dir={d}"]
    monkeypatch.setattr(train, "run", flaky)
    code, out, err = cli("sweep", *args)
    assert code == 1
    assert out.strip() == str(d)
    statuses = {r["job"]: r for r in _read_csv(d / "sweep_summary.csv")}
    assert [statuses[j]["status"] for j in "0123"] == ["done", "failed", "failed", "failed"]
    assert statuses["1"]["error"] == "RuntimeError: boom in seed 1"
    assert statuses["2"]["error"].startswith("train.updates_per_step (5) > rollout.batch_size")
    for j in ("1", "2", "3"):
        assert f"FAILED job {j} " in err
        text = (d / f"0{j}" / "ERROR").read_text()
        assert text.splitlines()[0] == statuses[j]["error"] and "Traceback" in text
    assert "--resume" in err  # the hint to rerun what failed
    # finished jobs' rows: job 0 (3 steps × 1 update and the final row), and the partial rows jobs 1 and 3
    # wrote before raising
    assert [r["job"] for r in _read_csv(d / "sweep.csv")] == ["0", "0", "0", "0", "1", "3"]

    monkeypatch.setattr(train, "run", real_run)
    done0 = (d / "00" / "DONE").stat().st_mtime_ns
    code, _, err = cli("sweep", *args, "--resume")
    assert code == 1  # updates_per_step=5 still fails; seed 1 now succeeds
    statuses = {r["job"]: r["status"] for r in _read_csv(d / "sweep_summary.csv")}
    assert statuses == {"0": "done", "1": "done", "2": "failed", "3": "failed"}
    assert not (d / "01" / "ERROR").exists()
    assert len(_read_csv(d / "01" / "metrics.csv")) == 3 + 1  # rerun from scratch: no row of the failed attempt
    assert (d / "00" / "DONE").stat().st_mtime_ns == done0


@pytest.mark.slow
def test_aggregate_reads_hydra_files_not_dir_names(basic_sweep, tmp_path, cli):
    d = tmp_path / "copy"
    shutil.copytree(basic_sweep, d)
    for name in ("sweep.csv", "sweep_summary.csv"):
        (d / name).unlink()
    for job in list(d.glob("*/.hydra")):  # rename every job dir: numbers must come from .hydra/
        job.parent.rename(job.parent.with_name(f"run-{9 - int(job.parent.name)}"))
    for job in d.glob("run-*"):  # a probe study's table aggregates the same way
        (job / "probe.csv").write_text("preset,low,high,bias_norm\ntis,0.5,2.0,0.25\nicepop,0.5,2.0,0.5\n")
    code, out, err = cli("aggregate", str(d))
    assert code == 0, err
    assert (d / "sweep.csv").read_bytes() == (basic_sweep / "sweep.csv").read_bytes()
    probe = _read_csv(d / "sweep_probe.csv")
    assert len(probe) == 16 and list(probe[0])[:4] == ["job", *GRID_KEYS]
    assert list(probe[0])[-4:] == ["preset", "low", "high", "bias_norm"]
    assert {(r["job"], r["preset"]) for r in probe} == {(str(j), p) for j in range(8) for p in ("tis", "icepop")}
    assert "sweep_probe.csv\t16 rows" in out and "8 done" in err
    assert not list(d.glob(".*.tmp"))


def test_missing_launcher_extra_is_one_line(cli, monkeypatch):
    monkeypatch.setattr(sweep, "plugin_installed", lambda module: False)
    code, _, err = cli("sweep", "seed=0,1", "--launcher", "joblib", "--dry-run")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1
    assert lines[0] == "is-study: error: launcher joblib needs the [parallel] extra: pip install 'is-study[parallel]'"
    code, _, err = cli("sweep", "seed=0,1", "hydra/launcher=submitit_slurm", "--dry-run")
    assert code == 2 and "pip install 'is-study[slurm]'" in err


def test_launcher_flags(cli):
    code, _, err = cli("sweep", "seed=0,1", "--jobs", "4", "--dry-run")
    assert code == 2 and "--launcher joblib" in err
    code, _, err = cli("sweep", "seed=0,1", "--launcher", "slurm", "--dry-run")
    assert code == 2 and "submitit-slurm" in err
    if not sweep.plugin_installed("hydra_plugins.hydra_ray_launcher"):
        code, _, err = cli("sweep", "seed=0,1", "--launcher", "ray", "--dry-run")
        assert code == 2 and "pip install 'is-study[ray]'" in err


@pytest.mark.slow
def test_one_launcher_vocabulary(cli):
    """`is-study list`, --launcher, hydra/launcher= and the files in conf/hydra/launcher/ use the same
    names, and hydra/launcher=NAME gives our preset, as --launcher NAME does."""
    from runner import registry

    names = ["basic", "joblib", "ray", "submitit-local", "submitit-slurm"]
    assert sorted(sweep.LAUNCHERS) == names == registry.group_options("hydra/launcher")
    code, out, _ = cli("list")
    assert code == 0
    # piped, `list` prints one line per item: what to type, a tab, what it is
    listed = [
        line.split("\t", 1)[0].removeprefix("hydra/launcher=")
        for line in out.splitlines()
        if line.startswith("hydra/launcher=")
    ]
    assert listed == names
    for old in ("serial", "parallel", "ray-cluster"):
        assert old not in listed
    for name in names:
        spec = sweep.LAUNCHERS[name]
        if spec.plugin and not sweep.plugin_installed(spec.plugin):
            continue
        fixed = "hydra.sweep.dir=/tmp/x"  # submitit's folder lives in it
        by_flag, _ = sweep.build_overrides(sweep.Request(launcher=name, overrides=[fixed]))
        by_option = hydra_app.compose([f"hydra/launcher={name}", fixed], with_hydra=True).hydra.launcher
        assert hydra_app.compose(by_flag, with_hydra=True).hydra.launcher == by_option
    joblib = hydra_app.compose(["hydra/launcher=joblib"], with_hydra=True).hydra.launcher
    assert joblib.n_jobs == -1 and joblib.prefer == "processes"  # our preset's values, the plugin's schema
    assert joblib.pre_dispatch == "2*n_jobs"


def test_launcher_presets_compose_with_jobs():
    cases = {
        "joblib": ("n_jobs", 3),
        "submitit-slurm": ("array_parallelism", 3),
    }
    for name, (key, value) in cases.items():
        overrides, _ = sweep.build_overrides(sweep.Request(launcher=name, jobs=3))
        cfg = hydra_app.compose(overrides, with_hydra=True)
        assert cfg.hydra.launcher[key] == value
    overrides, _ = sweep.build_overrides(sweep.Request(launcher="submitit-local", jobs=3))
    cfg = hydra_app.compose(overrides, with_hydra=True)
    assert cfg.hydra.sweeper.max_batch_size == 3 and cfg.hydra.launcher.cpus_per_task == 1
    slurm = hydra_app.compose(["hydra/launcher=submitit-slurm", "hydra.launcher.partition=cpu"], with_hydra=True)
    assert slurm.hydra.launcher.partition == "cpu" and slurm.hydra.launcher.timeout_min == 30


def test_name_goes_to_multirun_and_two_default_dirs_never_collide(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = sweep.plan(sweep.Request(overrides=["seed=0,1"], name="ladder"))
    assert p.sweep_dir == tmp_path / "multirun" / "ladder"
    explicit = sweep.plan(sweep.Request(overrides=["seed=0,1", f"hydra.sweep.dir={tmp_path}/x"], name="ladder"))
    assert explicit.sweep_dir == tmp_path / "x"
    dirs = {sweep.plan(sweep.Request(overrides=["seed=0,1"])).sweep_dir for _ in range(5)}
    assert len(dirs) == 5  # same second, distinct suffixes
    with pytest.raises(UserError, match="plain name"):
        sweep.plan(sweep.Request(name="../up"))


def test_representative_validation_keeps_one_job_per_group_choice():
    jobs = [
        [f"correction={c}", f"correction.high={h}", f"seed={s}"]
        for c in ("tis", "icepop")
        for h in (2, 5)
        for s in range(10)
    ]
    reps = project_sweeper.representative_jobs(jobs, lambda key: key == "correction")
    assert reps == [
        ["correction=tis", "correction.high=2", "seed=0"],
        ["correction=icepop", "correction.high=2", "seed=0"],
    ]


# (params, command line): each mix is expanded by the project's sweeper and by Hydra's BasicSweeper
EXPANSION_CASES = [
    ({}, []),
    ({}, ["seed=0,1,2"]),
    ({}, ["seed=range(0,4)", "correction=tis,icepop"]),
    ({}, ["seed=range(1,10,3)", "train.lr=range(0.1,0.35,0.1)"]),
    ({}, ["correction=choice(tis,icepop)", "seed=choice(0,1)", "train.steps=3"]),
    ({}, ["correction=glob(seq-*)", "mismatch=bf16,fp16"]),
    ({}, ["+extra=[1,2]", "++train.lr=0.1,0.2", "~log.timing", "+tags=[a,b],[c]"]),
    ({}, ["hydra.sweep.dir='a b,c'", "+note='x,y'", "+s=a\\,b", "+q=\"it's\",'two'"]),
    ({}, ["+d={a:1,b:[2,3]}", "seed=sort(3,1,2)", "seed=sort(3,1,2,reverse=true)", "+e=", "+n=null"]),
    ({}, ["seed=0,1", "correction=tis", "seed=5,6,7"]),  # a key again: its first place, its last values
    ({}, ["correction@foo=tis,icepop", "hydra/launcher=basic", "+arm=staleness/on-policy"]),
    ({"seed": "0,1", "correction": "tis,icepop"}, []),
    ({"seed": "range(0,3)", "correction.high": "2,5"}, ["seed=7,8", "train.steps=3", "correction=tis,icepop"]),
    ({"correction": "glob(*tis*)", "+x": "1,2"}, ["~log.timing", "mismatch=fp16"]),
    ({"experiment": "bigram/threshold-tradeoff"}, ["seed=0,1"]),
]


@pytest.fixture(scope="module")
def config_loader():
    with hydra_app.initialized() as hydra:
        yield hydra.config_loader


@pytest.mark.parametrize("params,arguments", EXPANSION_CASES)
def test_the_project_sweeper_expands_jobs_as_basic_sweeper_does(config_loader, params, arguments):
    """Same jobs, same order, same strings as Hydra's BasicSweeper.split_arguments (the internal class is
    imported here only, to compare), whole and cut into batches."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    strings = [f"{k}={v}" for k, v in params.items()] + arguments
    parsed = OverridesParser.create(config_loader=config_loader).parse_overrides(strings)
    ours = project_sweeper.expand_jobs(params, arguments, config_loader)
    assert ours == BasicSweeper.split_arguments(parsed, None)[0]
    assert len(ours) >= 1 and all(isinstance(o, str) for job in ours for o in job)
    for size in (1, 2, 3, 100):
        assert list(project_sweeper.batches(ours, size)) == BasicSweeper.split_arguments(parsed, size)


def test_the_expansion_cases_cover_every_sweep_kind(config_loader):
    """The cases above include each kind of sweep BasicSweeper expands, so the comparison covers them."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create(config_loader=config_loader)
    seen = set()
    for params, arguments in EXPANSION_CASES:
        for o in parser.parse_overrides([f"{k}={v}" for k, v in params.items()] + arguments):
            seen |= {o.value_type.name} if o.value_type is not None else set()  # None: `~key`
            seen |= {"add"} if o.is_add() else {"force"} if o.is_force_add() else {"delete"} if o.is_delete() else set()
            seen |= {"package"} if o.package else set()
    assert seen == {
        "ELEMENT",
        "SIMPLE_CHOICE_SWEEP",
        "CHOICE_SWEEP",
        "GLOB_CHOICE_SWEEP",
        "RANGE_SWEEP",
        "add",
        "force",
        "delete",
        "package",
    }


def test_the_project_sweeper_refuses_an_interval_sweep_as_basic_sweeper_does(config_loader):
    with pytest.raises(Exception, match="BasicSweeper does not support sweep type : INTERVAL_SWEEP"):
        project_sweeper.expand_jobs({}, ["train.lr=interval(0.1,0.2)"], config_loader)
    with pytest.raises(Exception, match="max_batch_size=0: a positive number of jobs, or null"):
        list(project_sweeper.batches([["seed=0"]], 0))


def test_the_sweep_is_planned_only_for_the_project_sweeper(tmp_path):
    """The plan (job list, resume, dry run) is the project sweeper's expansion, so another sweeper is
    refused in one line rather than run with a job list that might not match it."""
    with pytest.raises(
        UserError,
        match=r"only is-study's sweeper is supported \(hydra/sweeper=is-study; "
        r"hydra.sweeper is hydra._internal.core_plugins.basic_sweeper.BasicSweeper\)",
    ):
        sweep.plan(sweep.Request(overrides=["seed=0,1", "hydra/sweeper=basic", f"hydra.sweep.dir={tmp_path}"]))
    assert sweep.plan(sweep.Request(overrides=["seed=0,1", f"hydra.sweep.dir={tmp_path}"])).jobs == [
        ["seed=0"],
        ["seed=1"],
    ]


def _two_by_two(tmp_path: Path, name: str, *extra: str) -> Path:
    """A 2×2 sweep run through launch.sweep_multirun with the overrides `is-study sweep` would give it."""
    p = sweep.plan(
        sweep.Request(overrides=["correction=tis,icepop", "seed=0,1", *TINY, f"hydra.sweep.dir={tmp_path / name}"])
    )
    launch.sweep_multirun([*p.overrides, *extra])
    return p.sweep_dir


@pytest.mark.slow
def test_the_project_sweeper_writes_what_basic_sweeper_writes(tmp_path):
    """Issue 30 §5: the sweeper changed, every job's files did not. The same 2×2 sweep run with the
    project's sweeper (the default) and with Hydra's own (hydra/sweeper=basic): each job's
    .hydra/config.yaml, .hydra/overrides.yaml and metrics.csv byte for byte; of hydra.yaml and
    multirun.yaml only the sweeper's entry (and the sweep dir) differs."""
    ours = _two_by_two(tmp_path, "ours")
    basic = _two_by_two(tmp_path, "basic", "hydra/sweeper=basic")
    jobs = sorted(d.name for d in ours.iterdir() if d.is_dir())
    assert jobs == ["00", "01", "02", "03"] == sorted(d.name for d in basic.iterdir() if d.is_dir())
    for job in jobs:
        for name in (".hydra/config.yaml", ".hydra/overrides.yaml", "metrics.csv"):
            assert (ours / job / name).read_bytes() == (basic / job / name).read_bytes(), (job, name)
    assert (ours / "01" / ".hydra" / "overrides.yaml").read_text().splitlines()[:3] == [
        "- correction=tis",
        "- seed=1",
        "- train.steps=3",
    ]

    def without_sweeper(path: Path, sweep_dir: Path) -> list[str]:
        text = path.read_text().replace(str(sweep_dir), "SWEEP_DIR")
        text = re.sub(r"\n  sweeper:\n(    .*\n)+", "\n", text)
        return [ln for ln in text.splitlines() if "hydra/sweeper" not in ln]

    for name in ("multirun.yaml", "00/.hydra/hydra.yaml"):
        assert without_sweeper(ours / name, ours) == without_sweeper(basic / name, basic), name
    assert "_target_: hydra_plugins.is_study_sweeper.IsStudySweeper" in (ours / "multirun.yaml").read_text()


def test_the_project_sweeper_composes_each_job_once(tmp_path, monkeypatch):
    """The cost issue 30 §5 measured: BasicSweeper composed every job to validate it, then the launcher
    composed it again (8 compositions for 4 jobs). The project's sweeper composes one representative per
    group choice (here 2) and the launcher each job: 6."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    calls = []
    real = ConfigLoaderImpl.load_sweep_config

    def counted(self, master_config, sweep_overrides):
        calls.append(list(sweep_overrides))
        return real(self, master_config, sweep_overrides)

    monkeypatch.setattr(ConfigLoaderImpl, "load_sweep_config", counted)
    p = sweep.plan(
        sweep.Request(overrides=["correction=tis,icepop", "seed=0,1", *TINY, f"hydra.sweep.dir={tmp_path / 'once'}"])
    )
    launch.sweep_multirun(p.overrides)
    assert len(calls) == 2 + 4
    assert [job[:2] for job in calls[:2]] == [["correction=tis", "seed=0"], ["correction=icepop", "seed=0"]]
    assert sorted(map(tuple, calls[2:])) == sorted(map(tuple, p.jobs))


def test_a_bad_job_in_a_later_batch_stops_the_sweep_before_any_job_runs(tmp_path, cli):
    """Validation covers every batch before the first is launched: with 2 jobs a batch, the bad
    option in the second batch fails the sweep with the dry run's line, and no job has run."""
    d = tmp_path / "late-bad"
    args = ["seed=0,1", "correction=tis,icpop", *TINY, "hydra.sweeper.max_batch_size=1", f"hydra.sweep.dir={d}"]
    code, out, err = cli("sweep", *args)
    assert (code, out) == (2, "")
    assert err.startswith("is-study: error: config: unknown correction 'icpop'") and err.count("\n") == 1, err
    assert not _markers(d, "DONE") and not _markers(d, ".hydra/config.yaml")


def test_worker_tuning_freezes_the_heap_only_in_a_worker():
    """In a launcher's worker process (not the one that called sweep_multirun) the heap is frozen
    after the first job; the launching process (basic launcher) is left alone. Run in a fresh
    interpreter."""
    code = """
import gc
from runner.hydra_app import worker
worker.mark_launching_process()
assert not worker._in_worker()
worker._LAUNCHING_PID = None
assert worker._in_worker()
worker._freeze_worker_heap()
assert gc.get_freeze_count() > 0
print("ok")
"""
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_no_module_patches_hydra_or_joblib_internals():
    """Issue 30 §5: the sweep runs through Hydra's sweeper and launchers as shipped. No module of
    runner/ assigns to an attribute of Hydra's or the joblib plugin's classes or modules, none imports
    the joblib plugin's private _core, and none imports or names anything under hydra._internal: the
    sweeper is the project's own, on Hydra's public Sweeper interface."""
    pattern = re.compile(
        r"^\s*(BasicSweeper|Singleton|ConfigLoaderImpl|FileConfigSource|CachingConfigRepository"
        r"|ImportlibResourcesConfigSource|_core|core)\.\w+\s*=[^=]",
        re.M,
    )
    modules = sorted((REPO / "runner").rglob("*.py")) + sorted((REPO / "hydra_plugins").rglob("*.py"))
    assert REPO / "runner" / "hydra_app" / "sweeper.py" in modules
    for path in modules:
        text = path.read_text(encoding="utf-8")
        assert not pattern.search(text), (path, pattern.search(text).group(0))
        assert "hydra_joblib_launcher import _core" not in text, path
        assert "hydra._internal" not in text, path  # nothing private of Hydra's is imported or named
    assert not (REPO / "runner" / "hydra_app" / "reuse.py").exists()
    assert not (REPO / "runner" / "hydra_app" / "joblib_transport.py").exists()


def test_the_sweep_prints_nothing_and_leaves_progress_to_its_caller(tmp_path, capfd):
    """runner/sweep/command.py plans, runs and aggregates and returns a Result; the console is its caller's
    (runner/sweep/report.py): `watch` is entered with the sweep dir and the job count before the first
    job and left after the last, and nothing reaches stdout or stderr."""
    import contextlib

    seen = []

    @contextlib.contextmanager
    def watch(sweep_dir, total):
        seen.append((sweep_dir, total, len(_markers(sweep_dir, "DONE"))))
        yield
        seen.append(len(_markers(sweep_dir, "DONE")))

    d = (tmp_path / "quiet").resolve()
    result = sweep.run(sweep.Request(overrides=["seed=0,1", *TINY, f"hydra.sweep.dir={d}"]), watch=watch)
    assert result.ok and result.total == 2 and result.notes == []
    assert seen == [(d, 2, 0), 2]
    assert capfd.readouterr() == ("", "")


def test_a_launcher_error_is_reported_and_the_disk_decides(tmp_path, cli, monkeypatch):
    real = launch.sweep_multirun

    def collects_badly(overrides):  # every job runs, then the launcher fails collecting results
        real(overrides)
        raise RuntimeError("result pickle vanished")

    monkeypatch.setattr(launch, "sweep_multirun", collects_badly)
    code, _, err = cli("sweep", "seed=0,1", *TINY, f"hydra.sweep.dir={tmp_path / 'late'}")
    assert code == 0 and "note: the launcher raised after every job had finished" in err

    def fails_first(overrides):  # nothing ran: one line, exit 2, no sweep dir left behind
        raise RuntimeError("could not reach the cluster")

    monkeypatch.setattr(launch, "sweep_multirun", fails_first)
    code, _, err = cli("sweep", "seed=0,1", *TINY, f"hydra.sweep.dir={tmp_path / 'early'}")
    assert code == 2 and err.strip() == "is-study: error: sweep: RuntimeError: could not reach the cluster"
    assert not (tmp_path / "early").exists()


@pytest.mark.slow
def test_bench_sweep_measures_a_cold_start_without_bytecode(tmp_path):
    """scripts/bench_sweep.py --nocache: both launchers from a fresh interpreter with no bytecode cache
    (issue 16: the first joblib sweep in a fresh venv was 29 s against 18 s on basic). Tiny here: it
    proves the measurement runs; the figures are in docs/performance.md."""
    out = tmp_path / "bench.json"
    res = subprocess.run(
        [sys.executable, "scripts/bench_sweep.py", "--tiny", "--skip-cold", "--nocache", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert "cold" not in figures
    for launcher in ("basic", "joblib"):
        row = figures["nocache"][launcher]
        assert row["wall_s"] > row["compute_s"] > 0
    assert figures["nocache"]["speedup"] == round(
        figures["nocache"]["basic"]["wall_s"] / figures["nocache"]["joblib"]["wall_s"], 2
    )
    assert "nocache joblib: wall" in res.stdout


# ----------------------------------------------------------------------------------------- tables for pandas
@pytest.fixture(scope="module")
def world_sweep(tmp_path_factory):
    """staleness × precision (2 × 2 jobs, tokens logged every step): the keys the studies' own files name."""
    sweep_dir = tmp_path_factory.mktemp("sweeps") / "world"
    code, _, err = run_cli(
        "sweep",
        "mismatch.staleness=0,2",
        "mismatch.precision=bf16,fp16",
        *TINY,
        "log.tokens_every=1",
        f"hydra.sweep.dir={sweep_dir}",
    )
    assert code == 0, err
    return sweep_dir


@pytest.mark.slow
def test_sweep_tables_merge_on_one_name_per_key(world_sweep):
    """Every table names a key as the studies' files do (staleness, not mismatch.staleness), so pandas
    merges them on the same names without a rename; sweep.csv's last J is sweep_summary.csv's final J."""
    import pandas as pd

    tables = {
        name: pd.read_csv(world_sweep / name)
        for name in ("sweep.csv", "sweep_summary.csv", "sweep_events.csv", "sweep_tokens.csv")
    }
    for name, df in tables.items():
        assert not [c for c in df.columns if c.startswith("mismatch.")], name
        assert {"job", "staleness", "precision"} <= set(df.columns), name
    # summary.json's mismatch block, under a name no config key has
    assert {"measured_mismatch.token_kl_k3.first", "measured_mismatch.max_abs_prob_diff"} <= set(
        tables["sweep_summary.csv"].columns
    )
    assert "measured_mismatch.zero_grad_fraction" not in tables["sweep_summary.csv"].columns
    keys = ["job", "staleness", "precision"]
    summary = tables["sweep_summary.csv"]
    last_j = tables["sweep.csv"].groupby(keys, as_index=False)["objective"].last()
    merged = last_j.merge(summary[[*keys, "final_objective"]], on=keys, validate="one_to_one")
    assert len(merged) == 4
    assert (merged["objective"] == merged["final_objective"]).all()  # one final J, to the last bit
    tokens = tables["sweep_tokens.csv"].drop_duplicates(keys)
    assert len(tokens.merge(summary, on=keys)) == 4
    assert {(r.staleness, r.precision) for r in tokens.itertuples()} == {
        (k, p) for k in (0, 2) for p in ("bf16", "fp16")
    }
    assert "objective" not in summary.columns and set(summary["objective_kind"]) == {"exact"}


@pytest.mark.slow
def test_sweep_summary_reads_cleanly_and_survives_a_move(world_sweep, tmp_path):
    """run_dir is text (./00, not the integer 0) relative to the sweep dir, so it still resolves after the
    sweep dir is moved; no column is empty in every row."""
    import pandas as pd

    moved = tmp_path / "elsewhere" / "world"
    shutil.copytree(world_sweep, moved)
    summary = pd.read_csv(moved / "sweep_summary.csv")
    assert summary["run_dir"].tolist() == ["./00", "./01", "./02", "./03"]
    assert not pd.api.types.is_numeric_dtype(summary["run_dir"])
    assert "job_dir" not in summary.columns  # one column for the job's dir
    assert all((moved / d / "summary.json").is_file() for d in summary["run_dir"])
    assert not summary.columns[summary.isna().all()].tolist()  # error, collapse_step, ... when none failed
    cells = summary.select_dtypes(exclude="number").to_numpy().ravel()
    assert not [v for v in cells if isinstance(v, str) and os.path.isabs(v)]  # summary.json's absolute run_dir


@pytest.mark.slow
def test_aggregate_combines_separate_runs(tmp_path, cli):
    """`is-study aggregate runs/DAY1 runs/DAY2 --out DIR`: every run dir below the paths is a job; keys a run
    was not given come from its own files."""
    import pandas as pd

    runs = tmp_path / "runs"
    for day, args in (
        ("day1/10-00-00", ["seed=1"]),
        ("day1/11-00-00", ["correction=tis"]),
        ("day2/09-00-00", ["mismatch.staleness=3"]),
    ):
        code, _, err = cli("run", *args, *TINY, f"hydra.run.dir={runs / day}")
        assert code == 0, err
    code, _, err = cli("aggregate", str(runs / "day1"), str(runs / "day2"))
    assert code == 2 and err.count("\n") == 1 and "--out" in err  # several runs: where should the tables go?
    out = tmp_path / "tables"
    code, stdout, err = cli("aggregate", str(runs / "day1"), str(runs / "day2"), "--out", str(out))
    assert code == 0, err
    assert f"{out / 'sweep.csv'}\t{3 * ROWS_PER_JOB} rows" in stdout
    table = pd.read_csv(out / "sweep.csv")
    summary = pd.read_csv(out / "sweep_summary.csv")
    cells = {(r.job, r.seed, r.correction, r.staleness) for r in summary.itertuples()}
    assert cells == {(0, 1, "none", 1), (1, 0, "tis", 1), (2, 0, "none", 3)}
    assert set(table.groupby("job")[["seed", "correction", "staleness"]].first().itertuples(name=None)) == {
        (0, 1, "none", 1),
        (1, 0, "tis", 1),
        (2, 0, "none", 3),
    }
    assert [(out / d).resolve() for d in summary["run_dir"]] == [
        (runs / d).resolve() for d in ("day1/10-00-00", "day1/11-00-00", "day2/09-00-00")
    ]
    # a directory of runs alone: the tables go into it
    code, stdout, err = cli("aggregate", str(runs))
    assert code == 0, err
    assert len(pd.read_csv(runs / "sweep_summary.csv")) == 3


def test_aggregate_copies_plain_lines_as_the_csv_module_writes_them(tmp_path, monkeypatch):
    """aggregate copies a table's plain lines without the csv module; the tables must be byte for byte
    what parsing and rewriting every row gives, also where a job's table turns awkward mid-file (a
    quoted cell with a comma and a newline, a blank line, a short row, needless quotes) and where a job's own column is
    replaced by a key's (`seed`), so its cells are picked, not copied."""
    from runner.sweep import aggregate as agg

    sweep_dir = tmp_path / "s"
    code, _, err = run_cli("sweep", "seed=0,1", *TINY, "log.tokens_every=1", f"hydra.sweep.dir={sweep_dir}")
    assert code == 0, err
    tokens = sweep_dir / "01" / "tokens.csv"
    lines = tokens.read_text(encoding="utf-8").splitlines(keepends=True)
    width = lines[0].count(",") + 1
    assert len(lines) > 6 and "seed" in lines[0].split(",")
    awkward = '"a, b\nc"' + "," * (width - 1) + "\n"
    short = "1,2\n"
    needless_quotes = '"7"' + "," * (width - 1) + "\n"  # the csv module writes it back unquoted
    body = [*lines[:3], "\n", needless_quotes, *lines[3:5], awkward, short, *lines[5:]]
    tokens.write_text("".join(body), encoding="utf-8")

    names = ("sweep.csv", "sweep_tokens.csv", "sweep_summary.csv")
    agg.aggregate(sweep_dir)
    copied = {n: (sweep_dir / n).read_bytes() for n in names}
    monkeypatch.setattr(agg, "_copy_plain_lines", lambda lines, *args: lines)  # every row through the csv module
    agg.aggregate(sweep_dir)
    for n in names:
        assert copied[n] == (sweep_dir / n).read_bytes(), n
    rows = list(csv.reader(io.StringIO(copied["sweep_tokens.csv"].decode())))
    assert sum(1 for r in rows if r[0] == "1") == len(lines) - 1 + 3  # the awkward rows kept
    assert any("a, b\nc" in r for r in rows)
