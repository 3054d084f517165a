"""policy=mlp timings: one exact-J evaluation (value; value and gradient) and sampling one batch, at
the default shape (V = 16, T = 128, 2 × 64 hidden, count-exact k = 6), dense and with 4 experts.

    python scripts/bench_mlp.py [--repeat 5] [--seq-len 128] [--batch 64]

One thread, as the studies run. Each figure is the median of `repeat` timed runs after one warm-up
(the minimum is shown too: on a shared machine the minimum is the closer estimate of the cost).
Target (issue 13): one exact-J evaluation ≤ 2 s at T = 128, V = 16.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from runner.tasks import make_task  # noqa: E402
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
    """What the engine does per batch: the sampler, a log-softmax in the compute dtype, a draw."""
    sampler = world.sampler(params, prompts, precision)
    logits, tokens = sampler.start(), []
    for t in range(world.seq_len):
        probs = torch.log_softmax(logits, dim=-1).float().exp()  # [N, V]
        tokens.append(torch.multinomial(probs, 1, generator=generator).squeeze(-1))
        if t < world.seq_len - 1:
            logits = sampler.step(tokens[-1])
    return torch.stack(tokens, 1)  # [N, T]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
