"""The correction algebra of docs/corrections.md, as one pure function.

A correction is data (`Correction`); `apply_correction` evaluates any point of the algebra:

    ratio base   decoupled: lr = old − roll          bypass: lr = lp − roll (detached)
    log clamp    lr (token) or L_i (sequence/geometric) clamped to [−c, c] before exp()
    weight       none: 1 | token: ρ_t | sequence: ρ_seq = exp(L_i) | geometric: ρ_geo = exp(G_i)
                 | segment: exp(mean of lr over the token's run of masked-in tokens) (ROLL; runner/core/segments.py)
    weight op    raw | clamp(low?, high?) | clamp-high (min(·, high))
    filter       none | token | sequence | geometric | segment statistic, kept inside [low, high]; max: a sequence's
                 largest per-token statistic (verl's seq_max_*)
    statistic    filter_statistic: what each token contributes to the filter: log-ratio (lr_t) | k2 (½·lr_t²)
                 | k3 (e^lr_t − 1 − lr_t), verl's divergence estimators
    normalize    batch: the weight divided by its mean over the batch (self-normalised IS, verl's
                 rollout_is_batch_normalize), after the weight op and before the filter
    opsm         opsm_delta: off-policy sequence masking (DeepSeek-V3.2 eq. 9; TRL's off_policy_mask_threshold):
                 a sequence with a negative advantage whose mean KL, mean_t (ref − lp) with ref = roll or old
                 (opsm_reference), exceeds δ gets coefficient · 0; needs lp and the advantages
    diff filter  none | token | sequence | geometric | segment statistic of the probability difference
                 Δp_t = exp(base) − exp(roll) (sum, mean, run mean), kept inside [diff_low, diff_high]; a unit
                 must pass both filters (ROLL's diff_enabled beside ratio_enabled)
    shuffle      filter_shuffle: keep as many units as the filter keeps, drawn at random (a control arm:
                 the filter's rejection rate without its selection; needs a random stream)
    veto         reject a sequence if any masked-in ρ_t < veto
    reject       where: a rejected coefficient is exactly 0 | multiply: coefficient · 0/1 (0·inf = NaN)
    denominator  keep: rejected tokens still count | drop: they leave the action mask | drop-tokens: they
                 leave the mask, but a sequence left empty still counts among seq-mean-token-mean's sequences
                 (ROLL: its sample count is taken before the filter)
    self-normal  none | token | sequence: the weight (after its op, before rejection) divided by its batch mean,
                 over the batch's masked-in tokens (token) or of each sequence's masked mean (sequence, every
                 sequence counted); a mean not above 1e-8 (or NaN) leaves the weights as they are (slime's
                 tis_batch_normalize). The batch is what one call sees: apply_correction_split normalises each
                 group on its own, as slime does per micro-batch
    opsm_nan     zero: TRL's nan_to_num of each token's ref − lp (a NaN token counts 0) | keep: slime's mean over
                 the masked-in tokens, padding multiplied by the mask (zeroed under padding: ignore), whose NaN
                 is never above δ, so the sequence is kept
    nonfinite    keep | zero-ratio: NeMo-RL's nan_to_num(·, nan=0, posinf=0, neginf=0) on the weight's ratio
                 (before the weight op: an overflowing ρ becomes 0, not `high`), on the ratio a token filter
                 compares and on each lr_t a sequence or geometric filter's statistic sums | zero-logratio:
                 AReaL's where(isfinite(lr), lr, 0) on the log-ratio itself (ratio 1; a finite lr still overflows)
    filter_metric log-ratio: the filter reads lr_t (compared as exp(stat) or stat, band_space) | k1, k2, k3:
                 AReaL's KL estimators of the raw lr_t (k1 = lr, k2 = lr²/2, k3 = e^−lr − 1 + lr), padding
                 removed by a where, compared with [low, high] as they are; filter max: the largest masked-in
                 statistic of the sequence (0 for a sequence with none)
    filter_nan   reject: a NaN statistic fails the band | keep: SkyRL's ¬(s > high) ∧ ¬(s < low) keeps it
    veto_high    reject a sequence if any masked-in ρ_t > veto_high (SkyRL's outlier mask, with `veto` its low side)
    token mask   token_mask_low/high: tokens whose ρ_t leaves [low, high] are rejected (SkyRL's token_mask_is_*)
    m2_threshold M2PO (AReaL): over the batch's masked-in tokens, drop those with the largest lr_t² until the
                 mean of the rest is under the threshold (at least one is kept); they leave the action mask
    statistics_mask  original: the weight's and the filter's sums read the action mask | masked: they read it
                 after the M2 mask, the veto and the token mask (SkyRL: outlier → token mask → TIS → sequence
                 mask; AReaL: M2PO before its rejection sampling), so an inf lr_t they removed is NaN (inf·0) there
    weight_padding keep | zero: the coefficient is exactly 0 at padding, whatever the padding mode (AReaL's
                 where(loss_mask, behave_imp_weight, 0): an overflowing ρ_t there cannot meet a 0 in the backward)

All outputs are detached: no gradient flows through a coefficient. Nothing here knows about
configs, files or the CLI, so every study (case, train, probe, audit) calls the same maths.

About 570 lines on purpose: the data, its validation and the one evaluator read as the table above, top to
bottom; the steps only one or two frameworks add live in runner/core/framework_steps.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from runner.core.framework_steps import (  # noqa: F401 - SELF_NORMALIZE_MIN_MEAN, m2po_keep, off_policy_sequence_keep and in_diff_band are used from here
    SELF_NORMALIZE_MIN_MEAN,
    band_keep,
    batch_normalized,
    early_masks,
    in_diff_band,
    kl_filter_keep,
    m2po_keep,
    off_policy_sequence_keep,
    self_normalized,
    sequence_max,
    token_statistic,
)
from runner.core.masking import shuffled_keep, zero_padding, zero_where_not
from runner.core.metrics import correction_metrics, correction_metrics_by_group
from runner.core.segments import segment_mean
from runner.errors import UserError

LEVELS = ("none", "token", "sequence", "geometric")
# ROLL's segment level, for the weight and both filters: a level of its own, after the others
SEGMENT_LEVELS = (*LEVELS, "segment")
CHOICES = {
    "ratio": ("decoupled", "bypass"),
    "weight": SEGMENT_LEVELS,
    "weight_op": ("raw", "clamp", "clamp-high"),
    "filter": (*SEGMENT_LEVELS, "max"),  # max aggregates a filter's statistic, never a weight
    "diff_filter": SEGMENT_LEVELS,
    "filter_statistic": ("log-ratio", "k2", "k3"),
    # value: the statistic itself is compared with [low, high] (verl's k2 / k3 thresholds)
    "band_space": ("ratio", "log", "value"),
    "normalize": ("none", "batch"),
    "opsm_reference": ("roll", "old"),
    "reject": ("where", "multiply"),
    "denominator": ("keep", "drop", "drop-tokens"),
    # ignore: masked positions are replaced before any arithmetic, so NaN/inf padding cannot leak.
    # multiply: released code's `x * mask`, where NaN·0 = NaN leaks. zero-logratio: TRL's
    # log-ratio is zeroed at padding (ratio 1), the loss is still reduced by multiplication.
    # masked-sum: as multiply, but a token-mean reduction first replaces masked values by 0, as verl's
    # masked_sum does (torch.where), so NaN padding leaves the loss finite (not its gradient there).
    "padding": ("ignore", "multiply", "zero-logratio", "masked-sum"),
    "nonfinite": ("keep", "zero-ratio", "zero-logratio"),
    "filter_metric": ("log-ratio", "k1", "k2", "k3"),
    "filter_nan": ("reject", "keep"),
    "statistics_mask": ("original", "masked"),
    "weight_padding": ("keep", "zero"),
    "self_normalize": ("none", "token", "sequence"),
    "opsm_nan": ("zero", "keep"),
}


# slime's tis_batch_normalize divides only by a mean above this (mis.py)
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
    filter_metric: str = "log-ratio"  # AReaL's rejection_sampling.metric: ratio, or a KL estimator k1/k2/k3
    filter_nan: str = "reject"  # SkyRL's sequence mask keeps a NaN statistic
    veto_high: float | None = None  # SkyRL's outlier_token_is_threshold_high (a sequence veto from above)
    token_mask_low: float | None = None  # SkyRL's token_mask_is_threshold_low/high: a token mask before the rest
    token_mask_high: float | None = None
    m2_threshold: float | None = None  # AReaL's M2PO second-moment mask over the batch
    statistics_mask: str = "original"  # the mask the weight's and filter's sums read (see the module docstring)
    weight_padding: str = "keep"  # zero: the coefficient is exactly 0 at padding (AReaL's where(loss_mask, w, 0))
    filter_statistic: str = "log-ratio"  # per token, before the filter aggregates: lr, or verl's k2 / k3 of it
    normalize: str = "none"  # batch: self-normalised weights, mean 1 over the batch (verl's batch_normalize)
    # Off-policy sequence masking (OPSM, DeepSeek-V3.2): drop a negative-advantage sequence whose mean
    # KL(ref ‖ π_θ) estimate mean_t(ref − lp) exceeds opsm_delta; ref is the engine's log-probs (TRL) or old
    opsm_delta: float | None = None
    opsm_reference: str = "roll"
    faithful: bool = False  # reproduces released code, bugs included
    # The probability-difference filter: Δp = exp(base) − exp(roll) at diff_filter's level inside
    # [diff_low, diff_high] (either may be null: no bound on that side; negative bounds are allowed)
    diff_filter: str = "none"
    diff_low: float | None = None
    diff_high: float | None = None
    self_normalize: str = (
        "none"  # slime's tis_batch_normalize: divide the weights by their mean in the call: none | token | sequence
    )
    opsm_nan: str = (
        "zero"  # how OPSM's per-sequence drift treats NaN: zero (TRL, per token) | keep (slime: a NaN mean keeps)
    )

    @property
    def active(self) -> bool:
        return (
            self.weight != "none"
            or self.filter != "none"
            or self.veto is not None
            or self.has_masks
            or self.opsm_delta is not None
            or self.diff_filter != "none"
        )

    @property
    def has_masks(self) -> bool:
        """Any of the masks that run before the weight and the filter (veto_high, token mask, M2PO)."""
        return (
            self.veto_high is not None
            or self.token_mask_low is not None
            or self.token_mask_high is not None
            or self.m2_threshold is not None
        )

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
        for key in (
            "low",
            "high",
            "veto",
            "log_clamp",
            "filter_log_clamp",
            "veto_high",
            "token_mask_low",
            "token_mask_high",
            "m2_threshold",
            "opsm_delta",
        ):
            value = getattr(self, key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
                raise UserError(f"correction.{key} must be a number or null, got {value!r}")
            if value < 0:
                raise UserError(f"correction.{key} must be non-negative, got {value}")
        if self.low is not None and self.high is not None and self.low > self.high:
            raise UserError(f"correction.low ({self.low}) > correction.high ({self.high})")
        if (
            self.token_mask_low is not None
            and self.token_mask_high is not None
            and self.token_mask_low > self.token_mask_high
        ):
            raise UserError(
                f"correction.token_mask_low ({self.token_mask_low}) > correction.token_mask_high ({self.token_mask_high})"
            )
        if self.filter_metric != "log-ratio" and self.band_space != "ratio":
            raise UserError(
                f"correction.filter_metric={self.filter_metric} is compared as it is; band_space=log is for log-ratios"
            )
        for key in ("diff_low", "diff_high"):
            value = getattr(self, key)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value)
            ):
                raise UserError(f"correction.{key} must be a number or null, got {value!r}")
        if self.diff_low is not None and self.diff_high is not None and self.diff_low > self.diff_high:
            raise UserError(f"correction.diff_low ({self.diff_low}) > correction.diff_high ({self.diff_high})")
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
        if self.filter_statistic != "log-ratio" and self.band_space != "value":
            raise UserError(
                f"correction.filter_statistic={self.filter_statistic} is a divergence, not a log-ratio: it needs "
                "correction.band_space=value (its threshold is compared with the statistic itself)"
            )
        if self.normalize != "none" and self.weight == "none":
            raise UserError("correction.normalize=batch needs a weight to normalise (correction.weight is none)")


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


@dataclass(frozen=True)
class Bands:
    """K bands [low, high] evaluated at once (the probe's estimates): each bound becomes a [K, 1, 1] tensor,
    so the clamp and the band test broadcast to [K, B, T]. A missing bound is ±inf there, which the clamp
    and band_keep treat exactly as they treat None (NaN fails both comparisons, ±inf passes an infinite
    bound). Each bound is converted as the scalar path converts it: in Python, then to the compared
    tensor's dtype."""

    pairs: tuple[tuple[float | None, float | None], ...]

    def bounds(self, like: torch.Tensor, log: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        def value(bound: float | None, missing: float) -> float:
            if bound is None:
                return missing
            return (math.log(bound) if bound > 0 else -math.inf) if log else bound

        def column(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=like.dtype, device=like.device).view(-1, 1, 1)

        return (
            column([value(lo, -math.inf) for lo, _ in self.pairs]),
            column([value(hi, math.inf) for _, hi in self.pairs]),
        )


def banded(corr: Correction) -> bool:
    """Whether _evaluate can take every band of `corr` at once: not with a batch-level normalisation of the
    clamped weight (its mean would run over the bands too) nor a random filter control."""
    return corr.normalize == "none" and corr.self_normalize == "none" and not corr.filter_shuffle


def _in_band(stat: torch.Tensor, corr: Correction, token_ratio: bool = False, bands: Bands | None = None):
    """stat is a log-space statistic; compare it where the framework compares. `token_ratio`: stat is
    each token's lr, so under nonfinite=zero-ratio the ratio compared is the one the weight uses."""
    if corr.band_space == "ratio":
        value = torch.exp(stat)
        if corr.nonfinite == "zero-ratio" and token_ratio:
            value = _zero_nonfinite(value)
        lo, hi = (corr.low, corr.high) if bands is None else bands.bounds(value)
    elif corr.band_space == "value":
        value = stat
        lo, hi = (corr.low, corr.high) if bands is None else bands.bounds(value)
    else:
        value = stat
        if bands is not None:
            lo, hi = bands.bounds(value, log=True)
        else:
            lo = None if corr.low is None else (math.log(corr.low) if corr.low > 0 else -math.inf)
            hi = None if corr.high is None else (math.log(corr.high) if corr.high > 0 else -math.inf)
    return band_keep(value, lo, hi, corr.filter_nan)


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
    adv: torch.Tensor | None = None,
) -> CorrectionResult:
    """Evaluate `corr` on one batch of [B, T] log-probs; see the module docstring. `generator`: the random
    stream of `filter_shuffle` (required by it, unused otherwise). `adv`: the [B, T] advantages, which only
    off-policy sequence masking reads (without them it masks nothing)."""
    ev = _evaluate(corr, old, roll, mask, lp, generator, adv)
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
    adv: torch.Tensor | None = None,
) -> list[CorrectionResult]:
    """`apply_correction` on each group of sequences (contiguous slices that tile the batch, like
    a step's mini-batches), evaluated once for the whole batch: every coefficient is a function of
    its own sequence (but for normalize: batch, whose mean is the whole batch's, as verl normalises
    before it splits), so group g's result equals apply_correction on the rows g, and the metrics
    of all groups come from one pass (a small batch pays per call, not per element). With
    `filter_shuffle` the permutation is drawn over the whole batch, then split. M2PO's mask is a function of
    the batch it sees (AReaL computes it per micro-batch), so under m2_threshold each group is its own batch, and
    so under self_normalize (slime normalises each micro-batch by its own mean)."""
    if corr.m2_threshold is not None or corr.self_normalize != "none":
        return [
            apply_correction(
                corr,
                old[g],
                roll[g],
                mask[g],
                None if lp is None else lp[g],
                metrics=metrics,
                generator=generator,
                adv=None if adv is None else adv[g],
            )
            for g in groups
        ]
    ev = _evaluate(corr, old, roll, mask, lp, generator, adv)
    inputs = ev.metric_inputs()
    per_group = correction_metrics_by_group(corr, *inputs, groups=groups) if metrics else [{} for _ in groups]
    return [
        CorrectionResult(coef=ev.coef[g], mask=ev.new_mask[g], keep=ev.keep_full[g], metrics=m)
        for g, m in zip(groups, per_group)
    ]


def correction_parts(
    corr: Correction, old, roll, mask, lp=None, generator=None, adv=None, masks=None, bands: Bands | None = None
) -> _Evaluation:
    """apply_correction's intermediates (the raw and clamped weight, the survivors), for a caller that
    vectorises around the algebra and needs more than its result (the probe's per-band path). `masks`:
    early_masks' result for this batch, which does not depend on the band, computed once by a caller that
    evaluates many bands (M2PO sorts the whole batch). `bands`: every band at once where banded(corr), in
    place of corr's own [low, high]; what depends on the band then has a leading band axis."""
    if bands is not None and not banded(corr):
        raise ValueError(f"correction {corr.name}: its bands cannot be evaluated at once")
    return _evaluate(corr, old, roll, mask, lp, generator, adv, masks, bands)


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


def _evaluate(corr: Correction, old, roll, mask, lp, generator=None, adv=None, masks=None, bands=None) -> _Evaluation:
    mask = mask.to(old.dtype)
    lr = mismatch_log_ratio(corr, old, roll, mask, lp)
    if masks is None and corr.has_masks:
        masks = early_masks(corr, old, roll, mask, lr, lp)
    stats_mask = mask
    if masks is not None and corr.statistics_mask == "masked":
        stats_mask = masks.stats_mask
    count = stats_mask.sum(-1, keepdim=True)  # [B, 1]
    # verl's masked_sum selects the masked-in values first (a where), so NaN padding stays out of L_i there
    summed = torch.where(mask > 0, lr, 0.0) if corr.padding == "masked-sum" else lr
    seq_lr = (summed * stats_mask).sum(-1, keepdim=True) if corr.weight in ("sequence", "geometric") else None  # L_i

    # The coefficient, before rejection.
    if corr.weight == "none":
        raw = torch.ones_like(lr)
    elif corr.weight == "token":
        raw = _exp_clamped(lr, corr.log_clamp)
    elif corr.weight == "sequence":
        raw = _exp_clamped(seq_lr, corr.log_clamp).expand_as(lr)
    elif corr.weight == "segment":
        raw = _exp_clamped(segment_mean(lr, mask), corr.log_clamp)
    else:
        raw = _exp_clamped(seq_lr / count.clamp(min=1), corr.log_clamp).expand_as(lr)
    if corr.nonfinite == "zero-ratio":  # before the clamp, as NeMo-RL does: inf → 0, not → high
        raw = _zero_nonfinite(raw)
    if bands is not None and corr.weight_op in ("clamp", "clamp-high"):
        low, high = bands.bounds(raw)
        weight = raw.clamp(min=low, max=high) if corr.weight_op == "clamp" else raw.clamp(max=high)
    elif corr.weight_op == "clamp" and (corr.low, corr.high) != (None, None):
        weight = raw.clamp(min=corr.low, max=corr.high)
    elif corr.weight_op == "clamp-high" and corr.high is not None:
        weight = raw.clamp(max=corr.high)
    else:
        weight = raw
    # self-normalised: the coefficient is scaled, `weight` stays the clamped one (clamped_fraction reads it)
    scaled = batch_normalized(weight, mask, corr.weight) if corr.normalize == "batch" else weight
    if corr.self_normalize != "none":  # slime's: the mean of what one call sees, before rejection
        scaled = self_normalized(scaled, mask, corr.self_normalize)

    # Which units survive: a [B, T] mask for token filters, [B, 1] for sequence ones.
    keep = None
    if corr.filter != "none" and corr.filter_metric != "log-ratio":
        keep = kl_filter_keep(corr, old, roll, stats_mask, lp, None if bands is None else bands.bounds)
    elif corr.filter != "none":
        stat_lr = lr if corr.filter_log_clamp is None else lr.clamp(-corr.filter_log_clamp, corr.filter_log_clamp)
        if corr.filter == "token":
            stat = token_statistic(stat_lr, corr.filter_statistic)
        elif corr.filter == "segment":
            stat = segment_mean(_zero_nonfinite(stat_lr) if corr.nonfinite == "zero-ratio" else stat_lr, mask)
        else:
            if corr.nonfinite == "zero-ratio":
                stat_lr = _zero_nonfinite(stat_lr)
            stat_lr = token_statistic(stat_lr, corr.filter_statistic)
            if corr.filter == "max":
                stat = sequence_max(stat_lr, stats_mask)
            else:
                if corr.padding == "masked-sum":
                    stat_lr = torch.where(mask > 0, stat_lr, 0.0)
                stat = (stat_lr * stats_mask).sum(-1, keepdim=True)
            if corr.filter == "geometric":
                stat = stat / count.clamp(min=1)
        keep = _in_band(-stat if corr.filter_inverted else stat, corr, corr.filter == "token", bands)
    if corr.diff_filter != "none":
        passed = in_diff_band(corr, old, roll, mask, lp)
        keep = passed if keep is None else keep & passed
    if corr.filter != "none":
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
    if masks is not None:
        keep = masks.keep if keep is None else keep & masks.keep

    # Rejection: `where` zeroes exactly (never 0·inf), `multiply` is the released code's product.
    # Under `padding: ignore` the coefficient is also exactly 0 at padding.
    new_mask = mask
    coef = scaled
    if keep is not None:
        keep_float = keep.to(weight.dtype)
        coef = zero_where_not(scaled, keep, keep_float) if corr.reject == "where" else scaled * keep_float
        if corr.denominator in ("drop", "drop-tokens"):
            new_mask = mask * keep_float
    if masks is not None and masks.m2_keep is not None:  # AReaL counts its tokens after M2PO
        new_mask = new_mask * masks.m2_keep.to(mask.dtype)
    if corr.opsm_delta is not None and adv is not None:
        # a product, as TRL's per_token_loss * off_policy_mask: an inf coefficient it drops becomes NaN
        opsm = off_policy_sequence_keep(corr, old if lp is None else lp, old, roll, adv, mask)
        coef = coef * opsm.to(coef.dtype)
        if corr.denominator in ("drop", "drop-tokens"):
            new_mask = new_mask * opsm.to(mask.dtype)
        keep = opsm if keep is None else keep & opsm
    if corr.padding == "ignore" or corr.weight_padding == "zero":
        coef = zero_padding(coef, mask)
    coef = coef.detach()
    keep_full = torch.ones((1, 1), dtype=torch.bool) if keep is None else keep
    keep_full = keep_full.expand(*keep_full.shape[:-2], *lr.shape)  # [B, T], or [K, B, T] with bands
    return _Evaluation(
        coef=coef,
        new_mask=new_mask,
        keep_full=keep_full,
        old=old.detach(),
        roll=roll.detach(),
        mask=mask,
        lr=lr,
        raw=raw,
        weight=weight,
        keep=keep,
    )
