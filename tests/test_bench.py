"""The benchmark suite runs (CI proves it at a tiny size; the figures themselves are measured by
`python scripts/bench.py`, never by timed tests)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

from tests.conftest import REPO


def test_bench_suite_runs_at_tiny_size(tmp_path):
    out = tmp_path / "bench.json"
    res = subprocess.run([sys.executable, "scripts/bench.py", "--tiny", "--only", "correction,long,cli,train",
                          "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
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
    # the CLI rows also prove that --help and list import no torch
    cli_rows = [r for r in rows if "CLI latency" in r["name"]]
    assert all("torch imported: no" in r["detail"] for r in cli_rows)


def test_bench_rejects_an_unknown_benchmark():
    res = subprocess.run([sys.executable, "scripts/bench.py", "--only", "nope"], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 2
    assert "unknown benchmark(s) nope" in res.stderr
