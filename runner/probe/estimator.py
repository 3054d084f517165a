"""Every arm's gradient estimate of J from one batch: a fast vectorised path and a slow reference.

At lp = old the PPO ratio is exactly 1, inside the clip range, so the per-token surrogate's
gradient is −coef·A·∇lp (REINFORCE's is the same). With the reduction's weight s (1/N for
seq-mean-token-sum) the estimate of ∇J = −∇loss is

    ĝ = Σ_{i,t} g_it · ∇_θ log π_θ(y_it | s_it),    g_it = A_i · coef_it · mask'_it · s_it,

a weighting of the SAME per-token score vectors for every arm. `fast_estimates` does this for every
arm at once: one batched coefficient evaluation per preset over all its bands, then one weighted sum
of scores for the [arms, N, T] weight matrix, in closed form where the world has one
(`World.score_sums`: the bigram's scatter-add) and otherwise by one batched vector-Jacobian product
through the trainer's log-probs. `reference_estimates` runs `runner.core.losses.policy_loss` and a
backward pass per arm; tests/test_probe.py checks they agree to 1e-5.

Reductions other than seq-mean-token-sum are rescaled by T = rollout.seq_len, which is exact when
every response has T tokens (no EOS) and nothing is dropped from the denominator.

NaN/inf follow autograd's semantics: a non-finite coefficient times any zero factor (an advantage
of 0, a mask of 0 under `padding: multiply`) is NaN in both paths, as in the released code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from runner.core.corrections import (
    Bands,
    Correction,
    banded,
    correction_parts,
    early_masks,
    in_diff_band,
    mismatch_log_ratio,
)
from runner.core.losses import LossSpec, policy_loss
from runner.core.segments import segment_mean
from runner.errors import UserError
from runner.probe.settings import Arm
from runner.worlds.protocol import Params, flat


@dataclass(frozen=True)
class PresetGroup:
    """The arms that share one preset: the band-free correction and its bands as [K, 1, 1] bounds
    (a missing bound is ∓inf, which clamps and compares exactly like no bound)."""

    correction: Correction
    index: tuple[int, ...]  # positions in the arm list
    low: torch.Tensor
    high: torch.Tensor
    log_low: torch.Tensor
    log_high: torch.Tensor
    any_bound: bool
    bands: tuple[tuple[float | None, float | None], ...] = ()  # each arm's (low, high) as configured


def plan(arms: list[Arm]) -> list[PresetGroup]:
    groups: dict[Correction, list[int]] = {}
    for i, arm in enumerate(arms):
        if arm.correction.filter_shuffle:  # the probe's estimator has no random stream for it
            raise UserError(
                f"probe: correction={arm.correction.name} with filter_shuffle=true is a train-study "
                "control; the probe does not shuffle"
            )
        groups.setdefault(replace(arm.correction, low=None, high=None), []).append(i)
    out = []
    for corr, index in groups.items():
        lows = [arms[i].correction.low for i in index]
        highs = [arms[i].correction.high for i in index]

        def bounds(values, missing, log=False):
            vals = []
            for v in values:
                if v is None:
                    vals.append(missing)
                elif log:
                    vals.append(math.log(v) if v > 0 else -math.inf)
                else:
                    vals.append(v)
            return torch.tensor(vals, dtype=torch.float32).view(-1, 1, 1)

        out.append(
            PresetGroup(
                corr,
                tuple(index),
                bounds(lows, -math.inf),
                bounds(highs, math.inf),
                bounds(lows, -math.inf, log=True),
                bounds(highs, math.inf, log=True),
                any(v is not None for v in lows + highs),
                tuple(zip(lows, highs)),
            )
        )
    return out


def _self_normalized_bands(weight: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """[.., B, T] weights divided by their mean over the batch (the last two dimensions), band by band; a mean
    not above 1e-8 (or NaN) divides nothing."""
    from runner.core.corrections import SELF_NORMALIZE_MIN_MEAN

    masked = weight * mask
    if level == "token":
        mean = masked.sum((-2, -1), keepdim=True) / mask.sum().clamp(min=1)
    else:
        mean = (masked.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)).mean(-2, keepdim=True)
    return torch.where(mean > SELF_NORMALIZE_MIN_MEAN, weight / mean, weight)


def band_coefficients(
    group: PresetGroup, old: torch.Tensor, roll: torch.Tensor, mask: torch.Tensor, full: bool = False
):
    """`apply_correction` for one preset and its K bands at once, at lp = old: (coef, reduction
    mask, keep or None, changed or None), each broadcastable to [K, B, T] (a sequence-level factor
    stays [.., B, 1] until it is used); `changed` is where the clamp changed the weight (None for a
    preset that does not clamp). The band-free parts (log-ratios, raw weight, filter statistic,
    veto) are computed once. `full`: the mask is all ones, so the padding wheres are skipped."""
    corr = group.correction
    inside = None if full and corr.veto is None else mask > 0
    lr = old - roll  # decoupled; bypass (lp − roll) is the same at lp = old
    if corr.nonfinite == "zero-logratio":
        lr = torch.where(torch.isfinite(lr), lr, 0.0)
    if corr.padding in ("ignore", "zero-logratio") and not full:
        lr = torch.where(inside, lr, 0.0)

    def exp_clamped(x, bound):
        return torch.exp(x if bound is None else x.clamp(-bound, bound))

    def per_seq(x, geometric):
        x = (x * mask).sum(-1, keepdim=True) if not full else x.sum(-1, keepdim=True)
        return x / mask.sum(-1, keepdim=True).clamp(min=1) if geometric else x

    if corr.weight == "none":
        raw = torch.ones(1, 1, dtype=old.dtype)
    elif corr.weight == "token":
        raw = exp_clamped(lr, corr.log_clamp)
    elif corr.weight == "segment":  # one run of T tokens when the mask is full: the geometric level
        raw = exp_clamped(per_seq(lr, True) if full else segment_mean(lr, mask), corr.log_clamp)
    else:
        raw = exp_clamped(per_seq(lr, corr.weight == "geometric"), corr.log_clamp)  # [B, 1]
    if corr.nonfinite == "zero-ratio":
        raw = torch.nan_to_num(raw, nan=0.0, posinf=0.0, neginf=0.0)
    if corr.weight_op == "clamp" and group.any_bound:
        weight = raw.clamp(min=group.low, max=group.high)
    elif corr.weight_op == "clamp-high" and bool(torch.isfinite(group.high).any()):
        weight = raw.clamp(max=group.high)
    else:
        weight = raw
    changed = weight != raw if weight is not raw else None
    if corr.self_normalize != "none":  # each band's weights by their own batch mean (framework_steps.self_normalized)
        weight = _self_normalized_bands(weight.expand(*weight.shape[:-1], mask.shape[-1]), mask, corr.self_normalize)

    keep = None
    if corr.filter != "none":
        stat_lr = lr if corr.filter_log_clamp is None else lr.clamp(-corr.filter_log_clamp, corr.filter_log_clamp)
        if corr.nonfinite == "zero-ratio" and corr.filter != "token":
            stat_lr = torch.nan_to_num(stat_lr, nan=0.0, posinf=0.0, neginf=0.0)
        if corr.filter == "segment" and not full:
            stat = segment_mean(stat_lr, mask)
        else:
            stat = stat_lr if corr.filter == "token" else per_seq(stat_lr, corr.filter in ("geometric", "segment"))
        if corr.filter_inverted:
            stat = -stat
        if corr.band_space == "ratio":
            value = torch.exp(stat)
            if corr.nonfinite == "zero-ratio" and corr.filter == "token":
                value = torch.nan_to_num(value, nan=0.0, posinf=0.0, neginf=0.0)
            keep = (value >= group.low) & (value <= group.high)
        else:
            keep = (stat >= group.log_low) & (stat <= group.log_high)
    if corr.diff_filter != "none":  # band-free: the same for every band of the group
        passed = in_diff_band(corr, old, roll, mask, old)  # lp = old
        keep = passed if keep is None else keep & passed
    if corr.veto is not None:
        threshold = math.log(corr.veto) if corr.veto > 0 else -math.inf
        vetoed = ((lr < threshold) & inside).any(-1, keepdim=True)
        keep = ~vetoed if keep is None else keep & ~vetoed

    red_mask = mask
    if keep is None:
        coef = weight
    else:
        if corr.reject == "where":
            coef = torch.where(keep, weight, 0.0)
        else:
            coef = weight * keep.to(weight.dtype)
        if corr.denominator in ("drop", "drop-tokens"):
            red_mask = mask * keep.to(mask.dtype)
    if corr.padding == "ignore" and not full:
        coef = torch.where(inside, coef, 0.0)
    return coef, red_mask, keep, changed


def vectorised(corr: Correction) -> bool:
    """Whether band_coefficients' closed form covers `corr`. The options it leaves out go through the
    algebra itself, one band at a time: a k2 / k3 or max filter, a value band, batch-normalised weights,
    OPSM, the masks that run before the weight and the filter (SkyRL's order of operations, M2PO), AReaL's
    KL statistics, zeroed padding and SkyRL's NaN-keeping band."""
    return (
        corr.filter_statistic == "log-ratio"
        and corr.filter != "max"
        and corr.band_space != "value"
        and corr.normalize == "none"
        and corr.opsm_delta is None
        and not corr.has_masks
        and corr.statistics_mask == "original"
        and corr.filter_metric == "log-ratio"
        and corr.filter_nan == "reject"
        and corr.weight_padding == "keep"
    )


def per_band_coefficients(group: PresetGroup, old: torch.Tensor, roll: torch.Tensor, mask: torch.Tensor, adv=None):
    """band_coefficients' outputs, [K, B, T] each, from runner.core.corrections evaluated on every band (at
    lp = old, as the probe's estimate is): the same order of operations as training by construction. The
    bands go through the algebra at once (corrections.Bands) unless the correction normalises its weight
    over the batch or draws a random control; then one band at a time."""
    corr = group.correction
    early = None  # the masks before the weight (M2PO, SkyRL's) do not depend on the band: computed once
    if corr.has_masks:
        m = mask.to(old.dtype)
        early = early_masks(corr, old, roll, m, mismatch_log_ratio(corr, old, roll, m, old), old)
    shape = (len(group.bands), *old.shape)
    if banded(corr):  # a leading band axis where the band matters, broadcast where it does not
        ev = correction_parts(corr, old, roll, mask, lp=old, adv=adv, masks=early, bands=Bands(tuple(group.bands)))
        coef, new_mask, keep_full, weight, raw = ev.coef, ev.new_mask, ev.keep_full, ev.weight, ev.raw
    else:
        evs = [
            correction_parts(replace(corr, low=low, high=high), old, roll, mask, lp=old, adv=adv, masks=early)
            for low, high in group.bands
        ]
        coef, new_mask = torch.stack([e.coef for e in evs]), torch.stack([e.new_mask for e in evs])
        keep_full = torch.stack([e.keep_full for e in evs])
        weight, raw = torch.stack([e.weight for e in evs]), torch.stack([e.raw for e in evs])
    changed = (weight != raw).expand(shape) if corr.weight_op != "raw" else None
    rejects = (
        corr.filter != "none"
        or corr.veto is not None
        or corr.opsm_delta is not None
        or corr.has_masks
        or corr.diff_filter != "none"
    )
    keep = keep_full.expand(shape) if rejects else None
    # AReaL counts its tokens after M2PO, whatever the denominator
    dropped = (corr.denominator in ("drop", "drop-tokens") and keep is not None) or corr.m2_threshold is not None
    red_mask = new_mask.expand(shape) if dropped else mask
    return coef.expand(shape), red_mask, keep, changed


def reduction_weights(
    red_mask: torch.Tensor, reduction: str, n_seq: int, sequences: torch.Tensor | None = None
) -> torch.Tensor:
    """mask'·s: d(reduced loss)/d(per-token loss) for [.., B, T] reduction masks. `sequences`: the
    seq-mean-token-mean count of sequences when it is not red_mask's non-empty rows (drop-tokens)."""
    if reduction == "seq-mean-token-sum":
        return red_mask * (1.0 / max(n_seq, 1))
    if reduction == "token-mean":
        return red_mask / red_mask.sum((-2, -1), keepdim=True).clamp(min=1)
    counts = red_mask.sum(-1, keepdim=True)
    nonempty = counts > 0
    per_seq = torch.where(nonempty, 1.0 / counts.clamp(min=1), 0.0)
    divisor = nonempty.sum((-2, -1), keepdim=True) if sequences is None else sequences
    return red_mask * per_seq / divisor.clamp(min=1)


def scale_for(reduction: str, seq_len: int) -> float:
    """The exact rescale that makes the estimate's on-policy mean ∇J (see the module docstring)."""
    return 1.0 if reduction == "seq-mean-token-sum" else float(seq_len)


@dataclass
class Estimates:
    grad: torch.Tensor  # [K, n_params] float32: each arm's estimate of ∇J (flat)
    # None when not asked for (metrics=False):
    ess: torch.Tensor | None  # [K]: (Σw)² / (n·Σw²) over masked-in tokens (as correction_metrics)
    masked: torch.Tensor | None  # [K]: the fraction of masked-in tokens rejected
    seq_masked: torch.Tensor | None  # [K]: the fraction of non-empty sequences with every token rejected
    clamped: torch.Tensor | None = None  # [K]: the fraction of masked-in tokens kept with a clamped weight


def score_sums(world, params: Params, batch, weights: torch.Tensor) -> torch.Tensor:
    """Σ_{i,t} w_kit ∇_θ log π_θ(y_it | ·) for K weightings at once: [K, B, T] → [K, n_params] (flat).
    The world's closed form where it has one, else one batched vector-Jacobian product."""
    closed = world.score_sums(params, batch.prompts, batch.tokens, weights)
    if closed is not None:
        return closed
    with torch.enable_grad():
        leaves = {name: p.detach().requires_grad_(True) for name, p in params.items()}
        logp = world.token_stats(leaves, batch.prompts, batch.tokens, entropy=False).logp
        grads = torch.autograd.grad(
            logp, list(leaves.values()), grad_outputs=weights.to(logp.dtype), is_grads_batched=True, allow_unused=True
        )
    K = weights.shape[0]
    return torch.cat(
        [
            torch.zeros(K, p.numel(), dtype=weights.dtype) if g is None else g.reshape(K, -1)
            for p, g in zip(leaves.values(), grads)
        ],
        dim=1,
    )


def fast_estimates(
    groups: list[PresetGroup],
    n_arms: int,
    batch,
    world,
    params: Params,
    reduction: str,
    seq_len: int,
    metrics: bool = True,
) -> Estimates:
    """Every arm's estimate from one batch: per preset, the coefficients of all its bands, times
    the shared A·mask'·s, written straight into one [arms, B, T] weight matrix; then one scatter."""
    mask = batch.mask
    B, T = mask.shape
    full = bool(mask.min() > 0)
    weights = torch.empty(n_arms, B, T, dtype=torch.float32)
    shared = batch.adv * reduction_weights(mask, reduction, B)  # A·mask·s when nothing is dropped
    if metrics:
        inside = mask > 0
        n_in = inside.sum()
        n_tok = n_in.clamp(min=1)
        nonempty = inside.any(-1)
        n_seq = nonempty.sum().clamp(min=1)
        ess, masked, seq_masked, clamped = (torch.zeros(n_arms) for _ in range(4))
    for group in groups:
        if vectorised(group.correction):
            coef, red_mask, keep, changed = band_coefficients(group, batch.old, batch.roll, mask, full)
        else:
            coef, red_mask, keep, changed = per_band_coefficients(group, batch.old, batch.roll, mask, batch.adv)
        sequences = (mask.sum(-1) > 0).sum() if group.correction.denominator == "drop-tokens" else None
        base = shared if red_mask is mask else batch.adv * reduction_weights(red_mask, reduction, B, sequences)
        i, j = group.index[0], group.index[-1] + 1
        contiguous = group.index == tuple(range(i, j))
        out = weights[i:j] if contiguous else torch.empty(len(group.index), B, T)
        # A·coef·mask'·s: a NaN wherever a non-finite coefficient meets a 0, as in autograd
        torch.mul(coef.expand(len(group.index), B, T), base, out=out)
        if not contiguous:
            weights[list(group.index)] = out
        if metrics:
            idx = list(group.index)
            c = coef.expand(len(idx), B, T)
            w = c if full else torch.where(inside, c, 0.0)
            sum_w, sum_w2 = w.sum((-2, -1)), (w * w).sum((-2, -1))
            ess[idx] = torch.where(
                sum_w2 > 0, sum_w * sum_w / (n_tok * sum_w2.clamp(min=torch.finfo(w.dtype).tiny)), 0.0
            )
            if keep is not None:
                kept = keep.expand(len(idx), B, T) & inside
                masked[idx] = (n_in - kept.sum((-2, -1))) / n_tok
                seq_masked[idx] = (nonempty & ~kept.any(-1)).sum(-1) / n_seq
            if changed is not None:  # as metrics.csv's clamped_fraction: kept tokens the clamp changed
                hit = changed.expand(len(idx), B, T) & inside
                if keep is not None:
                    hit = hit & keep.expand(len(idx), B, T)
                clamped[idx] = hit.sum((-2, -1)) / n_tok
    grad = score_sums(world, params, batch, weights)
    scale = scale_for(reduction, seq_len)
    if scale != 1:
        grad = grad * scale
    if not metrics:
        return Estimates(grad=grad, ess=None, masked=None, seq_masked=None)
    return Estimates(grad=grad, ess=ess, masked=masked, seq_masked=seq_masked, clamped=clamped)


def reference_estimates(arms: list[Arm], batch, world, params: Params, spec: LossSpec, seq_len: int) -> torch.Tensor:
    """The slow path: for each arm, the trainer's lp from θ, `policy_loss`, one backward pass. [K, n_params]."""
    scale = scale_for(spec.reduction, seq_len)
    out = []
    for arm in arms:
        leaves = {name: p.detach().clone().requires_grad_(True) for name, p in params.items()}
        lp = world.token_stats(leaves, batch.prompts, batch.tokens, entropy=False).logp
        res = policy_loss(spec, arm.correction, lp, batch.old, batch.roll, batch.adv, batch.mask, metrics=False)
        res.loss.backward()
        out.append(-flat({name: p.grad for name, p in leaves.items()}) * scale)
    return torch.stack(out)
