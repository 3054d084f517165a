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
"""

from __future__ import annotations

from dataclasses import replace

import torch

from runner.core.corrections import Correction, apply_correction
from runner.core.losses import LossSpec, policy_loss
from runner.core.schema import CORRECTION_METRICS
from runner.replay.schema import StepBatch

RAW_WEIGHT_COLUMNS = ("raw_weight_mean", "raw_weight_std", "raw_weight_min", "raw_weight_max")
LOSS_COLUMNS = ("loss", "grad_norm", "nonfinite_loss", "nonfinite_grad", "nonfinite_inputs", "nonfinite_coef")
REPLAY_COLUMNS = (
    "step",
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


def _raw_weight(corr: Correction, batch: StepBatch, lp) -> dict[str, float]:
    """The weight before the clamp and before any rejection: the preset with weight_op raw and no filter."""
    if corr.weight == "none":
        return dict(zip(RAW_WEIGHT_COLUMNS, (1.0, 0.0, 1.0, 1.0) if batch.tokens else (0.0,) * 4))
    bare = replace(corr, weight_op="raw", filter="none", filter_shuffle=False, veto=None)
    coef = apply_correction(bare, _old(batch), batch.roll, batch.mask, lp=lp, metrics=False).coef
    return masked_stats(coef, batch.mask)


def _old(batch: StepBatch) -> torch.Tensor:
    # A bypass form never reads `old` for its ratio; the metrics' max|Δp| then compares lp with roll.
    return batch.old if batch.old is not None else batch.lp


def _nonfinite_inputs(batch: StepBatch) -> int:
    keep = batch.mask > 0
    tensors = [t for t in (batch.old, batch.roll, batch.lp, batch.advantages) if t is not None]
    return int(sum(int((~torch.isfinite(t) & keep).sum()) for t in tensors))


def replay_step(batch: StepBatch, presets: list[Correction], loss: LossSpec, generator: torch.Generator) -> list[dict]:
    """One replay.csv row per preset for this step."""
    rows = []
    bad_inputs = _nonfinite_inputs(batch)
    sequences = int((batch.mask.sum(-1) > 0).sum())
    for preset in presets:
        corr, note = form(preset, batch)
        row = {
            "step": batch.step,
            "preset": preset.name,
            "applies": int(corr is not None),
            "ratio": "" if corr is None else corr.ratio,
            "sequences": sequences,
            "tokens": batch.tokens,
            "nonfinite_inputs": bad_inputs,
            "note": note,
        }
        if corr is not None:
            row.update(_evaluate(corr, batch, loss, generator))
            if batch.advantages is None:
                row["note"] = "; ".join(filter(None, [note, "no advantages in the dump: no loss"]))
        rows.append(row)
    return rows


def _evaluate(corr: Correction, batch: StepBatch, loss: LossSpec, generator: torch.Generator) -> dict:
    base = batch.lp if batch.lp is not None else batch.old
    lp = base.detach().clone().requires_grad_(batch.advantages is not None)
    old = _old(batch)
    cres = apply_correction(corr, old, batch.roll, batch.mask, lp=lp, metrics=True, generator=generator)
    out = {**cres.metrics, **_raw_weight(corr, batch, lp.detach())}
    out["nonfinite_coef"] = int((~torch.isfinite(cres.coef) & (batch.mask > 0)).sum())
    if batch.advantages is None:
        return out
    res = policy_loss(loss, corr, lp, old, batch.roll, batch.advantages, batch.mask, metrics=False, correction=cres)
    (grad,) = torch.autograd.grad(res.loss, lp, allow_unused=True)
    grad = torch.zeros_like(lp) if grad is None else grad
    out.update(
        loss=float(res.loss.detach()),
        grad_norm=float(torch.linalg.vector_norm(grad.double())),
        nonfinite_loss=int(not torch.isfinite(res.loss)),
        nonfinite_grad=int((~torch.isfinite(grad)).sum()),
    )
    return out
