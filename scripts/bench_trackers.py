"""What log.trackers and log.format=parquet cost.

    python scripts/bench_trackers.py [--tiny] [--rounds R] [--steps N] [--out bench_trackers.json]

1. Each installed tracker's cost on a default run (`is-study run`: the bigram world, 200 steps): the train
   study run in this process with log.trackers=[] and with [TRACKER], in alternating rounds, timing the
   whole study call (opening the tracker, its rows, closing it). The figure is the median over rounds of
   (with tracker) / (without). A first untimed round pays each library's import, which a fresh process
   pays once; it is measured apart, in a subprocess (`import_s`), and shown beside the ratio.
   Target: ≤ 1.10×. `--steps 1000` runs five times as many rows: with the default run's figures it splits a
   tracker's cost into a fixed part (start, finish) and a part per row, which is what a long run pays.
2. The per-token table at T = 1024 (64 sequences of 1024 tokens a logged step, 5 logged steps): writing the
   same columns as tokens.csv (the study's own writer and row format) and as tokens.parquet, time and size,
   after an untimed warm-up write (pyarrow's one-time start).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TARGET = 1.10


def _study_seconds(overrides: list[str], run_dir: Path) -> float:
    from runner.hydra_app import app as hydra_app
    from runner.studies import train

    cfg = hydra_app.compose(overrides)
    start = time.perf_counter()
    train.run(cfg, run_dir)
    return time.perf_counter() - start


IMPORTS = {"tensorboard": "tensorboardX", "mlflow": "mlflow.tracking", "wandb": "wandb"}


def _import_seconds(module: str) -> float:
    """A fresh process's import of what the tracker opens with, after torch (a run has it already)."""
    code = f"import time, torch; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return float(out.strip().splitlines()[-1])


def trackers_cost(steps: int, rounds: int, root: Path) -> list[dict]:
    from runner import tracking

    names = [n for n, s in tracking.TRACKERS.items() if s.needs is None or tracking.installed(s.needs)]
    base = [f"train.steps={steps}", "log.quiet=true"]
    os.environ.setdefault("WANDB_MODE", "offline")
    sides = ["none", *names]
    times: dict[str, list[float]] = {side: [] for side in sides}
    for r in range(rounds + 1):  # round 0 warms up: imports, the first tensor allocations
        for side in sides:
            run_dir = root / f"{side}-{r}" / "run"
            trackers = "[]" if side == "none" else f"[{side}]"
            seconds = _study_seconds([*base, f"log.trackers={trackers}"], run_dir)
            shutil.rmtree(run_dir.parent, ignore_errors=True)
            if r:
                times[side].append(seconds)
    rows = []
    for name in names:
        ratios = [t / b for t, b in zip(times[name], times["none"])]
        needs = tracking.TRACKERS[name].needs
        rows.append(
            {
                "tracker": name,
                "ratio": statistics.median(ratios),
                "ratios": [round(x, 3) for x in ratios],
                "run_s": statistics.median(times[name]),
                "baseline_s": statistics.median(times["none"]),
                "import_s": _import_seconds(IMPORTS[name]) if needs else 0.0,
            }
        )
    return rows


def token_table(steps: int, seq_len: int, sequences: int, root: Path) -> dict:
    """tokens.csv against tokens.parquet for `steps` logged steps of sequences × seq_len tokens."""
    from runner.records import CsvWriter
    from runner.studies.train import token_row_template
    from runner.tracking.parquet import TokenParquetWriter

    constants = {"seed": 0, "correction": "seq-mask-tis", "staleness": 4, "precision": "bf16"}
    rng = random.Random(0)
    n = sequences * seq_len
    batches = []  # each logged step's columns, as the study's Writer gets them: step, seq, pos, token, old, roll
    for step in range(steps):
        old = [-rng.expovariate(1.0) for _ in range(n)]
        roll = [o + rng.gauss(0, 0.01) for o in old]
        seq, pos = [i // seq_len for i in range(n)], [i % seq_len for i in range(n)]
        batches.append([[step * 50] * n, seq, pos, [rng.randrange(16) for _ in range(n)], old, roll])
    from runner.core.schema import TOKEN_COLUMNS

    template = token_row_template(constants)
    # warm-up, untimed: pyarrow's first array and first write pay a one-time start (~0.5 s), once per process
    warm = TokenParquetWriter(root / "warm.parquet", constants)
    warm.write_columns([c[:1000] for c in batches[0]])
    warm.close()
    start = time.perf_counter()
    with CsvWriter(root / "tokens.csv", TOKEN_COLUMNS) as writer:
        for columns in batches:
            writer.write_number_rows(list(zip(*columns)), template)
    csv_s = time.perf_counter() - start
    start = time.perf_counter()
    writer = TokenParquetWriter(root / "tokens.parquet", constants)
    for columns in batches:
        writer.write_columns(columns)
    writer.close()
    parquet_s = time.perf_counter() - start
    return {
        "rows": n * steps,
        "seq_len": seq_len,
        "logged_steps": steps,
        "csv_s": csv_s,
        "parquet_s": parquet_s,
        "csv_mib": (root / "tokens.csv").stat().st_size / 2**20,
        "parquet_mib": (root / "tokens.parquet").stat().st_size / 2**20,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="CI smoke run: 4-step runs, one round; targets not judged")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds per side (default 5)")
    ap.add_argument("--steps", type=int, default=200, help="train.steps of each run (default 200, the default run's)")
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = ap.parse_args()
    steps, rounds = (4, 1) if args.tiny else (args.steps, args.rounds)
    root = Path(tempfile.mkdtemp(prefix="bench_trackers_"))
    try:
        figures = {"loadavg_before": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count()}
        figures["trackers"] = trackers_cost(steps, rounds, root)
        from runner.tracking import installed

        if installed("pyarrow"):
            figures["tokens"] = token_table(1 if args.tiny else 5, 64 if args.tiny else 1024, 64, root)
        figures["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    figures["target"] = TARGET
    figures["judged"] = not args.tiny
    print(f"tracker cost on a {steps}-step default run, median of {rounds} alternating rounds (target ≤ {TARGET}×)")
    for row in figures["trackers"]:
        ok = "ok" if row["ratio"] <= TARGET else "OVER"
        print(
            f"  {row['tracker']:12s} {row['ratio']:.3f}×  ({row['run_s']:.2f} s against {row['baseline_s']:.2f} s; "
            f"import {row['import_s']:.2f} s in a fresh process)  {ok if figures['judged'] else ''}"
        )
    if "tokens" in figures:
        t = figures["tokens"]
        print(
            f"tokens table, {t['rows']:,} rows (T = {t['seq_len']}, {t['logged_steps']} logged steps): "
            f"CSV {t['csv_s']:.2f} s {t['csv_mib']:.1f} MiB, Parquet {t['parquet_s']:.2f} s {t['parquet_mib']:.1f} MiB"
        )
    print(f"load average {figures['loadavg_before'][0]} → {figures['loadavg_after'][0]}")
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
