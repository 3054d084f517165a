"""The field regime's calibration table: where experiment=WORLD/field-regime sits against the field's
measured mismatch, per precision and size, from runs on a seed and sampling stream no claim uses.

    python scripts/calibrate_regime.py [--world mlp|transformer] [--out-dir DIR] [--sizes default,paper]
                                       [--precisions bf16,fp16,fp8] [--variants dense,...] [--steps N]
    python scripts/calibrate_regime.py --read DIR            # tabulate runs already made

Each cell is one `is-study run experiment=WORLD/field-regime mismatch.precision=P` (staleness 0: the
arithmetic alone) at seed 1000, mismatch.sampling_stream=1; paper size is T = 1024 (scripts/bench_regime.py's
`sized`) and 500 steps (--steps overrides the count, for a world whose step is slow). Read from each run's
summary.json mismatch block (first / last 10% of updates) and metrics.csv (entropy over the same windows).
Nothing is tuned here: it measures the world as its config file fixes it, and prints a Markdown table with
the literature's targets beside.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

from bench_regime import CALIBRATION, sized  # noqa: E402

SIZES = {"default": [], "paper": ["train.steps=500", "train.objective_every=100"]}  # paper: and sized(1024)
# The network: dense, or 4 experts whose routes the bf16 engine recomputes (MoE route flips), and the same with
# routing replay (the engine routes as the trainer did): the causal ablation of the flips. Each expert layer's
# gate starts near 1/E, so two layers shrink the logits E² = 16×: init_std 20 · 16 gives the dense start's
# sharpness back (0.59 nats per sampled token, 7% of them at p < 0.1, at seed 1000).
MOE = ["policy.experts=4", "policy.init_std=320"]
VARIANTS = {
    "dense": [],
    "moe4": MOE,
    "moe4-replay": [*MOE, "mismatch.router_replay=true"],
}
# The transformer's: its KV cache in fp8 as vLLM stores it (the mismatch that grows with the context), and 4
# experts with and without routing replay (its top-1 router's gate scales the chosen expert, so the
# warm start's sharpness is SFT's, not an init choice)
TRANSFORMER_VARIANTS = {
    "dense": [],
    "kv-fp8": ["mismatch.kv_cache=fp8"],
    "moe4": ["policy.experts=4"],
    "moe4-replay": ["policy.experts=4", "mismatch.router_replay=true"],
}
TARGETS = {
    "token_kl_k3": "~6e-4 dense bf16 (Qwen3-8B), ~1.5e-3 MoE",
    "seq_kl_k3": "1–20 nats at paper size",
    "ratio_outside": "ratio > 2 on ~1e-4 (dense) to ~1e-3 (MoE) of tokens",
    "growth": "k3 rises as entropy falls",
    "fp16": "fp16 20–60× below bf16",
}


def run(
    out_dir: Path, size: str, precision: str, variant: str = "dense", world: str = "mlp", steps: int | None = None
) -> Path:
    run_dir = out_dir / f"{size}-{precision}{'' if variant == 'dense' else '-' + variant}"
    if not (run_dir / "DONE").exists():
        variants = TRANSFORMER_VARIANTS if world == "transformer" else VARIANTS
        cmd = [sys.executable, "-m", "runner", "run", f"experiment={world}/field-regime"]
        cmd += [f"mismatch.precision={precision}", *CALIBRATION, *SIZES[size], *variants[variant]]
        if size == "paper":
            cmd += sized(1024, world)
        if steps is not None:
            cmd.append(f"train.steps={steps}")
        # the warm start's share of sampled tokens at p < 0.1 is read from the first step's tokens.csv
        cmd += ["log.tokens_every=1000000", f"hydra.run.dir={run_dir}"]
        subprocess.run(cmd, cwd=REPO, check=True)
    return run_dir


def row(run_dir: Path) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    m = summary["mismatch"]
    metrics = pd.read_csv(run_dir / "metrics.csv").dropna(subset=["loss"])
    tenth = max(1, math.ceil(len(metrics) / 10))
    tokens_file = run_dir / "tokens.csv"
    low_p = float("nan")
    if tokens_file.is_file():
        tokens = pd.read_csv(tokens_file)
        first = tokens[tokens.step == tokens.step.min()]
        low_p = float((first.old.map(math.exp) < 0.1).mean())
    return {
        "run": run_dir.name,
        "T": summary["world"]["seq_len"],
        "token_k3": (m["token_kl_k3"]["first"], m["token_kl_k3"]["last"]),
        "seq_k3": (m["seq_kl_k3"]["first"], m["seq_kl_k3"]["last"]),
        "outside": (m["ratio_outside_0.5_2"]["first"], m["ratio_outside_0.5_2"]["last"]),
        "max_dp": m["max_abs_prob_diff"],
        "entropy": (metrics.entropy.iloc[:tenth].mean(), metrics.entropy.iloc[-tenth:].mean()),
        "J": (summary["initial_objective"], summary["final_objective"]),
        "zero_grad": m["zero_grad_fraction"],
        "low_p": low_p,
    }


def table(rows: list[dict]) -> str:
    def pair(p, fmt="{:.2g}"):
        return f"{fmt.format(p[0])} → {fmt.format(p[1])}"

    lines = [
        "| run | T | per-token k3 | per-sequence k3 (nats) | tokens with ratio outside [0.5, 2] | max \\|Δp\\| "
        "| k3 last / first | entropy first → last | tokens at p < 0.1 (step 0) | J first → last | zero-gradient updates |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        growth = r["token_k3"][1] / r["token_k3"][0] if r["token_k3"][0] else float("nan")
        lines.append(
            f"| {r['run']} | {r['T']} | {pair(r['token_k3'])} | {pair(r['seq_k3'])} | {pair(r['outside'])} "
            f"| {r['max_dp']:.2g} | {growth:.2f}× | {pair(r['entropy'], '{:.2f}')} | {r['low_p']:.1%} "
            f"| {pair(r['J'], '{:.2f}')} "
            f"| {r['zero_grad']:.2f} |"
        )
    by = {r["run"]: r for r in rows}
    for size in SIZES:
        bf16, fp16 = by.get(f"{size}-bf16"), by.get(f"{size}-fp16")
        if bf16 and fp16 and fp16["token_k3"][0] > 0:
            lines.append("")
            lines.append(
                f"{size} size: bf16 / fp16 per-token k3 = {bf16['token_k3'][0] / fp16['token_k3'][0]:.0f}× "
                f"at the start, {bf16['token_k3'][1] / fp16['token_k3'][1]:.0f}× at the end."
            )
    lines.append("")
    lines += [f"- target, {key}: {text}" for key, text in TARGETS.items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", default="mlp", choices=("mlp", "transformer"))
    parser.add_argument("--out-dir", default=None, help="default runs/calibrate-regime[-transformer]")
    parser.add_argument("--steps", type=int, default=None, help="train.steps instead of the size's")
    parser.add_argument("--sizes", default="default,paper")
    parser.add_argument("--precisions", default="bf16,fp16,fp8")
    parser.add_argument("--variants", default="dense", help="comma-separated, of the world's VARIANTS")
    parser.add_argument("--read", default=None, help="tabulate the run dirs under this directory instead")
    args = parser.parse_args()
    if args.read:
        dirs = sorted(p.parent for p in Path(args.read).glob("*/summary.json"))
    else:
        out = Path(args.out_dir or f"runs/calibrate-regime{'-transformer' if args.world == 'transformer' else ''}")
        dirs = [
            run(out, s, p, v, args.world, args.steps)
            for s in args.sizes.split(",")
            for p in args.precisions.split(",")
            for v in args.variants.split(",")
        ]
    print(table([row(d) for d in dirs]))


if __name__ == "__main__":
    main()
