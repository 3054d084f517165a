"""One logged step through each correction: what it would have masked, clamped and weighted, and the loss
it would have given. Everything goes through the algebra's own functions (apply_correction, policy_loss),
vectorised over the step's whole [B, T] batch, as the probe evaluates a batch.

Which form of a preset is evaluated depends on what the dump holds:
  old present            the preset as it ships (every shipped preset is decoupled: lr = old − roll)
  no old, lp present     its bypass form (ratio: bypass, lr = lp − roll): the only ratio the dump allows
  neither                nothing to compare roll with: the row says so (`applies` 0) and its metrics are empty
The loss is PPO's (or loss=NAME's) at lp = the dump's lp, else lp = old (a step's first update, ratio 1), and
its gradient norm is taken with respect to those log-probs. Without advantages (is-study's tokens.csv) the
loss columns stay empty.

A step may be split into `minibatches` contiguous mini-batches of sequences, as a train step splits its batch
into `train.updates_per_step` (runner/training/loop.py): one row per mini-batch (`update`), each with that
mini-batch's metrics, as metrics.csv has one row per update. The coefficients are evaluated once for the whole
step and split (apply_correction_split), as the train loop does.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from runner.core.corrections import Correction, CorrectionResult, apply_correction, apply_correction_split
from runner.core.losses import LossSpec, policy_loss
from runner.core.schema import CORRECTION_METRICS
from runner.errors import UserError
from runner.replay.schema import StepBatch

RAW_WEIGHT_COLUMNS = ("raw_weight_mean", "raw_weight_std", "raw_weight_min", "raw_weight_max")
LOSS_COLUMNS = ("loss", "grad_norm", "nonfinite_loss", "nonfinite_grad", "nonfinite_inputs", "nonfinite_coef")
REPLAY_COLUMNS = (
    "step",
    "update",
    "preset",
    "applies",
    "ratio",
    "sequences",
    "tokens",
    *CORRECTION_METRICS,
    *RAW_WEIGHT_COLUMNS,
    *LOSS_COLUMNS,
    "note",
)

NO_TRAINER_LOGPROBS = "needs the trainer's log-probs: this dump holds neither old (decoupled form) nor lp (bypass form)"


def form(corr: Correction, batch: StepBatch) -> tuple[Correction | None, str]:
    """The preset as the dump allows it to be evaluated, and the note that says which form that is."""
    if corr.ratio == "decoupled" and batch.old is not None:
        return corr, ""
    if batch.lp is not None:
        note = "" if corr.ratio == "bypass" else "bypass form (lr = lp − roll): the dump holds no old"
        return replace(corr, ratio="bypass"), note
    if corr.ratio == "bypass":
        return None, "bypass: needs lp, the trainer's current log-probs, which this dump does not hold"
    return None, NO_TRAINER_LOGPROBS


def masked_stats(x: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """mean, std, min and max of x over masked-in tokens (0 for an empty batch, as the metrics give)."""
    keep = mask > 0
    n = int(keep.sum())
    if n == 0:
        return dict.fromkeys(RAW_WEIGHT_COLUMNS, 0.0)
    values = x[keep].double()
    return dict(
        zip(
            RAW_WEIGHT_COLUMNS,
            torch.stack([values.mean(), values.std(correction=0), values.min(), values.max()]).tolist(),
        )
    )


def _old(batch: StepBatch) -> torch.Tensor:
    # A bypass form never reads `old` for its ratio; the metrics' max|Δp| then compares lp with roll.
    return batch.old if batch.old is not None else batch.lp


def minibatch_slices(batch: StepBatch, minibatches: int) -> list[slice]:
    """The step's rows split as the train loop splits its batch: torch.arange(n).tensor_split(k), by sequence
    index, so a sequence keeps its mini-batch whatever padding it carries."""
    n = batch.mask.shape[0]
    if minibatches > n:
        raise UserError(
            f"{batch.source}: step {batch.step}: --minibatches {minibatches} is more than the step's {n} sequences"
        )
    return [slice(int(c[0]), int(c[-1]) + 1) for c in torch.arange(n).tensor_split(minibatches)]


def _nonfinite_inputs(batch: StepBatch, sl: slice) -> int:
    keep = batch.mask[sl] > 0
    tensors = [t[sl] for t in (batch.old, batch.roll, batch.lp, batch.advantages) if t is not None]
    return int(sum(int((~torch.isfinite(t) & keep).sum()) for t in tensors))


def replay_step(
    batch: StepBatch,
    presets: list[Correction],
    loss: LossSpec,
    generator: torch.Generator,
    minibatches: int = 1,
) -> list[dict]:
    """One replay.csv row per preset and mini-batch for this step (preset-major, mini-batches in order)."""
    slices = minibatch_slices(batch, minibatches)
    counts = [
        dict(
            sequences=int((batch.mask[sl].sum(-1) > 0).sum()),
            tokens=int(batch.mask[sl].sum()),
            nonfinite_inputs=_nonfinite_inputs(batch, sl),
        )
        for sl in slices
    ]
    rows = []
    for preset in presets:
        corr, note = form(preset, batch)
        if corr is not None:
            evaluated = _evaluate(corr, batch, loss, generator, slices)
            if batch.advantages is None:
                note = "; ".join(filter(None, [note, "no advantages in the dump: no loss"]))
        for update, count in enumerate(counts):
            row = {
                "step": batch.step,
                "update": update,
                "preset": preset.name,
                "applies": int(corr is not None),
                "ratio": "" if corr is None else corr.ratio,
                **count,
                "note": note,
            }
            if corr is not None:
                row.update(evaluated[update])
            rows.append(row)
    return rows


def _evaluate(
    corr: Correction, batch: StepBatch, loss: LossSpec, generator: torch.Generator, slices: list[slice]
) -> list[dict]:
    """Each mini-batch's metrics, raw weight, loss and gradient norm."""
    base = batch.lp if batch.lp is not None else batch.old
    lp = base.detach().clone().requires_grad_(batch.advantages is not None)
    old = _old(batch)
    parts = apply_correction_split(
        corr, old, batch.roll, batch.mask, slices, lp=lp, metrics=True, generator=generator, adv=batch.advantages
    )
    raw = _raw_weight(corr, batch, lp.detach())
    return [_evaluate_part(corr, batch, loss, lp, old, sl, part, raw) for sl, part in zip(slices, parts)]


def _raw_weight(corr: Correction, batch: StepBatch, lp) -> torch.Tensor | None:
    """The weight before the clamp and before any rejection (the preset with weight_op raw and no filter);
    None for a preset without a weight (it is 1 everywhere)."""
    if corr.weight == "none":
        return None
    bare = replace(corr, weight_op="raw", filter="none", filter_shuffle=False, veto=None, diff_filter="none")
    return apply_correction(bare, _old(batch), batch.roll, batch.mask, lp=lp, metrics=False).coef


def _evaluate_part(
    corr: Correction,
    batch: StepBatch,
    loss: LossSpec,
    lp: torch.Tensor,
    old: torch.Tensor,
    sl: slice,
    cres: CorrectionResult,
    raw: torch.Tensor | None,
) -> dict:
    mask = batch.mask[sl]
    if raw is None:
        raw_stats = dict(zip(RAW_WEIGHT_COLUMNS, (1.0, 0.0, 1.0, 1.0) if mask.sum() > 0 else (0.0,) * 4))
    else:
        raw_stats = masked_stats(raw[sl], mask)
    out = {**cres.metrics, **raw_stats}
    out["nonfinite_coef"] = int((~torch.isfinite(cres.coef) & (mask > 0)).sum())
    if batch.advantages is None:
        return out
    res = policy_loss(
        loss, corr, lp[sl], old[sl], batch.roll[sl], batch.advantages[sl], mask, metrics=False, correction=cres
    )
    (grad,) = torch.autograd.grad(res.loss, lp, allow_unused=True)
    grad = torch.zeros_like(lp) if grad is None else grad
    out.update(
        loss=float(res.loss.detach()),
        grad_norm=float(torch.linalg.vector_norm(grad.double())),
        nonfinite_loss=int(not torch.isfinite(res.loss)),
        nonfinite_grad=int((~torch.isfinite(grad)).sum()),
    )
    return out
