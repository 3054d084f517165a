"""The algebra's steps that one or two frameworks add beside the spec's table, each as its framework writes
it; runner/core/corrections.py calls them in its order of operations (its docstring lists each field):

    statistics   token_statistic (verl's k2 / k3), kl_filter_keep (AReaL's k1 / k2 / k3 of the raw lr_t),
                 sequence_max (verl) and masked_max (AReaL): a sequence's largest statistic
    bands        band_keep, with SkyRL's NaN-keeping test; in_diff_band on probability_difference (ROLL)
    normalising  batch_normalized (verl, the whole batch) and self_normalized (slime, per call)
    early masks  early_masks: M2PO (m2po_keep, AReaL), the two-sided veto and the token mask, in SkyRL's order
    OPSM         off_policy_sequence_keep (TRL's and slime's off-policy sequence mask)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from runner.core.masking import zero_padding
from runner.core.segments import segment_mean

# `corr` is a runner.core.corrections.Correction, which imports this module
Correction = Any


SELF_NORMALIZE_MIN_MEAN = 1e-8


def token_statistic(lr: torch.Tensor, statistic: str) -> torch.Tensor:
    """What one token contributes to the filter. k2 and k3 are written as verl writes them (k3 as
    exp(x) − 1 − x, not expm1), so that a threshold decides the same tokens to the last bit."""
    if statistic == "k2":
        return 0.5 * lr**2
    if statistic == "k3":
        return torch.exp(lr) - 1.0 - lr
    return lr


def sequence_max(stat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, 1]: the largest statistic over a sequence's masked-in tokens, 0 for an empty sequence (verl's
    sequence_max), and for one whose every statistic is −inf, where AReaL's agg=max (masked_max) keeps
    −inf; a NaN among them makes it NaN, so the sequence is rejected."""
    top = stat.masked_fill(mask <= 0, -math.inf).amax(-1, keepdim=True)
    return torch.where(top == -math.inf, 0.0, top)


def batch_normalized(weight: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """The weight over its batch mean, as verl's rollout_is_batch_normalize computes it: the masked token
    mean for token weights, the mean over non-empty sequences of each sequence's weight otherwise, each
    masked mean a sum over count + 1e-8 (verl's masked_mean); NaN at padding is left out of the sums. A
    mean that is not above 1e-8 (an all-zero or NaN batch) leaves the weight as it is."""
    inside = mask > 0
    masked = torch.where(inside, weight, 0.0) * mask
    if level == "token":
        mean = masked.sum() / (mask.sum() + 1e-8)
    else:
        per_seq = masked.sum(-1) / (mask.sum(-1) + 1e-8)
        nonempty = (mask.sum(-1) > 0).to(weight.dtype)
        mean = (per_seq * nonempty).sum() / nonempty.sum().clamp_min(1e-8)
    return weight / mean if bool(mean > 1e-8) else weight


def off_policy_sequence_keep(corr: Correction, lp, old, roll, adv, mask) -> torch.Tensor:
    """[B, T] bool: DeepSeek-V3.2's off-policy sequence mask. A token is dropped when its advantage is negative
    and its sequence's drift, the masked mean (count clamped to 1) of ref − lp (the current policy, detached;
    ref = roll or old by opsm_reference), exceeds δ; the advantage is read per token, so a sequence-level
    advantage broadcast over its tokens decides the whole sequence. opsm_nan: zero, as TRL 1.16.0's
    get_off_policy_mask: each token's difference through nan_to_num(nan=0), which also maps ±inf to the
    dtype's extremes, so padding never reaches the sum; keep, as slime's compute_opsm_mask: the differences
    multiplied by the mask (zeroed under padding: ignore), and a NaN drift is never above δ, so it keeps the
    sequence."""
    ref = roll if corr.opsm_reference == "roll" else old
    diff = ref.detach() - lp.detach()
    if corr.opsm_nan == "zero":
        diff = torch.nan_to_num(diff, nan=0.0) * mask
    else:
        diff = zero_padding(diff, mask) if corr.padding == "ignore" else diff * mask
    drift = diff.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)
    adv = adv.detach()
    if corr.opsm_nan == "zero":  # TRL keeps what passes: a NaN drift (inf − inf) or advantage is dropped
        return (adv >= 0) | (drift <= corr.opsm_delta)
    return ~((adv < 0) & (drift > corr.opsm_delta))  # slime drops what fails: a NaN is kept


def band_keep(value: torch.Tensor, lo: float | None, hi: float | None, nan: str = "reject") -> torch.Tensor:
    # NaN statistics fail every comparison, so they are rejected, as in the released code; SkyRL tests
    # "not outside" instead, which a NaN passes (filter_nan: keep).
    if lo is not None and hi is not None:
        inside = (value >= lo) & (value <= hi)
    elif lo is not None:
        inside = value >= lo
    elif hi is not None:
        inside = value <= hi
    else:
        inside = value == value  # no band: keep everything that is not NaN
    return inside | torch.isnan(value) if nan == "keep" else inside


def probability_difference(corr: Correction, old, roll, mask, lp=None) -> torch.Tensor:
    """Δp_t = exp(base) − exp(roll), detached, base as in mismatch_log_ratio; exactly 0 at masked positions
    under `padding: ignore` (and zero-logratio), so NaN padding never reaches a statistic."""
    base = lp if corr.ratio == "bypass" else old
    if base is None:
        raise ValueError("a bypass correction needs lp")
    diff = torch.exp(base.detach()) - torch.exp(roll.detach())
    if corr.padding in ("ignore", "zero-logratio"):
        diff = zero_padding(diff, mask)
    return diff


def in_diff_band(corr: Correction, old, roll, mask, lp) -> torch.Tensor:
    """Which units' probability difference lies in [diff_low, diff_high]: [B, T] for the token and segment
    levels, [B, 1] for the sequence (masked sum) and geometric (masked mean) ones. NaN fails the band."""
    diff = probability_difference(corr, old, roll, mask, lp)
    if corr.diff_filter == "token":
        stat = diff
    elif corr.diff_filter == "segment":
        stat = segment_mean(diff, mask)
    else:
        stat = (diff * mask).sum(-1, keepdim=True)
        if corr.diff_filter == "geometric":
            stat = stat / mask.sum(-1, keepdim=True).clamp(min=1)
    passed = stat == stat
    if corr.diff_low is not None:
        passed = passed & (stat >= corr.diff_low)
    if corr.diff_high is not None:
        passed = passed & (stat <= corr.diff_high)
    return passed


def self_normalized(weight: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """weight / its batch mean. The mean multiplies by the mask, so a NaN at padding makes it NaN, and then,
    as in slime, nothing is divided."""
    masked = weight * mask
    if level == "token":
        mean = masked.sum() / mask.sum().clamp(min=1)
    else:
        mean = (masked.sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    return weight / mean if mean > SELF_NORMALIZE_MIN_MEAN else weight


@dataclass
class EarlyMasks:
    keep: torch.Tensor  # [B, T] bool: survived the M2 mask, the veto (both sides) and the token mask
    stats_mask: torch.Tensor  # the action mask times those, in SkyRL's order (the float products it takes)
    m2_keep: torch.Tensor | None  # M2PO's survivors, which also leave AReaL's token count


def raw_log_ratio(corr: Correction, old, roll, lp) -> torch.Tensor:
    """lr_t before any nonfinite or padding treatment: AReaL's KL estimators and its M2PO read this."""
    base = lp if corr.ratio == "bypass" else old
    return base.detach() - roll.detach()


def early_masks(corr: Correction, old, roll, mask, lr, lp) -> EarlyMasks:
    inside = mask > 0
    keep = torch.ones_like(inside)
    stats_mask = mask
    m2_keep = None
    if corr.m2_threshold is not None:
        m2_keep = m2po_keep(raw_log_ratio(corr, old, roll, lp), inside, corr.m2_threshold)
        keep = keep & m2_keep
        stats_mask = stats_mask * m2_keep.to(mask.dtype)
    if corr.veto_high is not None:
        # with `veto`, SkyRL's outlier mask: a sequence with any token outside [veto, veto_high] is rejected
        # (the low side is the veto below, also over the original mask); NaN is neither above nor below
        over = ((lr > math.log(corr.veto_high) if corr.veto_high > 0 else lr > -math.inf) & inside).any(
            -1, keepdim=True
        )
        keep = keep & ~over
    if corr.veto is not None and corr.statistics_mask == "masked":
        threshold = math.log(corr.veto) if corr.veto > 0 else -math.inf
        under = ((lr < threshold) & inside).any(-1, keepdim=True)
        keep = keep & ~under
    if corr.statistics_mask == "masked":
        stats_mask = stats_mask * keep.to(mask.dtype)  # the sequences the veto rejected leave every sum
    if corr.token_mask_low is not None or corr.token_mask_high is not None:
        in_band = band_keep(torch.exp(lr), corr.token_mask_low, corr.token_mask_high)
        token_keep = in_band | ~inside
        keep = keep & token_keep
        stats_mask = stats_mask * token_keep.to(mask.dtype)
    return EarlyMasks(keep=keep, stats_mask=stats_mask, m2_keep=m2_keep)


def m2po_keep(lr: torch.Tensor, inside: torch.Tensor, threshold: float) -> torch.Tensor:
    """M2PO's token mask (AReaL's m2_threshold): sort the masked-in lr_t² of the whole batch from the largest
    (a NaN sorts first), drop the first k, k the first index where the mean of the rest is under the
    threshold (every one but the smallest if none is). The sums run as suffix sums of the sorted values,
    from the smallest, so the cut is the same float for float."""
    m2 = lr * lr
    everywhere = bool(inside.all())  # no padding: skip the boolean gather and scatter
    selected = m2.reshape(-1) if everywhere else m2[inside]
    n = selected.numel()
    if n == 0:
        return torch.ones_like(inside)
    ordered = _descending(selected)
    tail_means = ordered.flip(0).cumsum(0).flip(0) / torch.arange(n, 0, -1, dtype=ordered.dtype)
    under = torch.nonzero(tail_means < threshold)
    n_drop = int(under[0, 0]) if len(under) else n - 1
    kept = _kept_after_dropping(selected, ordered, n_drop)
    if everywhere:
        return kept.reshape(inside.shape)
    keep = torch.ones_like(inside)
    keep[inside] = kept
    return keep


def _descending(values: torch.Tensor) -> torch.Tensor:
    """The values sorted from the largest, NaN first, as torch.sort(descending=True) orders them. Only the
    values: equal values are interchangeable in the suffix sums. NumPy's sort on a CPU tensor (SIMD-sorted,
    about 20x faster than torch's CPU sort at 16k values), ascending with NaN last, then reversed."""
    if values.device.type != "cpu":
        return torch.sort(values, descending=True).values
    import numpy as np

    return torch.from_numpy(np.sort(values.numpy())[::-1].copy())


def _kept_after_dropping(selected: torch.Tensor, ordered: torch.Tensor, n_drop: int) -> torch.Tensor:
    """Which of `selected` survive when the first n_drop of its descending order are dropped. Unless the cut
    splits a run of equal values, that is every value above the first one kept (and every NaN); where it
    does, which of the equal values go is torch.sort's order, so torch.sort decides, as in AReaL."""
    n = selected.numel()
    if n_drop == 0:
        return torch.ones(n, dtype=torch.bool, device=selected.device)
    last_dropped, first_kept = ordered[n_drop - 1], ordered[n_drop]
    if bool((last_dropped == first_kept) | (last_dropped.isnan() & first_kept.isnan())):
        _, order = torch.sort(selected, descending=True)
        kept = torch.ones(n, dtype=torch.bool, device=selected.device)
        kept[order[:n_drop]] = False
        return kept
    return ~((selected > first_kept) | selected.isnan())


def masked_max(stat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The largest masked-in statistic of each sequence, 0 for a sequence with none (AReaL's agg=max)."""
    inside = mask > 0
    top = stat.masked_fill(~inside, -math.inf).max(-1, keepdim=True)[0]
    return torch.where(inside.any(-1, keepdim=True), top, torch.zeros_like(top))


def kl_filter_keep(corr: Correction, old, roll, mask, lp, bounds=None) -> torch.Tensor:
    """AReaL's rejection on a KL estimator of the raw log-ratio: per token, or summed / averaged / maximised
    over the masked-in tokens (padding removed by a where), kept inside [low, high] as it is. `bounds`:
    corrections.Bands.bounds, for every band at once."""
    lr = raw_log_ratio(corr, old, roll, lp)
    if corr.filter_metric == "k1":
        kl = lr
    elif corr.filter_metric == "k2":
        kl = lr**2 / 2.0
    else:
        neg = -lr
        kl = neg.exp() - 1 - neg
    if corr.filter == "token":
        stat = kl
    elif corr.filter == "max":
        stat = masked_max(kl, mask)
    else:
        stat = torch.where(mask > 0, kl, 0.0).sum(-1, keepdim=True)
        if corr.filter == "geometric":
            stat = stat / mask.sum(-1, keepdim=True).clamp(min=1)
    low, high = (corr.low, corr.high) if bounds is None else bounds(stat)
    return band_keep(stat, low, high, corr.filter_nan)
