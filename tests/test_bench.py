"""The benchmark suite runs (CI proves it at a tiny size; the figures themselves are measured by
`python scripts/bench.py`, never by timed tests)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pytest

from tests.helpers.repo import REPO

pytestmark = pytest.mark.slow  # the benchmark suite itself, at tiny size


def test_bench_suite_runs_at_tiny_size(tmp_path):
    out = tmp_path / "bench.json"
    res = subprocess.run(
        [sys.executable, "scripts/bench.py", "--tiny", "--only", "correction,long,cli,train", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    rows = json.loads(out.read_text())
    names = [r["name"] for r in rows]
    assert any("metrics=on" in n for n in names) and any("metrics=off" in n for n in names)
    assert any("peak memory" in n for n in names) and any("CLI latency" in n for n in names)
    assert any("train step" in n for n in names)
    for row in rows:
        assert set(row) == {"name", "value", "target", "pass", "detail"}
        assert isinstance(row["pass"], bool) or (row["pass"] is None and row["target"] == "info"), row
        assert math.isfinite(row["value"]) and row["value"] > 0, row
    # 4 correction rows (2 baselines × metrics on/off), 3 long-sequence rows, 2 CLI rows, 3 train rows
    assert len(rows) == 12, names
    # the figures agree with the numbers they are drawn from: peak / inputs, where the inputs are
    # five float32 [8, 4096] tensors (0.625 MiB), and the time at T = 4096 over the time at T = 1024
    for row in (r for r in rows if "peak memory" in r["name"]):
        peak, inputs, processes = re.search(
            r"median peak \+([\d.]+) MiB .* for ([\d.]+) MiB of inputs, (\d) processes", row["detail"]
        ).groups()
        assert (inputs, processes) == ("0.6", "3"), row
        assert abs(row["value"] - float(peak) / 0.625) <= 0.05 / 0.625 + 1e-9, row  # peak is shown to 0.1 MiB
    (scaling,) = [r for r in rows if r["name"].startswith("time scaling T=1024→4096")]
    short, long_ = map(float, re.fullmatch(r"([\d.]+) ms → ([\d.]+) ms", scaling["detail"]).groups())
    assert scaling["value"] == pytest.approx(long_ / short, rel=0.02), scaling  # times shown to 0.01 ms
    # the CLI rows also prove that --help and list import no torch
    cli_rows = [r for r in rows if "CLI latency" in r["name"]]
    assert all("torch imported: no" in r["detail"] for r in cli_rows)


def test_bench_rejects_an_unknown_benchmark():
    res = subprocess.run(
        [sys.executable, "scripts/bench.py", "--only", "nope"], cwd=REPO, capture_output=True, text=True
    )
    assert res.returncode == 2
    assert "unknown benchmark(s) nope" in res.stderr


def _tiny_run(script: str, tmp_path):
    """scripts/SCRIPT.py --tiny: it exits 0, and what it wrote with --out, parsed."""
    out = tmp_path / f"{script}.json"
    res = subprocess.run(
        [sys.executable, f"scripts/{script}.py", "--tiny", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(out.read_text())


def test_bench_metrics_runs_at_tiny_size(tmp_path):
    """scripts/bench_metrics.py (the figures behind keeping the NumPy totals and the fused PPO) runs and
    reports every side: three train-step ratios and two per-call ratios, each a positive number."""
    rows = _tiny_run("bench_metrics", tmp_path)
    assert [r["name"].split(" (")[0] for r in rows] == [
        "train step, torch metrics vs today",
        "train step, readable PPO vs today",
        "train step, metrics off vs today",
        "per call, metrics torch vs numpy",
        "per call, PPO readable vs fused",
    ]
    assert all(math.isfinite(r["value"]) and r["value"] > 0 and r["target"] == "info" for r in rows), rows


def test_bench_replay_runs_at_tiny_size(tmp_path):
    """scripts/bench_replay.py (is-study replay's time and memory on a synthetic dump, every preset) runs and
    reports both figures, each a positive number from a replay that reached DONE."""
    rows = _tiny_run("bench_replay", tmp_path)
    assert [r["name"].split(",")[0] for r in rows] == ["replay time", "replay peak memory over the tokens' bytes"]
    from runner import registry

    presets = len(registry.own_presets() + registry.faithful_presets())
    assert f"16,384 tokens × {presets} presets" in rows[0]["name"]
    assert f"{4 * presets} replay.csv rows" in rows[0]["detail"]  # 4 steps at --tiny
    for row in rows:
        assert set(row) == {"name", "value", "target", "pass", "detail"}
        assert math.isfinite(row["value"]) and row["value"] > 0 and row["target"] == "info", row


def test_bench_trackers_runs_at_tiny_size(tmp_path):
    """scripts/bench_trackers.py (each tracker's cost on a default run, tokens.csv against tokens.parquet) runs,
    and its figures are the ratios of the times it reports."""
    from runner import tracking

    figures = _tiny_run("bench_trackers", tmp_path)
    installed = [n for n, s in tracking.TRACKERS.items() if s.needs is None or tracking.installed(s.needs)]
    assert [row["tracker"] for row in figures["trackers"]] == installed and figures["judged"] is False
    for row in figures["trackers"]:
        assert row["ratio"] == pytest.approx(row["ratios"][0], abs=5e-4) and row["ratio"] > 0, row
        assert math.isfinite(row["import_s"]) and row["import_s"] >= 0, row
    if tracking.installed("pyarrow"):
        tokens = figures["tokens"]
        assert tokens["rows"] == 64 * 64 and tokens["csv_mib"] > 0 and tokens["parquet_mib"] > 0


def test_bench_regime_runs_at_tiny_size(tmp_path):
    """scripts/bench_regime.py (each field regime's step, the mlp's exact J, each accuracy band) runs and
    reports its seven rows, each judged against its target."""
    rows = _tiny_run("bench_regime", tmp_path)
    assert [r["name"].split(" (")[0].split(" in [")[0] for r in rows] == [
        "mlp field-regime train step",
        "mlp field-regime exact J",
        "mlp field-regime accuracy",
        "mlp field-regime all-same groups",
        "transformer field-regime train step",
        "transformer field-regime accuracy",
        "transformer field-regime all-same groups",
    ]
    assert all(isinstance(r["pass"], bool) and math.isfinite(r["value"]) and r["value"] > 0 for r in rows), rows
