"""`policy=bigram`: a tabular autoregressive policy over `rollout.vocab_size` tokens, the exact
unit-test world.

The next token's logits depend only on the previous token, so the whole policy is ONE parameter
tensor θ of shape [V+1, V]: row s holds the logits after token s, and row V (= BOS) the logits
after the start token. That keeps the exact maths (exact.py) a small Markov-chain recursion and
the probe's score a closed form (`score_sums`).

A prompt is BOS followed by `rollout.prompt_len − 1` uniform tokens; only its last token matters
to a bigram. A response has `rollout.seq_len` tokens; with `rollout.eos_token` set it ends right
after the first EOS (the EOS itself is an action, as in an LLM) and the rest is padding, mask 0.

Precision: θ *is* the logit table, so the engine rounds the table once (`Precision.cast`, fp8
unscaled) and takes its log-softmax in the compute dtype. With nothing to multiply, bf16 changes a
logit by at most half a unit in the 8th bit: this world's mismatch is small and static by design.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from runner.config_checks import as_float, as_int, check_keys
from runner.errors import UserError
from runner.worlds.precision import FP32, Precision
from runner.worlds.protocol import Params, TokenStats, World

POLICY_KEYS = ("name", "description", "init_std")


@dataclass
class BigramWorld(World):
    vocab_size: int = 16
    seq_len: int = 16
    prompt_len: int = 1
    eos_token: int | None = None
    init_std: float = 0.0  # θ₀ ~ N(0, init_std²); 0 gives the uniform policy
    task: Any = None
    name = "bigram"

    @classmethod
    def from_config(cls, policy: Mapping[str, Any], rollout: Mapping[str, Any], task: Any) -> BigramWorld:
        """Reads the world's shape from `rollout.*` and the initialisation from `policy.*`."""
        policy = dict(policy or {})
        check_keys("policy", policy, POLICY_KEYS)
        vocab = as_int("rollout", rollout, "vocab_size", low=2)
        eos = rollout.get("eos_token")
        if eos is not None:
            eos = as_int("rollout", rollout, "eos_token", low=0)
            if eos >= vocab:
                raise UserError(f"rollout.eos_token must be a token id in [0, {vocab - 1}] or null, got {eos}")
        return cls(
            vocab_size=vocab,
            seq_len=as_int("rollout", rollout, "seq_len", low=1),
            prompt_len=as_int("rollout", rollout, "prompt_len", low=1, default=1),
            eos_token=eos,
            init_std=as_float("policy", policy, "init_std", low=0.0, default=0.0),
            task=task,
        )

    @property
    def bos(self) -> int:
        return self.vocab_size

    @property
    def num_states(self) -> int:
        return self.vocab_size + 1

    @cached_property
    def exact(self):
        from runner.worlds.bigram.exact import solver_for

        return solver_for(self, self.task)

    def init_params(self, generator: torch.Generator) -> Params:
        device = generator.device
        theta = torch.zeros(self.num_states, self.vocab_size, device=device)
        if self.init_std > 0:
            theta = self.init_std * torch.randn(self.num_states, self.vocab_size, generator=generator, device=device)
        return {"theta": theta}

    def sample_prompts(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """[n, prompt_len] long: BOS, then uniform tokens."""
        device = generator.device
        prompts = torch.full((n, self.prompt_len), self.bos, dtype=torch.long, device=device)
        if self.prompt_len > 1:
            prompts[:, 1:] = torch.randint(
                self.vocab_size, (n, self.prompt_len - 1), generator=generator, device=device
            )
        return prompts

    def start_distribution(
        self, dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu"
    ) -> torch.Tensor:
        """[V+1]: the law of the state (previous token) the first response token is drawn from."""
        dist = torch.zeros(self.num_states, dtype=dtype, device=device)
        if self.prompt_len == 1:
            dist[self.bos] = 1.0
        else:
            dist[: self.vocab_size] = 1.0 / self.vocab_size
        return dist

    @staticmethod
    def states(prompts: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """[N, T] the state (previous token, or the prompt's last token) each response token follows."""
        return torch.cat([prompts[:, -1:], tokens[:, :-1]], dim=1)

    def logits(
        self, params: Params, prompts: torch.Tensor, tokens: torch.Tensor, precision: Precision = FP32
    ) -> torch.Tensor:
        theta = params["theta"]
        table = theta if precision.exact else precision.cast(theta)
        return table[self.states(prompts, tokens)]  # [N, T, V]

    def sampler(self, params: Params, prompts: torch.Tensor, precision: Precision) -> _TableSampler:
        return _TableSampler(precision.cast(params["theta"]), prompts[:, -1])

    # The trainer's route: log π_θ(· | s) for every state s once per θ, indexed per token. Cheap, and
    # the value (not the route) is what `logits` gives; the protocol test checks they agree.
    def token_stats(
        self, params: Params, prompts: torch.Tensor, tokens: torch.Tensor, entropy: bool = True
    ) -> TokenStats:
        table = torch.log_softmax(params["theta"], dim=-1)
        prev = self.states(prompts, tokens)
        ent = None
        if entropy:
            with torch.no_grad():
                ent = (-(table.exp() * table).sum(-1))[prev]
        return TokenStats(logp=table[prev, tokens], entropy=ent)

    def score_sums(
        self, params: Params, prompts: torch.Tensor, tokens: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """Σ_{i,t} w_kit ∇_θ log π_θ(y_it | s_it) in closed form for K weightings at once: [K, N, T] →
        [K, (V+1)·V]. The score of a softmax row is e_y − π(· | s), so the sum is a scatter of w into the
        (state, token) cells minus each row's total times softmax(θ[s]): what autograd's gather +
        log_softmax backward computes. Masking is the caller's: give padding weight 0."""
        theta = params["theta"]
        S, V = theta.shape
        K = weights.shape[0]
        cell = (self.states(prompts, tokens) * V + tokens).reshape(-1)
        pos = torch.zeros(K, S * V, dtype=weights.dtype, device=weights.device)
        pos.index_add_(1, cell, weights.reshape(K, -1))
        pos = pos.view(K, S, V)
        probs = torch.softmax(theta.to(weights.dtype), dim=-1)
        return (pos - pos.sum(-1, keepdim=True) * probs).reshape(K, -1)


class _TableSampler:
    """A bigram needs no cache: the next logits are the table's row for the last token."""

    def __init__(self, table: torch.Tensor, first_state: torch.Tensor):
        self.table, self.first_state = table, first_state

    def start(self) -> torch.Tensor:
        return self.table[self.first_state]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.table[tokens]
