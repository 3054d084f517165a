"""The world protocol: what a study may ask of a policy world, and nothing about which world it is.

A *world* is a parametrised autoregressive policy over `vocab_size` tokens that writes responses of
up to `seq_len` tokens after a prompt. The studies (train, probe) and the one engine
(runner/worlds/engine.py) talk to it only through this protocol:

    init_params(gen)                         → Params, a dict of named tensors (the trainer's θ)
    sample_prompts(n, gen)                   → [n, P] long prompt tokens
    logits(params, prompts, tokens, prec)    → [N, T, V] teacher-forced logits: position t given the
                                               prompt and tokens[:, :t], computed in `prec`
    sampler(params, prompts, prec)           → Sampler: start() → [N, V], step(tokens [N]) → [N, V],
                                               the same logits one position at a time (with a KV
                                               cache where the model has one), in `prec`
    token_stats(params, prompts, tokens)     → TokenStats: the trainer's fp32 log π(y_t | ·) [N, T]
                                               (differentiable) and the entropy of π(· | ·) [N, T]
    exact                                    → an ExactSolver for the world's task, or None
    score_sums(params, prompts, tokens, w)   → Σ_{i,t} w_kit ∇ log π(y_it | ·) as [K, n_params], or
                                               None (the probe then uses autograd)

The same `logits` serve the fp32 trainer and the low-precision engine: the mismatch between them is
the arithmetic of `Precision`, never a separate code path. A world may compute `token_stats` by a
faster route than `logits` (the bigram's table), as long as the values agree; the protocol test
(tests/test_worlds.py) holds every world to that, to cached == teacher-forced sampling, and, where
there is an exact J, to Monte Carlo.

Params keep their insertion order; `flat` / `unflat` turn them into one vector (the probe's gradient
space) and back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch

from runner.worlds.precision import FP32, Precision

Params = dict[str, torch.Tensor]


class Sampler(Protocol):
    def start(self) -> torch.Tensor:
        """[N, V] logits of the first response token, in the precision's compute dtype."""

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append the sampled [N] tokens; [N, V] logits of the next position."""


class ExactSolver(Protocol):
    def objective(self, params: Params, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """J(θ) = E_{prompt, y ~ π_θ}[R] exactly, as a 0-d tensor in dtype, differentiable in params."""


@dataclass
class TokenStats:
    logp: torch.Tensor  # [N, T] log π_θ(y_t | prompt, y_<t) in fp32, carrying the gradient
    entropy: torch.Tensor | None  # [N, T] entropy of π_θ(· | prompt, y_<t) in nats, detached; None if not asked


class World:
    """Defaults for the optional parts of the protocol; a world subclasses it and fills in the rest."""

    name: ClassVar[str] = "world"
    vocab_size: int
    seq_len: int  # response length (the maximum, with EOS)
    eos_token: int | None
    prompt_len: int = 1
    exact: ExactSolver | None = None
    has_kv_cache: ClassVar[bool] = False  # the engine decodes with a key/value cache (mismatch.kv_cache applies)

    @classmethod
    def from_config(cls, policy: Mapping[str, Any], rollout: Mapping[str, Any], task: Any) -> World:
        """Validate `policy.*` and `rollout.*` (one-line UserErrors) and build the world for `task`."""
        raise NotImplementedError

    def init_params(self, generator: torch.Generator) -> Params:
        raise NotImplementedError

    def sample_prompts(self, n: int, generator: torch.Generator) -> torch.Tensor:
        raise NotImplementedError

    def logits(
        self, params: Params, prompts: torch.Tensor, tokens: torch.Tensor, precision: Precision = FP32
    ) -> torch.Tensor:
        raise NotImplementedError

    def sampler(self, params: Params, prompts: torch.Tensor, precision: Precision) -> Sampler:
        raise NotImplementedError

    def token_stats(
        self, params: Params, prompts: torch.Tensor, tokens: torch.Tensor, entropy: bool = True
    ) -> TokenStats:
        logp_all = torch.log_softmax(self.logits(params, prompts, tokens, FP32).float(), dim=-1)
        logp = logp_all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        ent = None
        if entropy:
            with torch.no_grad():
                ent = -(logp_all.exp() * logp_all).sum(-1)
        return TokenStats(logp=logp, entropy=ent)

    def score_sums(
        self, params: Params, prompts: torch.Tensor, tokens: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor | None:
        return None

    def summary(self) -> dict[str, Any]:
        """The world's shape for summary.json and probe.csv (plain values)."""
        return {
            "policy": self.name,
            "vocab_size": self.vocab_size,
            "seq_len": self.seq_len,
            "prompt_len": self.prompt_len,
            "eos_token": self.eos_token,
        }


def flat(params: Params) -> torch.Tensor:
    """The parameters (or gradients) as one vector, in the dict's order."""
    return torch.cat([p.reshape(-1) for p in params.values()])


def unflat(vector: torch.Tensor, like: Params) -> Params:
    out, i = {}, 0
    for name, p in like.items():
        out[name] = vector[i : i + p.numel()].view_as(p)
        i += p.numel()
    return out


def param_count(params: Params) -> int:
    return sum(p.numel() for p in params.values())


def exact_gradient(
    solver: ExactSolver, params: Params, dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, Params]:
    """(J(θ), ∇J(θ)) exactly, in `dtype` (float64: a ground truth needs no rounding of its own)."""
    with torch.enable_grad():
        leaves = {k: v.detach().to(dtype).requires_grad_(True) for k, v in params.items()}
        value = solver.objective(leaves, dtype)
        grads = torch.autograd.grad(value, list(leaves.values()), allow_unused=True)
    return value.detach(), {k: (torch.zeros_like(v) if g is None else g) for (k, v), g in zip(leaves.items(), grads)}
