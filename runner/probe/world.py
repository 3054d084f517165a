"""The probe's world: θ, the stale engine's θ', the exact ∇J(θ), and batches of rollouts.

θ (the trainer's policy, where the gradient is taken) is the initial policy when
`probe.pretrain_steps` is 0; otherwise the train study's own `Trainer` trains it for that many
steps ON-POLICY (mismatch none, correction none; the configured loss, rollout sizes and `train.*`
optimiser). θ therefore depends on the seed, the task, the rollout sizes and `train.*`, but not on
the mismatch, so worlds that differ only in staleness or precision share θ and ∇J(θ).

Staleness k is realised as k optimizer steps of drift: θ' is θ after k steps of the train study's
optimiser (`train.optimizer`, lr `probe.drift_lr` or `train.lr`, `train.grad_clip`, fresh state)
DESCENDING the exact J. So θ is k exact-gradient ascent steps ahead of the engine's weights, as if
the trainer had made k updates since it last synced the engine: the engine samples from θ' (in its
precision, with its noise, top-p and faults), the trainer recomputes `old` under θ in fp32. k = 0
gives θ' = θ, and with fp32, no noise and no faults roll == old bit for bit.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, replace

import torch

from runner.corrections import Correction
from runner.errors import UserError
from runner.probe.settings import LOSSES, ProbeSettings
from runner.synthetic.engine import Engine, Mismatch
from runner.synthetic.policy import Bigram
from runner.synthetic.task import exact_gradient

# The probe's sampling streams are its own, so pretraining does not shift which tokens it draws.
STREAM_OFFSET = 1 << 32


@dataclass
class Batch:
    prev: torch.Tensor  # [N, T] long
    tokens: torch.Tensor  # [N, T] long
    mask: torch.Tensor  # [N, T] float32
    old: torch.Tensor  # [N, T] float32: log π_θ(y_t), the trainer's recomputation (= lp)
    roll: torch.Tensor  # [N, T] float32: what the engine reported
    adv: torch.Tensor  # [N, T] float32: the sequence's advantage on every token
    outliers: torch.Tensor  # [N, T] bool


@dataclass
class World:
    setup: object  # runner.studies.train.Setup: seed, world, task, mismatch, loss, train, sizes, log
    probe: ProbeSettings
    theta: torch.Tensor  # [S, V] float32: the trainer's θ
    theta_engine: torch.Tensor  # [S, V] float32: θ', k drift steps behind
    objective: float  # exact J(θ)
    grad: torch.Tensor  # [S, V] float64: exact ∇J(θ)
    engine: Engine
    batch_size: int  # rollouts per batch (N)
    group_size: int

    @property
    def policy(self) -> Bigram:
        return self.setup.world

    def generators(self) -> tuple[torch.Generator, torch.Generator]:
        """(token stream, noise-and-fault stream), as the train study splits them."""
        seed = self.setup.seed
        return (torch.Generator().manual_seed(STREAM_OFFSET + 2 * seed),
                torch.Generator().manual_seed(STREAM_OFFSET + 2 * seed + 1))

    def sample(self, gen: torch.Generator, noise_gen: torch.Generator) -> Batch:
        world, G = self.policy, self.group_size
        prompts = world.sample_prompts(self.batch_size // G, gen).repeat_interleave(G, 0)
        ro = self.engine.sample(self.theta_engine, prompts, gen, noise_gen)
        rewards = self.setup.task.reward(ro.tokens, ro.mask)
        adv = advantages(rewards, G, self.probe.baseline)
        old = Bigram.token_log_probs(Bigram.log_prob_table(self.theta), ro.prev, ro.tokens)
        return Batch(prev=ro.prev, tokens=ro.tokens, mask=ro.mask, old=old, roll=ro.roll,
                     adv=adv.to(torch.float32).unsqueeze(-1).expand_as(ro.mask), outliers=ro.outliers)


def advantages(rewards: torch.Tensor, group_size: int, baseline: str) -> torch.Tensor:
    """[N] advantages over groups of `group_size` consecutive responses to one prompt.

    rloo:       R_i − mean of the OTHER G−1 rewards of the group. The baseline does not depend
                on y_i, so E[A_i ∇log π(y_i)] = ∇J exactly: the default, unbiased on-policy.
    group-mean: R_i − mean of all G (GRPO without std): (1 − 1/G) × the RLOO advantage, so the
                estimate's expectation is (1 − 1/G)·∇J on-policy (kept to show that bias).
    none:       R_i (plain REINFORCE, unbiased, higher variance).
    """
    if baseline == "none":
        return rewards.clone()
    groups = rewards.reshape(-1, group_size)
    total = groups.sum(-1, keepdim=True)
    if baseline == "rloo":
        adv = groups - (total - groups) / (group_size - 1)
    else:
        adv = groups - total / group_size
    return adv.reshape(-1)


class _Null:
    """Stands in for the train study's CSV/event writers and progress bar while pretraining."""

    def __init__(self):
        self.counts: collections.Counter[str] = collections.Counter()

    def write(self, *args, **kwargs) -> None:
        pass

    def event(self, *args, **kwargs) -> None:
        pass

    def advance(self, *args, **kwargs) -> None:
        pass

    def close(self) -> None:
        pass


def initial_theta(setup, steps: int) -> torch.Tensor:
    """θ₀ (steps = 0) or θ after `steps` on-policy steps of the train study's Trainer."""
    if steps == 0:
        return setup.world.init_params(torch.Generator().manual_seed(2 * setup.seed)).float()
    from runner.studies.train import Trainer

    pre = replace(setup, mismatch=Mismatch(), correction=Correction(), train=replace(setup.train, steps=steps),
                  metrics=False, timing=False, quiet=True)
    trainer = Trainer(pre, _Null(), _Null())
    trainer.train(_Null())
    theta = trainer.theta.detach().clone()
    if not torch.isfinite(theta).all():
        raise UserError(f"probe.pretrain_steps={steps}: pretraining left non-finite parameters")
    return theta


def drift(theta: torch.Tensor, setup, steps: int, lr: float) -> torch.Tensor:
    """θ after `steps` optimizer steps descending the exact J (see the module docstring), with the
    train study's optimizer and its clipping formula."""
    from runner.studies.train import Optimizer

    th = theta.detach().clone()
    if steps == 0:
        return th
    opt = Optimizer(th, setup.train.optimizer, lr)
    for _ in range(steps):
        _, grad = exact_gradient(setup.task, setup.world, th)
        grad = grad.to(th.dtype)  # minimising J: the optimizer steps against ∇J
        if setup.train.grad_clip is not None:
            grad = grad * (setup.train.grad_clip / (grad.norm() + 1e-6)).clamp(max=1.0)
        th.grad = grad
        opt.step()
    return th.detach()


def validate(cfg) -> tuple[object, ProbeSettings, int]:
    """Every config check, no work: (train Setup, ProbeSettings, rollouts per batch)."""
    from omegaconf import OmegaConf

    from runner.studies.train import load

    setup = load(cfg)
    probe = ProbeSettings.from_config(OmegaConf.to_container(cfg.probe, resolve=True) if "probe" in cfg else None)
    if setup.loss.name not in LOSSES:
        raise UserError(f"probe: loss={setup.loss.name} is not supported (the probe takes the gradient of the "
                        f"per-token surrogate at lp = old: one of {', '.join(LOSSES)})")
    if setup.adv_std_norm:
        raise UserError("probe: rollout.adv_std_norm=true biases the estimate of ∇J; the probe sets its "
                        "advantage with probe.baseline (rloo | group-mean | none)")
    G = setup.group_size
    if probe.baseline != "none" and G < 2:
        raise UserError(f"probe.baseline={probe.baseline} needs rollout.group_size >= 2, got {G}")
    n = probe.batch_size if probe.batch_size is not None else setup.batch_size * G
    if n % G:
        raise UserError(f"probe.batch_size ({n}) must be a multiple of rollout.group_size ({G})")
    probe.arms()  # applies every band to every preset: a bad pair fails here
    return setup, probe, n


def build(setup, probe: ProbeSettings, batch_size: int) -> World:
    theta = initial_theta(setup, probe.pretrain_steps)
    k = setup.mismatch.staleness
    theta_engine = drift(theta, setup, k, probe.drift_lr if probe.drift_lr is not None else setup.train.lr)
    objective, grad = exact_gradient(setup.task, setup.world, theta)
    return World(setup=setup, probe=probe, theta=theta, theta_engine=theta_engine, objective=float(objective),
                 grad=grad, engine=Engine(setup.world, setup.mismatch), batch_size=batch_size,
                 group_size=setup.group_size)
