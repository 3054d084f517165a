"""The correction algebra of shared/spec/corrections.md, as one pure function.

A correction is data (`Correction`); `apply_correction` evaluates any point of the algebra:

    ratio base   decoupled: lr = old − roll          bypass: lr = lp − roll (detached)
    log clamp    lr (token) or L_i (sequence/geometric) clamped to [−c, c] before exp()
    weight       none: 1 | token: ρ_t | sequence: ρ_seq = exp(L_i) | geometric: ρ_geo = exp(G_i)
    weight op    raw | clamp(low?, high?) | clamp-high (min(·, high))
    filter       none | token | sequence | geometric statistic, kept inside [low, high]
    veto         reject a sequence if any masked-in ρ_t < veto
    reject       where: a rejected coefficient is exactly 0 | multiply: coefficient · 0/1 (0·inf = NaN)
    denominator  keep: rejected tokens still count | drop: they leave the action mask

All outputs are detached: no gradient flows through a coefficient. Nothing here knows about
configs, files or the CLI, so every study (case, train, probe, audit) calls the same maths.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

import torch

from runner.errors import UserError

# verl's and SkyRL's safety bound on log-ratios; the metrics use it too, so they stay finite.
SAFETY_BOUND = 20.0

LEVELS = ("none", "token", "sequence", "geometric")
CHOICES = {
    "ratio": ("decoupled", "bypass"),
    "weight": LEVELS,
    "weight_op": ("raw", "clamp", "clamp-high"),
    "filter": LEVELS,
    "band_space": ("ratio", "log"),
    "reject": ("where", "multiply"),
    "denominator": ("keep", "drop"),
    # ignore: masked positions are replaced before any arithmetic, so NaN/inf padding cannot leak.
    # multiply: released code's `x * mask`, where NaN·0 = NaN leaks. zero-logratio: TRL's
    # log-ratio is zeroed at padding (ratio 1), the loss is still reduced by multiplication.
    "padding": ("ignore", "multiply", "zero-logratio"),
}


@dataclass(frozen=True)
class Correction:
    """One point of the algebra. Field names follow the spec's concept table."""

    name: str = "none"
    description: str = ""
    ratio: str = "decoupled"
    log_clamp: float | None = None
    weight: str = "none"
    weight_op: str = "raw"
    filter: str = "none"
    filter_log_clamp: float | None = None  # verl clamps each lr_t before summing for its filter
    filter_inverted: bool = False  # verl's rejection keeps 1/statistic inside the band
    band_space: str = "ratio"  # compare exp(stat) with [low, high], or stat with [log low, log high]
    reject: str = "where"
    denominator: str = "keep"
    padding: str = "ignore"
    low: float | None = None
    high: float | None = None
    veto: float | None = None
    faithful: bool = False  # reproduces released code, bugs included

    @property
    def active(self) -> bool:
        return self.weight != "none" or self.filter != "none" or self.veto is not None

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> "Correction":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(cfg) - known)
        if unknown:
            raise UserError(f"correction: unknown key(s) {', '.join(unknown)}; valid: {', '.join(sorted(known))}")
        corr = cls(**{k: v for k, v in cfg.items()})
        corr.validate()
        return corr

    def with_band(self, low: float | None, high: float | None) -> "Correction":
        from dataclasses import replace

        out = replace(self, low=low, high=high)
        out.validate()
        return out

    def validate(self) -> None:
        for key, allowed in CHOICES.items():
            value = getattr(self, key)
            if value not in allowed:
                raise UserError(f"correction.{key}={value!r} is not one of: {', '.join(allowed)}")
        for key in ("low", "high", "veto", "log_clamp", "filter_log_clamp"):
            value = getattr(self, key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
                raise UserError(f"correction.{key} must be a number or null, got {value!r}")
            if value < 0:
                raise UserError(f"correction.{key} must be non-negative, got {value}")
        if self.low is not None and self.high is not None and self.low > self.high:
            raise UserError(f"correction.low ({self.low}) > correction.high ({self.high})")


@dataclass
class CorrectionResult:
    coef: torch.Tensor  # [B, T] detached coefficient that multiplies the per-token loss
    mask: torch.Tensor  # [B, T] float action mask after `drop` rejection
    keep: torch.Tensor  # [B, T] bool: the unit survived the filter and the veto
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)  # 0-d tensors


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


def _exp_clamped(x: torch.Tensor, bound: float | None) -> torch.Tensor:
    return torch.exp(x if bound is None else x.clamp(-bound, bound))


def _in_band(stat: torch.Tensor, corr: Correction) -> torch.Tensor:
    """stat is a log-space statistic; compare it where the framework compares."""
    if corr.band_space == "ratio":
        value = torch.exp(stat)
        lo, hi = corr.low, corr.high
    else:
        value = stat
        lo = None if corr.low is None else (math.log(corr.low) if corr.low > 0 else -math.inf)
        hi = None if corr.high is None else (math.log(corr.high) if corr.high > 0 else -math.inf)
    # NaN statistics fail every comparison, so they are rejected, as in the released code.
    if lo is not None and hi is not None:
        return (value >= lo) & (value <= hi)
    if lo is not None:
        return value >= lo
    if hi is not None:
        return value <= hi
    return value == value  # no band: keep everything that is not NaN


def mismatch_log_ratio(corr: Correction, old, roll, mask, lp=None) -> torch.Tensor:
    """lr_t = base − roll, detached; under `padding: ignore` (and TRL's zero-logratio) it is exactly
    0 at masked positions, so NaN/inf padding never reaches an exp or a gradient."""
    if corr.ratio == "bypass":
        if lp is None:
            raise ValueError("a bypass correction needs lp")
        base = lp.detach()
    else:
        base = old.detach()
    lr = base - roll.detach()
    if corr.padding in ("ignore", "zero-logratio"):
        lr = zero_padding(lr, mask)
    return lr


def apply_correction(
    corr: Correction,
    old: torch.Tensor,
    roll: torch.Tensor,
    mask: torch.Tensor,
    lp: torch.Tensor | None = None,
    metrics: bool = True,
) -> CorrectionResult:
    """Evaluate `corr` on one batch of [B, T] log-probs; see the module docstring."""
    mask = mask.to(old.dtype)
    lr = mismatch_log_ratio(corr, old, roll, mask, lp)
    count = mask.sum(-1, keepdim=True)  # [B, 1]
    seq_lr = (lr * mask).sum(-1, keepdim=True) if corr.weight in ("sequence", "geometric") else None  # L_i

    # The coefficient, before rejection.
    if corr.weight == "none":
        raw = torch.ones_like(lr)
    elif corr.weight == "token":
        raw = _exp_clamped(lr, corr.log_clamp)
    elif corr.weight == "sequence":
        raw = _exp_clamped(seq_lr, corr.log_clamp).expand_as(lr)
    else:
        raw = _exp_clamped(seq_lr / count.clamp(min=1), corr.log_clamp).expand_as(lr)
    if corr.weight_op == "clamp" and (corr.low, corr.high) != (None, None):
        weight = raw.clamp(min=corr.low, max=corr.high)
    elif corr.weight_op == "clamp-high" and corr.high is not None:
        weight = raw.clamp(max=corr.high)
    else:
        weight = raw

    # Which units survive: a [B, T] mask for token filters, [B, 1] for sequence ones.
    keep = None
    if corr.filter != "none":
        stat_lr = lr if corr.filter_log_clamp is None else lr.clamp(-corr.filter_log_clamp, corr.filter_log_clamp)
        if corr.filter == "token":
            stat = stat_lr
        else:
            stat = (stat_lr * mask).sum(-1, keepdim=True)
            if corr.filter == "geometric":
                stat = stat / count.clamp(min=1)
        keep = _in_band(-stat if corr.filter_inverted else stat, corr)
    if corr.veto is not None:
        threshold = math.log(corr.veto) if corr.veto > 0 else -math.inf
        vetoed = ((lr < threshold) & (mask > 0)).any(-1, keepdim=True)
        keep = ~vetoed if keep is None else keep & ~vetoed

    # Rejection: `where` zeroes exactly (never 0·inf), `multiply` is the released code's product.
    # Under `padding: ignore` the coefficient is also exactly 0 at padding.
    new_mask = mask
    coef = weight
    if keep is not None:
        keep_float = keep.to(weight.dtype)
        coef = zero_where_not(weight, keep, keep_float) if corr.reject == "where" else weight * keep_float
        if corr.denominator == "drop":
            new_mask = mask * keep_float
    if corr.padding == "ignore":
        coef = zero_padding(coef, mask)
    coef = coef.detach()
    keep_full = (torch.ones((1, 1), dtype=torch.bool) if keep is None else keep).expand_as(lr)
    out = CorrectionResult(coef=coef, mask=new_mask, keep=keep_full)
    if metrics:
        out.metrics = correction_metrics(corr, old.detach(), roll.detach(), mask, lr, raw, weight, coef, keep)
    return out


METRIC_NAMES = ("is_weight_mean", "is_weight_std", "is_weight_min", "is_weight_max", "ess",
                "token_masked_fraction", "seq_masked_fraction", "clamped_fraction", "kl_k1", "kl_k3",
                "chi2_token", "chi2_seq", "log_ppl_diff", "max_abs_prob_diff")


def correction_metrics(corr, old, roll, mask, lr, raw, weight, coef, keep) -> dict[str, torch.Tensor]:
    """verl-style per-batch diagnostics over masked-in tokens.

    The [B, T] work is a handful of sums, dot products and extremes, with multiplies by the mask
    rather than selections; their scalars leave torch in one `.tolist()` and the fractions are
    formed in Python (a small batch pays per torch call, not per element). Never raises: an empty
    batch or all-zero weights give 0, and the KL/χ² metrics use the ±20 safety bound."""
    with torch.no_grad():
        dtype = coef.dtype
        seq_len = mask.sum(-1)
        nonempty = (seq_len > 0).to(dtype)
        n_tok = seq_len.sum()

        # Weights: under padding=ignore the coefficient already is exactly 0 at padding. The
        # temporaries are freed as soon as their sums are taken (at most three [B, T] extra).
        w = (coef if corr.padding == "ignore" else zero_padding(coef, mask)).reshape(-1)
        if w.numel():
            w_max = w.max()  # coefficients are ≥ 0, so the zeros at padding never win
            # shift every weight below 0 and mask: padding stays 0, the minimum is a masked-in one
            shift = w_max + 1
            w_min = (w - shift).mul_(mask.reshape(-1)).min() + shift
        else:
            w_min = w_max = n_tok
        sums = [n_tok, nonempty.sum(), w.sum(), torch.dot(w, w), w_min, w_max]
        del w

        # Rejections and clamps, counted per sequence when the filter is a sequence filter.
        changed = (weight != raw) if corr.weight_op != "raw" else None
        zero = torch.zeros((), dtype=dtype)
        if keep is None:
            kept_tokens, seq_rejected = n_tok, zero
            clamped = (changed * mask).sum() if changed is not None else zero
        elif keep.shape[-1] == 1:
            kept_seq = keep.reshape(-1).to(dtype)
            kept_tokens = torch.dot(seq_len, kept_seq)
            seq_rejected = torch.dot(nonempty, 1 - kept_seq)
            clamped = torch.dot((changed * mask).sum(-1), kept_seq) if changed is not None else zero
        else:
            kept = mask * keep.to(dtype)
            kept_tokens = kept.sum()
            seq_rejected = torch.dot(nonempty, (kept.sum(-1) == 0).to(dtype))
            clamped = kept.mul_(changed).sum() if changed is not None else zero
            del kept
        del changed
        sums += [kept_tokens, seq_rejected, clamped]

        # Mismatch diagnostics use the decoupled log-ratio old − roll (0 at padding), whatever the
        # ratio base; expm1 keeps k3 and χ² accurate for tiny mismatches, where ρ − 1 would cancel.
        reuse = corr.ratio == "decoupled" and corr.padding in ("ignore", "zero-logratio")
        lr_dec = lr if reuse else zero_padding(old - roll, mask)
        L = lr_dec.sum(-1)  # the sequence log-ratios
        lo_lr, hi_lr = torch.aminmax(lr_dec) if lr_dec.numel() else (zero, zero)
        within = bool((hi_lr <= SAFETY_BOUND) & (lo_lr >= -SAFETY_BOUND))
        lr_safe = lr_dec if within else lr_dec.clamp(-SAFETY_BOUND, SAFETY_BOUND)
        del lr_dec
        rho_m1 = torch.expm1(lr_safe).reshape(-1)
        # k3 per token before summing: a difference of two large sums would cancel a tiny k3 away
        sums += [L.sum(), torch.sub(rho_m1, lr_safe.reshape(-1)).sum(), torch.dot(rho_m1, rho_m1), rho_m1.sum()]
        del lr_safe, rho_m1
        per_seq_chi2 = torch.expm1(2 * L.clamp(-SAFETY_BOUND, SAFETY_BOUND))
        sums += [torch.dot(per_seq_chi2, nonempty), torch.dot(L / seq_len.clamp(min=1), nonempty)]

        prob_diff = torch.exp(old).sub_(torch.exp(roll))
        if bool(torch.isfinite(prob_diff.sum())):
            prob_diff.mul_(mask)
        else:
            prob_diff = torch.where(mask > 0, prob_diff, 0.0).nan_to_num_(nan=0.0)
        lo, hi = torch.aminmax(prob_diff) if prob_diff.numel() else (zero, zero)
        del prob_diff
        sums += [lo, hi]

        (n, n_nonempty, sum_w, sum_w2, w_min, w_max, kept_tokens, seq_rejected, clamped, sum_lr, sum_k3,
         sum_rho_m1_sq, sum_rho_m1, chi2_seq_sum, log_ppl_sum, lo, hi) = torch.stack(sums).tolist()
    n_safe, n_seq = max(n, 1.0), max(n_nonempty, 1.0)
    w_mean = sum_w / n_safe
    variance = sum_w2 / n_safe - w_mean * w_mean
    values = (
        w_mean,
        math.sqrt(variance) if variance > 0 else (variance if variance != variance else 0.0),
        w_min if n > 0 else 0.0,
        w_max if n > 0 else 0.0,
        sum_w * sum_w / (n_safe * sum_w2) if sum_w2 > 0 else 0.0,  # Kish ESS as a fraction
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
    return dict(zip(METRIC_NAMES, torch.tensor(values, dtype=dtype).unbind()))
