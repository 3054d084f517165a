"""The probe's world: θ, the stale engine's θ', the exact ∇J(θ), and batches of rollouts.

θ (the trainer's policy, where the gradient is taken) is the initial policy when
`probe.pretrain_steps` is 0; otherwise the training library's Trainer trains it for that many
steps ON-POLICY (mismatch none, correction none; the configured loss, rollout sizes and `train.*`
optimiser). θ therefore depends on the seed, the task, the rollout sizes and `train.*`, but not on
the mismatch, so worlds that differ only in staleness or precision share θ and ∇J(θ).

Staleness k is realised as k optimizer steps of drift: θ' is θ after k steps of the configured
optimiser (`train.optimizer`, lr `probe.drift_lr` or `train.lr`, `train.grad_clip`, fresh state)
DESCENDING J (the exact ∇J, or where a world has none a fresh Monte Carlo reference gradient each
step, runner/probe/reference.py). So θ is k ascent steps ahead of the engine's weights, as if
the trainer had made k updates since it last synced the engine: the engine samples from θ' (in its
precision, with its noise, top-p and faults), the trainer recomputes `old` under θ in fp32. k = 0
gives θ' = θ, and with fp32, no noise and no faults roll == old.

Gradients live in the flat parameter space of `runner.worlds.protocol.flat` (one vector per estimate).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from runner.core.corrections import Correction
from runner.errors import UserError
from runner.probe.reference import reference_gradient
from runner.probe.settings import LOSSES, ProbeSettings
from runner.training.advantages import baseline_advantages
from runner.training.config import Setup, load
from runner.training.loop import Trainer
from runner.training.optim import Optimizer, clip_, global_norm
from runner.worlds.engine import Engine, Mismatch
from runner.worlds.protocol import Params, exact_gradient, flat, unflat

# The probe's sampling streams are its own, so pretraining does not shift which tokens it draws.
STREAM_OFFSET = 1 << 32


@dataclass
class Batch:
    prompts: torch.Tensor  # [N, P] long
    tokens: torch.Tensor  # [N, T] long
    mask: torch.Tensor  # [N, T] float32
    old: torch.Tensor  # [N, T] float32: log π_θ(y_t), the trainer's recomputation (= lp)
    roll: torch.Tensor  # [N, T] float32: what the engine reported
    adv: torch.Tensor  # [N, T] float32: the sequence's advantage on every token
    outliers: torch.Tensor  # [N, T] bool


@dataclass
class World:
    setup: Setup
    probe: ProbeSettings
    params: Params  # the trainer's θ (float32)
    engine_params: Params  # θ', k drift steps behind
    objective: float  # J(θ): exact, or the reference rollouts' mean reward
    grad: torch.Tensor  # [P] float64: ∇J(θ), flat: exact, or a Monte Carlo reference (runner/probe/reference.py)
    engine: Engine
    batch_size: int  # rollouts per batch (N)
    group_size: int
    reference: str = "exact"  # exact | monte-carlo
    reference_noise: float = 0.0  # the estimated norm of grad's error (0 when exact)

    @property
    def policy(self):
        return self.setup.world

    def generators(self) -> tuple[torch.Generator, torch.Generator]:
        """(token stream, noise-and-fault stream), as the train study splits them."""
        seed = self.setup.seed
        return (
            torch.Generator().manual_seed(STREAM_OFFSET + 2 * seed),
            torch.Generator().manual_seed(STREAM_OFFSET + 2 * seed + 1),
        )

    def sample(self, gen: torch.Generator, noise_gen: torch.Generator) -> Batch:
        world, G = self.policy, self.group_size
        prompts = world.sample_prompts(self.batch_size // G, gen).repeat_interleave(G, 0)
        ro = self.engine.sample(self.engine_params, prompts, gen, noise_gen)
        rewards = self.setup.task.reward(ro.prompts, ro.tokens, ro.mask)
        adv = baseline_advantages(rewards, G, self.probe.baseline)
        with torch.no_grad():
            old = world.token_stats(self.params, ro.prompts, ro.tokens, entropy=False).logp
        return Batch(
            prompts=ro.prompts,
            tokens=ro.tokens,
            mask=ro.mask,
            old=old,
            roll=ro.roll,
            adv=adv.to(torch.float32).unsqueeze(-1).expand_as(ro.mask),
            outliers=ro.outliers,
        )


def initial_params(setup: Setup, steps: int) -> Params:
    """θ₀ (steps = 0) or θ after `steps` on-policy steps of the training library's Trainer."""
    if steps == 0:
        params = setup.world.init_params(torch.Generator().manual_seed(2 * setup.seed))
        return {name: p.float() for name, p in params.items()}
    pre = replace(
        setup,
        mismatch=Mismatch(),
        correction=Correction(),
        train=replace(setup.train, steps=steps),
        metrics=False,
        timing=False,
        quiet=True,
    )
    trainer = Trainer(pre)
    for step in range(steps):
        if trainer.step(step).stop is not None:
            break
    params = {name: p.detach().clone() for name, p in trainer.params.items()}
    if not all(bool(torch.isfinite(p).all()) for p in params.values()):
        raise UserError(f"probe.pretrain_steps={steps}: pretraining left non-finite parameters")
    return params


def drift(
    params: Params, setup: Setup, steps: int, lr: float, reference_rollouts: int = 4096, chunk: int = 64
) -> Params:
    """θ after `steps` optimizer steps descending J (see the module docstring), with the configured
    optimizer and its clipping formula: the exact ∇J, or a fresh Monte Carlo reference each step."""
    th = {name: p.detach().clone() for name, p in params.items()}
    if steps == 0:
        return th
    opt = Optimizer(th, setup.train.optimizer, lr)
    solver = setup.world.exact
    for step in range(steps):
        grads = (
            exact_gradient(solver, th)[1]
            if solver is not None
            else unflat(reference_gradient(setup, th, reference_rollouts, chunk, seed_offset=1 + step).grad, th)
        )
        for name, p in th.items():  # minimising J: the optimizer steps against ∇J
            p.grad = grads[name].to(p.dtype)
        if setup.train.grad_clip is not None:
            grad_list = [p.grad for p in th.values()]
            clip_(grad_list, setup.train.grad_clip, global_norm(grad_list))
        opt.step()
    return {name: p.detach() for name, p in th.items()}


def validate(cfg: Mapping[str, Any]) -> tuple[Setup, ProbeSettings, int]:
    """Every config check, no work: (Setup, ProbeSettings, rollouts per batch) of a resolved config
    (plain values: runner.studies.plain_config)."""
    setup = replace(load(cfg), device=torch.device("cpu"))  # the probe's statistics run on the CPU
    probe = ProbeSettings.from_config(cfg.get("probe"))
    if setup.loss.name not in LOSSES:
        raise UserError(
            f"probe: loss={setup.loss.name} is not supported (the probe takes the gradient of the "
            f"per-token surrogate at lp = old: one of {', '.join(LOSSES)})"
        )
    if setup.adv_std_norm:
        raise UserError(
            "probe: rollout.adv_std_norm=true biases the estimate of ∇J; the probe sets its "
            "advantage with probe.baseline (rloo | group-mean | none)"
        )
    if setup.mismatch.sampling_stream:
        raise UserError(
            "probe: mismatch.sampling_stream applies to training runs only (the probe draws its "
            "batches from its own streams)"
        )
    G = setup.group_size
    if probe.baseline != "none" and G < 2:
        raise UserError(f"probe.baseline={probe.baseline} needs rollout.group_size >= 2, got {G}")
    n = probe.batch_size if probe.batch_size is not None else setup.batch_size * G
    if n % G:
        raise UserError(f"probe.batch_size ({n}) must be a multiple of rollout.group_size ({G})")
    probe.arms()  # applies every band to every preset: a bad pair fails here
    return setup, probe, n


def build(setup: Setup, probe: ProbeSettings, batch_size: int) -> World:
    params = initial_params(setup, probe.pretrain_steps)
    k = setup.mismatch.staleness
    engine_params = drift(
        params,
        setup,
        k,
        probe.drift_lr if probe.drift_lr is not None else setup.train.lr,
        probe.reference_rollouts,
        batch_size,
    )
    if setup.world.exact is not None:
        objective, grads = exact_gradient(setup.world.exact, params)
        objective, grad, reference, noise = float(objective), flat(grads), "exact", 0.0
    else:
        ref = reference_gradient(setup, params, probe.reference_rollouts, batch_size)
        objective, grad, reference, noise = ref.objective, ref.grad, "monte-carlo", ref.noise
    return World(
        setup=setup,
        probe=probe,
        params=params,
        engine_params=engine_params,
        objective=objective,
        grad=grad,
        engine=Engine(setup.world, setup.mismatch),
        batch_size=batch_size,
        group_size=setup.group_size,
        reference=reference,
        reference_noise=noise,
    )
