"""The correction algebra of docs/corrections.md, as one pure function.

A correction is data (`Correction`); `apply_correction` evaluates any point of the algebra:

    ratio base   decoupled: lr = old − roll          bypass: lr = lp − roll (detached)
    log clamp    lr (token) or L_i (sequence/geometric) clamped to [−c, c] before exp()
    weight       none: 1 | token: ρ_t | sequence: ρ_seq = exp(L_i) | geometric: ρ_geo = exp(G_i)
    weight op    raw | clamp(low?, high?) | clamp-high (min(·, high))
    filter       none | token | sequence | geometric statistic, kept inside [low, high]
    shuffle      filter_shuffle: keep as many units as the filter keeps, drawn at random (a control arm:
                 the filter's rejection rate without its selection; needs a random stream)
    veto         reject a sequence if any masked-in ρ_t < veto
    reject       where: a rejected coefficient is exactly 0 | multiply: coefficient · 0/1 (0·inf = NaN)
    denominator  keep: rejected tokens still count | drop: they leave the action mask
    self-normal  none | token | sequence: the weight (after its op, before rejection) divided by its batch mean,
                 over the batch's masked-in tokens (token) or of each sequence's masked mean (sequence, every
                 sequence counted); a mean not above 1e-8 (or NaN) leaves the weights as they are (slime's
                 tis_batch_normalize). The batch is what one call sees: apply_correction_split normalises each
                 group on its own, as slime does per micro-batch
    opsm         opsm_delta: off-policy sequence masking (DeepSeek-V3.2; slime's --use-opsm): a token whose advantage
                 is negative is multiplied by 0 when its sequence's mean over masked-in tokens of base − lp
                 (opsm_base: old or roll) exceeds opsm_delta. It reads the policy's log-probs and the
                 advantages, so losses.policy_loss applies it to the per-token loss, not this function
    nonfinite    keep | zero-ratio: NeMo-RL's nan_to_num(·, nan=0, posinf=0, neginf=0) on the weight's ratio
                 (before the weight op: an overflowing ρ becomes 0, not `high`), on the ratio a token filter
                 compares and on each lr_t a sequence or geometric filter's statistic sums | zero-logratio:
                 AReaL's where(isfinite(lr), lr, 0) on the log-ratio itself (ratio 1; a finite lr still overflows)

All outputs are detached: no gradient flows through a coefficient. Nothing here knows about
configs, files or the CLI, so every study (case, train, probe, audit) calls the same maths.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from runner.core.masking import shuffled_keep, zero_padding, zero_where_not
from runner.core.metrics import correction_metrics, correction_metrics_by_group
from runner.errors import UserError

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
    # masked-sum: as multiply, but a token-mean reduction first replaces masked values by 0, as verl's
    # masked_sum does (torch.where), so NaN padding leaves the loss finite (not its gradient there).
    "padding": ("ignore", "multiply", "zero-logratio", "masked-sum"),
    "nonfinite": ("keep", "zero-ratio", "zero-logratio"),
    "self_normalize": ("none", "token", "sequence"),
    "opsm_base": ("old", "roll"),
}
# slime's tis_batch_normalize divides only by a mean above this (mis.py)
SELF_NORMALIZE_MIN_MEAN = 1e-8


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
    # A control, not a preset: the filter's decisions permuted at random over the batch's units, so the same
    # number is kept, at random (analysis/claims/staleness_breaks_tis.py: is geo-RS's grad norm its selection's
    # doing, or only that of averaging over few tokens?)
    filter_shuffle: bool = False
    band_space: str = "ratio"  # compare exp(stat) with [low, high], or stat with [log low, log high]
    reject: str = "where"
    denominator: str = "keep"
    padding: str = "ignore"
    low: float | None = None
    high: float | None = None
    veto: float | None = None
    nonfinite: str = "keep"  # what a NaN or ±inf ratio becomes (NeMo-RL: 0; AReaL: its log-ratio 0)
    faithful: bool = False  # reproduces released code, bugs included
    self_normalize: str = "none"  # divide the weights by their batch mean: none | token | sequence
    opsm_delta: float | None = None  # off-policy sequence masking's δ (None: off); applied by policy_loss
    opsm_base: str = "old"  # what the policy's drift is measured from: old (slime's default) | roll

    @property
    def active(self) -> bool:
        return self.weight != "none" or self.filter != "none" or self.veto is not None

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> Correction:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(cfg) - known)
        if unknown:
            raise UserError(f"correction: unknown key(s) {', '.join(unknown)}; valid: {', '.join(sorted(known))}")
        corr = cls(**dict(cfg.items()))
        corr.validate()
        return corr

    def with_band(self, low: float | None, high: float | None) -> Correction:
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
        if self.opsm_delta is not None and (
            isinstance(self.opsm_delta, bool)
            or not isinstance(self.opsm_delta, (int, float))
            or not math.isfinite(self.opsm_delta)
        ):
            raise UserError(f"correction.opsm_delta must be a finite number or null, got {self.opsm_delta!r}")
        if not isinstance(self.filter_shuffle, bool):
            raise UserError(f"correction.filter_shuffle must be true or false, got {self.filter_shuffle!r}")
        if self.filter_shuffle and self.filter == "none":
            raise UserError("correction.filter_shuffle=true needs a filter to shuffle (correction.filter is none)")


@dataclass
class CorrectionResult:
    coef: torch.Tensor  # [B, T] detached coefficient that multiplies the per-token loss
    mask: torch.Tensor  # [B, T] float action mask after `drop` rejection
    keep: torch.Tensor  # [B, T] bool: the unit survived the filter and the veto
    metrics: dict[str, float] = field(default_factory=dict)  # runner.core.schema.CORRECTION_METRICS


def _exp_clamped(x: torch.Tensor, bound: float | None) -> torch.Tensor:
    return torch.exp(x if bound is None else x.clamp(-bound, bound))


def _zero_nonfinite(x: torch.Tensor) -> torch.Tensor:
    return torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)


def _in_band(stat: torch.Tensor, corr: Correction, token_ratio: bool = False) -> torch.Tensor:
    """stat is a log-space statistic; compare it where the framework compares. `token_ratio`: stat is
    each token's lr, so under nonfinite=zero-ratio the ratio compared is the one the weight uses."""
    if corr.band_space == "ratio":
        value = torch.exp(stat)
        if corr.nonfinite == "zero-ratio" and token_ratio:
            value = _zero_nonfinite(value)
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


def opsm_keep(corr: Correction, lp, old, roll, adv, mask, sanitise: bool) -> torch.Tensor:
    """[B, T] 1.0 / 0.0: off-policy sequence masking. A token is dropped when its advantage is negative and its
    sequence's drift D_i = Σ_t (base_t − lp_t)·m_t / max(Σ_t m_t, 1) exceeds opsm_delta (slime's
    compute_opsm_mask, the sequence KL estimate of DeepSeek-V3.2's OPSM). A NaN drift is never above δ, so it
    keeps the sequence, as slime's comparison does. Under `sanitise` padding is zeroed first instead of
    multiplied (NaN padding cannot reach D_i)."""
    base = old if corr.opsm_base == "old" else roll
    diff = base.detach() - lp.detach()
    diff = zero_padding(diff, mask) if sanitise else diff * mask
    drift = diff.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    dropped = (adv.detach() < 0) & (drift > corr.opsm_delta)
    return (~dropped).to(lp.dtype)


def _self_normalized(weight: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """weight / its batch mean. The mean multiplies by the mask, so a NaN at padding makes it NaN, and then,
    as in slime, nothing is divided."""
    masked = weight * mask
    if level == "token":
        mean = masked.sum() / mask.sum().clamp(min=1)
    else:
        mean = (masked.sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    return weight / mean if mean > SELF_NORMALIZE_MIN_MEAN else weight


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
    if corr.nonfinite == "zero-logratio":
        lr = torch.where(torch.isfinite(lr), lr, 0.0)
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
    generator: torch.Generator | None = None,
) -> CorrectionResult:
    """Evaluate `corr` on one batch of [B, T] log-probs; see the module docstring. `generator`: the random
    stream of `filter_shuffle` (required by it, unused otherwise)."""
    ev = _evaluate(corr, old, roll, mask, lp, generator)
    out = CorrectionResult(coef=ev.coef, mask=ev.new_mask, keep=ev.keep_full)
    if metrics:
        out.metrics = correction_metrics(corr, *ev.metric_inputs())
    return out


def apply_correction_split(
    corr: Correction,
    old: torch.Tensor,
    roll: torch.Tensor,
    mask: torch.Tensor,
    groups: Sequence[slice],
    lp: torch.Tensor | None = None,
    metrics: bool = True,
    generator: torch.Generator | None = None,
) -> list[CorrectionResult]:
    """`apply_correction` on each group of sequences (contiguous slices that tile the batch, like
    a step's mini-batches), evaluated once for the whole batch: every coefficient is a function of
    its own sequence, so group g's result equals apply_correction on the rows g, and the metrics
    of all groups come from one pass (a small batch pays per call, not per element). With
    `filter_shuffle` the permutation is drawn over the whole batch, then split."""
    if corr.self_normalize != "none":  # each group's weights are normalised by that group's own mean
        return [
            apply_correction(corr, old[g], roll[g], mask[g], None if lp is None else lp[g], metrics, generator)
            for g in groups
        ]
    ev = _evaluate(corr, old, roll, mask, lp, generator)
    inputs = ev.metric_inputs()
    per_group = correction_metrics_by_group(corr, *inputs, groups=groups) if metrics else [{} for _ in groups]
    return [
        CorrectionResult(coef=ev.coef[g], mask=ev.new_mask[g], keep=ev.keep_full[g], metrics=m)
        for g, m in zip(groups, per_group)
    ]


@dataclass
class _Evaluation:
    coef: torch.Tensor  # the coefficient after rejection (and padding), detached
    new_mask: torch.Tensor
    keep_full: torch.Tensor
    # what the metrics read besides: the batch, the log-ratio lr, the coefficient before / after the
    # clamp, and the [B, 1] or [B, T] survivors (None without a filter or veto)
    old: torch.Tensor
    roll: torch.Tensor
    mask: torch.Tensor
    lr: torch.Tensor
    raw: torch.Tensor
    weight: torch.Tensor
    keep: torch.Tensor | None

    def metric_inputs(self) -> tuple:
        """correction_metrics' arguments after `corr`, in its order."""
        return self.old, self.roll, self.mask, self.lr, self.raw, self.weight, self.coef, self.keep


def _evaluate(corr: Correction, old, roll, mask, lp, generator=None) -> _Evaluation:
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
    if corr.nonfinite == "zero-ratio":  # before the clamp, as NeMo-RL does: inf → 0, not → high
        raw = _zero_nonfinite(raw)
    if corr.weight_op == "clamp" and (corr.low, corr.high) != (None, None):
        weight = raw.clamp(min=corr.low, max=corr.high)
    elif corr.weight_op == "clamp-high" and corr.high is not None:
        weight = raw.clamp(max=corr.high)
    else:
        weight = raw
    clamped = weight  # what the clamp metrics compare with raw: the normalisation is not a clamp
    if corr.self_normalize != "none":
        weight = _self_normalized(weight, mask, corr.self_normalize)

    # Which units survive: a [B, T] mask for token filters, [B, 1] for sequence ones.
    keep = None
    if corr.filter != "none":
        stat_lr = lr if corr.filter_log_clamp is None else lr.clamp(-corr.filter_log_clamp, corr.filter_log_clamp)
        if corr.filter == "token":
            stat = stat_lr
        else:
            if corr.nonfinite == "zero-ratio":
                stat_lr = _zero_nonfinite(stat_lr)
            stat = (stat_lr * mask).sum(-1, keepdim=True)
            if corr.filter == "geometric":
                stat = stat / count.clamp(min=1)
        keep = _in_band(-stat if corr.filter_inverted else stat, corr, token_ratio=corr.filter == "token")
        if corr.filter_shuffle:
            if generator is None:
                raise UserError(
                    f"correction={corr.name} with filter_shuffle=true needs a random stream; only the "
                    "train study has one"
                )
            keep = shuffled_keep(keep, mask, generator)
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
    return _Evaluation(
        coef=coef,
        new_mask=new_mask,
        keep_full=keep_full,
        old=old.detach(),
        roll=roll.detach(),
        mask=mask,
        lr=lr,
        raw=raw,
        weight=clamped,
        keep=keep,
    )
