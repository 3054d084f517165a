"""Train-step overhead: one `train` step (sampling, loss, backward, optimizer, the CSV row with every
metric and the exact objective) against the same step with logging and metrics off.

    python scripts/bench_train.py [--tiny] [--out bench_train.json]

Both sides run the same config and seed in alternating rounds; the figure is the median ratio of
per-step times. Target: <= 1.25x.
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


class _NullWriter:
    """Stands in for CsvWriter/EventWriter when logging is off."""

    counts: dict = {}

    def write(self, row) -> None:
        pass

    def write_rows(self, rows) -> None:
        pass

    def event(self, *args) -> None:
        pass

    def close(self) -> None:
        pass


class _NoProgress:
    def advance(self, info: str) -> None:
        pass


def _trainer(overrides: list[str], logging: bool, run_dir: Path):
    import torch

    from runner import hydra_app
    from runner.records import CsvWriter, EventWriter
    from runner.studies import train

    cfg = hydra_app.compose(overrides + [f"log.metrics={str(logging).lower()}"])
    setup = train.load(cfg)
    if logging:
        metrics = CsvWriter(run_dir / "metrics.csv", train._columns(setup))
        events = EventWriter(run_dir / "events.csv")
        tokens = CsvWriter(run_dir / "tokens.csv", train.TOKEN_COLUMNS) if setup.tokens_every else None
        trainer = train.Trainer(setup, metrics, events, tokens)
    else:
        trainer = train.Trainer(setup, _NullWriter(), _NullWriter(), None)
        zero = torch.zeros((), dtype=torch.float64)
        trainer.objective_tensor = lambda: zero  # the exact J is logging too
        trainer.objective = lambda: 0.0
    return trainer


def _time_steps(overrides: list[str], logging: bool, steps: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        trainer = _trainer(overrides + [f"train.steps={steps}"], logging, Path(tmp))
        start = time.perf_counter()
        trainer.train(_NoProgress())
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
            "correction=seq-mask-tis", "rollout.batch_size=32", "rollout.seq_len=64", "rollout.vocab_size=64"],
    }
    steps, rounds = (5, 2) if args.tiny else (40, 5)
    result = []
    for label, overrides in worlds.items():
        _time_steps(overrides, True, 3)  # warm-up: imports, first allocations
        on, off, ratios = [], [], []
        for _ in range(rounds):
            a = _time_steps(overrides, True, steps)
            b = _time_steps(overrides, False, steps)
            on.append(a)
            off.append(b)
            ratios.append(a / b)
        ratio = statistics.median(ratios)
        result.append({"name": f"train step, logging+metrics on vs off ({label})", "value": ratio,
                       "target": f"<= {TARGET}x", "pass": ratio <= TARGET,
                       "detail": f"{statistics.median(on) * 1e3:.2f} ms vs {statistics.median(off) * 1e3:.2f} ms per step"})
        print(f"{result[-1]['name']}: {ratio:.3f}x (target <= {TARGET}x) - {result[-1]['detail']}")
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
