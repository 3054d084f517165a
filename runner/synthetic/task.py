"""Tasks: a reward on sampled responses AND its exact expectation J(θ) under the bigram policy.

J(θ) = E_{prompt, y ~ π_θ}[R(y)] is computed by a forward recursion over the Markov chain, not by
sampling: d_t[s] is the probability that the response is still running at position t with previous
token s, so the joint law of the t-th token is q_t = d_t @ softmax(θ), and

    d_{t+1}[v] = q_t[v]   for every v but EOS (an EOS ends the response; BOS is never re-entered).

Each step is a [V+1] × [V+1, V] product, autograd differentiates it, and `exact_gradient` gives
the exact on-policy ∇J(θ): the ground truth of the `train` study's `objective` column and of the
probe study's bias figures. J is always for the trainer's policy π_θ at temperature 1, whatever
the engine samples from.

- `task=target-count`: R = (number of response tokens in `task.targets`) / `rollout.seq_len`.
  Additive per token, so J = (1/T) Σ_t Σ_{v ∈ targets} q_t[v]. Without EOS, R is the fraction of
  target tokens; with EOS it is normalised by the maximum length, which keeps it additive.
- `task=target-threshold`: a sequence-level 0/1 reward, R = 1[count ≥ `task.min_count`] (a
  verifier's pass/fail). The recursion tracks (state, count so far): [V+1, T+1] per step.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from runner.errors import UserError
from runner.synthetic.policy import Bigram, as_int, check_keys


class Task:
    name = "task"

    def reward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[N] rewards of sampled responses ([N, T] tokens, [N, T] 0/1 action mask)."""
        raise NotImplementedError

    def objective(self, world: Bigram, theta: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """Exact J(θ) as a 0-d tensor in dtype (float64: a ground truth needs no rounding of its
        own), differentiable in θ."""
        raise NotImplementedError


def _targets(cfg: Mapping[str, Any], world: Bigram) -> tuple[int, ...]:
    targets = cfg.get("targets")
    if not isinstance(targets, (list, tuple)) or not targets:
        raise UserError(f"task.targets must be a non-empty list of token ids, got {targets!r}")
    for tok in targets:
        if isinstance(tok, bool) or not isinstance(tok, int) or not 0 <= tok < world.vocab_size:
            raise UserError(f"task.targets: {tok!r} is not a token id in [0, {world.vocab_size - 1}]")
    return tuple(sorted(set(targets)))


def _chain(world: Bigram, theta: torch.Tensor):
    """Yields q_t = P(running at t, y_t = v) for t = 0..T−1: the forward recursion."""
    probs = torch.softmax(theta, dim=-1)  # [S, V]
    d = world.start_distribution(theta.dtype)
    for _ in range(world.seq_len):
        q = d @ probs  # [V]
        yield q
        alive = q if world.eos_token is None else q.index_fill(0, torch.tensor([world.eos_token]), 0.0)
        d = torch.cat([alive, alive.new_zeros(1)])  # the BOS state is never re-entered


class TargetCount(Task):
    name = "target-count"

    def __init__(self, world: Bigram, targets: tuple[int, ...]):
        self.world = world
        self.targets = targets
        self._is_target = torch.zeros(world.vocab_size, dtype=torch.bool)
        self._is_target[list(targets)] = True
        self._constants: dict[torch.dtype, tuple[Bigram, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {}

    def _constants_in(self, world: Bigram, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(hit / T [V], d_0 [S], [[0, I], [0, I]] [2S, 2S]) in dtype, built once: the objective runs
        every step and each torch call costs a few µs at this size. Keyed by dtype and checked by
        identity: hashing the frozen world costs more than this whole lookup."""
        cached = self._constants.get(dtype)
        if cached is None or cached[0] is not world:
            S = world.num_states
            block = torch.zeros(2 * S, 2 * S, dtype=dtype)
            block[:, S:] = torch.eye(S, dtype=dtype).repeat(2, 1)
            hit_over_T = self._is_target.to(dtype) / world.seq_len
            cached = self._constants[dtype] = (world, (hit_over_T, world.start_distribution(dtype), block))
        return cached[1]

    def reward(self, tokens, mask):
        hits = self._is_target[tokens].to(mask.dtype) * mask
        return hits.sum(-1) / self.world.seq_len

    def objective(self, world, theta, dtype=torch.float64):
        # J = Σ_t d_t · (P·hit) / T with d_{t+1} = d_t·M, M = P with the EOS column zeroed and an
        # empty BOS column, so Σ_t d_t = d_0 · Σ_{k<T} M^k: the top-right block of [[M, I], [0, I]]^T,
        # which matrix_power forms in log₂T products inside one call (this runs once a step, and a
        # loop of 2T small ops was a sixth of a default step's logging cost).
        hit_over_T, start, identity_columns = self._constants_in(world, dtype)
        probs = torch.softmax(theta, dim=-1, dtype=dtype)  # [S, V]
        move = probs if world.eos_token is None else probs.index_fill(1, torch.tensor([world.eos_token]), 0.0)
        S, V = world.num_states, world.vocab_size
        block = identity_columns.clone()
        block[:S, :V] = move  # the BOS column stays empty
        power_sum = torch.linalg.matrix_power(block, world.seq_len)[:S, S:]  # Σ_{k<T} M^k
        return torch.linalg.multi_dot([start, power_sum, probs, hit_over_T])  # d_0 · ΣM^k · P · hit / T


class TargetThreshold(Task):
    name = "target-threshold"

    def __init__(self, world: Bigram, targets: tuple[int, ...], min_count: int):
        self.world = world
        self.targets = targets
        self.min_count = min_count
        self._is_target = torch.zeros(world.vocab_size, dtype=torch.bool)
        self._is_target[list(targets)] = True

    def reward(self, tokens, mask):
        count = (self._is_target[tokens].to(mask.dtype) * mask).sum(-1)
        return (count >= self.min_count).to(mask.dtype)

    def objective(self, world, theta, dtype=torch.float64):
        T, V = world.seq_len, world.vocab_size
        probs = torch.softmax(theta, dim=-1, dtype=dtype)  # [S, V]
        hit = self._is_target.to(dtype).unsqueeze(-1)  # [V, 1]
        d = torch.zeros(world.num_states, T + 1, dtype=dtype)  # (state, count so far)
        d[:, 0] = world.start_distribution(dtype)
        ended = torch.zeros(T + 1, dtype=dtype)  # the count law of responses ended by EOS
        for _ in range(T):
            q = probs.transpose(0, 1) @ d  # [V, T+1]: next token v, count before it
            shifted = torch.cat([q.new_zeros(V, 1), q[:, :-1]], dim=1)  # count + 1
            q = hit * shifted + (1 - hit) * q
            if world.eos_token is not None:
                ended = ended + q[world.eos_token]
                q = q.index_fill(0, torch.tensor([world.eos_token]), 0.0)
            d = torch.cat([q, q.new_zeros(1, T + 1)])
        final = ended + d.sum(0)
        return final[self.min_count:].sum()


TASKS = ("target-count", "target-threshold")


def make_task(cfg: Mapping[str, Any], world: Bigram) -> Task:
    """Build (and validate) the task of a `task:` config section."""
    cfg = dict(cfg)
    name = cfg.get("name")
    if name == "target-count":
        check_keys("task", cfg, ("name", "description", "targets"))
        return TargetCount(world, _targets(cfg, world))
    if name == "target-threshold":
        check_keys("task", cfg, ("name", "description", "targets", "min_count"))
        min_count = as_int("task", cfg, "min_count", low=0)
        if min_count > world.seq_len:
            raise UserError(f"task.min_count ({min_count}) > rollout.seq_len ({world.seq_len}): the reward is always 0")
        return TargetThreshold(world, _targets(cfg, world), min_count)
    raise UserError(f"task.name={name!r} is not one of: {', '.join(TASKS)}")


def exact_gradient(task: Task, world: Bigram, theta: torch.Tensor,
                   dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """(J(θ), ∇J(θ)) exactly, in `dtype` (float64: a ground truth needs no rounding of its own)."""
    with torch.enable_grad():
        th = theta.detach().to(dtype).requires_grad_(True)
        value = task.objective(world, th, dtype)
        (grad,) = torch.autograd.grad(value, th)
    return value.detach(), grad


def grpo_advantages(rewards: torch.Tensor, group_size: int, std_norm: bool = False,
                    eps: float = 1e-6) -> torch.Tensor:
    """[N] GRPO advantages: the reward minus its group's mean (groups are consecutive runs of
    `group_size`), optionally divided by the group's std (+ eps, so a uniform group gives 0)."""
    groups = rewards.reshape(-1, group_size)
    adv = groups - groups.mean(-1, keepdim=True)
    if std_norm:
        std = groups.std(-1, keepdim=True) if group_size > 1 else torch.zeros_like(groups[:, :1])
        adv = adv / (std + eps)
    return adv.reshape(-1)
