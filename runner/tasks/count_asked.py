"""`task=count-asked`: the prompt asks for a count. Prompt token i (one of len(task.k) prompts, drawn
uniformly) asks for task.k[i] tokens of `task.targets` in the response; R = 1[it holds that many,
give or take task.tolerance]. A verifiable 0/1 reward over a spread of difficulties: the counts far
from what the policy emits by habit are the hard prompts.

Its difficulty depends on what the policy sees. With its count in the state (the mlp world's default)
a policy can learn to stop exactly at k (count-exact, in that state, saturates by step 20). Without it (`policy.state=[prompt, position]`:
each position decides alone, as in experiment=mlp/field-regime) it can hit every asked count only by
making each position's choice of target or not sharp, which takes longer the longer the response
(tests/test_count_asked.py). Without the prompt too (`[previous, position]`) it must also carry the
question in its own tokens.

For an exact solver, counts past max(k) + tolerance all fail alike, so the count's law is kept up
to `count_cap` = max(k) + tolerance + 1, the last bin meaning "at least that many" (`expected` takes one law per
prompt, [prompts, count_cap + 1]).
"""

from __future__ import annotations

import torch

from runner.config_checks import as_int, check_keys
from runner.errors import UserError
from runner.tasks.base import CountTask
from runner.tasks.targets import parse_asked_counts, parse_targets, rollout_shape


class CountAsked(CountTask):
    name = "count-asked"

    def __init__(self, vocab_size: int, targets: tuple[int, ...], k: tuple[int, ...], tolerance: int = 0):
        super().__init__(vocab_size, targets)
        self.k, self.tolerance = k, tolerance
        self.asked = torch.tensor(k)  # [X]: prompt token i asks for k[i]
        self.count_cap = max(k) + tolerance + 1
        counts = torch.arange(self.count_cap + 1)
        self.accepts = (counts - self.asked.unsqueeze(1)).abs() <= tolerance  # [X, cap+1]; the cap bin never does

    @classmethod
    def from_config(cls, cfg, rollout):
        check_keys("task", cfg, ("name", "description", "targets", "k", "tolerance"))
        vocab, seq_len = rollout_shape(rollout)
        targets = parse_targets(cfg, vocab)
        k = parse_asked_counts(cfg, seq_len)
        if len(k) > vocab:
            raise UserError(f"task.k asks {len(k)} counts, but there are only {vocab} prompt tokens")
        return cls(vocab, targets, k, as_int("task", cfg, "tolerance", low=0, default=0))

    def prompt_tokens(self) -> torch.Tensor:
        """[X] the prompts' tokens (token i asks for k[i])."""
        return torch.arange(len(self.k))

    def sample_prompts(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """[n, 1] prompt tokens, uniform over the asked counts."""
        return torch.randint(len(self.k), (n, 1), generator=generator, device=generator.device)

    def reward(self, prompts, tokens, mask):
        asked = self.asked.to(tokens.device)[prompts[:, -1]]  # [N]
        return ((self.count(tokens, mask) - asked).abs() <= self.tolerance).to(mask.dtype)

    def expected(self, law):
        """E[R] from [X, count_cap + 1] laws of the count, one per prompt (the prompts equally likely)."""
        accepts = self.accepts[:, : law.shape[1]].to(law.device, law.dtype)
        return (law[:, : accepts.shape[1]] * accepts).sum(1).mean()
