"""DAPO's dynamic sampling (Yu et al. 2025, `rollout.dynamic_sampling=N`): a group whose responses all
got the same reward has GRPO advantage 0 and moves nothing, so the step draws up to N more batches of
prompts and keeps the groups whose rewards differ, until the batch is full again.

A step keeps the batch's size: if N extra batches still leave it short, the first all-same groups
fill the rest (they carry no gradient, as they would have without the option). DAPO stops after
`max_num_gen_batches` the same way. The extra draws come from the sampling stream, so a run with the
option on follows other tokens than one without; with N = 0 nothing is drawn and nothing changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields

import torch

from runner.worlds.engine import Rollout


def mixed_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """[B] bool: the groups whose rewards are not all equal."""
    groups = rewards.view(-1, group_size)
    return groups.amin(1) != groups.amax(1)


def _take(ro: Rollout, rows: torch.Tensor) -> Rollout:
    return Rollout(**{f.name: getattr(ro, f.name)[rows] for f in fields(Rollout)})


def _cat(parts: list[Rollout]) -> Rollout:
    return Rollout(**{f.name: torch.cat([getattr(p, f.name) for p in parts]) for f in fields(Rollout)})


def refill(
    ro: Rollout,
    rewards: torch.Tensor,
    group_size: int,
    extra_batches: int,
    draw: Callable[[], tuple[Rollout, torch.Tensor]],
) -> tuple[Rollout, torch.Tensor, int]:
    """(the batch with its all-same groups replaced where `draw` found mixed ones, its rewards, how many
    extra batches were drawn). `draw()` samples one more batch of the same size and its rewards."""
    batch = rewards.numel() // group_size
    kept_ro, kept_rewards = [], []
    have, drawn = 0, 0
    candidates = [(ro, rewards)]
    while True:
        part_ro, part_rewards = candidates[-1]
        keep = mixed_groups(part_rewards, group_size)
        rows = keep.repeat_interleave(group_size).nonzero().squeeze(1)
        kept_ro.append(_take(part_ro, rows))
        kept_rewards.append(part_rewards[rows])
        have += int(keep.sum())
        if have >= batch or drawn == extra_batches:
            break
        candidates.append(draw())
        drawn += 1
    if have < batch:  # still short: the first batch's all-same groups fill the rest
        same = (~mixed_groups(rewards, group_size)).repeat_interleave(group_size).nonzero().squeeze(1)
        rows = same[: (batch - have) * group_size]
        kept_ro.append(_take(ro, rows))
        kept_rewards.append(rewards[rows])
    n = batch * group_size
    full = _cat(kept_ro)
    return _take(full, torch.arange(n, device=rewards.device)), torch.cat(kept_rewards)[:n], drawn
