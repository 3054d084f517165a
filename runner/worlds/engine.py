"""The rollout engine: what an inference server (vLLM, SGLang) does differently from the trainer,
written once for every world.

It samples responses from a world's policy and reports a log-prob for every sampled token: that
report is `roll`. Everything in `mismatch.*` happens here and only here:

- staleness k: the engine's parameters are the trainer's from k steps ago. `ParamHistory` is the
  ring buffer: the study pushes θ at the start of every step and the engine reads the oldest entry,
  so step t samples from θ_{t−k} (θ₀ while t < k). k = 0 is synchronous.
- precision fp32 | bf16 | fp16 | fp8: the world computes its forward pass in that precision
  (runner/worlds/precision.py says what each rounds). `logprobs`: where the engine takes the
  log-softmax of those logits: `fp32` upcasts them first, as vLLM and SGLang do, so the mismatch is
  the forward pass's alone; `compute` takes it in the compute dtype, which adds a floor of rounding
  that does not depend on the policy (what the bigram world has always done: its only arithmetic is
  that log-softmax). The trainer recomputes `old` in fp32. `router_replay`: a mixture-of-experts
  world routes as the trainer does (the router in fp32). `kv_cache`: the dtype the engine stores keys
  and values in, where the world has a cache (fp8 as vLLM's `kv_cache_dtype=fp8` stores them).
- logit_noise σ: N(0, σ²) added to every logit (nondeterministic kernels, in the large).
- temperature, top_p: the engine samples from the processed distribution and reports ITS
  log-probs, as vLLM does (top-p as in vLLM: drop the smallest-probability tokens whose cumulative
  mass is <= 1 − top_p, always keep the most likely).
- outlier_rate p, outlier_shift Δ: with probability p per generated token the REPORTED log-prob is
  shifted by Δ. The sample itself is unaffected. This is fault injection, reproducing the extreme
  sequences of the seed bug report.

With k = 0, fp32, σ = 0, temperature 1, top_p 1 and p = 0, `roll` equals the trainer's `old`
(bit for bit in the bigram world, whose sampler and trainer index the same table).
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from runner.config_checks import as_bool, as_choice, as_float, as_int, check_keys
from runner.errors import UserError
from runner.worlds.precision import KV_CACHES, PRECISIONS, Precision
from runner.worlds.protocol import Params, World

LOGPROBS = ("compute", "fp32")


@dataclass(frozen=True)
class Mismatch:
    staleness: int = 0
    precision: str = "fp32"
    logit_noise: float = 0.0
    temperature: float = 1.0
    top_p: float = 1.0
    outlier_rate: float = 0.0
    outlier_shift: float = -1000.0
    router_replay: bool = False
    # bf16 | fp16 | fp8: the dtype of the engine's key/value cache (worlds with one); None: the compute dtype
    kv_cache: str | None = None
    logprobs: str = "compute"  # compute | fp32: the dtype of the engine's log-softmax
    # Which random stream the rollouts (prompts and tokens) are drawn from; θ₀ is the seed's either way. 0 is the
    # seed's own stream; another value gives a run that differs from it only by its random draws (claim 4's
    # chaos floor: how far two fp32 runs drift apart with no mismatch at all). Training only.
    sampling_stream: int = 0

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> Mismatch:
        s = "mismatch"
        check_keys(s, cfg, cls.__dataclass_fields__)
        return cls(
            staleness=as_int(s, cfg, "staleness", low=0),
            precision=as_choice(s, cfg, "precision", PRECISIONS),
            logit_noise=as_float(s, cfg, "logit_noise", low=0.0),
            temperature=as_float(s, cfg, "temperature", low=0.0, low_open=True),
            top_p=as_float(s, cfg, "top_p", low=0.0, high=1.0, low_open=True),
            outlier_rate=as_float(s, cfg, "outlier_rate", low=0.0, high=1.0),
            # ±inf is a legitimate fault to inject; NaN is not a shift.
            outlier_shift=as_float(s, cfg, "outlier_shift", finite=False),
            router_replay=as_bool(s, cfg, "router_replay", default=False),
            kv_cache=_kv_cache(cfg),
            logprobs=as_choice(s, cfg, "logprobs", LOGPROBS, default="compute"),
            sampling_stream=as_int(s, cfg, "sampling_stream", low=0, default=0),
        )

    @property
    def exact(self) -> bool:
        """No mismatch at all: roll == old."""
        return (
            self.staleness == 0
            and self.precision == "fp32"
            and self.logit_noise == 0
            and self.temperature == 1
            and self.top_p == 1
            and self.outlier_rate == 0
        )

    @property
    def compute_precision(self) -> Precision:
        return Precision(self.precision, router_fp32=self.router_replay, kv_cache=self.kv_cache)


def _kv_cache(cfg: Mapping[str, Any]) -> str | None:
    if cfg.get("kv_cache") is None:
        return None
    kv = as_choice("mismatch", cfg, "kv_cache", KV_CACHES)
    if cfg.get("precision", "fp32") == "fp32":
        raise UserError(f"mismatch.kv_cache={kv} needs a low-precision engine (mismatch.precision bf16, fp16 or fp8)")
    return kv


class ParamHistory:
    """The ring buffer of past parameters that realises staleness k."""

    def __init__(self, staleness: int):
        self.staleness = staleness
        self._buf: collections.deque[Params] = collections.deque(maxlen=staleness + 1)

    def push(self, params: Params) -> None:
        self._buf.append({name: p.detach().clone() for name, p in params.items()})

    def engine_params(self) -> Params:
        """θ_{t−k}, or θ₀ while fewer than k steps have passed."""
        return self._buf[0]


@dataclass
class Rollout:
    prompts: torch.Tensor  # [N, P] long
    tokens: torch.Tensor  # [N, T] long; padding holds EOS
    mask: torch.Tensor  # [N, T] float32 action mask
    roll: torch.Tensor  # [N, T] float32: the engine's reported log-probs; 0 at padding
    outliers: torch.Tensor  # [N, T] bool: where a fault was injected into `roll`


class Engine:
    def __init__(self, world: World, mismatch: Mismatch):
        if mismatch.kv_cache is not None and not world.has_kv_cache:
            raise UserError(
                f"mismatch.kv_cache needs a world with a KV cache (policy=transformer); {world.name} has none"
            )
        self.world = world
        self.mismatch = mismatch
        self.precision = mismatch.compute_precision
        self.dtype = torch.float32 if mismatch.logprobs == "fp32" else self.precision.compute

    def process(self, logits: torch.Tensor, noise_generator: torch.Generator | None = None) -> torch.Tensor:
        """Engine-dtype logits [..., V] → the log-probs of the distribution the engine samples from."""
        m = self.mismatch
        logits = logits.to(self.dtype)
        if m.logit_noise > 0:
            noise = torch.randn(logits.shape, generator=noise_generator, device=logits.device)
            logits = logits + (m.logit_noise * noise).to(self.dtype)
        if m.temperature != 1:
            logits = logits / m.temperature
        logp = torch.log_softmax(logits, dim=-1)
        if m.top_p < 1:
            sorted_lp, order = logp.float().sort(dim=-1)
            drop_sorted = sorted_lp.exp().cumsum(-1) <= 1 - m.top_p
            drop_sorted[..., -1] = False
            drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
            logp = torch.log_softmax(logits.masked_fill(drop, float("-inf")), dim=-1)
        return logp

    @torch.no_grad()
    def sample(
        self,
        params: Params,
        prompts: torch.Tensor,
        generator: torch.Generator,
        noise_generator: torch.Generator | None = None,
    ) -> Rollout:
        """Sample one response per prompt from the engine's parameters (the caller passes θ_{t−k}).
        Vectorised over the batch; the only loop is over the T positions."""
        world, m = self.world, self.mismatch
        noise_generator = noise_generator or generator
        n, T = prompts.shape[0], world.seq_len
        device = prompts.device
        if getattr(world, "reads_own_tokens", True):
            sampler = world.sampler(params, prompts, self.precision)
            tokens = torch.empty(n, T, dtype=torch.long, device=device)
            roll = torch.empty(n, T, dtype=torch.float32, device=device)
            logits = sampler.start()
            for t in range(T):
                logp = self.process(logits, noise_generator)
                tok = torch.multinomial(logp.float().exp(), 1, generator=generator).squeeze(-1)
                tokens[:, t] = tok
                roll[:, t] = logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1).float()
                if t + 1 < T:
                    logits = sampler.step(tok)
        else:
            # A policy that does not read its own tokens draws every position at once, by inverting each
            # state's CDF at one uniform draw: the same law as T multinomial calls, at a fraction of
            # the cost (torch.multinomial took 24 µs a row on the CPU here), from another random stream
            if m.logit_noise == 0:  # once per state that occurs, then looked up: noise would be per token
                logp = self.process(world.position_logits(params, self.precision))[world.row_of(prompts)]
            else:
                dummy = torch.zeros(n, T, dtype=torch.long, device=device)
                logp = self.process(world.logits(params, prompts, dummy, self.precision), noise_generator)
            cdf = logp.double().exp().cumsum(-1).view(n * T, -1)  # [N·T, V]
            u = torch.rand(n * T, 1, generator=generator, device=device, dtype=torch.float64) * cdf[:, -1:]
            # right=True: a token of probability 0 (an empty step of the CDF) is never drawn
            tokens = torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.shape[1] - 1).view(n, T)
            roll = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).float()

        mask = torch.ones(n, T, device=device)
        if world.eos_token is not None:
            # Positions after the first EOS are padding; the EOS itself is a generated token.
            is_eos = (tokens == world.eos_token).long()
            ended_before = (is_eos.cumsum(-1) - is_eos) > 0
            mask = (~ended_before).float()
            tokens = tokens.masked_fill(ended_before, world.eos_token)
            roll = roll * mask  # the engine reports nothing for padding; frameworks pad with 0

        if m.outlier_rate > 0:
            outliers = (torch.rand(n, T, generator=noise_generator, device=device) < m.outlier_rate) & (mask > 0)
            roll = torch.where(outliers, roll + m.outlier_shift, roll)
        else:
            outliers = torch.zeros(n, T, dtype=torch.bool, device=device)
        return Rollout(prompts=prompts, tokens=tokens, mask=mask, roll=roll, outliers=outliers)

    @torch.no_grad()
    def score(
        self,
        params: Params,
        prompts: torch.Tensor,
        tokens: torch.Tensor,
        noise_generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """What this engine would report for given tokens (teacher forcing), [N, T] float32 without
        outliers. With σ = 0 these are the `roll` values `sample` reports (exactly where the world's
        teacher-forced and sampled forward passes round alike)."""
        logp = self.process(self.world.logits(params, prompts, tokens, self.precision), noise_generator)
        return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).float()
