"""Measure a world before running any claim in it: the numbers its parameters are fixed from.

    python scripts/calibrate_world.py policy=mlp task=count-exact [OVERRIDES] [--lrs 1e-4,3e-4,1e-3] [--steps 30]

Prints, for the composed config:
  1. at initialisation: J (exact or Monte Carlo), the mean entropy per token, and the engine's mismatch
     against the fp32 trainer per precision (mean kl_k3 per token, max |Δp|) on tokens the engine
     samples, at staleness 0 with no noise: what the arithmetic alone gives;
  2. warm-up grad norms (clipping off, at the config's train.lr) over the first --steps steps:
     percentiles, from which a clip that binds sometimes (about the 90th) is chosen;
  3. for each learning rate in --lrs: the per-update policy KL (policy_kl_k3 after one update: the
     k3 estimate of KL(π_old ‖ π_θ) per token) and J after --steps steps. The field calibrates its
     learning rates to about 1e-3 nats per token per update.
Nothing is tuned here: the script measures, and the world's config file states what was chosen and why.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _setup(overrides):
    from runner.hydra_app.app import compose
    from runner.studies.train import load

    return load(compose(overrides + ["log.quiet=true"]))


def mismatch_at_init(s, n: int = 256) -> dict[str, tuple[float, float]]:
    import torch

    from runner.worlds.engine import Engine

    g = torch.Generator().manual_seed(2 * s.seed)
    params = s.world.init_params(g)
    out = {}
    for precision in ("bf16", "fp16", "fp8"):
        gen = torch.Generator().manual_seed(12345)
        prompts = s.world.sample_prompts(n, gen)
        ro = Engine(
            s.world,
            replace(
                s.mismatch,
                precision=precision,
                staleness=0,
                logit_noise=0.0,
                outlier_rate=0.0,
                temperature=1.0,
                top_p=1.0,
            ),
        ).sample(params, prompts, gen)
        old = s.world.token_stats(params, ro.prompts, ro.tokens, entropy=False).logp
        inside = ro.mask > 0
        lr = (old - ro.roll)[inside].double()
        k3 = (torch.expm1(lr) - lr).mean()
        dp = (old.exp() - ro.roll.exp())[inside].abs().max()
        out[precision] = (float(k3), float(dp))
    return out


def run_steps(s, steps: int):
    """Per-update records of `steps` training steps (the library's Trainer, no files)."""
    from runner.training.loop import Trainer

    trainer = Trainer(s)
    records = [trainer.step(t) for t in range(steps)]
    return trainer, records


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*")
    p.add_argument("--lrs", default="", help="comma-separated learning rates to measure (default: the config's)")
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    s = _setup(args.overrides)
    trainer, _ = run_steps(replace(s, train=replace(s.train, steps=1)), 0)
    stats = s.world.token_stats(trainer.params, *_prompts_and_tokens(s, trainer))
    print(f"world {s.world.name} task {s.task.name}: T={s.world.seq_len} V={s.world.vocab_size}")
    print(
        f"init: J = {trainer.initial_objective:.4f}; mean entropy {float(stats.entropy.mean()):.4f} nats "
        f"(uniform {torch.log(torch.tensor(float(s.world.vocab_size))):.4f})"
    )
    for precision, (k3, dp) in mismatch_at_init(s).items():
        print(f"init mismatch {precision}: kl_k3 {k3:.3g} per token, max |Δp| {dp:.3g}")

    warm = replace(s, train=replace(s.train, grad_clip=None, steps=args.steps))
    _, records = run_steps(warm, args.steps)
    norms = sorted(float(u.grad_norm) for r in records for u in r.updates if float(u.grad_norm) > 0)
    if len(norms) >= 10:
        q = statistics.quantiles(norms, n=10, method="inclusive")
        print(
            f"warm-up grad norms (clip off, {len(norms)} non-zero of "
            f"{sum(len(r.updates) for r in records)} updates): p10 {q[0]:.3g}  p50 {q[4]:.3g}  p90 {q[8]:.3g}  "
            f"max {norms[-1]:.3g}"
        )
    for lr in [float(x) for x in args.lrs.split(",")] if args.lrs else [s.train.lr]:
        run = replace(s, train=replace(s.train, lr=lr, steps=args.steps), metrics=True)
        trainer, records = run_steps(run, args.steps)
        from runner.core.losses import loss_metrics

        kls = [
            loss_metrics(*torch.stack(u.loss_counts).tolist())["policy_kl_k3"]
            for r in records
            for u in r.updates
            if u.update == 1
        ]
        clipped = statistics.mean(float(u.clipped) for r in records for u in r.updates)
        print(
            f"lr {lr:g}: per-update policy KL (k3, after one update) median {statistics.median(kls):.3g} "
            f"mean {statistics.mean(kls):.3g}; clip bound {clipped:.0%} of updates; "
            f"J after {args.steps} steps {trainer.objective():.4f}"
        )
    return 0


def _prompts_and_tokens(s, trainer):
    import torch

    from runner.worlds.engine import Engine, Mismatch

    gen = torch.Generator().manual_seed(99)
    ro = Engine(s.world, Mismatch()).sample(trainer.params, s.world.sample_prompts(256, gen), gen)
    return ro.prompts, ro.tokens


if __name__ == "__main__":
    sys.exit(main())
