"""The probe's reference gradient where a world has no exact objective (the transformer): a large
on-policy batch, never called exact.

    ∇J ≈ g_ref = (1/N) Σ_i A_i Σ_t ∇ log π_θ(y_it)        (RLOO advantages: unbiased on-policy)

over N fp32, synchronous rollouts from π_θ itself, in chunks of one probe batch. The batch is split in
two halves, g₁ and g₂ (each a mean over N/2); g_ref = (g₁ + g₂)/2, and since E‖g₁ − g₂‖² = 4·E‖g_ref − ∇J‖²,

    reference_noise = ‖g₁ − g₂‖ / 2

estimates how far the reference itself is from ∇J. The probe adds it to every bias CI radius and says
"monte-carlo" wherever it would have said "exact". J comes with it (the mean reward of the same
rollouts, and its standard error).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from runner.training.advantages import baseline_advantages
from runner.worlds.engine import Engine, Mismatch
from runner.worlds.protocol import Params

REFERENCE_STREAM = 11 << 40  # far from the training, probe and Monte Carlo objective streams


@dataclass
class Reference:
    objective: float  # mean reward of the reference rollouts
    objective_se: float
    grad: torch.Tensor  # [n_params] float64
    noise: float  # ‖g₁ − g₂‖ / 2: the estimated norm of grad's own error


def reference_gradient(setup, params: Params, rollouts: int, chunk: int, seed_offset: int = 0) -> Reference:
    """g_ref, J and the split-half noise from `rollouts` on-policy rollouts in chunks of `chunk`
    (a multiple of the group size), sampled on the CPU with their own stream."""
    from runner.probe.estimator import score_sums

    world, G = setup.world, setup.group_size
    chunk = max(G, chunk - chunk % G)
    n_chunks = max(2, math.ceil(rollouts / chunk))
    n_chunks += n_chunks % 2  # two equal halves
    engine = Engine(world, Mismatch())
    gen = torch.Generator().manual_seed(REFERENCE_STREAM + 2 * setup.seed + seed_offset)
    halves = [None, None]
    rewards_all = []
    for c in range(n_chunks):
        prompts = world.sample_prompts(chunk // G, gen).repeat_interleave(G, 0)
        ro = engine.sample(params, prompts, gen)
        rewards = setup.task.reward(ro.prompts, ro.tokens, ro.mask).double()
        rewards_all.append(rewards)
        adv = baseline_advantages(rewards, G, "rloo").to(torch.float32)
        weights = (adv.unsqueeze(-1) * ro.mask).unsqueeze(0) / chunk  # [1, B, T]: seq-mean-token-sum
        batch = type("Batch", (), {"prompts": ro.prompts, "tokens": ro.tokens})
        g = score_sums(world, params, batch, weights)[0].double()
        h = c * 2 // n_chunks
        halves[h] = g if halves[h] is None else halves[h] + g
    g1, g2 = (h / (n_chunks // 2) for h in halves)
    rewards = torch.cat(rewards_all)
    return Reference(
        objective=float(rewards.mean()),
        objective_se=float(rewards.std() / math.sqrt(len(rewards))),
        grad=(g1 + g2) / 2,
        noise=float((g1 - g2).norm() / 2),
    )
