"""Is `is-study replay` fast and small enough for a real run's dump?

    python scripts/bench_replay.py [--tiny] [--tokens 1048576] [--steps 16] [--out bench_replay.json]

A synthetic dump in is-study's NPZ format (--tokens logged tokens over --steps steps, 256 tokens a sequence,
every token masked in; old, roll, mask and advantages float32, roll ≈ old + N(0, 0.3²)) is replayed through
every preset by `is-study replay`'s own code, tokens.csv included, in a fresh process. Two figures:

    time     seconds of the whole replay, reading the file to DONE (target ≤ 30 s for 1M tokens on the
             2-core machine)
    memory   the replay's peak RSS above that of a process that imported the same modules and did nothing,
             over the tokens' bytes in memory (16 bytes a token; target ≤ 3x)

Both come from one run of the replay (with --repeats N, the median of N runs). --tiny (16k tokens) only proves
the script runs: start-up costs dominate there, so its figures carry no target.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SEQ_LEN = 256
BYTES_PER_TOKEN = 16  # old, roll, mask, advantages: four float32
IMPORTS = "import torch, numpy, msgpack; import runner.replay.command, runner.replay.formats, runner.replay.own_npz"


def write_dump(path: Path, tokens: int, steps: int, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    sequences = max(tokens // SEQ_LEN, steps)
    old = rng.normal(-1.5, 0.7, (sequences, SEQ_LEN)).astype(np.float32)
    roll = (old + rng.normal(0, 0.3, old.shape)).astype(np.float32)
    np.savez(
        path,
        old=old,
        roll=roll,
        mask=np.ones_like(old),
        advantages=rng.normal(0, 1, sequences).astype(np.float32),
        step=np.arange(sequences) * steps // sequences,
    )
    return sequences * SEQ_LEN


def _child(code: str) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of `python -c code`, alone in its process."""
    script = (
        "import resource, sys, time\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        f"{IMPORTS}\n"
        "t0 = time.perf_counter()\n"
        f"{code}\n"
        "seconds = time.perf_counter() - t0\n"
        "print(seconds, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)\n"
    )
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO)
    if res.returncode != 0:
        raise SystemExit(res.stderr[-2000:])
    seconds, peak = res.stdout.split()[-2:]
    return float(seconds), float(peak)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="a seconds-long smoke run (16k tokens)")
    ap.add_argument("--tokens", type=int, default=1 << 20)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("bench_replay.json"))
    args = ap.parse_args()
    tokens, steps = (1 << 14, 4) if args.tiny else (args.tokens, args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        dump = Path(tmp) / "dump.npz"
        tokens = write_dump(dump, tokens, steps)
        runs = []
        for i in range(args.repeats):
            out = Path(tmp) / f"out{i}"
            code = (
                "from runner.replay.command import Request, run\n"
                f"run(Request(path=__import__('pathlib').Path({str(dump)!r}), out=__import__('pathlib').Path({str(out)!r})))"
            )
            runs.append(_child(code))
            assert (out / "DONE").is_file()
            rows = sum(1 for _ in open(out / "replay.csv")) - 1
        _, baseline = _child("pass")
    seconds = statistics.median(r[0] for r in runs)
    peak = statistics.median(r[1] for r in runs)
    data_mib = tokens * BYTES_PER_TOKEN / 2**20
    memory = (peak - baseline) / data_mib
    limit_s = 30.0 * tokens / (1 << 20)
    results = [
        {
            "name": f"replay time, {tokens:,} tokens × {rows // steps} presets",
            "value": seconds,
            "target": f"<= {limit_s:.3g} s",
            "pass": seconds <= limit_s,
            "detail": f"{steps} steps, {rows} replay.csv rows, tokens.csv written; {tokens / seconds / 1e6:.2f}M tokens/s",
        },
        {
            "name": "replay peak memory over the tokens' bytes",
            "value": memory,
            "target": "<= 3x",
            "pass": memory <= 3.0,
            "detail": f"peak RSS +{peak - baseline:.1f} MiB over an idle process's {baseline:.0f} MiB, for {data_mib:.1f} MiB of tokens",
        },
    ]
    if args.tiny:  # start-up costs dominate 16k tokens: the targets are for a real dump's size
        for r in results:
            r["target"], r["pass"] = "info", None
    for r in results:
        print(
            f"{r['name']}: {r['value']:.3g} (target {r['target']}, { {True: 'ok', False: 'MISSED', None: 'info'}[r['pass']] }) {r['detail']}"
        )
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
