"""Differential testing: `--reference correction=PRESET` compares a subject with one of our presets
on ordinary inputs (|old − roll| ≤ 3, PPO unclipped, left-aligned masks), where both should agree
when the subject implements what the preset does. A bug that never overflows (a clamp that is
missing, so a kept token gets weight 10 where the band says at most 5) shows up here long before
any invariant notices.

The reference runs under loss=ppo and the subject's reduction (for an external target, the one
found on the calibration batch). Where the gradients differ, the finding speaks in weights: the
subject's coefficient (its weights function's, or the ratio of its gradient to plain PPO's at that
token, which is the weight a token-level correction applied) against the preset's.
"""

from __future__ import annotations

import torch

from runner.audit.invariants import Violation, _fmt, _same, _where
from runner.audit.subjects import Batch, PresetSubject
from runner.errors import UserError

CHECK = "reference"
F64 = torch.float64


def parse(text: str) -> str:
    key, sep, preset = text.partition("=")
    if key.strip() != "correction" or not sep or not preset.strip():
        raise UserError(f"--reference must be correction=PRESET (e.g. correction=seq-mask-tis), got {text!r}")
    return preset.strip()


def reference_subject(subject, preset: str) -> PresetSubject:
    """Our preset under the subject's loss (a preset subject) or loss=ppo with the target's reduction."""
    from runner.core.corrections import Correction
    from runner.core.losses import LossSpec
    from runner.hydra_app import app as hydra_app

    corr = Correction.from_config(hydra_app.to_container(hydra_app.compose([f"correction={preset}"]).correction))
    if subject.kind == "preset" or subject.fn is None:
        spec = subject.spec
    else:
        spec = LossSpec(reduction=subject.reduction() or "token-mean")
    return PresetSubject(corr, spec)


def check(subject, ref: PresetSubject, batch: Batch) -> Violation | None:
    if batch.all_masked:
        return None
    out, want = subject(batch, F64), ref(batch, F64)
    ok = _same(out.grad, want.grad, 1e-6, 1e-9) | (batch.mask == 0)
    if bool(ok.all()):
        if bool(_same(out.loss, want.loss, 1e-6, 1e-9)):
            return None
        return Violation(f"loss {_fmt(float(out.loss))}, correction={ref.name} gives {_fmt(float(want.loss))}", "loss")
    i, j = (~ok).nonzero()[0].tolist()
    theirs = float(want.coef[i, j]) if bool(want.keep[i, j]) else 0.0
    if subject.kind == "preset" or subject.has_coef:
        mine = float(out.coef[i, j]) if bool(out.keep[i, j]) else 0.0
        how = ""
    else:
        plain = float(subject.none()(batch, F64).grad[i, j])
        if plain == 0:
            return Violation(
                f"grad{_where(~ok)} {_fmt(float(out.grad[i, j]))}, correction={ref.name} gives "
                f"{_fmt(float(want.grad[i, j]))}",
                "grad",
            )
        mine = float(out.grad[i, j]) / plain
        how = " (its gradient over plain PPO's)"
    side = "above" if mine > theirs else "below"
    kept = "" if bool(want.keep[i, j]) else " (rejects it)"
    return Violation(
        f"token{_where(~ok)} gets weight {_fmt(mine)}{how}; correction={ref.name} gives {_fmt(theirs)}{kept}",
        f"weight:{side}",
    )
