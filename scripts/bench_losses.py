"""What does each loss cost next to PPO's, on the same batch and correction?

    python scripts/bench_losses.py [--tiny] [--rounds 5] [--out bench_losses.json]

One forward and backward of policy_loss (metrics on, as the train study runs it) on scripts/bench.py's
synthetic batch (B=64, T=4096; --tiny: 8×256), one thread, correction=none (so the loss is all that differs),
each loss as its conf/loss YAML ships it (its own reduction included). A figure is
the median over rounds of the per-round ratio of a loss's time over PPO's; context figures, no target: a
loss is chosen for its maths, and this says what the choice costs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny sizes: proves the script runs, measures nothing")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="bench_losses.json")
    args = parser.parse_args()

    import torch
    import yaml
    from torch.utils import benchmark

    from runner.core.corrections import Correction
    from runner.core.losses import LOSSES, LossSpec, policy_loss
    from scripts.bench import _synthetic_batch

    torch.set_num_threads(1)
    B, T = (8, 256) if args.tiny else (64, 4096)
    lp0, old, roll, adv, mask = _synthetic_batch(B, T)
    corr = Correction()

    def timed(name: str):
        spec = LossSpec.from_config(yaml.safe_load((REPO / "conf" / "loss" / f"{name}.yaml").read_text()))

        def run():
            lp = lp0.clone().requires_grad_(True)
            policy_loss(spec, corr, lp, old, roll, adv, mask).loss.backward()

        return run

    fns = {name: timed(name) for name in LOSSES}
    min_run_time = 0.02 if args.tiny else 0.3
    times = {name: [] for name in LOSSES}
    for _ in range(1 if args.tiny else args.rounds):
        for name, fn in fns.items():
            timer = benchmark.Timer(stmt="f()", globals={"f": fn})
            times[name].append(timer.blocked_autorange(min_run_time=min_run_time).median)
    rows = []
    for name in LOSSES:
        ratio = statistics.median(a / b for a, b in zip(times[name], times["ppo"]))
        rows.append({"name": f"loss={name} / loss=ppo (B={B}, T={T}, fwd+bwd)", "value": ratio, "target": None})
        print(f"{name:10s} {statistics.median(times[name]) * 1e3:8.2f} ms  {ratio:5.2f}x ppo")
    Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
