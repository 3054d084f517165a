"""Segments: the maximal runs of masked-in tokens within a response (a multi-turn episode's assistant turns,
separated by the masked-out tool or user tokens between them).

ROLL's `weight_type: segment` and `agg_type: segment` (roll/pipeline/agentic/utils.py,
compute_segment_masked_mean) give every token of a run the mean of the run's values, and 0 outside every run;
a response with no gap in its mask is one segment, where the segment mean is the geometric level's mean.
"""

from __future__ import annotations

import torch


def segment_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[.., T] → [.., T]: each masked-in token gets the mean of x over its run of consecutive masked-in tokens,
    a masked-out token 0. Values outside the runs are never read, so NaN padding does not leak into a run."""
    inside = mask > 0
    starts = inside.clone()
    starts[..., 1:] &= ~inside[..., :-1]
    length = x.shape[-1]
    # One id per run, unique across rows: the run's number within its row (1, 2, ...), offset by the row's
    # index times T + 1; every masked-out token gets its row's id 0, which nothing reads back.
    run = torch.cumsum(starts, -1) * inside
    rows = torch.arange(run[..., 0].numel(), device=x.device).reshape(run.shape[:-1] + (1,))
    ids = (run + rows * (length + 1)).reshape(-1)
    values = torch.where(inside, x, 0.0).reshape(-1)
    slots = rows.numel() * (length + 1)
    sums = torch.zeros(slots, dtype=x.dtype, device=x.device).index_add_(0, ids, values)
    counts = torch.zeros(slots, dtype=x.dtype, device=x.device).index_add_(0, ids, inside.reshape(-1).to(x.dtype))
    means = (sums[ids] / counts[ids].clamp(min=1)).reshape(x.shape)
    return torch.where(inside, means, 0.0)
