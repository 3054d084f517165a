"""The bigram's exact objective: J(θ) = E_{prompt, y ~ π_θ}[R(y)] by a forward recursion over the
Markov chain, not by sampling. d_t[s] is the probability that the response is still running at
position t with previous token s, so the joint law of the t-th token is q_t = d_t @ softmax(θ), and

    d_{t+1}[v] = q_t[v]   for every v but EOS (an EOS ends the response; BOS is never re-entered).

Autograd differentiates it, and `runner.worlds.protocol.exact_gradient` gives the exact on-policy
∇J(θ): the ground truth of the train study's `objective` column and of the probe's bias figures.
J is always for the trainer's policy π_θ at temperature 1, whatever the engine samples from.

Two solvers, by the reward's structure:
- an *additive* task (R a sum of per-token rewards, task=target-count) needs only Σ_t d_t, which is
  d_0 · Σ_{k<T} M^k: the top-right block of [[M, I], [0, I]]^T, formed by matrix_power in log₂T
  products inside one call (this runs once a step);
- any other *count task* (R a function of the number of target tokens) carries the count along:
  the recursion over (state, count so far) gives the count's law, and the task turns it into E[R].
"""

from __future__ import annotations

import torch

from runner.tasks.base import CountTask


def solver_for(world, task):
    if getattr(task, "additive", False):
        return AdditiveObjective(world, task)
    if isinstance(task, CountTask):
        return CountLawObjective(world, task)
    return None


class AdditiveObjective:
    def __init__(self, world, task):
        self.world, self.task = world, task
        self._constants: dict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def _constants_in(
        self, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(per-token reward [V], d_0 [S], [[0, I], [0, I]] [2S, 2S]) in dtype, built once: the
        objective runs every step and each torch call costs a few µs at this size."""
        cached = self._constants.get((dtype, device))
        if cached is None:
            S = self.world.num_states
            block = torch.zeros(2 * S, 2 * S, dtype=dtype, device=device)
            block[:, S:] = torch.eye(S, dtype=dtype, device=device).repeat(2, 1)
            cached = self._constants[(dtype, device)] = (
                self.task.token_reward(dtype).to(device),
                self.world.start_distribution(dtype, device),
                block,
            )
        return cached

    def objective(self, params, dtype=torch.float64):
        world = self.world
        theta = params["theta"]
        token_reward, start, identity_columns = self._constants_in(dtype, theta.device)
        probs = torch.softmax(theta, dim=-1, dtype=dtype)  # [S, V]
        move = (
            probs
            if world.eos_token is None
            else probs.index_fill(1, torch.tensor([world.eos_token], device=theta.device), 0.0)
        )
        S, V = world.num_states, world.vocab_size
        block = identity_columns.clone()
        block[:S, :V] = move  # the BOS column stays empty
        power_sum = torch.linalg.matrix_power(block, world.seq_len)[:S, S:]  # Σ_{k<T} M^k
        return torch.linalg.multi_dot([start, power_sum, probs, token_reward])  # d_0 · ΣM^k · P · r


class CountLawObjective:
    def __init__(self, world, task):
        self.world, self.task = world, task

    def objective(self, params, dtype=torch.float64):
        world = self.world
        T, V = world.seq_len, world.vocab_size
        theta = params["theta"]
        device = theta.device
        probs = torch.softmax(theta, dim=-1, dtype=dtype)  # [S, V]
        hit = self.task.is_target.to(device, dtype).unsqueeze(-1)  # [V, 1]
        d = torch.zeros(world.num_states, T + 1, dtype=dtype, device=device)  # (state, count so far)
        d[:, 0] = world.start_distribution(dtype, device)
        ended = torch.zeros(T + 1, dtype=dtype, device=device)  # the count law of responses ended by EOS
        for _ in range(T):
            q = probs.transpose(0, 1) @ d  # [V, T+1]: next token v, count before it
            shifted = torch.cat([q.new_zeros(V, 1), q[:, :-1]], dim=1)  # count + 1
            q = hit * shifted + (1 - hit) * q
            if world.eos_token is not None:
                ended = ended + q[world.eos_token]
                q = q.index_fill(0, torch.tensor([world.eos_token], device=device), 0.0)
            d = torch.cat([q, q.new_zeros(1, T + 1)])
        return self.task.expected(ended + d.sum(0))
