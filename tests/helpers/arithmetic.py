"""The tests' floating-point arithmetic, made the same on every x86-64 CPU with AVX2, and its fingerprint.

A tiny training run is chaotic: one different last bit in a log-softmax moves a sampled token a few steps
later, and every number after it. torch's CPU results carry three machine-dependent choices, each with a
public switch that pins it:

- ATen's own vectorised kernels (log-softmax, reductions) dispatch on the widest SIMD the CPU has (AVX2 or
  AVX-512); ATEN_CPU_CAPABILITY=avx2 fixes them to the AVX2 build, which every CI machine runs;
- MKL (every float32/float64 matmul, and exp through its vector maths) picks its kernels by vendor and ISA,
  so an Intel AVX-512 Xeon and an AMD EPYC round differently; MKL_CBWR=COMPATIBLE is its conditional
  numerical reproducibility mode, the one branch it documents as giving the same results on Intel and
  non-Intel processors;
- oneDNN (bf16 and fp16 matmuls) is capped at AVX2 by runner/worlds/precision.py already; it is set here too
  so that the cap holds before any import.

OpenBLAS (NumPy's, in the analysis) is fixed to its Haswell kernels for the same reason.
tests/conftest.py sets these before torch is imported (a value already in the environment is kept). The cost
is speed: MKL's compatible branch made an mlp field-regime step 1.4× slower here, which is why is-study
itself does not set them (docs/testing.md says how to get the tests' numbers from a run).

`fingerprint()` hashes a handful of those operations' results. The golden files and the claims' pinned
numbers record the fingerprint of the platform that wrote them (tests/golden/PLATFORM): where it matches,
they are compared exactly; where it does not (another torch build, or a CPU these switches do not cover),
the comparisons that can tolerate rounding do, and the ones that cannot say so.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

PORTABLE_ENV = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "COMPATIBLE",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "OPENBLAS_CORETYPE": "Haswell",
}

PLATFORM_FILE = Path(__file__).resolve().parents[1] / "golden" / "PLATFORM"


def pin_environment() -> None:
    for key, value in PORTABLE_ENV.items():
        os.environ.setdefault(key, value)


def fingerprint() -> str:
    """A hash of float32/float64/bf16/fp16 results of the operations the worlds use, on fixed inputs."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    x = torch.randn(257, 67, generator=g) * 3
    w = torch.randn(67, 129, generator=g)
    q = torch.randn(3, 4, 33, 16, generator=g)
    results = [
        x @ w,
        x.double() @ w.double(),
        q @ q.transpose(-2, -1),
        (x.bfloat16() @ w.bfloat16()).float(),
        (x.half() @ w.half()).float(),
        torch.log_softmax(x, -1),
        torch.softmax(x, -1),
        torch.logsumexp(x, -1),
        x.exp(),
        torch.expm1(x),
        x.abs().log(),
        torch.log1p(x.abs()),
        torch.tanh(x),
        F.gelu(x),
        F.layer_norm(x, (67,)),
        x.sum(0),
        x.double().sum(),
        x.cumsum(0),
        x.norm(dim=-1),
    ]
    digest = hashlib.sha256()
    for r in results:
        digest.update(r.contiguous().numpy().tobytes())
    return digest.hexdigest()[:12]


def platform() -> str:
    """'TORCH_VERSION FINGERPRINT': what a pinned number depends on besides the code."""
    import torch

    return f"{torch.__version__} {fingerprint()}"


def pinned_platform() -> str:
    """The platform that wrote the golden files and the claims' pinned numbers."""
    return PLATFORM_FILE.read_text().strip()


def on_pinned_platform() -> bool:
    return platform() == pinned_platform()
