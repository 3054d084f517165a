"""`task=count-exact`: a sparse, verifiable reward, R = 1[the response holds exactly `task.k` tokens
of `task.targets`].

Unlike target-count it has a wrong direction: past k, every further target token turns a success
into a failure, so the policy must learn *when* to stop emitting them, a decision that depends on
the count so far. The defaults (one target token in 16, k = 6) give a near-uniform policy
J ≈ 0.11 at T = 64 and 0.12 at T = 128 (Binomial(T, 1/16) at 6): room to climb and to fail.
"""

from __future__ import annotations

from runner.config_checks import as_int, check_keys
from runner.errors import UserError
from runner.tasks.base import CountTask
from runner.tasks.targets import parse_targets, rollout_shape


class CountExact(CountTask):
    name = "count-exact"

    def __init__(self, vocab_size: int, targets: tuple[int, ...], k: int):
        super().__init__(vocab_size, targets)
        self.k = k

    @classmethod
    def from_config(cls, cfg, rollout):
        check_keys("task", cfg, ("name", "description", "targets", "k"))
        vocab, seq_len = rollout_shape(rollout)
        targets = parse_targets(cfg, vocab)
        k = as_int("task", cfg, "k", low=0)
        if k > seq_len:
            raise UserError(f"task.k ({k}) > rollout.seq_len ({seq_len}): the reward is always 0")
        return cls(vocab, targets, k)

    def reward(self, prompts, tokens, mask):
        return (self.count(tokens, mask) == self.k).to(mask.dtype)

    def expected(self, law):
        return law[self.k]
