"""Advantages over groups of `group_size` consecutive responses to one prompt ([N] rewards → [N])."""

from __future__ import annotations

import torch


def grpo_advantages(rewards: torch.Tensor, group_size: int, std_norm: bool = False, eps: float = 1e-6) -> torch.Tensor:
    """GRPO: the reward minus its group's mean, optionally divided by the group's std (+ eps, so a
    uniform group gives 0)."""
    groups = rewards.reshape(-1, group_size)
    adv = groups - groups.mean(-1, keepdim=True)
    if std_norm:
        std = groups.std(-1, keepdim=True) if group_size > 1 else torch.zeros_like(groups[:, :1])
        adv = adv / (std + eps)
    return adv.reshape(-1)


def baseline_advantages(rewards: torch.Tensor, group_size: int, baseline: str) -> torch.Tensor:
    """The probe's advantages, by baseline:

    rloo:       R_i − mean of the OTHER G−1 rewards of the group. The baseline does not depend
                on y_i, so E[A_i ∇log π(y_i)] = ∇J exactly: the default, unbiased on-policy.
    group-mean: R_i − mean of all G (GRPO without std): (1 − 1/G) × the RLOO advantage, so the
                estimate's expectation is (1 − 1/G)·∇J on-policy (kept to show that bias).
    none:       R_i (plain REINFORCE, unbiased, higher variance).
    """
    if baseline == "none":
        return rewards.clone()
    groups = rewards.reshape(-1, group_size)
    total = groups.sum(-1, keepdim=True)
    if baseline == "rloo":
        adv = groups - (total - groups) / (group_size - 1)
    else:
        adv = groups - total / group_size
    return adv.reshape(-1)
