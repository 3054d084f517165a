"""How an inference engine rounds a forward pass: `mismatch.precision` (and `mismatch.router_replay`).

The trainer computes in fp32. The engine runs the *same* forward pass of the same parameters in a
lower precision, so the two disagree for the reasons they disagree in LLM serving: rounded weights,
rounded activations, a softmax in a short mantissa. Nothing is injected; the size of the mismatch is
whatever the arithmetic gives, and it grows by itself as logits sharpen.

    fp32   storage and compute in float32 (the trainer's own precision)
    bf16   weights and activations in bfloat16 (8 bits of mantissa, fp32's range)
    fp16   weights and activations in float16 (11 bits of mantissa, range ±65504)
    fp8    weights rounded through float8_e4m3fn with one scale per tensor (amax / 448), activations
           rounded the same way as they enter each matmul, with one scale per token (amax of that
           token's vector: a scale per whole batch would make one sequence's numbers depend on the
           others in the batch); the arithmetic itself in bfloat16, as fp8 serving stacks compute

A world applies these where its forward pass has weights and activations (`weights`, `activations`).
A tabular world whose parameters *are* the logits rounds its table once (`cast`: a plain round trip
through the storage dtype, fp8 unscaled), which is what the bigram world has always done.

`router_fp32` (mismatch.router_replay=true): a mixture-of-experts world computes its router in fp32
from the fp32 weights, so the engine routes every token exactly as the trainer does (routing replay).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

# A bf16 or fp16 matmul on the CPU runs in oneDNN, which on a CPU with AVX512-BF16 or AMX uses the native
# dot-product instructions; their rounding differs from rounding the operands and accumulating in fp32, which
# is what oneDNN does on every other CPU (and a GPU's tensor cores do), so one seed gave other numbers on
# another machine. Capped at AVX2, every CPU computes the engine alike. oneDNN reads the variable once, at its
# first call, which comes after this import; a value the user has set is kept.
os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")

import torch  # after the variable above, so that no oneDNN call can come first

PRECISIONS = ("fp32", "bf16", "fp16", "fp8")
KV_CACHES = ("bf16", "fp16", "fp8")  # mismatch.kv_cache: the engine's key/value store, where it has one
_STORAGE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}
_COMPUTE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}
FP8_MAX = 448.0  # the largest finite float8_e4m3fn


@dataclass(frozen=True)
class Precision:
    name: str = "fp32"
    router_fp32: bool = False
    kv_cache: str | None = None  # None: keys and values stay in the compute dtype, as they came out of their GEMM

    def __post_init__(self) -> None:
        if self.name not in PRECISIONS:
            raise ValueError(f"precision {self.name!r} is not one of {PRECISIONS}")
        if self.kv_cache is not None and (self.kv_cache not in KV_CACHES or self.name == "fp32"):
            raise ValueError(f"kv_cache {self.kv_cache!r} needs a low-precision engine and one of {KV_CACHES}")

    @property
    def storage(self) -> torch.dtype:
        return _STORAGE[self.name]

    @property
    def compute(self) -> torch.dtype:
        """The dtype the arithmetic runs in (logits come out in it)."""
        return _COMPUTE[self.name]

    @property
    def exact(self) -> bool:
        return self.name == "fp32"

    def cast(self, t: torch.Tensor) -> torch.Tensor:
        """A plain round trip through the storage dtype into the compute dtype (fp8 unscaled)."""
        return t.detach().to(self.storage).to(self.compute)

    def weights(self, t: torch.Tensor) -> torch.Tensor:
        """A weight tensor as the engine holds it, in the compute dtype (fp8: per-tensor scaled)."""
        if self.name != "fp8":
            return t.detach().to(self.compute)
        return _fp8_round(t.detach().float(), t.detach().abs().amax()).to(self.compute)

    def activations(self, t: torch.Tensor) -> torch.Tensor:
        """An activation entering a matmul, in the compute dtype (fp8: one scale per token, i.e. per
        vector along the last dim). Differentiable where it is the identity or a dtype cast."""
        if self.name != "fp8":
            return t.to(self.compute)
        x = t.detach().float()
        return _fp8_round(x, x.abs().amax(-1, keepdim=True)).to(self.compute)

    def cached(self, t: torch.Tensor) -> torch.Tensor:
        """A key or value as the engine's cache stores it (float32 holding the stored values). fp8 is e4m3
        with vLLM's default scale of 1.0 (`kv_cache_dtype=fp8` without calibrated scales): 3 mantissa bits,
        and values under 2^-6 kept only as subnormals."""
        if self.kv_cache is None:
            return t
        if self.kv_cache == "fp8":
            return t.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float()
        return t.to(_STORAGE[self.kv_cache]).float()


def _fp8_round(x: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    return (x / scale).to(torch.float8_e4m3fn).float() * scale


FP32 = Precision("fp32")
