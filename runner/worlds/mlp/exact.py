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
    def __init__(
        self, net: Net, task: CountTask, start_prev: torch.Tensor, eos_token: int | None, prompt: int | None = None
    ):
        self.net = net
        self.task = task
        self.start_prev = start_prev  # [S0] long: the states of position 0, equally likely
        self.eos_token = eos_token
        self.prompt = prompt  # the prompt's last token, for a net that sees it (PromptsDP gives it)

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
            rows_prompt = torch.full_like(rows_prev, self.prompt) if self.prompt is not None else rows_prev
            feats = net.features(rows_prev, rows_count, rows_position, table, rows_prompt)  # [S·(t+1), D]
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


class PromptsDP:
    """CountDP once per prompt token: for a task whose reward depends on the prompt (task=count-asked,
    E[R | prompt] averaged by the task) or a net that sees the prompt at every position (the prompts'
    count laws averaged, the prompts equally likely)."""

    def __init__(self, net: Net, task: CountTask, prompts: torch.Tensor, eos_token: int | None):
        self.task = task
        self.per_prompt = hasattr(task, "prompt_tokens")
        self.solvers = [CountDP(net, task, x.view(1), eos_token, int(x)) for x in prompts]

    def objective(self, params: Params, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        laws = torch.stack([s.count_law(params, dtype) for s in self.solvers])
        return self.task.expected(laws if self.per_prompt else laws.mean(0))


class PositionDP:
    """J(θ) when the policy does not see the count (`policy.state` without `count`).

    The policy then depends on the count not at all, so it is evaluated once per state it does see,
    (prompt, previous token, position) or any part of it, in batches of CHUNK positions, instead of once
    per (prev, count, t); the count is carried by the recursion alone. With d_t[x, c, s] the probability
    that a response to prompt x is still running at position t with previous token s (one state when
    the net does not see it) and c target tokens so far,

        q_t[x, c, v]      = Σ_s d_t[x, c, s] · π(v | x, s, t)        one [C, S] @ [S, V] product per prompt
        d_{t+1}[x, c', v] = q_t[x, c', v] (v not a target) + q_t[x, c'−1, v] (v a target)

    summed over v when the net does not see the previous token, and EOS ends a response as in CountDP.
    A task with a `count_cap` (count-asked: max k + tolerance + 1) keeps counts only up to the cap,
    whose bin absorbs every larger count: C = cap + 1 bins instead of T + 1. The rows x are the prompts'
    last tokens: a task's own prompts (`prompt_tokens`: one law per prompt, for its `expected`), or
    `start_prev`, equally likely, mixed into one law (kept apart only when the net sees the prompt).
    """

    CHUNK = 64  # positions per forward pass

    def __init__(self, net: Net, task: CountTask, start_prev: torch.Tensor, eos_token: int | None):
        self.net, self.task, self.eos_token = net, task, eos_token
        self.per_prompt = hasattr(task, "prompt_tokens")
        self.prompts = task.prompt_tokens() if self.per_prompt else start_prev  # [X] last prompt tokens
        self.sees_prompt = "prompt" in net.sees
        self.sees_previous = "previous" in net.sees
        cap = getattr(task, "count_cap", None)
        self.bins = min(cap, net.seq_len) + 1 if cap is not None else net.seq_len + 1

    def objective(self, params: Params, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        law = self.count_law(params, dtype)
        return self.task.expected(law if self.per_prompt else law.mean(0))

    def _start(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """[X, C, S]: all mass at count 0 on the prompt's last token (or on the one state)."""
        states = self.net.vocab_size + 1 if self.sees_previous else 1
        apart = self.per_prompt or self.sees_prompt
        rows = self.prompts.numel() if apart else 1
        d = torch.zeros(rows, self.bins, states, dtype=dtype, device=device)
        column = self.prompts.to(device) if self.sees_previous else torch.zeros_like(self.prompts)
        if apart:
            d[torch.arange(rows), 0, column.to(device)] = 1.0
        else:
            d[0, 0].index_add_(0, column.to(device), torch.full((column.numel(),), 1.0 / column.numel(), dtype=dtype))
        return d

    def _policy(self, params: Params, table: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """[P, X or 1, S, V] π(v | x, s, t) at the given positions, one forward pass."""
        net, V = self.net, self.net.vocab_size
        device = positions.device
        prompts = self.prompts.to(device) if self.sees_prompt else torch.zeros(1, dtype=torch.long, device=device)
        previous = (
            torch.arange(V + 1, device=device)
            if self.sees_previous
            else torch.zeros(1, dtype=torch.long, device=device)
        )
        P, X, S = positions.numel(), prompts.numel(), previous.numel()
        grid_position = positions.view(P, 1, 1).expand(P, X, S).reshape(-1)
        grid_prompt = prompts.view(1, X, 1).expand(P, X, S).reshape(-1)
        grid_previous = previous.view(1, 1, S).expand(P, X, S).reshape(-1)
        feats = net.features(grid_previous, torch.zeros_like(grid_previous), grid_position, table, grid_prompt)
        logits, _ = net.forward(params, feats, FP32, batch_invariant=False)
        return torch.softmax(logits, dim=-1).view(P, X, S, V)

    def count_law(self, params: Params, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """[X, C] the law of the count per row (one row when the start is mixed); the last bin absorbs."""
        net, T, C = self.net, self.net.seq_len, self.bins
        params = {name: p.to(dtype) for name, p in params.items()}
        device = next(iter(params.values())).device
        table = net.encoding_table(dtype, device)
        hit = self.task.is_target.to(device, dtype)  # [V]
        d = self._start(dtype, device)  # [X, C, S]
        X = d.shape[0]
        ended = torch.zeros(X, C, dtype=dtype, device=device)
        for first in range(0, T, self.CHUNK):
            positions = torch.arange(first, min(T, first + self.CHUNK), device=device)
            policies = self._policy(params, table, positions)  # [P, X or 1, S, V]
            if not self.sees_previous:  # one state per prompt: only the targets' share and EOS's matter
                d, ended = self._classes(d, ended, policies, hit)
                continue
            for policy in policies:  # [X or 1, S, V] at one position
                q = d @ policy  # [X, C, V]: a batched product when the policy depends on the prompt
                moved = q * hit
                nxt = q - moved + _count_up(moved)  # [X, C, V]
                if self.eos_token is not None:
                    ended = ended + nxt[:, :, self.eos_token]
                    nxt = nxt.index_fill(2, torch.tensor([self.eos_token], device=device), 0.0)
                d = F.pad(nxt, (0, 1))  # [X, C, V+1]: no response returns to BOS
        return ended + d.sum(2)  # [X, C]

    def _classes(self, d, ended, policies, hit):
        """The recursion for a net that sees neither its previous token nor its count (S = 1): a
        position moves the count by the mass on targets, and EOS (a target or not) ends the response."""
        eos = self.eos_token
        p_eos = policies[..., 0, eos] if eos is not None else torch.zeros_like(policies[..., 0, 0])  # [P, X|1]
        p_hit = (policies[..., 0, :] * hit).sum(-1)  # [P, X|1]: EOS included when it is a target
        eos_hits = bool(eos is not None and hit[eos] > 0)
        up = p_hit - (p_eos if eos_hits else 0)  # moves the count up, the response goes on
        stay = 1 - p_hit - (0 if eos_hits else p_eos)  # the count stays, the response goes on
        row = d[:, :, 0]  # [X, C]
        for t in range(policies.shape[0]):
            a, b, e = stay[t].unsqueeze(-1), up[t].unsqueeze(-1), p_eos[t].unsqueeze(-1)  # [X|1, 1]
            shifted = _count_up(row)
            ended = ended + e * (shifted if eos_hits else row)
            row = a * row + b * shifted
        return row.unsqueeze(-1), ended


def _count_up(mass: torch.Tensor) -> torch.Tensor:
    """[X, C, ...] mass on counts → the same mass one count higher (a target was emitted); the last bin
    absorbs, keeping what was already there and what reaches it."""
    up = torch.cat([torch.zeros_like(mass[:, :1]), mass[:, :-1]], 1)
    return torch.cat([up[:, :-1], up[:, -1:] + mass[:, -1:]], 1)
