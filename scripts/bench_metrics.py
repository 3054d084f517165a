"""Do the metrics' second backend and the fused PPO pay for themselves at the sizes users run?

    python scripts/bench_metrics.py [--tiny] [--rounds 12] [--steps 20] [--worlds bigram,mlp,transformer]
                                    [--out bench_metrics.json]

One training step of each world's default run (bigram, mlp, transformer; correction=tis, loss=ppo), one
thread, as the train study runs. Four sides, the same config and seed, timed in alternating rounds:

    today          the shipped code: NumPy totals for the correction metrics at these sizes, the fused PPO
    torch metrics  the metrics' torch totals only (runner.core.metrics.NUMPY_MAX_ELEMENTS = -1)
    readable PPO   PPO's plain autograd formula only (runner.core.losses.FUSED_PPO = False)
    metrics off    log.metrics=false: what computing every metric costs a step in all

A figure is the median over rounds of the per-round ratio of per-step times (a side over `today`); the order
of the sides rotates from round to round. Beside
them, per call: the metrics of one step's batch (NumPy vs torch totals) and one mini-batch's PPO loss forward
and backward (fused vs readable), on the tensors a default step hands them, alternating, median of repeats. The
transformer starts from random θ₀ (policy.sft.steps=0): the warm start changes no tensor's size; and its
Monte Carlo J (512 rollouts a step) is left out, as it would swamp every other cost. Context
figures, no target: the decision they inform is written in runner/core/metrics.py and runner/core/losses.py.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

WORLDS = {
    "bigram": ["policy=bigram", "correction=tis"],
    "mlp": ["policy=mlp", "correction=tis"],
    # J is a Monte Carlo estimate of 512 rollouts here, taken every step by default: left out (step 0 only)
    "transformer": ["policy=transformer", "correction=tis", "policy.sft.steps=0", "train.objective_every=1000000"],
}
SIDES = ("today", "torch metrics", "readable PPO", "metrics off")


def _trainer(overrides: list[str], side: str):
    from runner.hydra_app import app as hydra_app
    from runner.studies import train
    from runner.training.loop import Trainer

    setup = train.load(hydra_app.compose(overrides + [f"log.metrics={str(side != 'metrics off').lower()}"]))
    return Trainer(setup)


def _seconds_per_step(overrides: list[str], side: str, steps: int) -> float:
    from runner.core import losses, metrics

    numpy_max, fused = metrics.NUMPY_MAX_ELEMENTS, losses.FUSED_PPO
    metrics.NUMPY_MAX_ELEMENTS = -1 if side == "torch metrics" else numpy_max
    losses.FUSED_PPO = side != "readable PPO"
    try:
        trainer = _trainer(overrides, side)
        trainer.step(0)  # first-call allocations stay out of the figure
        start = time.perf_counter()
        for t in range(1, steps + 1):
            trainer.step(t)
        return (time.perf_counter() - start) / steps
    finally:
        metrics.NUMPY_MAX_ELEMENTS, losses.FUSED_PPO = numpy_max, fused


def _batch_shape(overrides: list[str]) -> str:
    from runner.hydra_app import app as hydra_app

    cfg = hydra_app.compose(overrides)
    r = cfg.rollout
    updates = cfg.train.updates_per_step
    return f"{r.batch_size}×{r.group_size} sequences of {r.seq_len} tokens, {updates} updates a step"


def _step_inputs(overrides: list[str]):
    """What one default step hands the metrics (apply_correction_split's intermediates, the step's groups) and
    its first update's policy_loss (its arguments, lp detached from the world's graph)."""
    from runner.core import corrections
    from runner.training import loop

    captured = {}
    metrics_of_groups, policy_loss = corrections.correction_metrics_by_group, loop.policy_loss

    def keep_metrics_inputs(*args, **kwargs):
        captured.setdefault("metrics", (args, kwargs))
        return metrics_of_groups(*args, **kwargs)

    def keep_loss_inputs(*args, **kwargs):
        captured.setdefault("loss", (args, kwargs))
        return policy_loss(*args, **kwargs)

    corrections.correction_metrics_by_group, loop.policy_loss = keep_metrics_inputs, keep_loss_inputs
    try:
        _trainer(overrides, "today").step(0)
    finally:
        corrections.correction_metrics_by_group, loop.policy_loss = metrics_of_groups, policy_loss
    return captured["metrics"], captured["loss"]


def _per_call(overrides: list[str], repeats: int, calls: int) -> dict[str, float]:
    """Seconds a call, median of `repeats` alternating repeats of `calls` calls."""
    from runner.core import losses, metrics

    (m_args, m_kwargs), (l_args, l_kwargs) = _step_inputs(overrides)
    spec, corr, lp, *rest = l_args

    def metrics_call(backend):
        return lambda: metrics.correction_metrics_by_group(*m_args, **{**m_kwargs, "backend": backend})

    def loss_call(fused):
        def run():
            losses.FUSED_PPO = fused
            try:
                x = lp.detach().clone().requires_grad_(True)
                losses.policy_loss(spec, corr, x, *rest, **l_kwargs).loss.backward()
            finally:
                losses.FUSED_PPO = True

        return run

    sides = {
        "metrics numpy": metrics_call("numpy"),
        "metrics torch": metrics_call("torch"),
        "PPO fused": loss_call(True),
        "PPO readable": loss_call(False),
    }
    times: dict[str, list[float]] = {name: [] for name in sides}
    for fn in sides.values():
        fn()
    for r in range(repeats):
        for name in list(sides)[r % len(sides) :] + list(sides)[: r % len(sides)]:
            fn = sides[name]
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - start) / calls)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="a few steps: proves the script runs, measures nothing")
    parser.add_argument("--out", default="bench_metrics.json")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of the train-step figures (default 12)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps a side a round")
    parser.add_argument("--worlds", default=",".join(WORLDS), help=f"comma-separated subset of: {', '.join(WORLDS)}")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    steps, rounds = (2, 1) if args.tiny else (args.steps, args.rounds or 12)
    worlds = {"bigram": WORLDS["bigram"]} if args.tiny else {w: WORLDS[w] for w in args.worlds.split(",")}
    result = []
    for world, overrides in worlds.items():
        times: dict[str, list[float]] = {side: [] for side in SIDES}
        for r in range(rounds):
            for side in SIDES[r % len(SIDES) :] + SIDES[: r % len(SIDES)]:  # each side in each place of the order
                gc.collect()
                times[side].append(_seconds_per_step(overrides, side, steps))
        ms = {side: statistics.median(t) * 1e3 for side, t in times.items()}
        shape = _batch_shape(overrides)
        for side in SIDES[1:]:
            ratio = statistics.median(a / b for a, b in zip(times[side], times["today"]))
            row = {
                "name": f"train step, {side} vs today ({world}: {shape})",
                "value": ratio,
                "target": "info",
                "pass": None,
                "detail": f"{ms[side]:.2f} ms vs {ms['today']:.2f} ms per step, median of {rounds} "
                f"rounds of {steps} steps",
            }
            result.append(row)
            print(f"{row['name']}: {ratio:.3f}x - {row['detail']}", flush=True)
        per_call = _per_call(overrides, *((3, 5) if args.tiny else (15, 50)))
        for second, first in (("metrics torch", "metrics numpy"), ("PPO readable", "PPO fused")):
            ratio = per_call[second] / per_call[first]
            row = {
                "name": f"per call, {second} vs {first.split()[-1]} ({world})",
                "value": ratio,
                "target": "info",
                "pass": None,
                "detail": f"{per_call[second] * 1e6:.0f} µs vs {per_call[first] * 1e6:.0f} µs; "
                + ("one call a step" if second.startswith("metrics") else "one call an update"),
            }
            result.append(row)
            print(f"{row['name']}: {ratio:.3f}x - {row['detail']}", flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
