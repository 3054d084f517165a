"""`policy=bigram`: a tabular autoregressive policy over `rollout.vocab_size` tokens.

The next token's logits depend only on the previous token, so the whole policy is ONE parameter
tensor θ of shape [V+1, V]: row s holds the logits after token s, and row V (= BOS) the logits
after the start token. That keeps the exact maths of `task.py` a small Markov-chain recursion.

A prompt is BOS followed by `rollout.prompt_len − 1` uniform tokens; only its last token matters
to a bigram, so the state the first response token is drawn from is BOS (prompt_len = 1) or a
uniform token. A response has `rollout.seq_len` tokens; with `rollout.eos_token` set it ends right
after the first EOS (the EOS itself is an action, as in an LLM) and the rest is padding, mask 0.

This module is the trainer's side: fp32 log-probs that carry the gradient. The rollout engine's
reduced-precision, stale, noisy view of the same θ is in `engine.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import torch

from runner.errors import UserError


# ------------------------------------------------------------------ config checks (shared by the
# synthetic modules and the studies: every bad value is one clear line, raised before any file)
def check_keys(section: str, cfg: Mapping[str, Any], allowed: Iterable[str]) -> None:
    unknown = sorted(set(cfg) - set(allowed))
    if unknown:
        raise UserError(f"{section}: unknown key(s) {', '.join(unknown)}; valid: {', '.join(sorted(allowed))}")


def as_int(section: str, cfg: Mapping[str, Any], key: str, low: int | None = None, default: Any = ...) -> int:
    value = cfg.get(key, default)
    if value is ...:
        raise UserError(f"{section}.{key} is missing")
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserError(f"{section}.{key} must be an integer, got {value!r}")
    if low is not None and value < low:
        raise UserError(f"{section}.{key} must be >= {low}, got {value}")
    return value


def as_float(section: str, cfg: Mapping[str, Any], key: str, low: float | None = None, high: float | None = None,
             low_open: bool = False, finite: bool = True, default: Any = ...) -> float:
    value = cfg.get(key, default)
    if value is ...:
        raise UserError(f"{section}.{key} is missing")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"{section}.{key} must be a number, got {value!r}")
    value = float(value)
    if math.isnan(value) or (finite and math.isinf(value)):
        raise UserError(f"{section}.{key} must be a finite number, got {value}")
    if low is not None and (value <= low if low_open else value < low):
        raise UserError(f"{section}.{key} must be {'>' if low_open else '>='} {low:g}, got {value:g}")
    if high is not None and value > high:
        raise UserError(f"{section}.{key} must be <= {high:g}, got {value:g}")
    return value


def as_choice(section: str, cfg: Mapping[str, Any], key: str, choices: Iterable[str], default: Any = ...) -> str:
    value = cfg.get(key, default)
    choices = tuple(choices)
    if value not in choices:
        raise UserError(f"{section}.{key}={value!r} is not one of: {', '.join(choices)}")
    return value


def as_bool(section: str, cfg: Mapping[str, Any], key: str, default: Any = ...) -> bool:
    value = cfg.get(key, default)
    if not isinstance(value, bool):
        raise UserError(f"{section}.{key} must be true or false, got {value!r}")
    return value


# ------------------------------------------------------------------------------------ the policy
@dataclass(frozen=True)
class Bigram:
    vocab_size: int = 16
    seq_len: int = 16
    prompt_len: int = 1
    eos_token: int | None = None
    init_std: float = 0.0  # θ₀ ~ N(0, init_std²); 0 gives the uniform policy

    POLICY_KEYS = ("name", "description", "init_std")

    @classmethod
    def from_config(cls, rollout: Mapping[str, Any], policy: Mapping[str, Any] | None = None) -> "Bigram":
        """Reads the world's shape from `rollout.*` and the initialisation from `policy.*`."""
        policy = dict(policy or {})
        check_keys("policy", policy, cls.POLICY_KEYS)
        if policy.get("name", "bigram") != "bigram":
            raise UserError(f"policy.name={policy.get('name')!r} is not one of: bigram")
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
        )

    @property
    def bos(self) -> int:
        return self.vocab_size

    @property
    def num_states(self) -> int:
        return self.vocab_size + 1

    def init_params(self, generator: torch.Generator) -> torch.Tensor:
        theta = torch.zeros(self.num_states, self.vocab_size)
        if self.init_std > 0:
            theta = self.init_std * torch.randn(self.num_states, self.vocab_size, generator=generator)
        return theta

    def sample_prompts(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """[n, prompt_len] long: BOS, then uniform tokens."""
        prompts = torch.full((n, self.prompt_len), self.bos, dtype=torch.long)
        if self.prompt_len > 1:
            prompts[:, 1:] = torch.randint(self.vocab_size, (n, self.prompt_len - 1), generator=generator)
        return prompts

    def start_distribution(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """[V+1]: the law of the state (previous token) the first response token is drawn from."""
        dist = torch.zeros(self.num_states, dtype=dtype)
        if self.prompt_len == 1:
            dist[self.bos] = 1.0
        else:
            dist[: self.vocab_size] = 1.0 / self.vocab_size
        return dist

    # The trainer's maths. `table` is log π_θ(· | s) for every state s, computed once per θ and
    # indexed per token: cheap, and the same code path the exact k=0 fp32 engine uses, so on-policy
    # roll == old bit for bit.
    @staticmethod
    def log_prob_table(theta: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(theta, dim=-1)

    @staticmethod
    def token_log_probs(table: torch.Tensor, prev: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """[N, T] log π(y_t | y_{t−1}) from a [V+1, V] table; differentiable through `table`."""
        return table[prev, tokens]

    @staticmethod
    def entropy_table(table: torch.Tensor) -> torch.Tensor:
        """[V+1]: the entropy of π(· | s) in nats."""
        return -(table.exp() * table).sum(-1)

    def score_gradient(self, theta: torch.Tensor, prev: torch.Tensor, tokens: torch.Tensor,
                       weights: torch.Tensor) -> torch.Tensor:
        """Σ_{i,t} w_{it} ∇_θ log π_θ(y_{it} | y_{i,t−1}) in closed form, without autograd.

        `weights` is [..., N, T] (leading dims batch many weightings of the same tokens: presets,
        bands) and the result [..., V+1, V]. The score of a softmax row is e_y − π(· | s), so the
        sum is a scatter of w at (s, y) minus (Σ of w at state s) · π(· | s). Masking is the
        caller's: give padding weight 0.
        """
        probs = torch.softmax(theta.to(weights.dtype), dim=-1)  # [S, V]
        lead = weights.shape[:-2]
        w = weights.reshape(*lead, -1)
        flat = (prev * self.vocab_size + tokens).reshape(-1)
        pos = torch.zeros(*lead, self.num_states * self.vocab_size, dtype=w.dtype)
        pos = pos.index_add(-1, flat, w).reshape(*lead, self.num_states, self.vocab_size)
        per_state = torch.zeros(*lead, self.num_states, dtype=w.dtype).index_add(-1, prev.reshape(-1), w)
        return pos - per_state.unsqueeze(-1) * probs
