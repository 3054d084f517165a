"""policy=mlp timings: one exact-J evaluation (value; value and gradient) and sampling one batch, at
T = 128, V = 16 (2 × 64 hidden, count-exact k = 6), dense and with 4 experts; and a default
`is-study run policy=mlp` end to end.

    python scripts/bench_mlp.py [--repeat 5] [--seq-len 128] [--batch 64] [--out bench_mlp.json] [--tiny]

One thread, as the studies run. Each figure is the median of `repeat` timed runs after one warm-up
(the minimum is shown too: on a shared machine the minimum is the closer estimate of the cost).
Targets (issue 13): one exact-J evaluation (value + gradient) ≤ 2 s at T = 128, V = 16; a default run
≤ 60 s; sampling vectorised over the batch (64 sequences cost far less than 64 × one: the only loop is
over positions). --out writes the suite's rows for scripts/bench.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from runner.tasks import make_task  # noqa: E402
from runner.worlds.engine import Engine, Mismatch  # noqa: E402
from runner.worlds.precision import Precision  # noqa: E402
from runner.worlds.protocol import exact_gradient  # noqa: E402
from runner.worlds.registry import make_world  # noqa: E402

TARGET_S = 2.0


def _timed(fn, repeat: int) -> tuple[float, float]:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times)


def _sample(world, params, prompts, precision: Precision, generator: torch.Generator) -> torch.Tensor:
    """The engine's sampling of one batch, in `precision`."""
    return Engine(world, Mismatch(precision=precision.name)).sample(params, prompts, generator).tokens


def _default_run_seconds() -> float:
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "runner", "run", "policy=mlp", f"hydra.run.dir={tmp}/run", "-q"],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--out", default=None, help="also write the suite's rows as JSON")
    parser.add_argument("--tiny", action="store_true", help="a quick smoke run: T = 16, 2 repeats, no default run")
    args = parser.parse_args()
    if args.tiny:
        args.repeat, args.seq_len = 2, 16
    torch.set_num_threads(1)

    rollout = {"vocab_size": 16, "seq_len": args.seq_len, "prompt_len": 1, "eos_token": None}
    task = make_task({"name": "count-exact", "targets": [0], "k": 6}, rollout)
    rows = []
    for experts in (0, 4):
        world = make_world({"name": "mlp", "experts": experts}, rollout, task)
        gen = torch.Generator().manual_seed(0)
        params = world.init_params(gen)
        prompts = world.sample_prompts(args.batch, gen)
        label = "dense" if experts == 0 else f"{experts} experts"
        cases = {
            "exact J (value, float64)": lambda: world.exact.objective(params),
            "exact J (value + gradient, float64)": lambda: exact_gradient(world.exact, params),
            f"sample {args.batch}x{args.seq_len} fp32": lambda: _sample(world, params, prompts, Precision("fp32"), gen),
            f"sample {args.batch}x{args.seq_len} bf16": lambda: _sample(world, params, prompts, Precision("bf16"), gen),
        }
        tokens = _sample(world, params, prompts, Precision("fp32"), gen)

        def token_stats_backward():
            leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
            world.token_stats(leaves, prompts, tokens).logp.sum().backward()

        cases[f"token_stats + backward {args.batch}x{args.seq_len}"] = token_stats_backward
        one = prompts[:1]
        cases[f"sample 1x{args.seq_len} fp32"] = lambda: _sample(world, params, one, Precision("fp32"), gen)
        for name, fn in cases.items():
            median, best = _timed(fn, args.repeat)
            rows.append((label, name, median, best))

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"policy=mlp, V = 16, T = {args.seq_len}, 1 thread, {os.cpu_count()} CPUs, load average {load:.2f}")
    print(f"{'world':<10} {'what':<42} {'median s':>9} {'min s':>8}")
    for label, name, median, best in rows:
        flag = ""
        if name.startswith("exact J"):
            flag = "  ok (<= 2 s)" if median <= TARGET_S else "  OVER the 2 s target"
        print(f"{label:<10} {name:<42} {median:9.3f} {best:8.3f}{flag}")
    if args.out:
        timing = {(label, name): median for label, name, median, _ in rows}
        suite = []
        for label in ("dense", "4 experts"):
            grad_s = timing[(label, "exact J (value + gradient, float64)")]
            suite.append(
                {
                    "name": f"mlp exact J + ∇J, T={args.seq_len}, V=16 ({label})",
                    "value": grad_s,
                    "target": f"<= {TARGET_S:g} s",
                    "pass": grad_s <= TARGET_S,
                    "detail": f"value alone {timing[(label, 'exact J (value, float64)')]:.3f} s",
                }
            )
        batch_s = timing[("dense", f"sample {args.batch}x{args.seq_len} fp32")]
        one_s = timing[("dense", f"sample 1x{args.seq_len} fp32")]
        ratio = batch_s / one_s
        suite.append(
            {
                "name": f"mlp sampling {args.batch} sequences vs 1 (vectorised over the batch)",
                "value": ratio,
                "target": f"<= {args.batch / 4:g}x",
                "pass": ratio <= args.batch / 4,
                "detail": f"{batch_s * 1e3:.1f} ms vs {one_s * 1e3:.1f} ms",
            }
        )
        if not args.tiny:
            run_s = _default_run_seconds()
            suite.append(
                {
                    "name": "default `is-study run policy=mlp` (200 steps, T=64, exact J every 20 steps)",
                    "value": run_s,
                    "target": "<= 60 s",
                    "pass": run_s <= 60,
                    "detail": "wall, torch import included",
                }
            )
        Path(args.out).write_text(json.dumps(suite, indent=1))


if __name__ == "__main__":
    main()
