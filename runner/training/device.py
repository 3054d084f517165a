"""`device=auto|cpu|cuda` (or cuda:N): where a run's parameters, rollouts and arithmetic live.

auto picks CUDA when torch can see a GPU, else the CPU. The same config and seed give the same numbers
on the same device; across devices the kernels differ, so the numbers do too (and a CSV written on one
is not byte-identical to one written on the other)."""

from __future__ import annotations

import re

import torch

from runner.errors import UserError

DEVICES = ("auto", "cpu", "cuda")


def resolve(name: object) -> torch.device:
    if not isinstance(name, str) or not (name in DEVICES or re.fullmatch(r"cuda:\d+", name)):
        raise UserError(f"device={name!r} is not one of: auto, cpu, cuda, cuda:N")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UserError(
                f"device={name}: torch {torch.__version__} sees no CUDA device here "
                f"(use device=cpu, or device=auto to take a GPU when there is one)"
            )
        index = int(name.split(":")[1]) if ":" in name else 0
        if index >= torch.cuda.device_count():
            raise UserError(f"device={name}: only {torch.cuda.device_count()} CUDA device(s) here")
    return torch.device(name)
