"""log.trackers: every tracker's output, read back with the library's own reader, holds metrics.csv's values
under the names of runner/tracking/names.py; a tracker failing mid-run loses nothing of the CSV; a tracker
whose package is missing is refused before the run starts."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import pytest

from runner import tracking
from runner.tracking.names import TRACKER_NAMES
from tests.helpers.cli import run_cli

ROOT = Path(__file__).resolve().parents[1]
STEPS, UPDATES = 6, 2
TINY = [f"train.steps={STEPS}", f"train.updates_per_step={UPDATES}", "log.timing=false", "-q"]


def run(tmp: Path, *overrides: str) -> Path:
    code, _, err = run_cli("run", *TINY, f"hydra.run.dir={tmp}", *overrides)
    assert code == 0, err
    return tmp


def csv_rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def expected(run_dir: Path) -> dict[int, dict[str, float]]:
    """{tracker step: {tracker name: value}} of every non-empty, numeric metrics.csv cell."""
    out = {}
    for row in csv_rows(run_dir):
        step = int(row["step"]) * UPDATES + int(row["update"])
        out[step] = {TRACKER_NAMES[c]: float(v) for c, v in row.items() if c in TRACKER_NAMES and v != ""}
    return out


def assert_same(got: dict[int, dict[str, float]], want: dict[int, dict[str, float]], cast=float) -> None:
    assert sorted(got) == sorted(want)
    for step, values in want.items():
        assert set(got[step]) == set(values), step
        for name, value in values.items():
            g = got[step][name]
            assert (math.isnan(cast(value)) and math.isnan(g)) or cast(g) == cast(value), (step, name, g, value)


# ------------------------------------------------------------------------------------------------ names


def test_names_are_namespaced_and_unique():
    from runner.core.schema import ALL_METRICS_COLUMNS, CONSTANT_COLUMNS

    assert set(TRACKER_NAMES) == set(ALL_METRICS_COLUMNS) - set(CONSTANT_COLUMNS)
    assert len(set(TRACKER_NAMES.values())) == len(TRACKER_NAMES)
    assert all(re.fullmatch(r"(training|actor|faults|rollout_corr|perf)/[a-z0-9_]+", n) for n in TRACKER_NAMES.values())


def test_docs_table_is_the_code_table():
    text = (ROOT / "docs" / "metrics.md").read_text()
    section = text.split("## Tracker names", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z0-9_]+)` \| `([a-z_/0-9]+)` \|", section, flags=re.M)
    assert dict(rows) == TRACKER_NAMES


# ------------------------------------------------------------------------------------------------ jsonl


def read_jsonl(path: Path) -> dict[int, dict[str, float]]:
    out = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        assert set(record) == {"step", "data"}
        out[record["step"]] = {k: math.nan if v is None else v for k, v in record["data"].items()}
    return out


@pytest.mark.slow  # whole (tiny) runs or a sweep
def test_jsonl_holds_metrics_csv_value_for_value(tmp_path):
    run_dir = run(tmp_path / "r", "log.trackers=[jsonl]")
    assert_same(read_jsonl(run_dir / "metrics.jsonl"), expected(run_dir))
    # verl's file logger's shape: compact JSON, one object per line
    first = (run_dir / "metrics.jsonl").read_text().splitlines()[0]
    assert first.startswith('{"step":0,"data":{"training/global_step":0,"training/update":0,')


def test_jsonl_writes_nonfinite_values_as_null(tmp_path):
    from runner.tracking.jsonl import JsonlTracker
    from runner.tracking.run_info import RunInfo

    tracker = JsonlTracker(RunInfo(tmp_path, "r", None))
    tracker.log(3, {"actor/pg_loss": -math.inf, "actor/grad_norm": math.nan, "training/update": 1})
    tracker.close()
    assert (tmp_path / "metrics.jsonl").read_text() == (
        '{"step":3,"data":{"actor/pg_loss":null,"actor/grad_norm":null,"training/update":1}}\n'
    )


@pytest.mark.slow  # whole (tiny) runs or a sweep
def test_trackers_leave_metrics_csv_byte_identical(tmp_path):
    plain = run(tmp_path / "plain")
    tracked = run(tmp_path / "tracked", "log.trackers=[jsonl]")
    for name in ("metrics.csv", "tokens.csv", "events.csv"):
        assert (plain / name).read_bytes() == (tracked / name).read_bytes(), name


@pytest.mark.slow  # whole (tiny) runs or a sweep
def test_a_tracker_failing_mid_run_loses_no_csv(tmp_path, monkeypatch):
    from runner.tracking.jsonl import JsonlTracker

    calls = {"n": 0}
    real = JsonlTracker.log

    def full_disk(self, step, data):
        calls["n"] += 1
        if calls["n"] == 4:
            raise OSError(28, "No space left on device")
        real(self, step, data)

    monkeypatch.setattr(JsonlTracker, "log", full_disk)
    code, _, err = run_cli("run", *TINY, f"hydra.run.dir={tmp_path / 'r'}", "log.trackers=[jsonl]")
    assert code == 0
    lines = [line for line in err.splitlines() if "tracker" in line]
    assert lines == [
        "is-study: tracker jsonl failed (OSError: [Errno 28] No space left on device); "
        "it is off for the rest of the run, the CSV files go on"
    ]
    run_dir = tmp_path / "r"
    assert (run_dir / "DONE").exists() and len(csv_rows(run_dir)) == STEPS * UPDATES + 1
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 3  # what it wrote before it failed


# ------------------------------------------------------------------------------------------------ background


class Recording:
    """A tracker that records what reaches it, from which thread, and fails where told."""

    name = "rec"

    def __init__(self, fail_at: int | None = None):
        import threading

        self.rows, self.calls, self.closed, self.fail_at = [], 0, False, fail_at
        self.threads = {threading.current_thread().name}

    def log_rows(self, rows):
        import threading

        self.threads.add(threading.current_thread().name)
        for step, data in rows:
            if step == self.fail_at:
                raise OSError(28, "No space left on device")
            self.rows.append((step, dict(data)))
        self.calls += 1

    def close(self):
        self.closed = True


def test_a_background_tracker_gets_every_row_in_order_off_the_run_s_thread():
    import threading

    from runner.tracking.background import BackgroundTracker

    made, sent_all = [], threading.Event()

    def opener():  # a slow start (W&B's service process): the rows queue meanwhile
        sent_all.wait(10)
        made.append(Recording())
        return made[-1]

    tracker = BackgroundTracker("rec", opener)
    sent = [(step, {"training/reward": step / 7}) for step in range(2000)]
    for step, data in sent:
        tracker.log(step, data)
    sent_all.set()
    tracker.close()
    (rec,) = made
    assert rec.rows == sent and rec.closed  # whole and in order once close returns
    assert "MainThread" not in rec.threads  # opened and fed on its own thread
    assert rec.calls == 1  # the rows that waited were handed over in one call


@pytest.mark.parametrize("where", ["open", "row"])
def test_a_background_tracker_s_error_is_reported_once_on_the_run_s_thread(where, capsys):
    from runner.tracking.background import BackgroundTracker
    from runner.tracking.base import Trackers

    def opener():
        if where == "open":
            raise ConnectionError("no tracking server at nosuch://x")
        return Recording(fail_at=3)

    trackers = Trackers([BackgroundTracker("rec", opener)], updates_per_step=1)
    for step in range(10):
        trackers.row({"step": step, "update": 0, "reward": 0.5})
    trackers.close()
    what = (
        "ConnectionError: no tracking server at nosuch://x"
        if where == "open"
        else "OSError: [Errno 28] No space left on device"
    )
    assert capsys.readouterr().err.splitlines() == [
        f"is-study: tracker rec failed ({what}); it is off for the rest of the run, the CSV files go on"
    ]
    assert trackers.live == []


# ------------------------------------------------------------------------------------------------ choosing


def test_unknown_tracker_is_one_line_and_exit_2(tmp_path):
    code, _, err = run_cli("run", *TINY, f"hydra.run.dir={tmp_path / 'r'}", "log.trackers=[jsonl,neptune]")
    assert code == 2 and err.strip().splitlines() == [
        "is-study: error: log.trackers: unknown tracker 'neptune'; choose from jsonl, tensorboard, mlflow, wandb"
    ]
    assert not (tmp_path / "r" / "metrics.csv").exists()


@pytest.mark.parametrize("name", ["tensorboard", "mlflow", "wandb"])
def test_a_missing_package_names_the_pip_command_before_any_work(tmp_path, monkeypatch, name):
    monkeypatch.setattr(tracking, "installed", lambda module: module != tracking.TRACKERS[name].needs)
    code, _, err = run_cli("run", *TINY, f"hydra.run.dir={tmp_path / 'r'}", f"log.trackers=[{name}]")
    assert code == 2
    assert err.strip().splitlines() == [
        f"is-study: error: log.trackers: {name} needs the {tracking.TRACKERS[name].needs} package: "
        "pip install 'is-study[tracking]'"
    ]
    assert not (tmp_path / "r").exists()  # refused before the run dir was made


# ------------------------------------------------------------------------------------------------ tensorboard


def read_tensorboard(log_dir: Path) -> tuple[dict[int, dict[str, float]], object]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    out: dict[int, dict[str, float]] = {}
    for tag in events.Tags()["scalars"]:
        if tag.startswith("hparams/"):
            continue
        for e in events.Scalars(tag):
            out.setdefault(e.step, {})[tag] = e.value
    return out, events


@pytest.mark.slow  # whole (tiny) runs or a sweep
def test_tensorboard_holds_metrics_csv_value_for_value(tmp_path):
    pytest.importorskip("tensorboard")
    pytest.importorskip("tensorboardX")
    import numpy as np

    run_dir = run(tmp_path / "r", "log.trackers=[tensorboard]")
    got, events = read_tensorboard(run_dir / "tensorboard")
    assert_same(got, expected(run_dir), cast=np.float32)  # TensorBoard stores float32 scalars
    # the config as hparams, the final J as its metric
    from tensorboard.plugins.hparams import plugin_data_pb2

    hparams = {}
    for content in events.PluginTagToContent("hparams").values():
        data = plugin_data_pb2.HParamsPluginData.FromString(content)
        if data.HasField("session_start_info"):
            hparams = dict(data.session_start_info.hparams)
    assert hparams["train.steps"].number_value == STEPS and hparams["correction.name"].string_value == "none"
    final = [row for row in csv_rows(run_dir) if row["reward"] == ""][-1]
    assert [e.value for e in events.Scalars("hparams/final_objective")] == [np.float32(float(final["objective"]))]


@pytest.mark.slow  # whole (tiny) runs or a sweep
def test_plot_adds_the_figures_to_the_run_s_tensorboard_log(tmp_path):
    pytest.importorskip("tensorboard")
    pytest.importorskip("tensorboardX")
    run_dir = run(tmp_path / "r", "log.trackers=[tensorboard]")
    code, _, err = run_cli("plot", str(run_dir), "--kind", "training", "--out", str(tmp_path / "fig"))
    assert code == 0, err
    _, events = read_tensorboard(run_dir / "tensorboard")
    images = events.Tags()["images"]
    assert images and all(tag.startswith("figures/") for tag in images)
    pngs = sorted(p.stem for p in (tmp_path / "fig").glob("*.png"))
    assert sorted(tag.removeprefix("figures/") for tag in images) == pngs


# ------------------------------------------------------------------------------------------------ mlflow


def read_mlflow(store: Path, experiment: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store.resolve().as_uri())
    found = client.get_experiment_by_name(experiment)
    assert found is not None, experiment
    runs = client.search_runs([found.experiment_id])
    return client, runs


def mlflow_history(client, run) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for name in run.data.metrics:
        for m in client.get_metric_history(run.info.run_id, name):
            out.setdefault(m.step, {})[name] = m.value
    return out


@pytest.mark.slow  # whole (tiny) runs or a sweep
def test_mlflow_holds_metrics_csv_value_for_value(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run_dir = run(tmp_path / "runs" / "r", "log.trackers=[mlflow]")
    client, runs = read_mlflow(tmp_path / "runs" / "mlruns", "is-study")  # the file store beside the run dirs
    assert [r.info.run_name for r in runs] == ["r"] and runs[0].info.status == "FINISHED"
    assert_same(mlflow_history(client, runs[0]), expected(run_dir))
    params = runs[0].data.params
    assert params["train.steps"] == str(STEPS) and params["correction.name"] == "none"


@pytest.mark.slow  # whole (tiny) runs or a sweep
def test_mlflow_takes_the_tracking_uri_the_user_sets(tmp_path):
    pytest.importorskip("mlflow")
    store = tmp_path / "elsewhere"
    run(tmp_path / "runs" / "r", "log.trackers=[mlflow]", f"log.mlflow_uri={store.resolve().as_uri()}")
    assert not (tmp_path / "runs" / "mlruns").exists()
    _, runs = read_mlflow(store, "is-study")
    assert [r.info.run_name for r in runs] == ["r"]


# ------------------------------------------------------------------------------------------------ wandb


def wandb_file(run_dir: Path) -> Path:
    (found,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    return found


@pytest.mark.slow  # whole (tiny) runs or a sweep
def test_wandb_runs_offline_and_holds_metrics_csv_value_for_value(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from tests.helpers import wandb_log

    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline is the tracker's own default
    run_dir = run(tmp_path / "r", "log.trackers=[wandb]")
    path = wandb_file(run_dir)
    assert_same(wandb_log.history(path), expected(run_dir))
    record = wandb_log.run_record(path)
    assert record.display_name == "r" and record.run_group == ""
    config = wandb_log.config(path)
    assert config["train.steps"] == STEPS and config["correction.name"] == "none"


def test_the_tracking_extra_brings_every_tracker_s_package_and_ci_installs_it():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {re.split(r"[<>=\[]", r)[0] for r in extras["tracking"]}
    # the import each tracker checks for → the distribution that provides it
    provides = {"tensorboardX": "tensorboardX", "mlflow": "mlflow-skinny", "wandb": "wandb", "pyarrow": "pyarrow"}
    needed = {spec.needs for spec in tracking.TRACKERS.values() if spec.needs} | {tracking.FORMATS["parquet"]}
    # beside what the trackers import: TensorBoard to read their event files, crc32c to checksum them in C
    assert {provides[m] for m in needed} | {"tensorboard", "crc32c"} == names
    assert "export EXTRAS=test,tracking" in (ROOT / ".ci" / "run").read_text()  # CI installs it, so nothing skips there


# ------------------------------------------------------------------------------------------------ sweeps


@pytest.fixture(scope="module")
def tracked_sweep(tmp_path_factory):
    """A 2 × 2 sweep with every installed tracker: one tracker run per job, grouped by the sweep."""
    names = ["jsonl"] + [n for n, spec in tracking.TRACKERS.items() if spec.needs and tracking.installed(spec.needs)]
    sweep_dir = tmp_path_factory.mktemp("sweeps") / "demo"
    env = pytest.MonkeyPatch()
    env.setenv("WANDB_MODE", "offline")  # never a network, whatever the environment says
    env.delenv("MLFLOW_TRACKING_URI", raising=False)
    env.delenv("WANDB_PROJECT", raising=False)
    code, _, err = run_cli(
        "sweep",
        "correction=none,tis",
        "mismatch.staleness=0,4",
        f"train.steps={STEPS}",
        f"train.updates_per_step={UPDATES}",
        "log.timing=false",
        f"log.trackers=[{','.join(names)}]",
        f"hydra.sweep.dir={sweep_dir}",
    )
    env.undo()
    assert code == 0, err
    return sweep_dir, names


JOBS = {"00": ("none", 0), "01": ("none", 4), "02": ("tis", 0), "03": ("tis", 4)}


@pytest.mark.slow  # whole (tiny) runs or a sweep
def test_a_sweep_s_jobs_each_have_their_own_tracker_run(tracked_sweep):
    sweep_dir, _ = tracked_sweep
    for job in JOBS:
        assert_same(read_jsonl(sweep_dir / job / "metrics.jsonl"), expected(sweep_dir / job))


@pytest.mark.slow  # whole (tiny) runs or a sweep
def test_a_sweep_in_tensorboard_is_one_run_per_job_with_its_swept_keys_as_hparams(tracked_sweep):
    pytest.importorskip("tensorboard")
    pytest.importorskip("tensorboardX")
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer
    from tensorboard.plugins.hparams import plugin_data_pb2

    sweep_dir, _ = tracked_sweep
    mux = EventMultiplexer()
    mux.AddRunsFromDirectory(str(sweep_dir))
    mux.Reload()
    runs = {job: f"{job}/tensorboard/correction={c},mismatch.staleness={k}" for job, (c, k) in JOBS.items()}
    assert sorted(mux.Runs()) == sorted(runs.values())
    for job, (correction, staleness) in JOBS.items():
        content = mux.PluginRunToTagToContent("hparams")[runs[job]]
        starts = [plugin_data_pb2.HParamsPluginData.FromString(c) for c in content.values()]
        (start,) = [s.session_start_info for s in starts if s.HasField("session_start_info")]
        hparams = {k: v.string_value or v.number_value for k, v in start.hparams.items()}
        assert hparams == {"correction": correction, "mismatch.staleness": staleness}


@pytest.mark.slow  # whole (tiny) runs or a sweep
def test_a_sweep_in_mlflow_is_one_experiment_named_after_it(tracked_sweep):
    pytest.importorskip("mlflow")
    sweep_dir, _ = tracked_sweep
    client, runs = read_mlflow(sweep_dir.parent / "mlruns", "demo")  # beside the sweep dir
    by_name = {r.info.run_name: r for r in runs}
    assert sorted(by_name) == [f"demo/{job}" for job in JOBS]
    for job, (correction, staleness) in JOBS.items():
        r = by_name[f"demo/{job}"]
        assert r.data.params["correction"] == correction and r.data.params["mismatch.staleness"] == str(staleness)
        assert_same(mlflow_history(client, r), expected(sweep_dir / job))


@pytest.mark.slow  # whole (tiny) runs or a sweep
def test_a_sweep_in_wandb_is_one_group_named_after_it(tracked_sweep):
    pytest.importorskip("wandb")
    from tests.helpers import wandb_log

    sweep_dir, _ = tracked_sweep
    for job, (correction, staleness) in JOBS.items():
        path = wandb_file(sweep_dir / job)
        record = wandb_log.run_record(path)
        assert (record.display_name, record.run_group) == (f"demo/{job}", "demo")
        config = wandb_log.config(path)
        assert config["correction"] == correction and config["mismatch.staleness"] == staleness
        assert_same(wandb_log.history(path), expected(sweep_dir / job))


# ------------------------------------------------------------------------------------------------ parquet


def assert_frames_match(csv_frame, parquet_frame, float32_columns=()):
    import numpy as np
    import pandas as pd

    assert list(parquet_frame.columns) == list(csv_frame.columns)
    assert dict(parquet_frame.dtypes) == dict(csv_frame.dtypes)
    for column in csv_frame.columns:
        a, b = csv_frame[column], parquet_frame[column]
        if column in float32_columns:  # float32 values: their 9-digit text gives them back as float32
            a, b = a.astype(np.float32), b.astype(np.float32)
        pd.testing.assert_series_equal(a, b, check_exact=True)


@pytest.mark.slow  # whole (tiny) runs or a sweep
def test_parquet_tables_read_back_with_the_csv_columns_and_dtypes(tmp_path):
    pytest.importorskip("pyarrow")
    import pandas as pd

    run_dir = run(tmp_path / "r", "log.format=parquet", "log.tokens_every=2", "policy=mlp")
    metrics = pd.read_csv(run_dir / "metrics.csv")
    assert_frames_match(metrics, pd.read_parquet(run_dir / "metrics.parquet"))
    tokens = pd.read_csv(run_dir / "tokens.csv")
    assert tokens["step"].nunique() == 3 and len(tokens) > 100
    assert_frames_match(tokens, pd.read_parquet(run_dir / "tokens.parquet"), float32_columns=("old", "roll"))


@pytest.mark.slow  # whole (tiny) runs or a sweep
def test_aggregate_writes_sweep_parquet(tracked_sweep, tmp_path):
    pytest.importorskip("pyarrow")
    import pandas as pd

    sweep_dir, _ = tracked_sweep
    code, out, err = run_cli("aggregate", str(sweep_dir), "--format", "parquet")
    assert code == 0, err
    assert f"{sweep_dir / 'sweep.parquet'}\t" in out
    assert_frames_match(pd.read_csv(sweep_dir / "sweep.csv"), pd.read_parquet(sweep_dir / "sweep.parquet"))


def test_parquet_without_pyarrow_is_refused_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setattr(tracking, "installed", lambda module: module != "pyarrow")
    code, _, err = run_cli("run", *TINY, f"hydra.run.dir={tmp_path / 'r'}", "log.format=parquet")
    assert code == 2 and err.strip() == (
        "is-study: error: log.format parquet needs the pyarrow package: pip install 'is-study[tracking]'"
    )
    assert not (tmp_path / "r").exists()


@pytest.mark.slow  # a whole (tiny) run
def test_a_tracker_that_cannot_open_is_reported_and_the_run_goes_on(tmp_path):
    pytest.importorskip("mlflow")
    code, _, err = run_cli(
        "run", *TINY, f"hydra.run.dir={tmp_path / 'r'}", "log.trackers=[jsonl,mlflow]", "log.mlflow_uri=nosuch://x"
    )
    assert code == 0
    (line,) = [line for line in err.splitlines() if "tracker" in line]
    assert line.startswith("is-study: tracker mlflow failed (") and line.endswith("the CSV files go on")
    assert (tmp_path / "r" / "DONE").exists()
    assert len(read_jsonl(tmp_path / "r" / "metrics.jsonl")) == STEPS * UPDATES + 1  # the other tracker carried on
