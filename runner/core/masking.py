"""Exact zeroing of masked-out entries: the one place the algebra, the losses and the metrics
make padding (or a rejected unit) exactly 0, so NaN/inf there never leaks into a value or a gradient.
"""

from __future__ import annotations

import torch

# verl's and SkyRL's safety bound on log-ratios; the metrics use it too, so they stay finite.
SAFETY_BOUND = 20.0


def zero_where_not(x: torch.Tensor, keep: torch.Tensor, keep_float: torch.Tensor | None = None) -> torch.Tensor:
    """x where `keep`, exactly 0 elsewhere, with no NaN from 0·inf and no gradient leaking out.

    On CPU torch.where is ~25x slower than a multiply (bool kernels), and a multiply is only safe
    when x is finite: one sum tells (a NaN or ±inf anywhere makes it non-finite; an overflow of
    finite values merely takes the where). Both branches give the same numbers."""
    if bool(torch.isfinite(x.detach().sum())):
        return x * (keep.to(x.dtype) if keep_float is None else keep_float)
    return torch.where(keep.bool() if keep.dtype != torch.bool else keep, x, 0.0)


def zero_padding(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x with masked-out entries exactly 0: NaN/inf padding leaks into neither the value nor a
    gradient. The boolean mask is only built on the (rare) non-finite path."""
    if bool(torch.isfinite(x.detach().sum())):
        return x * mask
    return torch.where(mask > 0, x, 0.0)


def shuffled_keep(keep: torch.Tensor, mask: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A random control for a filter: the same number of kept units as `keep`, at positions drawn at random
    (a uniform random permutation of keep's values), independent of the statistic the filter read.
    keep [B, 1] (a sequence filter): permuted over the sequences that have a masked-in token; keep [B, T]
    (a token filter): over the masked-in tokens. Units outside the mask keep their value."""
    live = (mask.sum(-1, keepdim=True) > 0) if keep.shape[-1] == 1 else mask > 0
    live = live.expand_as(keep)
    values = keep[live]
    order = torch.rand(values.shape, generator=generator, device=values.device).argsort()
    out = keep.clone()
    out[live] = values[order]
    return out
