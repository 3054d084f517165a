"""J(θ) for the objective column: exact where the world has a solver, else by Monte Carlo.

Monte Carlo: the mean reward of `train.objective_samples` fp32, on-policy rollouts (no staleness, no
precision mismatch, no noise: J is the trainer's policy's value), on a fixed set of prompts with
common random numbers: every evaluation reuses the same prompt and sampling streams, so the
difference between two evaluations is the policy's, not the dice's. Its standard error goes into
the `objective_se` column beside it.
"""

from __future__ import annotations

import math

import torch

from runner.worlds.engine import Engine, Mismatch
from runner.worlds.protocol import Params

MC_STREAM = 7 << 40  # far from the training streams (2·seed, 2·seed + 1) and the probe's


class ExactObjective:
    monte_carlo = False

    def __init__(self, solver):
        self.solver = solver

    def __call__(self, params: Params) -> tuple[torch.Tensor, None]:
        with torch.no_grad():
            return self.solver.objective(params, torch.float64), None


class MonteCarloObjective:
    monte_carlo = True

    def __init__(self, world, task, samples: int, seed: int, group: int = 16, device: torch.device | str = "cpu"):
        self.world, self.task, self.samples, self.seed, self.device = world, task, samples, seed, torch.device(device)
        self.engine = Engine(world, Mismatch())  # fp32, synchronous, exact: π_θ itself
        self.group = min(group, samples)

    @torch.no_grad()
    def __call__(self, params: Params) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator(device=self.device).manual_seed(MC_STREAM + self.seed)
        prompts = self.world.sample_prompts(math.ceil(self.samples / self.group), gen)
        prompts = prompts.repeat_interleave(self.group, 0)[: self.samples]
        ro = self.engine.sample(params, prompts, gen)
        rewards = self.task.reward(ro.prompts, ro.tokens, ro.mask).double()
        return rewards.mean(), rewards.std() / math.sqrt(len(rewards))


def make_objective(world, task, samples: int, seed: int, device: torch.device | str = "cpu"):
    solver = world.exact
    return (
        ExactObjective(solver) if solver is not None else MonteCarloObjective(world, task, samples, seed, device=device)
    )
