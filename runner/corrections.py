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


def sanitize_masked(mask: torch.Tensor, *tensors: torch.Tensor) -> list[torch.Tensor]:
    """Replace masked-out entries by 0 before any arithmetic: NaN/inf padding cannot leak,
    not even into a gradient (torch.where passes no gradient to the unselected branch)."""
    inside = mask > 0
    return [torch.where(inside, t, torch.zeros((), dtype=t.dtype)) for t in tensors]


def _exp_clamped(x: torch.Tensor, bound: float | None) -> torch.Tensor:
    return torch.exp(x if bound is None else x.clamp(-bound, bound))


def _in_band(stat: torch.Tensor, corr: Correction) -> torch.Tensor:
    """stat is a log-space statistic; compare it where the framework compares."""
    keep = torch.ones_like(stat, dtype=torch.bool)
    if corr.band_space == "ratio":
        value = torch.exp(stat)
        if corr.low is not None:
            keep &= value >= corr.low
        if corr.high is not None:
            keep &= value <= corr.high
    else:
        if corr.low is not None:
            keep &= stat >= (math.log(corr.low) if corr.low > 0 else -math.inf)
        if corr.high is not None:
            keep &= stat <= (math.log(corr.high) if corr.high > 0 else -math.inf)
    # NaN statistics fail every comparison, so they are rejected, as in the released code.
    return keep


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
    inside = mask > 0
    old_d, roll_d = old.detach(), roll.detach()
    lp_d = lp.detach() if lp is not None else None
    if corr.padding == "ignore":
        old_d, roll_d = sanitize_masked(mask, old_d, roll_d)
        if lp_d is not None:
            (lp_d,) = sanitize_masked(mask, lp_d)

    if corr.ratio == "bypass":
        if lp_d is None:
            raise ValueError("a bypass correction needs lp")
        lr = lp_d - roll_d
    else:
        lr = old_d - roll_d
    if corr.padding == "zero-logratio":
        lr = torch.where(inside, lr, torch.zeros((), dtype=lr.dtype))

    count = mask.sum(-1, keepdim=True)  # [B, 1]
    need_seq = corr.weight in ("sequence", "geometric") or metrics
    seq_lr = (lr * mask).sum(-1, keepdim=True) if need_seq else None  # L_i

    # The coefficient, before rejection.
    if corr.weight == "none":
        raw = torch.ones_like(lr)
    elif corr.weight == "token":
        raw = _exp_clamped(lr, corr.log_clamp)
    elif corr.weight == "sequence":
        raw = _exp_clamped(seq_lr, corr.log_clamp).expand_as(lr)
    else:
        raw = _exp_clamped(seq_lr / count.clamp(min=1), corr.log_clamp).expand_as(lr)
    if corr.weight_op == "clamp":
        weight = raw.clamp(min=corr.low, max=corr.high) if (corr.low, corr.high) != (None, None) else raw
    elif corr.weight_op == "clamp-high":
        weight = raw.clamp(max=corr.high) if corr.high is not None else raw
    else:
        weight = raw

    # Which units survive.
    if corr.filter == "none":
        keep = None
    else:
        stat_lr = lr if corr.filter_log_clamp is None else lr.clamp(-corr.filter_log_clamp, corr.filter_log_clamp)
        if corr.filter == "token":
            stat = stat_lr
        else:
            stat = (stat_lr * mask).sum(-1, keepdim=True)
            if corr.filter == "geometric":
                stat = stat / count.clamp(min=1)
        if corr.filter_inverted:
            stat = -stat
        keep = _in_band(stat, corr).expand_as(lr)
    if corr.veto is not None:
        vetoed = ((lr < (math.log(corr.veto) if corr.veto > 0 else -math.inf)) & inside).any(-1, keepdim=True)
        keep = ~vetoed.expand_as(lr) if keep is None else keep & ~vetoed

    if keep is None:
        coef = weight
        keep = torch.ones_like(inside)
        new_mask = mask
    else:
        if corr.reject == "where":
            coef = torch.where(keep, weight, torch.zeros((), dtype=weight.dtype))
        else:
            coef = weight * keep.to(weight.dtype)
        new_mask = mask * keep.to(mask.dtype) if corr.denominator == "drop" else mask
    if corr.padding == "ignore":
        coef = torch.where(inside, coef, torch.zeros((), dtype=coef.dtype))

    out = CorrectionResult(coef=coef.detach(), mask=new_mask, keep=keep)
    if metrics:
        out.metrics = correction_metrics(corr, old_d, roll_d, mask, lr_seq=seq_lr, raw=raw, weight=weight,
                                         coef=out.coef, keep=keep)
    return out


def correction_metrics(corr, old, roll, mask, lr_seq, raw, weight, coef, keep) -> dict[str, torch.Tensor]:
    """verl-style per-batch diagnostics over masked-in tokens. Never raises: an empty batch or
    all-zero weights give 0, and the KL/χ² metrics use the ±20 safety bound so they stay finite."""
    inside = mask > 0
    zero = torch.zeros((), dtype=coef.dtype)
    n_tok = mask.sum()
    n_tok_safe = n_tok.clamp(min=1)
    seq_len = mask.sum(-1)
    nonempty = seq_len > 0
    n_seq = nonempty.sum().clamp(min=1).to(coef.dtype)

    w = torch.where(inside, coef, zero)
    w_mean = w.sum() / n_tok_safe
    w_var = torch.where(inside, (coef - w_mean) ** 2, zero).sum() / n_tok_safe
    sum_w2 = (w * w).sum()
    ess = torch.where(sum_w2 > 0, w.sum() ** 2 / (n_tok_safe * sum_w2.clamp(min=torch.finfo(w.dtype).tiny)), zero)

    rejected = inside & ~keep
    seq_rejected = nonempty & ~(keep & inside).any(-1)
    clamped = inside & keep & (weight != raw)

    # Mismatch diagnostics always use the decoupled log-ratio old − roll, whatever the ratio base.
    lr = torch.where(inside, old - roll, zero)
    lr_safe = lr.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    L = torch.where(inside, lr_safe, zero).sum(-1)
    G = L / seq_len.clamp(min=1)
    prob_diff = torch.where(inside, (torch.exp(old) - torch.exp(roll)).abs(), zero)
    big = torch.tensor(float("inf"), dtype=coef.dtype)
    return {
        "is_weight_mean": w_mean,
        "is_weight_std": w_var.sqrt(),
        "is_weight_min": torch.where(n_tok > 0, torch.where(inside, coef, big).min(), zero),
        "is_weight_max": torch.where(n_tok > 0, torch.where(inside, coef, -big).max(), zero),
        "ess": ess,
        "token_masked_fraction": rejected.sum() / n_tok_safe,
        "seq_masked_fraction": seq_rejected.sum() / n_seq,
        "clamped_fraction": clamped.sum() / n_tok_safe,
        "kl_k1": -lr.sum() / n_tok_safe,
        "kl_k3": torch.where(inside, torch.expm1(lr_safe) - lr_safe, zero).sum() / n_tok_safe,
        "chi2_token": torch.where(inside, torch.exp(2 * lr_safe), zero).sum() / n_tok_safe - (n_tok > 0).to(coef.dtype),
        "chi2_seq": torch.where(nonempty, torch.exp(2 * L.clamp(-SAFETY_BOUND, SAFETY_BOUND)) - 1, zero).sum() / n_seq,
        "log_ppl_diff": torch.where(nonempty, G, zero).sum() / n_seq,
        "max_abs_prob_diff": torch.nan_to_num(prob_diff, nan=0.0).max() if prob_diff.numel() else zero,
    }
