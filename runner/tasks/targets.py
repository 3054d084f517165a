"""Count tasks over a target set of tokens (`task.targets`).

- `task=target-count`: R = (number of response tokens in targets) / `rollout.seq_len`. Additive per
  token, so an exact solver may sum per-token rewards (`token_reward`). Without EOS, R is the
  fraction of target tokens; with EOS it is normalised by the maximum length, which keeps it additive.
- `task=target-threshold`: a sequence-level 0/1 reward, R = 1[count ≥ `task.min_count`] (a
  verifier's pass/fail).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from runner.config_checks import as_int, check_keys
from runner.errors import UserError
from runner.tasks.base import CountTask


def parse_targets(cfg: Mapping[str, Any], vocab_size: int) -> tuple[int, ...]:
    targets = cfg.get("targets")
    if not isinstance(targets, (list, tuple)) or not targets:
        raise UserError(f"task.targets must be a non-empty list of token ids, got {targets!r}")
    for tok in targets:
        if isinstance(tok, bool) or not isinstance(tok, int) or not 0 <= tok < vocab_size:
            raise UserError(f"task.targets: {tok!r} is not a token id in [0, {vocab_size - 1}]")
    return tuple(sorted(set(targets)))


def rollout_shape(rollout: Mapping[str, Any]) -> tuple[int, int]:
    """(vocab_size, seq_len) of `rollout.*`, validated."""
    return as_int("rollout", rollout, "vocab_size", low=2), as_int("rollout", rollout, "seq_len", low=1)


class TargetCount(CountTask):
    name = "target-count"
    additive = True

    def __init__(self, vocab_size: int, seq_len: int, targets: tuple[int, ...]):
        super().__init__(vocab_size, targets)
        self.seq_len = seq_len

    @classmethod
    def from_config(cls, cfg, rollout):
        check_keys("task", cfg, ("name", "description", "targets"))
        vocab, seq_len = rollout_shape(rollout)
        return cls(vocab, seq_len, parse_targets(cfg, vocab))

    def reward(self, prompts, tokens, mask):
        return self.count(tokens, mask) / self.seq_len

    def token_reward(self, dtype: torch.dtype) -> torch.Tensor:
        """[V]: each token's share of R (R is the sum over the response)."""
        return self.is_target.to(dtype) / self.seq_len

    def expected(self, law):
        return (law * torch.arange(law.shape[-1], dtype=law.dtype, device=law.device)).sum(-1) / self.seq_len


class TargetThreshold(CountTask):
    name = "target-threshold"

    def __init__(self, vocab_size: int, targets: tuple[int, ...], min_count: int):
        super().__init__(vocab_size, targets)
        self.min_count = min_count

    @classmethod
    def from_config(cls, cfg, rollout):
        check_keys("task", cfg, ("name", "description", "targets", "min_count"))
        vocab, seq_len = rollout_shape(rollout)
        targets = parse_targets(cfg, vocab)
        min_count = as_int("task", cfg, "min_count", low=0)
        if min_count > seq_len:
            raise UserError(f"task.min_count ({min_count}) > rollout.seq_len ({seq_len}): the reward is always 0")
        return cls(vocab, targets, min_count)

    def reward(self, prompts, tokens, mask):
        return (self.count(tokens, mask) >= self.min_count).to(mask.dtype)

    def expected(self, law):
        return law[self.min_count :].sum()


def parse_asked_counts(cfg, seq_len: int) -> tuple[int, ...]:
    """task.k: one count a prompt asks for, each in [0, seq_len]."""
    k = cfg.get("k")
    if not isinstance(k, (list, tuple)) or not k:
        raise UserError(f"task.k must be a non-empty list of counts (one per prompt), got {k!r}")
    for count in k:
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= seq_len:
            raise UserError(f"task.k: {count!r} is not a count in [0, rollout.seq_len = {seq_len}]")
    return tuple(k)
