"""Calibration facts of `policy=transformer` at its warm start, before any claim is run.

    python scripts/calibrate_transformer.py [OVERRIDE ...]      e.g. task.values=96 policy.sft.steps=2000

Builds the world of `is-study run policy=transformer OVERRIDES` (SFT from the cache, or trained
now), then prints: the warm start's accuracy and entropy profile (sft.measure), and for each engine
precision the per-token mismatch against the fp32 trainer on the engine's own samples (kl_k3,
max|Δp|) with where it sits by the trainer's probability of the sampled token. --json writes it all.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--prompts", type=int, default=512, help="prompts sampled per precision")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    import torch

    from runner.hydra_app import app as hydra_app
    from runner.tasks import make_task
    from runner.worlds.precision import Precision
    from runner.worlds.registry import make_world
    from runner.worlds.transformer import mismatch

    torch.set_num_threads(args.threads)
    cfg = hydra_app.to_container(hydra_app.compose(["policy=transformer", *args.overrides]))
    task = make_task(cfg["task"], cfg["rollout"])
    world = make_world(cfg["policy"], cfg["rollout"], task)
    start = time.perf_counter()
    params = world.init_params(torch.Generator().manual_seed(cfg["seed"]))
    out = {"world": world.summary(), "init_seconds": round(time.perf_counter() - start, 2), "precisions": {}}
    print(json.dumps(out["world"].get("warm_start", {}), indent=1))

    prompts = world.sample_prompts(args.prompts, torch.Generator().manual_seed(args.seed))
    precisions = {"bf16": Precision("bf16"), "fp16": Precision("fp16"), "fp8": Precision("fp8")}
    if world.shape.experts:
        precisions["bf16+router_replay"] = Precision("bf16", router_fp32=True)
    for name, precision in precisions.items():
        tok = mismatch.token_mismatch(world, params, prompts, precision, torch.Generator().manual_seed(args.seed + 1))
        summary, bins = mismatch.summarize(tok), mismatch.by_probability(tok)
        out["precisions"][name] = {"summary": summary, "by_probability": bins}
        print(
            f"\n{name}: kl_k3 {summary['kl_k3']:.3g} ± {summary['kl_k3_se']:.2g}   max|Δp| {summary['max_abs_prob_diff']:.3g}"
            f"   mean|Δp| {summary['mean_abs_prob_diff']:.3g}   tokens {summary['tokens']}"
        )
        print(f"  {'p_old bin':>14} {'share':>7} {'kl_k3':>10} {'mean|Δp|':>10} {'max|Δp|':>10} {'mean|Δlogp|':>12}")
        for row in bins:
            if "kl_k3" not in row:
                continue
            print(
                f"  [{row['p_low']:.2f}, {row['p_high']:.2f}) {row['share']:7.3f} {row['kl_k3']:10.3g} "
                f"{row['mean_abs_dp']:10.3g} {row['max_abs_dp']:10.3g} {row['mean_abs_dlogp']:12.3g}"
            )
    k3 = {k: v["summary"]["kl_k3"] for k, v in out["precisions"].items()}
    print(f"\nkl_k3 ratio bf16/fp16: {k3['bf16'] / k3['fp16']:.1f}   fp8/bf16: {k3['fp8'] / k3['bf16']:.1f}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
