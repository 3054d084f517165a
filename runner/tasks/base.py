"""A task is a reward on sampled responses. It never computes J itself: an exact objective belongs
to a world's solver (runner/worlds/*/exact.py), which asks the task only what its reward is.

    reward(prompts, tokens, mask) → [N] rewards of sampled responses ([N, P] prompts, [N, T] tokens,
                                    [N, T] 0/1 action mask)

A task whose reward depends only on how many response tokens fall in a target set is a *count
task*: it also gives `expected(law)`, E[R] from the law of that count ([C+1] probabilities of
0..C target tokens), which is all a dynamic-programming solver needs. A task that brings its own
prompts and vocabulary (arithmetic, sorting) sets `vocab_size` and `sample_prompts`; count tasks
leave both to the world.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch


class Task:
    name: ClassVar[str] = "task"
    vocab_size: int | None = None  # None: the world's (rollout.vocab_size)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], rollout: Mapping[str, Any]) -> Task:
        raise NotImplementedError

    def reward(self, prompts: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def sample_prompts(self, n: int, generator: torch.Generator) -> torch.Tensor | None:
        """[n, P] prompts, or None to let the world draw its own."""
        return None


class CountTask(Task):
    """R is a function of the number of response tokens in `targets` (see the module docstring)."""

    targets: tuple[int, ...]

    def __init__(self, vocab_size: int, targets: tuple[int, ...]):
        self.targets = targets
        self.is_target = torch.zeros(vocab_size, dtype=torch.bool)
        self.is_target[list(targets)] = True

    def count(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return (self.is_target.to(tokens.device)[tokens].to(mask.dtype) * mask).sum(-1)

    def expected(self, law: torch.Tensor) -> torch.Tensor:
        """E[R] from the [C+1] law of the count (differentiable)."""
        raise NotImplementedError
