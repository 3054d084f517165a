"""The probe's vectorised gradient path against its slow reference, on the same batches.

    python scripts/bench_probe.py            # 12 presets × 5 bands, B=256, T=64, V=32; target ≥ 10×
    python scripts/bench_probe.py --tiny     # a seconds-long smoke run (CI proves it runs)

Fast: `runner.probe.estimator.fast_estimates`, every preset × band from one set of per-token scores
(one batched coefficient evaluation per preset, one scatter). Slow: `reference_estimates`, one
`policy_loss` + backward per preset × band. Both get the same pre-sampled batches and θ; the script
first checks they agree to 1e-5, then times them with torch.utils.benchmark (warm-up, medians of
blocked runs) in alternating rounds, so background load hits both alike, and prints the median of
the per-round ratios. Exit code 1 when the full-size ratio is under the target.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

BANDS = [[0.5, 5.0], [0.8, 1.25], [0.5, 2.0], [None, 3.0], [0.9, 1.1]]
TARGET = 10.0


def build(presets: int, bands: int, batch: int, seq_len: int, vocab: int, n_batches: int):
    import torch
    from omegaconf import OmegaConf

    from runner.hydra_app.app import compose
    from runner.probe.settings import default_preset_names
    from runner.probe.world import build as build_world
    from runner.probe.world import validate
    from runner.registry import faithful_presets, own_presets
    from runner.studies import plain_config

    names = (
        default_preset_names() + [n for n in own_presets() + faithful_presets() if n not in default_preset_names()]
    )[:presets]
    group = 8 if batch % 8 == 0 else 2
    cfg = compose(
        [
            "study=probe",
            "mismatch=outliers",
            "mismatch.outlier_rate=0.002",
            f"rollout.vocab_size={vocab}",
            f"rollout.seq_len={seq_len}",
            f"rollout.batch_size={batch // group}",
            f"rollout.group_size={group}",
            "task.targets=[0,1,2,3]",
            "log.quiet=true",
        ]
    )
    OmegaConf.set_struct(cfg, False)
    cfg.probe.presets = names
    cfg.probe.bands = BANDS[:bands]
    cfg.probe.pretrain_steps = 5
    cfg.probe.repeats = 2
    setup, probe, n = validate(plain_config(cfg))
    world = build_world(setup, probe, n)
    gen, noise_gen = world.generators()
    batches = [world.sample(gen, noise_gen) for _ in range(n_batches)]
    spec = replace(setup.loss, reduction=probe.reduction)
    return world, probe.arms(), batches, spec, torch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a quick smoke run: 3 presets × 2 bands, B=16, T=8, V=8")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the probe's default is 1)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--out", default=None, help="also write [{name, value, target, pass, detail}] as JSON")
    args = parser.parse_args()

    from runner.probe.estimator import fast_estimates, plan, reference_estimates

    if args.tiny:
        size = dict(presets=3, bands=2, batch=16, seq_len=8, vocab=8, n_batches=2)
        rounds, min_run = args.rounds or 1, 0.05
    else:
        size = dict(presets=12, bands=5, batch=256, seq_len=64, vocab=32, n_batches=3)
        rounds, min_run = args.rounds or 3, 0.5
    world, arms, batches, spec, torch = build(**size)
    torch.set_num_threads(args.threads)
    groups = plan(arms)
    T = world.policy.seq_len

    def fast():
        return [
            fast_estimates(groups, len(arms), b, world.policy, world.params, spec.reduction, T, metrics=False).grad
            for b in batches
        ]

    def slow():
        return [reference_estimates(arms, b, world.policy, world.params, spec, T) for b in batches]

    worst, nonfinite = 0.0, 0
    for f, s in zip(fast(), slow()):
        ff, sf = torch.isfinite(f).flatten(1).all(1), torch.isfinite(s).flatten(1).all(1)
        if not torch.equal(ff, sf):
            print("FAIL: the two paths disagree on which estimates are finite", file=sys.stderr)
            return 1
        nonfinite += int((~ff).sum())
        worst = max(worst, float((f[ff] - s[ff]).abs().max()) if ff.any() else 0.0)
    if worst > 1e-5:
        print(f"FAIL: the two paths differ by {worst:.3g} > 1e-5", file=sys.stderr)
        return 1

    from scripts.bench import _median_ratio

    slow_s, fast_s, ratio = _median_ratio(slow, fast, rounds, min_run)
    n = len(batches)
    print(
        f"probe gradient paths: {size['presets']} presets × {size['bands']} bands = {len(arms)} arms, "
        f"B={world.batch_size}, T={T}, V={world.policy.vocab_size}, {n} batches, {args.threads} thread(s)"
    )
    print(
        f"  agreement: max |fast − slow| = {worst:.2e} (tolerance 1e-5); {nonfinite} non-finite estimates, "
        f"flagged alike by both"
    )
    print(f"  slow (policy_loss + backward per arm): {slow_s / n * 1e3:8.2f} ms per batch")
    print(f"  fast (one batched weighting)         : {fast_s / n * 1e3:8.2f} ms per batch")
    print(f"  ratio slow/fast: {ratio:.1f}x (median of {rounds} round(s); target >= {TARGET:g}x)")
    if args.out:
        import json
        from pathlib import Path

        Path(args.out).write_text(
            json.dumps(
                [
                    {
                        "name": f"probe vectorised vs per-preset backward ({len(arms)} arms, B={world.batch_size}, T={T}, "
                        f"V={world.policy.vocab_size})",
                        "value": ratio,
                        "target": f">= {TARGET:g}x",
                        "pass": ratio >= TARGET,
                        "detail": f"slow {slow_s / n * 1e3:.1f} ms vs fast {fast_s / n * 1e3:.2f} "
                        f"ms per batch; max |fast − slow| {worst:.1e}",
                    }
                ],
                indent=1,
            )
        )
    if not args.tiny and ratio < TARGET:
        print(f"FAIL: {ratio:.1f}x < {TARGET:g}x", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
