"""verl-style per-batch diagnostics of a correction, over masked-in tokens (`rollout_corr/...`).

    is_weight_mean/std/min/max  the coefficient that multiplies the per-token loss
    ess                         Kish effective sample size, (Σw)² / (n·Σw²), as a fraction
    token/seq_masked_fraction   units rejected by the filter or the veto
    clamped_fraction            kept tokens whose weight the clamp changed
    kl_k1, kl_k3                mean of −lr and of ρ − 1 − lr, with lr = old − roll
    chi2_token, chi2_seq        mean ρ² − 1 per token, mean ρ_seq² − 1 per sequence
    log_ppl_diff                mean over sequences of L_i / |y_i|
    max_abs_prob_diff           max |p_old − p_roll|

Every metric is formed from seventeen batch totals (sums, dot products, extremes). Those totals are
taken by one of two backends that compute the same definitions: torch for large batches, and
NumPy for small ones, where each call's fixed cost is the whole price (a train mini-batch has 512
tokens). `tests/test_metrics.py` checks the two agree on every preset, NaN/inf and empty batches
included. The totals of several groups of rows (a train step's mini-batches) come from one pass.
The fractions and ratios are then formed once, in Python, from the totals. Nothing raises: an
empty batch or all-zero weights give 0, and the KL/χ² metrics use the ±20 safety bound.
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import numpy as np
import torch

from runner.core.masking import SAFETY_BOUND, zero_padding
from runner.core.schema import CORRECTION_METRICS

METRIC_NAMES = CORRECTION_METRICS  # runner/core/schema.py: the CSV columns these become

# Up to this many [B, T] elements NumPy's ~1 µs a call beats torch's ~4 µs; beyond, torch's kernels
# win. One seq-mask-tis metrics pass, single-threaded, NumPy vs torch: 512 elements 41 vs 115 µs,
# 16384: 115 vs 163 µs, 65536: 701 vs 332 µs.
NUMPY_MAX_ELEMENTS = 16384
_NUMPY_DTYPES = (torch.float32, torch.float64)


def correction_metrics(corr, old, roll, mask, lr, raw, weight, coef, keep, backend: str = "auto") -> dict[str, float]:
    """The metrics of one evaluated correction. The arguments are apply_correction's detached
    intermediates: lr the log-ratio it used, raw / weight the coefficient before / after the
    clamp, coef after rejection, keep the [B, 1] or [B, T] survivors or None.
    `backend`: auto | torch | numpy."""
    return correction_metrics_by_group(corr, old, roll, mask, lr, raw, weight, coef, keep,
                                       groups=(slice(0, mask.shape[0]),), backend=backend)[0]


def correction_metrics_by_group(corr, old, roll, mask, lr, raw, weight, coef, keep, groups: Sequence[slice],
                                backend: str = "auto") -> list[dict[str, float]]:
    """correction_metrics of each group of rows: contiguous, non-empty slices that tile the batch
    in order (a step's mini-batches)."""
    bounds = _group_bounds(groups, mask.shape[0])
    if backend == "auto":
        small = coef.numel() <= NUMPY_MAX_ELEMENTS and coef.device.type == "cpu" and coef.dtype in _NUMPY_DTYPES
        backend = "numpy" if small else "torch"
    if backend == "numpy":
        return [_from_totals(*t) for t in _totals_numpy(corr, old, roll, mask, lr, raw, weight, coef, keep, bounds)]
    tensors = (old, roll, mask, lr, raw, weight, coef)
    with torch.no_grad():
        return [_from_totals(*_totals_torch(corr, *(t[a:b] for t in tensors), None if keep is None else keep[a:b]))
                for a, b in bounds]


def _group_bounds(groups: Sequence[slice], rows: int) -> list[tuple[int, int]]:
    bounds = [g.indices(rows)[:2] if g.step in (None, 1) else (-1, -1) for g in groups]
    edges = [0] + [b for _, b in bounds]
    if not bounds or any(a != edge or b <= a for (a, b), edge in zip(bounds, edges)) or edges[-1] != rows:
        if rows == 0 and len(groups) == 1:
            return [(0, 0)]
        raise ValueError(f"groups must be non-empty contiguous slices that tile {rows} rows in order, got {groups}")
    return bounds


def _from_totals(n, n_nonempty, sum_w, sum_w2, w_min, w_max, kept_tokens, seq_rejected, clamped, sum_lr, sum_k3,
                 sum_rho_m1_sq, sum_rho_m1, chi2_seq_sum, log_ppl_sum, lo, hi) -> dict[str, float]:
    n_safe, n_seq = max(n, 1.0), max(n_nonempty, 1.0)
    w_mean = sum_w / n_safe
    variance = sum_w2 / n_safe - w_mean * w_mean
    values = (
        w_mean,
        math.sqrt(variance) if variance > 0 else (variance if variance != variance else 0.0),
        w_min if n > 0 else 0.0,
        w_max if n > 0 else 0.0,
        # Kish ESS as a fraction; (Σw)² ≤ n·Σw², so above 1 only by float32 rounding of the sums
        min(sum_w * sum_w / (n_safe * sum_w2), 1.0) if sum_w2 > 0 else 0.0,
        (n - kept_tokens) / n_safe,
        seq_rejected / n_seq,
        clamped / n_safe,
        -sum_lr / n_safe,  # k1
        sum_k3 / n_safe,
        (sum_rho_m1_sq + 2 * sum_rho_m1) / n_safe,  # χ² = mean(ρ²) − 1 = mean((ρ−1)² + 2(ρ−1))
        chi2_seq_sum / n_seq,
        log_ppl_sum / n_seq,
        max(hi, -lo),
    )
    return dict(zip(METRIC_NAMES, values))


def _totals_torch(corr, old, roll, mask, lr, raw, weight, coef, keep) -> list[float]:
    """The totals as torch reductions, leaving torch in one `.tolist()`. Most [B, T] temporaries
    are written into one scratch tensor (a fresh 1 MiB tensor can cost more in page faults than
    its arithmetic), masks multiply rather than select, and no bool tensor meets a float one in
    an arithmetic op (CPU torch's mixed-dtype kernels are ~10x slower than float ones)."""
    dtype = coef.dtype
    seq_len = mask.sum(-1)
    nonempty = (seq_len > 0).to(dtype)
    n_tok = seq_len.sum()
    zero = torch.zeros((), dtype=dtype)
    scratch = torch.empty(mask.shape, dtype=dtype)

    # Weights: under padding=ignore the coefficient already is exactly 0 at padding.
    w = (coef if corr.padding == "ignore" else zero_padding(coef, mask)).reshape(-1)
    if w.numel():
        w_max = w.max()  # coefficients are ≥ 0, so the zeros at padding never win
        if bool(torch.isfinite(w_max)):
            # shift every weight below 0 and mask: padding stays 0, the minimum is a masked-in one
            shift = w_max + 1
            w_min = torch.sub(w, shift, out=scratch.view(-1)).mul_(mask.reshape(-1)).min() + shift
        else:  # an inf weight would turn the shift into NaN
            w_min = torch.where(mask.reshape(-1) > 0, w, math.inf).min()
    else:
        w_min = w_max = n_tok
    totals = [n_tok, nonempty.sum(), w.sum(), torch.dot(w, w), w_min, w_max]
    del w

    # Rejections and clamps (1.0 where the clamp changed a masked-in token's weight), counted per
    # sequence when the filter is a sequence filter.
    changed = torch.ne(weight, raw, out=scratch).mul_(mask) if corr.weight_op != "raw" else None
    if keep is None:
        kept_tokens, seq_rejected = n_tok, zero
        clamped = changed.sum() if changed is not None else zero
    elif keep.shape[-1] == 1:
        kept_seq = keep.reshape(-1).to(dtype)
        kept_tokens = torch.dot(seq_len, kept_seq)
        seq_rejected = torch.dot(nonempty, 1 - kept_seq)
        clamped = torch.dot(changed.sum(-1), kept_seq) if changed is not None else zero
    else:
        kept = keep.to(dtype).mul_(mask)
        kept_tokens = kept.sum()
        seq_rejected = torch.dot(nonempty, (kept.sum(-1) == 0).to(dtype))
        clamped = torch.dot(kept.reshape(-1), changed.reshape(-1)) if changed is not None else zero
        del kept
    del changed
    totals += [kept_tokens, seq_rejected, clamped]

    # Mismatch diagnostics use the decoupled log-ratio old − roll (0 at padding), whatever the
    # ratio base; expm1 keeps k3 and χ² accurate for tiny mismatches, where ρ − 1 would cancel.
    lr_dec = lr if _reuses_lr(corr) else zero_padding(old - roll, mask)
    L = lr_dec.sum(-1)  # the sequence log-ratios
    lo_lr, hi_lr = torch.aminmax(lr_dec) if lr_dec.numel() else (zero, zero)
    within = bool((hi_lr <= SAFETY_BOUND) & (lo_lr >= -SAFETY_BOUND))
    lr_safe = lr_dec if within else lr_dec.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    del lr_dec
    rho_m1 = torch.expm1(lr_safe)
    flat = rho_m1.reshape(-1)
    # k3 per token before summing: a difference of two large sums would cancel a tiny k3 away
    k3 = torch.sub(rho_m1, lr_safe, out=scratch)
    totals += [L.sum(), k3.sum(), torch.dot(flat, flat), flat.sum()]
    del lr_safe, flat, k3
    per_seq_chi2 = torch.expm1(2 * L.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    totals += [torch.dot(per_seq_chi2, nonempty), torch.dot(L / seq_len.clamp(min=1), nonempty)]

    # p_old − p_roll = p_roll·(ρ − 1): when ρ − 1 above is exactly expm1(old − roll), one exp
    # instead of two, and no cancellation between two nearly equal probabilities
    if within and _reuses_lr(corr):
        prob_diff = torch.exp(roll, out=scratch).mul_(rho_m1)
    else:
        prob_diff = torch.exp(old, out=scratch).sub_(torch.exp(roll))
    del rho_m1
    if bool(torch.isfinite(prob_diff.sum())):
        prob_diff.mul_(mask)
    else:
        prob_diff = torch.where(mask > 0, prob_diff, 0.0).nan_to_num_(nan=0.0)
    lo, hi = torch.aminmax(prob_diff) if prob_diff.numel() else (zero, zero)
    del prob_diff, scratch
    totals += [lo, hi]
    return torch.stack(totals).tolist()


def _totals_numpy(corr, old, roll, mask, lr, raw, weight, coef, keep, bounds) -> list[list[float]]:
    """The totals of every group, from NumPy views of the tensors (no copy), in as few calls as
    the definitions allow: each per-token quantity is a row of one [K, B, T] array, a product with
    a vector of ones (BLAS, ~4× faster than .sum(-1) at this size) gives the per-sequence sums,
    the per-sequence quantities join them as more rows, and one reduceat sums every group."""
    arrays = old.numpy(), roll.numpy(), mask.numpy(), lr.numpy(), raw.numpy(), weight.numpy(), coef.numpy()
    B, T = arrays[2].shape  # apply_correction's intermediates are detached, so .numpy() is a view
    if B * T == 0:  # nothing is masked in: every total is 0
        return [[0.0] * 17 for _ in bounds]
    keep = None if keep is None else keep.numpy()
    with np.errstate(all="ignore"):  # NaN/inf are data here (the faithful presets make them)
        # First without the ±20 bound on lr: k3_t = e^lr − 1 − lr exceeds 19 wherever |lr| > 20,
        # so a k3 total of at most 19 proves the bound changed nothing; else, bounded this time.
        totals = _numpy_pass(corr, *arrays, keep, bounds, bound_lr=False)
        if not sum(t[5] for t in totals) <= 19.0:
            totals = _numpy_pass(corr, *arrays, keep, bounds, bound_lr=True)
    out = []
    for g, (n_tok, sum_w, sum_w2, sum_lr, sum_rho_m1, sum_k3, sum_rho_m1_sq, *rest) in enumerate(totals):
        clamped = rest[0] if corr.weight_op != "raw" else 0.0
        n_nonempty, chi2_seq, log_ppl_sum, seq_rejected, n_kept, w_max, neg_w_min, diff_max = rest[-8:]
        out.append([n_tok, n_nonempty, sum_w, sum_w2, -neg_w_min, w_max, n_kept, seq_rejected, clamped, sum_lr,
                    sum_k3, sum_rho_m1_sq, sum_rho_m1, chi2_seq, log_ppl_sum, -diff_max, diff_max])
    return out


def _numpy_pass(corr, old, roll, mask, lr, raw, weight, coef, keep, bounds, bound_lr: bool) -> list[list[float]]:
    """Per group: the per-token sums (rows below), then nonempty sequences, Σχ²_i, Σ L_i/|y_i|,
    rejected sequences, kept tokens, then max w, max −w and max |p_old − p_roll| (masked-in)."""
    B, T = mask.shape
    starts = [a for a, _ in bounds]
    w = coef if corr.padding == "ignore" else _np_zero_padding(coef, mask)
    lr_dec = lr if _reuses_lr(corr) else _np_zero_padding(old - roll, mask)
    lr_safe = np.minimum(np.maximum(lr_dec, -SAFETY_BOUND), SAFETY_BOUND) if bound_lr else lr_dec

    # per-token rows: tokens, w, w², lr, ρ−1, ρ−1−lr (k3), (ρ−1)², then the clamped tokens and, for
    # a token filter, the kept ones; every row is 0 at padding (w and lr are, and expm1(0) = 0)
    token_keep = keep is not None and keep.shape[-1] != 1
    clamps = corr.weight_op != "raw"
    K = 7 + clamps + token_keep
    # float64 rows: the sums are exact enough that equal weights give mean = max and ESS = 1
    rows = np.empty((K, B, T), dtype=np.float64)
    rows[0], rows[1], rows[3] = mask, w, lr_dec
    np.multiply(w, w, out=rows[2])
    rho_m1 = np.expm1(lr_safe, out=rows[4])
    np.subtract(rho_m1, lr_safe, out=rows[5])
    np.multiply(rho_m1, rho_m1, out=rows[6])
    kept = np.multiply(mask, keep, out=rows[K - 1]) if token_keep else mask
    if clamps:
        np.multiply(weight != raw, kept, out=rows[7])

    # per-sequence rows: the sums above, then nonempty, χ²_i, L_i/|y_i|, rejected, kept tokens
    per_seq = np.empty((K + 5, B), dtype=np.float64)
    np.matmul(rows, _ones(T, np.float64), out=per_seq[:K])
    seq_len, L = per_seq[0], per_seq[3]
    nonempty, chi2, log_ppl, rejected, kept_per_seq = per_seq[K:]
    np.greater(seq_len, 0, out=nonempty)
    # an empty sequence has L_i = 0 (lr is 0 at padding), so both terms are 0 there already
    np.expm1(2 * np.minimum(np.maximum(L, -SAFETY_BOUND), SAFETY_BOUND), out=chi2)
    np.divide(L, np.maximum(seq_len, 1), out=log_ppl)
    if keep is None:
        kept_per_seq[:] = seq_len
        rejected[:] = 0.0
    elif token_keep:
        kept_per_seq[:] = per_seq[K - 1]
        np.logical_and(nonempty, kept_per_seq == 0, out=rejected)
    else:  # a sequence filter: its verdict scales the per-sequence sums
        keep_seq = keep.reshape(-1)
        np.multiply(seq_len, keep_seq, out=kept_per_seq)
        np.greater(nonempty, keep_seq, out=rejected)  # a non-empty sequence the filter dropped
        if clamps:
            per_seq[7] *= keep_seq

    # extremes over masked-in tokens as maxima of one [3, B·T] array: w, −w (−inf at padding) and
    # |p_old − p_roll| (0 at padding); weights are ≥ 0, so a 0 at padding never wins the first.
    # p_old − p_roll = p_roll·(ρ − 1) when the ρ − 1 above is expm1(old − roll) itself: one exp
    # instead of two, and no cancellation. A group's rows are one contiguous run of B·T, and one
    # reduceat over runs is ~8× faster than a max over the short last axis.
    extremes = np.empty((3, B, T), dtype=coef.dtype)
    extremes[0] = w
    np.negative(w, out=extremes[1])
    if not bound_lr and _reuses_lr(corr):
        np.multiply(np.exp(roll), rho_m1, out=extremes[2])
    else:
        np.subtract(np.exp(old), np.exp(roll), out=extremes[2])
    np.abs(extremes[2], out=extremes[2])
    if per_seq[0].sum() < mask.size:  # padding is present
        padding = mask == 0
        extremes[1][padding] = -np.inf
        extremes[2][padding] = 0.0
    runs = [a * T for a in starts]
    maxima = np.maximum.reduceat(extremes.reshape(3, -1), runs, axis=1)
    if not np.isfinite(maxima[2]).all():  # as _totals_torch: a NaN counts as 0, an inf as the largest float
        cleaned = np.nan_to_num(np.where(mask > 0, extremes[2], 0.0).astype(coef.dtype), nan=0.0)
        maxima[2] = np.maximum.reduceat(cleaned.reshape(-1), runs)
    return np.concatenate([np.add.reduceat(per_seq, starts, axis=1), maxima]).T.tolist()


@functools.lru_cache(maxsize=64)
def _ones(n: int, dtype: np.dtype) -> np.ndarray:
    """A read-only vector of n ones (for per-sequence sums as one BLAS product)."""
    ones = np.ones(n, dtype=dtype)
    ones.flags.writeable = False
    return ones


def _reuses_lr(corr) -> bool:
    """The correction's own log-ratio already is old − roll with padding at 0."""
    return corr.ratio == "decoupled" and corr.padding in ("ignore", "zero-logratio")


def _np_zero_padding(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return x * mask if np.isfinite(x.sum()) else np.where(mask > 0, x, 0.0).astype(x.dtype)
