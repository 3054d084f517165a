"""`task=sort`: write the prompt's list in ascending order, then EOS. A verifiable task that needs the
whole context: every answer token depends on the list, and where values repeat, on how many copies
of the current value the response has already written.

Vocabulary (`vocab_size` = `task.values` + 3):

    0 … values−1    the list items
    values          BOS  (starts every prompt)
    values + 1      SEP  (ends the list: the response starts after it)
    values + 2      EOS  (ends the response; the EOS is an action, the rest is padding with mask 0)

A prompt is BOS x_1 … x_L SEP with L = `task.length` items drawn uniformly with replacement from
the values (so some values repeat), from the caller's seeded generator. The answer is the sorted
list and EOS, L + 1 tokens, which must fit `rollout.seq_len`; `length: null` fills it (L =
rollout.seq_len − 1).

Reward: 1 for an exact match of the response (up to and including its EOS) with the answer, 0
otherwise. With `task.partial_credit: true` it is instead the length of the answer's longest
correct prefix over L + 1 (1 still means exact).

The noisy teacher for a warm start (`teacher`): the answer, except that at each *fork*, the point
where the teacher has written some copies of a repeated value and more remain, it moves on to the
next value with probability `fork_error`, dropping the remaining copies. Dropping a duplicate is the
structured mistake (sorting right but losing count); after it the teacher sorts on correctly, as a
model that lost count does. A list with R repeated items has R forks, and the teacher is right on
it with probability (1 − fork_error)^R.
"""

from __future__ import annotations

import torch

from runner.config_checks import as_bool, as_int, check_keys
from runner.errors import UserError
from runner.tasks.base import Task

MAX_RESPONSE = 256  # rollout.seq_len's ceiling for this task


class Sort(Task):
    name = "sort"

    def __init__(self, length: int, values: int, partial_credit: bool = False):
        self.length = length
        self.values = values
        self.partial_credit = partial_credit
        self.bos, self.sep, self.eos = values, values + 1, values + 2
        self.vocab_size = values + 3

    @classmethod
    def from_config(cls, cfg, rollout):
        check_keys("task", cfg, ("name", "description", "length", "values", "partial_credit"))
        seq_len = as_int("rollout", rollout, "seq_len", low=2)
        if seq_len > MAX_RESPONSE:
            raise UserError(f"rollout.seq_len must be <= {MAX_RESPONSE} for task=sort, got {seq_len}")
        length = seq_len - 1 if cfg.get("length") is None else as_int("task", cfg, "length", low=1)
        if length + 1 > seq_len:
            raise UserError(
                f"task.length={length} needs rollout.seq_len >= {length + 1} (the sorted list and EOS), got {seq_len}"
            )
        values = as_int("task", cfg, "values", low=2, high=4096)
        return cls(length, values, as_bool("task", cfg, "partial_credit", default=False))

    @property
    def prompt_len(self) -> int:
        return self.length + 2

    @property
    def response_len(self) -> int:
        return self.length + 1

    def identity(self) -> dict:
        """What the warm start depends on (the SFT cache key)."""
        return {"name": self.name, "length": self.length, "values": self.values}

    def sample_prompts(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """[n, L + 2]: BOS, L uniform items, SEP."""
        items = torch.randint(self.values, (n, self.length), generator=generator, device=generator.device)
        bos = torch.full((n, 1), self.bos, dtype=torch.long, device=items.device)
        sep = torch.full((n, 1), self.sep, dtype=torch.long, device=items.device)
        return torch.cat([bos, items, sep], dim=1)

    def answer(self, prompts: torch.Tensor) -> torch.Tensor:
        """[n, L + 1]: the sorted items, then EOS."""
        items = prompts[:, 1 : 1 + self.length].sort(dim=-1).values
        return torch.cat([items, torch.full_like(items[:, :1], self.eos)], dim=1)

    def reward(self, prompts, tokens, mask):
        answer = self.answer(prompts.to(tokens.device))  # [N, L+1]
        n_ans = answer.shape[1]
        if tokens.shape[1] < n_ans:  # the response cannot hold the answer
            return torch.zeros(tokens.shape[0], dtype=mask.dtype, device=tokens.device)
        # A position counts only if the response wrote it (mask 1) and it equals the answer there.
        hit = (tokens[:, :n_ans] == answer) & (mask[:, :n_ans] > 0)  # [N, L+1]
        prefix = hit.to(torch.long).cumprod(dim=1).sum(dim=1)  # [N] correct tokens before the first miss
        if self.partial_credit:
            return prefix.to(mask.dtype) / n_ans
        # The answer ends in EOS, so a full prefix match means the response ended exactly there.
        return (prefix == n_ans).to(mask.dtype)

    def forks(self, prompts: torch.Tensor) -> torch.Tensor:
        """[n, L + 1] bool: answer positions whose token repeats the previous one (a fork for the
        teacher: write another copy, or move on)."""
        answer = self.answer(prompts)
        repeat = torch.zeros_like(answer, dtype=torch.bool)
        repeat[:, 1:] = answer[:, 1:] == answer[:, :-1]
        return repeat

    def teacher(
        self, prompts: torch.Tensor, generator: torch.Generator, fork_error: float, width: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Noisy demonstrations: ([n, width] tokens padded with EOS, [n, width] 0/1 mask up to and
        including the EOS). At each fork the teacher drops the rest of the run with probability
        `fork_error` (see the module docstring)."""
        answer = self.answer(prompts)  # [n, L+1]
        repeat = self.forks(prompts)  # [n, L+1]
        slip = repeat & (torch.rand(answer.shape, generator=generator, device=generator.device) < fork_error)
        dropped = torch.zeros_like(slip)  # [n, L+1]: copies the teacher does not write
        for j in range(1, answer.shape[1]):  # a slip drops the rest of its run
            dropped[:, j] = slip[:, j] | (repeat[:, j] & dropped[:, j - 1])
        keep = ~dropped
        position = torch.arange(answer.shape[1], device=answer.device)
        order = torch.argsort(dropped.long() * answer.shape[1] + position, dim=1)  # kept tokens first, in order
        written = answer.gather(1, order)  # [n, L+1]
        n_kept = keep.sum(1, keepdim=True)  # [n, 1], EOS included
        out = torch.full((answer.shape[0], width), self.eos, dtype=torch.long, device=answer.device)
        out[:, : answer.shape[1]] = torch.where(position < n_kept, written, self.eos)
        mask = (torch.arange(width, device=answer.device) < n_kept).float()
        return out, mask
