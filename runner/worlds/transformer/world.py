"""`policy=transformer`: a tiny causal LM (model.py) on a task that brings its own vocabulary and
prompts (`task=sort` by default), warm-started by supervised training on a noisy teacher (sft.py).

The inference engine and the trainer compute the same logits by different routes, the mechanism
the field describes:

- the engine samples with a KV cache (`sampler`): the prompt in one prefill pass, then one position
  per step, in the engine's precision (bf16 / fp16 / fp8, see model.py for what is rounded where);
- the trainer recomputes every position in one fp32 teacher-forced pass (`logits`, `token_stats`).

In fp32 the two agree to float32 rounding (tests/test_transformer_world.py holds them to 1e-5);
in low precision they differ by the arithmetic alone. There is no exact objective (`exact` is
None) and no closed-form score (`score_sums` is None: the probe uses autograd).

The world's shape: `vocab_size`, prompts and EOS from the task; responses of `rollout.seq_len`
tokens (at least the task's answer); prompt + response must fit `policy.context`. The params live
on the device of the generator given to `init_params`, and every forward runs where they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from runner.config_checks import as_float, as_int, check_keys
from runner.errors import UserError
from runner.worlds.precision import FP32, Precision
from runner.worlds.protocol import Params, World, param_count
from runner.worlds.transformer import sft as sft_module
from runner.worlds.transformer.kv_cache import KVCache
from runner.worlds.transformer.model import Shape, engine_weights, forward, init_params

POLICY_KEYS = (
    "name",
    "description",
    "n_layer",
    "n_head",
    "d_model",
    "mlp_ratio",
    "context",
    "experts",
    "init_std",
    "sft",
)


class TransformerWorld(World):
    name = "transformer"
    has_kv_cache = True

    def __init__(
        self, shape: Shape, seq_len: int, task: Any, init_std: float = 0.02, sft: sft_module.SFTConfig | None = None
    ):
        self.shape = shape
        self.task = task
        self.vocab_size = shape.vocab_size
        self.seq_len = seq_len
        self.eos_token = task.eos
        self.prompt_len = task.prompt_len
        self.init_std = init_std
        self.sft = sft or sft_module.SFTConfig(steps=0)
        self.warm_start: dict[str, Any] = {}  # filled by init_params: SFT's measurements and cache entry

    @classmethod
    def from_config(cls, policy: Mapping[str, Any], rollout: Mapping[str, Any], task: Any) -> TransformerWorld:
        s = "policy"
        check_keys(s, policy, POLICY_KEYS)
        if getattr(task, "vocab_size", None) is None or not hasattr(task, "eos"):
            raise UserError(
                f"policy=transformer needs a task with its own vocabulary, prompts and EOS "
                f"(e.g. task=sort); task={getattr(task, 'name', task)!r} has none"
            )
        d_model = as_int(s, policy, "d_model", low=1, default=64)
        n_head = as_int(s, policy, "n_head", low=1, default=4)
        if d_model % n_head:
            raise UserError(f"policy.d_model ({d_model}) must be divisible by policy.n_head ({n_head})")
        shape = Shape(
            vocab_size=task.vocab_size,
            context=as_int(s, policy, "context", low=2, default=512, high=65536),
            n_layer=as_int(s, policy, "n_layer", low=1, default=2),
            n_head=n_head,
            d_model=d_model,
            mlp_ratio=as_int(s, policy, "mlp_ratio", low=1, default=4),
            experts=as_int(s, policy, "experts", low=0, default=0),
        )
        if shape.experts == 1:
            raise UserError("policy.experts must be 0 (a dense MLP) or >= 2, got 1")
        seq_len = as_int("rollout", rollout, "seq_len", low=1)
        if seq_len < task.response_len:
            raise UserError(
                f"rollout.seq_len ({seq_len}) is shorter than task={task.name}'s answer ({task.response_len} tokens)"
            )
        if task.prompt_len + seq_len > shape.context:
            raise UserError(
                f"prompt ({task.prompt_len}) + rollout.seq_len ({seq_len}) exceeds policy.context ({shape.context})"
            )
        sft = sft_module.SFTConfig.from_config(policy.get("sft") or {})
        if sft.steps > 0 and not hasattr(task, "teacher"):
            raise UserError(
                f"policy.sft.steps > 0 needs a task with a teacher (e.g. task=sort); "
                f"task={task.name!r} has none (set policy.sft.steps=0)"
            )
        return cls(shape, seq_len, task, as_float(s, policy, "init_std", low=0.0, default=0.02), sft)

    # ------------------------------------------------------------------------------- parameters
    def init_params(self, generator: torch.Generator) -> Params:
        """The warm-started θ₀: SFT's checkpoint (trained now, or loaded from the cache) when
        policy.sft.steps > 0, on the generator's device; otherwise the random initialisation
        drawn from `generator`. The SFT run has its own seed (policy.sft.seed), so every run of the
        same world starts from the same checkpoint whatever its seed."""
        if self.sft.steps == 0:
            self.warm_start = {}
            return init_params(self.shape, generator, self.init_std)
        params, self.warm_start = sft_module.warm_start(self, generator.device)
        return params

    def sample_prompts(self, n: int, generator: torch.Generator) -> torch.Tensor:
        return self.task.sample_prompts(n, generator)

    # ------------------------------------------------------------------------ the trainer's route
    def logits(
        self, params: Params, prompts: torch.Tensor, tokens: torch.Tensor, precision: Precision = FP32
    ) -> torch.Tensor:
        """[N, T, V] teacher-forced: position t's logits given the prompt and tokens[:, :t], in one
        pass over the whole sequence (no cache), in the precision's compute dtype."""
        device = params["wte"].device
        prompts, tokens = prompts.to(device), tokens.to(device)
        idx = torch.cat([prompts, tokens[:, :-1]], dim=1)  # [N, P + T − 1]
        routes = self._replayed_routes(params, idx, precision)
        out = forward(self.shape, engine_weights(params, precision), idx, precision, routes=routes)
        out = out[:, prompts.shape[1] - 1 :]  # [N, T, V]
        return out if precision.exact else out.to(precision.compute)

    def _replayed_routes(
        self, params: Params, idx: torch.Tensor, precision: Precision, cache: KVCache | None = None
    ) -> list[torch.Tensor] | None:
        """Routing replay: the fp32 trainer's expert choices for these tokens, or None."""
        if not (self.shape.experts and precision.router_fp32 and not precision.exact):
            return None
        routes: list[torch.Tensor] = []
        with torch.no_grad():
            forward(self.shape, params, idx, FP32, cache=cache, record_routes=routes)
        return routes

    # ------------------------------------------------------------------------- the engine's route
    def sampler(self, params: Params, prompts: torch.Tensor, precision: Precision) -> CachedSampler:
        return CachedSampler(self, params, prompts, precision)

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        out.update(
            n_layer=self.shape.n_layer,
            n_head=self.shape.n_head,
            d_model=self.shape.d_model,
            mlp_ratio=self.shape.mlp_ratio,
            context=self.shape.context,
            experts=self.shape.experts,
            task=self.task.name,
            prompt_len=self.prompt_len,
            n_params=param_count(init_params(self.shape, torch.Generator().manual_seed(0))),
        )
        if self.warm_start:
            out["warm_start"] = self.warm_start
        return out


class CachedSampler:
    """The engine's sampling loop: `start()` prefills the prompt and gives the first response
    position's [N, V] logits; each `step(tokens)` appends one token per sequence and gives the
    next position's. The engine holds its own rounded copy of the weights and a KV cache of
    prompt + `seq_len` positions (so `step` may be called up to seq_len times)."""

    def __init__(self, world: TransformerWorld, params: Params, prompts: torch.Tensor, precision: Precision):
        self.world, self.precision = world, precision
        self.device = params["wte"].device
        self.prompts = prompts.to(self.device)
        shape = world.shape
        with torch.no_grad():
            self.weights = engine_weights({k: v.detach() for k, v in params.items()}, precision)
        n, max_len = self.prompts.shape[0], self.prompts.shape[1] + world.seq_len
        dtype = params["wte"].dtype  # float32 (float64 only in the tests' exact-arithmetic check)

        def new_cache() -> KVCache:
            return KVCache(shape.n_layer, n, shape.n_head, max_len, shape.head_dim, dtype, self.device)

        self.cache = new_cache()
        # Routing replay keeps the trainer's fp32 pass running alongside, for its expert choices.
        replay = shape.experts and precision.router_fp32 and not precision.exact
        self.replay_params = {k: v.detach() for k, v in params.items()} if replay else None
        self.replay_cache = new_cache() if replay else None

    def _next(self, idx: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            routes = None
            if self.replay_params is not None:
                routes = self.world._replayed_routes(self.replay_params, idx, self.precision, self.replay_cache)
            out = forward(self.world.shape, self.weights, idx, self.precision, cache=self.cache, routes=routes)
        return out[:, -1] if self.precision.exact else out[:, -1].to(self.precision.compute)  # [N, V]

    def start(self) -> torch.Tensor:
        return self._next(self.prompts)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        return self._next(tokens.to(self.device).view(-1, 1))
