"""The per-batch diagnostics of a correction, over masked-in tokens: the diagnostics verl logs under
rollout_corr/, named flat here; docs/metrics.md maps them. With w the coefficient that multiplies the
per-token loss, lr = old − roll, ρ = e^lr, L_i = Σ_t lr_t and |y_i| a sequence's masked-in tokens:

    is_weight_mean/std/min/max  of w
    ess                         Kish effective sample size, (Σw)² / (n·Σw²), as a fraction
    token/seq_masked_fraction   units rejected by the filter or the veto
    clamped_fraction            kept tokens whose weight the clamp changed
    kl_k1, kl_k3                mean of −lr and of ρ − 1 − lr
    chi2_token, chi2_seq        mean ρ² − 1 per token, mean ρ_seq² − 1 = e^(2·L_i) − 1 per sequence
    log_ppl_diff                mean over sequences of L_i / |y_i|
    max_abs_prob_diff           max |p_old − p_roll|

Every metric is formed from a group of rows' `Totals` (sums, dot products, extremes, named as above), by
`metrics_from_totals`, in that order. Nothing raises: an empty batch or all-zero weights give 0, and the KL/χ²
metrics use the ±20 safety bound on lr.

The totals are taken by one of two backends under the same names: `_totals_torch`, and `_totals_numpy` for
batches up to NUMPY_MAX_ELEMENTS on the CPU, which is every default run's (a step's 1024 to 4096 token slots).
The NumPy one stays for two reasons. The runs' metrics.csv are its bytes, and torch cannot reproduce them: its
float32 exp and expm1 round differently from NumPy's on 39% and 9% of inputs (2·10⁶ N(0, 9) draws, torch 2.13,
NumPy 2.4), and NumPy's sums are float64 over float32 products, so the torch totals, float32 or float64, change
the pinned runs' metrics.csv (tests/test_behaviour_unchanged.py, bigram and mlp tis-tames-mismatch tried). And
it is cheaper where it runs: a step's metrics cost 4.6x, 6.2x and 5.9x as much through torch at bigram's, mlp's
and the transformer's default sizes (bigram: 2.6 vs 0.55 ms, of a 7 to 25 ms step on the shared 2-core machine;
scripts/bench_metrics.py, per call). `tests/test_metrics.py` checks the two agree on every preset, NaN/inf and
empty batches included.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields

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


@dataclass(frozen=True)
class Totals:
    """What every metric of one group of rows is formed from; sums and extremes over masked-in tokens."""

    tokens: float  # n
    sequences: float  # non-empty sequences (at least one masked-in token)
    sum_w: float  # Σ w
    sum_w2: float  # Σ w²
    min_w: float
    max_w: float
    kept_tokens: float  # tokens that survived the filter and the veto
    rejected_sequences: float  # non-empty sequences the filter or the veto dropped
    clamped_tokens: float  # kept tokens whose weight the clamp changed (0 without a clamp)
    sum_lr: float  # Σ lr
    sum_k3: float  # Σ ρ − 1 − lr
    sum_rho_m1_sq: float  # Σ (ρ − 1)²
    sum_rho_m1: float  # Σ ρ − 1
    sum_chi2_seq: float  # Σ_i e^(2·L_i) − 1, over non-empty sequences
    sum_log_ppl: float  # Σ_i L_i / |y_i|, over non-empty sequences
    max_abs_prob_diff: float  # max |p_old − p_roll|; NaN counts as 0


TOTALS = tuple(f.name for f in fields(Totals))
NO_TOTALS = Totals(**dict.fromkeys(TOTALS, 0.0))  # an empty batch


def metrics_from_totals(t: Totals) -> dict[str, float]:
    """The module docstring's definitions, as ratios of totals; an empty batch or group gives 0, not 0/0."""
    n, sequences = max(t.tokens, 1.0), max(t.sequences, 1.0)
    mean = t.sum_w / n
    variance = t.sum_w2 / n - mean * mean  # can round below 0; NaN stays NaN
    return {
        "is_weight_mean": mean,
        "is_weight_std": math.sqrt(variance) if variance > 0 else (variance if math.isnan(variance) else 0.0),
        "is_weight_min": t.min_w if t.tokens > 0 else 0.0,
        "is_weight_max": t.max_w if t.tokens > 0 else 0.0,
        # (Σw)² ≤ n·Σw², so above 1 only by rounding of the sums
        "ess": min(t.sum_w * t.sum_w / (n * t.sum_w2), 1.0) if t.sum_w2 > 0 else 0.0,
        "token_masked_fraction": (t.tokens - t.kept_tokens) / n,
        "seq_masked_fraction": t.rejected_sequences / sequences,
        "clamped_fraction": t.clamped_tokens / n,
        "kl_k1": -t.sum_lr / n,
        "kl_k3": t.sum_k3 / n,
        "chi2_token": (t.sum_rho_m1_sq + 2 * t.sum_rho_m1) / n,  # mean(ρ²) − 1 = mean((ρ−1)² + 2(ρ−1))
        "chi2_seq": t.sum_chi2_seq / sequences,
        "log_ppl_diff": t.sum_log_ppl / sequences,
        "max_abs_prob_diff": t.max_abs_prob_diff,
    }


def correction_metrics(corr, old, roll, mask, lr, raw, weight, coef, keep, backend: str = "auto") -> dict[str, float]:
    """The metrics of one evaluated correction. The arguments are apply_correction's detached
    intermediates: lr the log-ratio it used, raw / weight the coefficient before / after the
    clamp, coef after rejection, keep the [B, 1] or [B, T] survivors or None.
    `backend`: auto | torch | numpy."""
    return correction_metrics_by_group(
        corr, old, roll, mask, lr, raw, weight, coef, keep, groups=(slice(0, mask.shape[0]),), backend=backend
    )[0]


def correction_metrics_by_group(
    corr, old, roll, mask, lr, raw, weight, coef, keep, groups: Sequence[slice], backend: str = "auto"
) -> list[dict[str, float]]:
    """correction_metrics of each group of rows: contiguous, non-empty slices that tile the batch
    in order (a step's mini-batches)."""
    bounds = _group_bounds(groups, mask.shape[0])
    if backend == "auto":
        small = coef.numel() <= NUMPY_MAX_ELEMENTS and coef.device.type == "cpu" and coef.dtype in _NUMPY_DTYPES
        backend = "numpy" if small else "torch"
    if backend == "numpy":
        totals = _totals_numpy(corr, old, roll, mask, lr, raw, weight, coef, keep, bounds)
    else:
        tensors = (old, roll, mask, lr, raw, weight, coef)
        with torch.no_grad():
            totals = [
                _totals_torch(corr, *(t[a:b] for t in tensors), None if keep is None else keep[a:b]) for a, b in bounds
            ]
    return [metrics_from_totals(t) for t in totals]


def _group_bounds(groups: Sequence[slice], rows: int) -> list[tuple[int, int]]:
    bounds = [g.indices(rows)[:2] if g.step in (None, 1) else (-1, -1) for g in groups]
    edges = [0] + [b for _, b in bounds]
    if not bounds or any(a != edge or b <= a for (a, b), edge in zip(bounds, edges)) or edges[-1] != rows:
        if rows == 0 and len(groups) == 1:
            return [(0, 0)]
        raise ValueError(f"groups must be non-empty contiguous slices that tile {rows} rows in order, got {groups}")
    return bounds


def _totals_torch(corr, old, roll, mask, lr, raw, weight, coef, keep) -> Totals:
    """The totals as torch reductions, leaving torch in one `.tolist()`. Most [B, T] temporaries
    are written into one scratch tensor (a fresh 1 MiB tensor can cost more in page faults than
    its arithmetic), masks multiply rather than select, and no bool tensor meets a float one in
    an arithmetic op (CPU torch's mixed-dtype kernels are ~10x slower than float ones)."""
    dtype = coef.dtype
    seq_len = mask.sum(-1)
    nonempty = (seq_len > 0).to(dtype)
    tokens = seq_len.sum()
    zero = torch.zeros((), dtype=dtype)
    scratch = torch.empty(mask.shape, dtype=dtype)

    # The weights: under padding=ignore the coefficient already is exactly 0 at padding.
    w = (coef if corr.padding == "ignore" else zero_padding(coef, mask)).reshape(-1)
    if w.numel():
        max_w = w.max()  # coefficients are ≥ 0, so the zeros at padding never win
        if bool(torch.isfinite(max_w)):
            # shift every weight below 0 and mask: padding stays 0, the minimum is a masked-in one
            shift = max_w + 1
            min_w = torch.sub(w, shift, out=scratch.view(-1)).mul_(mask.reshape(-1)).min() + shift
        else:  # an inf weight would turn the shift into NaN
            min_w = torch.where(mask.reshape(-1) > 0, w, math.inf).min()
    else:
        min_w = max_w = tokens
    sum_w, sum_w2 = w.sum(), torch.dot(w, w)
    del w

    # Rejections and clamps (1.0 where the clamp changed a masked-in token's weight), counted per
    # sequence when the filter is a sequence filter.
    changed = torch.ne(weight, raw, out=scratch).mul_(mask) if corr.weight_op != "raw" else None
    if keep is None:
        kept_tokens, rejected_sequences = tokens, zero
        clamped_tokens = changed.sum() if changed is not None else zero
    elif keep.shape[-1] == 1:
        kept_seq = keep.reshape(-1).to(dtype)
        kept_tokens = torch.dot(seq_len, kept_seq)
        rejected_sequences = torch.dot(nonempty, 1 - kept_seq)
        clamped_tokens = torch.dot(changed.sum(-1), kept_seq) if changed is not None else zero
    else:
        kept = keep.to(dtype).mul_(mask)
        kept_tokens = kept.sum()
        rejected_sequences = torch.dot(nonempty, (kept.sum(-1) == 0).to(dtype))
        clamped_tokens = torch.dot(kept.reshape(-1), changed.reshape(-1)) if changed is not None else zero
        del kept
    del changed

    # The mismatch: the decoupled log-ratio old − roll (0 at padding), whatever the correction's
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
    sum_lr, sum_k3, sum_rho_m1_sq, sum_rho_m1 = L.sum(), k3.sum(), torch.dot(flat, flat), flat.sum()
    del lr_safe, flat, k3
    chi2_seq = torch.expm1(2 * L.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    sum_chi2_seq, sum_log_ppl = torch.dot(chi2_seq, nonempty), torch.dot(L / seq_len.clamp(min=1), nonempty)

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

    named = {
        "tokens": tokens,
        "sequences": nonempty.sum(),
        "sum_w": sum_w,
        "sum_w2": sum_w2,
        "min_w": min_w,
        "max_w": max_w,
        "kept_tokens": kept_tokens,
        "rejected_sequences": rejected_sequences,
        "clamped_tokens": clamped_tokens,
        "sum_lr": sum_lr,
        "sum_k3": sum_k3,
        "sum_rho_m1_sq": sum_rho_m1_sq,
        "sum_rho_m1": sum_rho_m1,
        "sum_chi2_seq": sum_chi2_seq,
        "sum_log_ppl": sum_log_ppl,
        "min_prob_diff": lo,
        "max_prob_diff": hi,
    }
    values = dict(zip(named, torch.stack(list(named.values())).tolist()))
    min_prob_diff, max_prob_diff = values.pop("min_prob_diff"), values.pop("max_prob_diff")
    return Totals(**values, max_abs_prob_diff=max(max_prob_diff, -min_prob_diff))


def _totals_numpy(corr, old, roll, mask, lr, raw, weight, coef, keep, bounds) -> list[Totals]:
    """The totals of every group, from NumPy views of the tensors (no copy), in as few calls as
    the definitions allow: each per-token quantity is a row of one [K, B, T] array, a product with
    a vector of ones (BLAS, ~4× faster than .sum(-1) at this size) gives the per-sequence sums,
    the per-sequence quantities join them as more rows, and one reduceat sums every group."""
    arrays = old.numpy(), roll.numpy(), mask.numpy(), lr.numpy(), raw.numpy(), weight.numpy(), coef.numpy()
    B, T = arrays[2].shape  # apply_correction's intermediates are detached, so .numpy() is a view
    if B * T == 0:  # nothing is masked in: every total is 0
        return [NO_TOTALS for _ in bounds]
    keep = None if keep is None else keep.numpy()
    with np.errstate(all="ignore"):  # NaN/inf are data here (the faithful presets make them)
        # First without the ±20 bound on lr: k3_t = e^lr − 1 − lr exceeds 19 wherever |lr| > 20,
        # so a k3 total of at most 19 proves the bound changed nothing; else, bounded this time.
        totals = _numpy_pass(corr, *arrays, keep, bounds, bound_lr=False)
        if not sum(g["sum_k3"] for g in totals) <= 19.0:
            totals = _numpy_pass(corr, *arrays, keep, bounds, bound_lr=True)
    for g in totals:
        g.setdefault("clamped_tokens", 0.0)  # no clamp, no such row
    return [Totals(**{name: g[name] for name in TOTALS if name != "min_w"}, min_w=-g["max_neg_w"]) for g in totals]


def _numpy_pass(corr, old, roll, mask, lr, raw, weight, coef, keep, bounds, bound_lr: bool) -> list[dict[str, float]]:
    """Per group, by name: the sums of the per-token rows and of the per-sequence rows below, then the
    maxima of w, of −w and of |p_old − p_roll| over masked-in tokens."""
    B, T = mask.shape
    starts = [a for a, _ in bounds]
    w = coef if corr.padding == "ignore" else _np_zero_padding(coef, mask)
    lr_dec = lr if _reuses_lr(corr) else _np_zero_padding(old - roll, mask)
    lr_safe = np.minimum(np.maximum(lr_dec, -SAFETY_BOUND), SAFETY_BOUND) if bound_lr else lr_dec

    # per-token rows: tokens, w, w², lr, ρ−1, ρ−1−lr (k3), (ρ−1)², then the clamped tokens and, for
    # a token filter, the kept ones; every row is 0 at padding (w and lr are, and expm1(0) = 0)
    token_keep = keep is not None and keep.shape[-1] != 1
    clamps = corr.weight_op != "raw"
    token_rows = ["tokens", "sum_w", "sum_w2", "sum_lr", "sum_rho_m1", "sum_k3", "sum_rho_m1_sq"]
    token_rows += ["clamped_tokens"] * clamps + ["kept_in_token_filter"] * token_keep
    K = len(token_rows)
    # float64 rows, so the sums are float64; each product is still taken in the inputs' dtype (float32 in
    # the worlds) before it is stored, so is_weight_std = √(E[w²] − E[w]²) loses a spread below ~1e-3 of
    # the mean (tests/test_metrics.py, the xfail): kept, since the runs' bytes are these
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
    seq_rows = ["sequences", "sum_chi2_seq", "sum_log_ppl", "rejected_sequences", "kept_tokens"]

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
    names = token_rows + seq_rows + ["max_w", "max_neg_w", "max_abs_prob_diff"]
    return [
        dict(zip(names, group))
        for group in np.concatenate([np.add.reduceat(per_seq, starts, axis=1), maxima]).T.tolist()
    ]


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
