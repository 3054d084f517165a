#!/usr/bin/env python
# bash: python scripts/bench_sweep.py --out bench_sweep.json
"""How much a sweep costs beyond its jobs' own compute, and what 2 joblib workers buy.

Two figures, on one sweep of `--n` small train runs ('seed=range(0,N)', `--steps` steps each):

1. per-job overhead of the basic launcher = (sweep wall time − Σ the jobs' own compute, i.e. each
   job's summary.json wall_s) / N. Target ≤ 150 ms per job. Everything is counted: Hydra composing
   each job's config (once, in the launcher; the project's sweeper, runner/hydra_app/sweeper.py, checks
   one job per group choice before launching), writing .hydra/, the resume check, the progress thread,
   the aggregation.
   Also in CPU time (this process's CPU seconds outside the study functions, / N), which other
   processes on a shared machine do not inflate.
2. joblib speedup with 2 workers = basic wall / joblib wall on the same sweep. Target ≥ 1.5×.

Each is measured three ways:
  steady   in this process, imports warm (torch, Hydra, the study) and, for joblib, its two worker
           processes already started by a small warm-up sweep: the per-job cost of a long sweep.
  cold     `python -m runner sweep ...` as a user runs it, from a fresh interpreter: adds the fixed
           start-up (Python, torch, Hydra; for joblib also starting 2 workers that import torch)
           spread over N jobs.
  nocache  the same with no bytecode cache at all (PYTHONPYCACHEPREFIX set to an empty dir, and
           PYTHONDONTWRITEBYTECODE=1 so none is written): every process compiles every module it
           imports, as in a fresh venv whose installer did not compile bytecode (uv's default). The
           basic launcher compiles torch once, in its one process; joblib in each worker.
The targets are judged on `steady`; `cold` and `nocache` are printed beside it. The machine's load
average is recorded too: on a shared machine other processes inflate every wall time.

  python scripts/bench_sweep.py                  # 50 jobs of 20 steps; about 2 minutes on 2 cores
  python scripts/bench_sweep.py --tiny           # CI smoke run: 6 jobs of 2 steps, a few seconds
  python scripts/bench_sweep.py --out bench.json # also write the figures as JSON
  python scripts/bench_sweep.py --nocache        # also the cold start without any bytecode cache
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TARGET_OVERHEAD_MS = 150.0
TARGET_SPEEDUP = 1.5


def _overrides(n: int, steps: int, sweep_dir: Path) -> list[str]:
    return [f"seed=range(0,{n})", f"train.steps={steps}", "log.quiet=true", f"hydra.sweep.dir={sweep_dir}"]


def _compute_s(sweep_dir: Path) -> float:
    return sum(json.loads(p.read_text())["wall_s"] for p in sweep_dir.glob("*/summary.json"))


def _figures(wall: float, sweep_dir: Path, n: int) -> dict:
    done = len(list(sweep_dir.glob("*/DONE")))
    if done != n:
        raise SystemExit(f"bench: {sweep_dir} has {done} of {n} jobs done")
    compute = _compute_s(sweep_dir)
    return {
        "wall_s": round(wall, 3),
        "compute_s": round(compute, 3),
        "overhead_ms_per_job": round((wall - compute) / n * 1000, 1),
    }


def steady(n: int, steps: int, workers: int, root: Path) -> dict:
    from runner.studies import train  # noqa: F401 - warm imports: torch, the study
    from runner.sweep import command as sweep

    def timed(name: str, **kw) -> tuple[float, Path]:
        d = root / name
        t0 = time.perf_counter()
        result = sweep.run(sweep.Request(overrides=_overrides(n if name != "warm" else workers, steps, d), **kw))
        wall = time.perf_counter() - t0
        if not result.ok:
            raise SystemExit(f"bench: sweep {name} failed: {d}")
        return wall, d

    sweep.run(sweep.Request(overrides=_overrides(2, 1, root / "warm-basic")))
    # CPU seconds too (basic runs every job in this process): on a shared machine other processes
    # inflate wall times, not this process's CPU time.
    import runner.studies as studies

    real_run_study, in_jobs = studies.run_study, [0.0]

    def counted(cfg, run_dir):
        c0 = time.process_time()
        try:
            return real_run_study(cfg, run_dir)
        finally:
            in_jobs[0] += time.process_time() - c0

    studies.run_study = counted
    try:
        c0 = time.process_time()
        wall_b, d_b = timed("basic")
        cpu_b = time.process_time() - c0
    finally:
        studies.run_study = real_run_study
    timed("warm", launcher="joblib", jobs=workers)  # starts the loky workers (they stay up)
    wall_j, d_j = timed("joblib", launcher="joblib", jobs=workers)
    basic = _figures(wall_b, d_b, n)
    basic["cpu_s"] = round(cpu_b, 3)
    basic["overhead_cpu_ms_per_job"] = round((cpu_b - in_jobs[0]) / n * 1000, 1)
    return {"basic": basic, "joblib": _figures(wall_j, d_j, n), "speedup": round(wall_b / wall_j, 2)}


def cold(n: int, steps: int, workers: int, root: Path, nocache: bool = False) -> dict:
    env = dict(os.environ)
    mode = "nocache" if nocache else "cold"

    def timed(name: str, extra: list[str]) -> tuple[float, Path]:
        d = root / f"{mode}-{name}"
        if nocache:  # a new empty cache per sweep: nothing compiled is found, nothing is written
            cache = root / f"{mode}-{name}-pycache"
            cache.mkdir()
            env.update(PYTHONPYCACHEPREFIX=str(cache), PYTHONDONTWRITEBYTECODE="1")
        cmd = [sys.executable, "-m", "runner", "sweep", *_overrides(n, steps, d), *extra]
        t0 = time.perf_counter()
        res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - t0
        if res.returncode != 0:
            raise SystemExit(f"bench: {' '.join(cmd)} failed:\n{res.stderr}")
        return wall, d

    wall_b, d_b = timed("basic", [])
    wall_j, d_j = timed("joblib", ["--launcher", "joblib", "--jobs", str(workers)])
    return {"basic": _figures(wall_b, d_b, n), "joblib": _figures(wall_j, d_j, n), "speedup": round(wall_b / wall_j, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=50, help="jobs in the sweep (default 50)")
    ap.add_argument("--steps", type=int, default=20, help="train.steps per job (default 20)")
    ap.add_argument("--workers", type=int, default=2, help="joblib workers (default 2)")
    ap.add_argument("--tiny", action="store_true", help="CI smoke run: 6 jobs of 2 steps; targets not judged")
    ap.add_argument("--skip-cold", action="store_true", help="only the in-process (steady) measurement")
    ap.add_argument(
        "--nocache",
        action="store_true",
        help="also the cold start without any bytecode cache (about a minute more on 2 cores)",
    )
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    ap.add_argument("--keep", action="store_true", help="keep the sweep dirs (printed)")
    args = ap.parse_args()
    if args.tiny:
        args.n, args.steps = 6, 2

    root = Path(tempfile.mkdtemp(prefix="bench_sweep_"))
    try:
        # loky (joblib) workers call gc.collect() every second when psutil is absent: worth recording.
        figures = {
            "jobs": args.n,
            "steps": args.steps,
            "workers": args.workers,
            "cpus": os.cpu_count(),
            "psutil": importlib.util.find_spec("psutil") is not None,
            "loadavg_before": [round(x, 2) for x in os.getloadavg()],
            "steady": steady(args.n, args.steps, args.workers, root),
        }
        if not args.skip_cold:
            figures["cold"] = cold(args.n, args.steps, args.workers, root)
        if args.nocache:
            figures["nocache"] = cold(args.n, args.steps, args.workers, root, nocache=True)
        figures["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        if args.keep:
            print(f"sweep dirs kept in {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)

    s = figures["steady"]
    figures["targets"] = {
        "overhead_ms_per_job": TARGET_OVERHEAD_MS,
        "speedup": TARGET_SPEEDUP,
        "judged": not args.tiny,
        "overhead_ok": s["basic"]["overhead_ms_per_job"] <= TARGET_OVERHEAD_MS,
        "speedup_ok": s["speedup"] >= TARGET_SPEEDUP,
    }
    print(
        f"sweep of {args.n} jobs × {args.steps} steps, {args.workers} joblib workers, {os.cpu_count()} CPUs, "
        f"load average {figures['loadavg_before'][0]} → {figures['loadavg_after'][0]}"
    )
    for mode in ("steady", "cold", "nocache"):
        if mode not in figures:
            continue
        f = figures[mode]
        print(
            f"  {mode:7s} basic : wall {f['basic']['wall_s']:7.2f} s, job compute {f['basic']['compute_s']:6.2f} s, "
            f"overhead {f['basic']['overhead_ms_per_job']:6.1f} ms/job   (target ≤ {TARGET_OVERHEAD_MS:g})"
            + (f"; in CPU time {f['basic']['overhead_cpu_ms_per_job']:.1f} ms/job" if "cpu_s" in f["basic"] else "")
        )
        print(
            f"  {mode:7s} joblib: wall {f['joblib']['wall_s']:7.2f} s, speedup {f['speedup']:.2f}×"
            f"{'':22s}(target ≥ {TARGET_SPEEDUP:g}×)"
        )
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
