"""A small decoder-only causal language model (nanoGPT's shape), written once for two routes:

- the trainer: one fp32 forward over prompt + response (teacher forcing), with autograd;
- the inference engine: the same forward, position by position with a KV cache (kv_cache.py), in
  the engine's precision.

Both call `forward` below; only the `Precision` and the cache differ, so whatever the two disagree
on comes from the arithmetic, as in LLM serving, never from a second implementation.

How the engine's precision is applied (what bf16/fp16/fp8 serving stacks do):

- every Linear (q/k/v, attention output, MLP in/out) takes `precision.weights(W)` and
  `precision.activations(x)`, accumulates in fp32 and rounds its output to the compute dtype once,
  as a tensor-core GEMM with an fp32 accumulator does;
- the embeddings, LayerNorm weights, the tied LM head and the MoE router are held in the compute
  dtype but never fp8 (vLLM's fp8 quantizes the Linear layers and leaves the gate unquantized);
- attention scores and their softmax are fp32 and the probabilities are rounded to the compute
  dtype before the product with V (FlashAttention's arithmetic); the KV cache holds K and V as
  rounded by their projection, or in `mismatch.kv_cache`'s dtype (fp8 as vLLM stores it unscaled);
- LayerNorm statistics are fp32 and its output is rounded (the fused norm kernels of vLLM/PyTorch);
- the residual stream, GELU and every add are rounded to the compute dtype after each op.

The low precision is emulated: tensors stay float32 but hold values rounded to the compute dtype
after every op (`_Round`). A native bf16 op computes in fp32 and rounds its output, so the values
are those of a native run up to fp32 summation order, and the same code runs on any device. For
fp32 every rounding is the identity, so the trainer's pass is exactly this code with nothing added.

Mixture of experts (`experts` > 0): each MLP is E experts with a top-1 router (Switch Transformer).
The chosen expert's output is scaled by its gate probability, which is what lets the router learn.
The engine computes the router in its own precision, so near-ties can flip to another expert. With
`precision.router_fp32` (routing replay), the expert choices come from the fp32 trainer's pass over
the same tokens and the engine uses them, computing the gate value in its own precision.

Parameters are a flat dict of tensors (the world protocol's Params); x @ W orientation ([in, out]).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from runner.worlds.precision import FP32, Precision
from runner.worlds.transformer.kv_cache import KVCache

Params = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Shape:
    vocab_size: int
    context: int = 512  # positions: prompt + response
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 64
    mlp_ratio: int = 4
    experts: int = 0  # 0: dense MLP; E > 0: E experts with a top-1 router

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def d_ff(self) -> int:
        return self.mlp_ratio * self.d_model


def init_params(shape: Shape, generator: torch.Generator, std: float = 0.02) -> Params:
    """nanoGPT's initialisation: N(0, std²) weights, the residual projections scaled by
    1/sqrt(2 n_layer), zero biases, unit LayerNorm gains. On the generator's device."""
    d, f, E = shape.d_model, shape.d_ff, shape.experts
    dev = generator.device

    def normal(*size: int, scale: float = std) -> torch.Tensor:
        return scale * torch.randn(*size, generator=generator, device=dev)

    def zeros(*size: int) -> torch.Tensor:
        return torch.zeros(*size, device=dev)

    def ones(*size: int) -> torch.Tensor:
        return torch.ones(*size, device=dev)

    proj_std = std / math.sqrt(2 * shape.n_layer)
    p: Params = {"wte": normal(shape.vocab_size, d), "wpe": normal(shape.context, d)}
    for i in range(shape.n_layer):
        h = f"h{i}."
        p[h + "ln1.w"], p[h + "ln1.b"] = ones(d), zeros(d)
        p[h + "attn.w_qkv"], p[h + "attn.b_qkv"] = normal(d, 3 * d), zeros(3 * d)
        p[h + "attn.w_out"], p[h + "attn.b_out"] = normal(d, d, scale=proj_std), zeros(d)
        p[h + "ln2.w"], p[h + "ln2.b"] = ones(d), zeros(d)
        if E == 0:
            p[h + "mlp.w_in"], p[h + "mlp.b_in"] = normal(d, f), zeros(f)
            p[h + "mlp.w_out"], p[h + "mlp.b_out"] = normal(f, d, scale=proj_std), zeros(d)
        else:
            p[h + "mlp.router"] = normal(d, E)
            p[h + "mlp.w_in"], p[h + "mlp.b_in"] = normal(E, d, f), zeros(E, f)
            p[h + "mlp.w_out"], p[h + "mlp.b_out"] = normal(E, f, d, scale=proj_std), zeros(E, d)
    p["ln_f.w"], p["ln_f.b"] = ones(d), zeros(d)
    return p


# Linear layers' weights: rounded through `precision.weights` (fp8-scaled where fp8). Everything
# else (embeddings, norms, biases, the router) is only held in the compute dtype.
_LINEAR = ("attn.w_qkv", "attn.w_out", "mlp.w_in", "mlp.w_out")


def engine_weights(params: Params, precision: Precision) -> Params:
    """The weights as the engine holds them: rounded once, detached, float32 storage.
    For fp32 it returns `params` itself, so the trainer's autograd flows through."""
    if precision.exact:
        return params
    out = {}
    for name, w in params.items():
        held = precision.weights(w) if name.endswith(_LINEAR) else w.detach().to(precision.compute)
        out[name] = held.float()
    return out


class _Round:
    """Emulated low precision: round a float32 tensor to the compute dtype and back."""

    def __init__(self, precision: Precision):
        self.precision = precision
        self.exact = precision.exact

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.exact else t.to(self.precision.compute).float()

    def act(self, t: torch.Tensor) -> torch.Tensor:
        """An activation entering a Linear (fp8: per-token scaled rounding)."""
        return t if self.exact else self.precision.activations(t).float()

    def linear(
        self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, quantized: bool = True
    ) -> torch.Tensor:
        """A GEMM; `quantized=False` for a layer fp8 serving keeps in the compute dtype (the router)."""
        y = (self.act(x) if quantized else self(x)) @ w  # fp32 accumulate of rounded operands
        if b is not None:
            y = y + b  # the GEMM epilogue adds the bias before the one output rounding
        return self(y)

    def layer_norm(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self(F.layer_norm(x, (x.shape[-1],), w, b))  # fp32 statistics, rounded output


def forward(
    shape: Shape,
    weights: Params,
    idx: torch.Tensor,
    precision: Precision = FP32,
    cache: KVCache | None = None,
    routes: list[torch.Tensor] | None = None,
    record_routes: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """Logits [N, t, V] (float32 holding compute-dtype values) for the tokens `idx` [N, t].

    `weights` come from `engine_weights(params, precision)`. Without a cache the t tokens are the
    whole sequence, attended causally. With a cache they are the next t positions after the
    `cache.length` already written (t = the prompt at prefill, then 1 per sampled token).
    `routes` ([N, t] expert ids per layer) replaces the router's choice (routing replay);
    `record_routes`, a list, collects the choices this pass made.
    """
    rnd = _Round(precision)
    N, t = idx.shape
    start = cache.length if cache is not None else 0
    pos = torch.arange(start, start + t, device=idx.device)  # [t]
    x = rnd(weights["wte"][idx] + weights["wpe"][pos])  # [N, t, d]
    for i in range(shape.n_layer):
        h = f"h{i}."
        a = rnd.layer_norm(x, weights[h + "ln1.w"], weights[h + "ln1.b"])  # [N, t, d]
        x = rnd(x + _attention(shape, weights, h, a, rnd, cache, i))  # [N, t, d]
        m = rnd.layer_norm(x, weights[h + "ln2.w"], weights[h + "ln2.b"])  # [N, t, d]
        layer_routes = routes[i] if routes is not None else None
        x = rnd(x + _mlp(shape, weights, h, m, rnd, layer_routes, record_routes))  # [N, t, d]
    x = rnd.layer_norm(x, weights["ln_f.w"], weights["ln_f.b"])  # [N, t, d]
    return rnd(x @ weights["wte"].T)  # [N, t, V]: the LM head is the tied embedding


def _attention(
    shape: Shape, w: Params, h: str, x: torch.Tensor, rnd: _Round, cache: KVCache | None, layer: int
) -> torch.Tensor:
    N, t, d = x.shape
    H, hd = shape.n_head, shape.head_dim
    qkv = rnd.linear(x, w[h + "attn.w_qkv"], w[h + "attn.b_qkv"])  # [N, t, 3d]
    q, k, v = (z.view(N, t, H, hd).transpose(1, 2) for z in qkv.split(d, dim=-1))  # [N, H, t, hd] each
    if rnd.precision.kv_cache is not None:  # what the cache stores, whether this pass writes one or not
        k, v = rnd.precision.cached(k), rnd.precision.cached(v)
    if cache is not None:
        k, v = cache.update(layer, k, v)  # [N, H, s, hd]: every position so far (s = past + t)
    s = k.shape[2]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(hd)  # [N, H, t, s] in fp32
    if t > 1:  # position j of the t new ones sees the s − t past ones and itself
        causal = torch.ones(t, s, dtype=torch.bool, device=x.device).tril(diagonal=s - t)  # [t, s]
        scores = scores.masked_fill(~causal, float("-inf"))
    probs = rnd(torch.softmax(scores, dim=-1))  # [N, H, t, s]: fp32 softmax, rounded for the PV GEMM
    y = rnd(probs @ v)  # [N, H, t, hd]
    y = y.transpose(1, 2).reshape(N, t, d)  # [N, t, d]
    return rnd.linear(y, w[h + "attn.w_out"], w[h + "attn.b_out"])  # [N, t, d]


def _mlp(
    shape: Shape,
    w: Params,
    h: str,
    x: torch.Tensor,
    rnd: _Round,
    routes: torch.Tensor | None,
    record: list[torch.Tensor] | None,
) -> torch.Tensor:
    if shape.experts == 0:
        u = rnd(F.gelu(rnd.linear(x, w[h + "mlp.w_in"], w[h + "mlp.b_in"])))  # [N, t, 4d]
        return rnd.linear(u, w[h + "mlp.w_out"], w[h + "mlp.b_out"])  # [N, t, d]
    gate_logits = rnd.linear(x, w[h + "mlp.router"], quantized=False)  # [N, t, E] in the engine's precision
    gate_probs = torch.softmax(gate_logits, dim=-1)  # [N, t, E] fp32, as MoE routers do
    choice = gate_probs.argmax(-1) if routes is None else routes  # [N, t] expert ids
    if record is not None:
        record.append(choice)
    gate = gate_probs.gather(-1, choice.unsqueeze(-1))  # [N, t, 1]
    out = torch.zeros_like(x)  # [N, t, d]
    for e in range(shape.experts):  # each expert runs on its own tokens (a grouped GEMM)
        sel = choice == e  # [N, t]
        if not bool(sel.any()):
            continue
        xe = x[sel]  # [n_e, d]
        u = rnd(F.gelu(rnd.linear(xe, w[h + "mlp.w_in"][e], w[h + "mlp.b_in"][e])))  # [n_e, 4d]
        out = out.index_put((sel,), rnd.linear(u, w[h + "mlp.w_out"][e], w[h + "mlp.b_out"][e]))
    return rnd(out * gate)  # [N, t, d]
