"""The MLP world's exact objective J(θ) = E_{prompt, y ~ π_θ}[R] for any count task, by dynamic
programming over (position, previous token, count); autograd through it gives the exact ∇J
(`runner.worlds.protocol.exact_gradient`).

d_t[s, c] is the probability that the response is still running at position t with previous token
s and c target tokens so far (c ≤ t). The policy in those states is one batched forward pass of the
network over every (s, c) of the position, so position t costs one [S·(t+1), D] forward, and

    q_t[v, c]        = Σ_s d_t[s, c] · π(v | s, c, t)            the next token v, count before it
    d_{t+1}[v, c']   = q_t[v, c'] (v not a target) + q_t[v, c'−1] (v a target)
    ended[c']       += d_{t+1}[EOS, c'];  d_{t+1}[EOS, ·] = 0    an EOS ends the response

(the EOS is a response token, counted if it is a target). After T positions the count's law is
ended + Σ_s d_T[s, ·], and the task turns it into E[R]. d_0 puts all mass on the last prompt token:
BOS when rollout.prompt_len = 1, a uniform token otherwise (the network sees only that token).

Everything runs in the dtype asked for (float64 for a ground truth), the network included: an exact
precision casts nothing, so the parameters' own dtype is the arithmetic. With experts, J is smooth
between routing boundaries and jumps across them; autograd gives the gradient of the smooth piece
θ is in (through the gates), which is also what the score function ∇log π sees.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from runner.tasks.base import CountTask
from runner.worlds.mlp.model import Net
from runner.worlds.precision import FP32
from runner.worlds.protocol import Params


class CountDP:
    def __init__(self, net: Net, task: CountTask, start_prev: torch.Tensor, eos_token: int | None):
        self.net = net
        self.task = task
        self.start_prev = start_prev  # [S0] long: the states of position 0, equally likely
        self.eos_token = eos_token

    def objective(self, params: Params, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        return self.task.expected(self.count_law(params, dtype))

    def count_law(
        self, params: Params, dtype: torch.dtype = torch.float64, visits: list[tuple[torch.Tensor, ...]] | None = None
    ) -> torch.Tensor:
        """[T+1] the law of the response's count of target tokens. `visits`, when given, receives
        (prev, count, position, P(running in that state)) per position, each [S·(t+1)]."""
        net, T, V = self.net, self.net.seq_len, self.net.vocab_size
        params = {name: p.to(dtype) for name, p in params.items()}
        device = next(iter(params.values())).device
        table = net.encoding_table(dtype, device)  # [T+1, 1+2J]
        hit = self.task.is_target.to(device, dtype).unsqueeze(-1)  # [V, 1]
        prev = self.start_prev.to(device)
        d = torch.full((prev.numel(), 1), 1.0 / prev.numel(), dtype=dtype, device=device)  # [S0, 1]
        ended = torch.zeros(T + 1, dtype=dtype, device=device)  # the count law of responses that ended with EOS
        for t in range(T):
            S = prev.numel()
            rows_prev = prev.repeat_interleave(t + 1)  # [S·(t+1)]: s-major, then c
            rows_count = torch.arange(t + 1, device=device).repeat(S)  # [S·(t+1)]
            rows_position = torch.full_like(rows_prev, t)  # [S·(t+1)]
            if visits is not None:
                visits.append((rows_prev, rows_count, rows_position, d.detach().reshape(-1)))
            feats = net.features(rows_prev, rows_count, rows_position, table)  # [S·(t+1), D]
            logits, _ = net.forward(params, feats, FP32, batch_invariant=False)  # [S·(t+1), V]
            probs = torch.softmax(logits, dim=-1).view(S, t + 1, V)
            q = torch.einsum("sc,scv->vc", d, probs)  # [V, t+1]
            d = F.pad(q * (1 - hit), (0, 1)) + F.pad(q * hit, (1, 0))  # [V, t+2]
            if self.eos_token is not None:
                ended = ended + F.pad(d[self.eos_token], (0, T - t - 1))
                d = d.index_fill(0, torch.tensor([self.eos_token], device=device), 0.0)
            prev = torch.arange(V, device=device)
        return ended + d.sum(0)  # [T+1]

    def states(self, params: Params) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every state of the recursion as flat [M] tensors (prev, count, position, occupancy), the
        occupancy being the float64 probability that a response passes through it: for questions
        asked of the whole state space, such as where the engine disagrees with the trainer."""
        visits: list[tuple[torch.Tensor, ...]] = []
        with torch.no_grad():
            self.count_law(params, torch.float64, visits)
        prev, count, position, occupancy = (torch.cat(column) for column in zip(*visits))
        return prev, count, position, occupancy
