"""Train-step overhead: one `train` step (sampling, loss, backward, optimizer, the CSV rows with
every metric, tokens.csv) against the same step with logging and metrics off.

    python scripts/bench_train.py [--tiny] [--out bench_train.json]

"Off" means log.metrics=false and no files written (metrics.csv, events.csv, tokens.csv). The exact
objective J(θ_t) is computed on both sides: the study needs it whether or not anything is logged
(collapse detection, best / final objective in summary.json). A second figure, shown for context
with no target, also leaves it out of the "off" side, counting it as logging. All sides run the
same config and seed in alternating rounds; a figure is the median ratio of per-step times.
Target: <= 1.25x.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TARGET = 1.25


SIDES = ("on", "off", "off, no objective")


def _steps(overrides: list[str], side: str, run_dir: Path):
    """A function running one training step of this side: "on" is the train study's loop (the library's
    step, then the rows, events and tokens written by the study's Writer); "off" the library's step alone
    with log.metrics=false."""
    import torch

    from runner.hydra_app import app as hydra_app
    from runner.studies import train
    from runner.training.loop import Trainer

    setup = train.load(hydra_app.compose(overrides + [f"log.metrics={str(side == 'on').lower()}"]))
    trainer = Trainer(setup)
    if side == "on":
        writer = train.Writer(setup, run_dir)
        return lambda step: writer.write(trainer.step(step))
    if side == "off, no objective":
        zero = torch.zeros((), dtype=torch.float64)
        trainer.objective_fn = lambda params: (zero, None)
    return trainer.step


def _time_steps(overrides: list[str], side: str, steps: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        step = _steps(overrides + [f"train.steps={steps}"], side, Path(tmp))
        start = time.perf_counter()
        for t in range(steps):
            step(t)
        return (time.perf_counter() - start) / steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--out", default="bench_train.json")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)  # as the train study runs
    worlds = {
        "default world: 8×8 sequences of 16 tokens": ["correction=seq-mask-tis"],
        # the same step on a bigger batch: the overhead is a fixed number of small torch calls
        "larger world: 32×8 sequences of 64 tokens, V=64": [
            "correction=seq-mask-tis",
            "rollout.batch_size=32",
            "rollout.seq_len=64",
            "rollout.vocab_size=64",
        ],
    }
    steps, rounds = (5, 2) if args.tiny else (40, 7)
    result = []
    for label, overrides in worlds.items():
        _time_steps(overrides, "on", 3)  # warm-up: imports, first allocations
        times: dict[str, list[float]] = {side: [] for side in SIDES}
        for _ in range(rounds):
            for side in SIDES:
                times[side].append(_time_steps(overrides, side, steps))
        for off_side in SIDES[1:] if label.startswith("default") else SIDES[1:2]:
            ratio = statistics.median(a / b for a, b in zip(times["on"], times[off_side]))
            ms = {side: statistics.median(t) * 1e3 for side, t in times.items()}
            detail = f"{ms['on']:.2f} ms vs {ms[off_side]:.2f} ms per step"
            if off_side == "off":
                row = {
                    "name": f"train step, logging+metrics on vs off ({label})",
                    "value": ratio,
                    "target": f"<= {TARGET}x",
                    "pass": ratio <= TARGET,
                    "detail": detail,
                }
            else:  # stricter than the target's definition: shown, not judged
                row = {
                    "name": f"train step, as above but the exact objective counted as logging ({label})",
                    "value": ratio,
                    "target": "info",
                    "pass": None,
                    "detail": f"{detail}; the objective costs {ms['off'] - ms[off_side]:.2f} ms a step",
                }
            result.append(row)
            print(f"{row['name']}: {ratio:.3f}x (target {row['target']}) - {row['detail']}")
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
