"""The all-masked check: a batch in which no token is generated must give a finite loss and
gradient, or be refused with an exception the user documents as allowed (`--allow-raise`).

Such a batch is excluded from the seven invariants, where it made everything fail at once (0/0 in
a token mean is NaN, and a loss that refuses it "fails" every check). Here it is judged once. A
non-finite result is a finding only when the correction causes it: when the same batch on-policy
(old = roll = lp, so every correction is the identity) is non-finite in the same way, the reduction
divides by zero tokens whatever the correction does, and that is reported as a note instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from runner.audit.generators import InputProfile, all_masked_cases
from runner.audit.invariants import Violation, value_class
from runner.audit.subjects import Batch, Outcome, SubjectRaised

CHECK = "all-masked"
TEXT = "a batch with no generated token gives a finite loss and gradient (or an allowed refusal)"


@dataclass
class Verdict:
    status: str  # pass | fail | raise (a crash, reported once among the crashes)
    batch: Batch | None = None
    violation: Violation | None = None
    note: str | None = None


def _nonfinite(out: Outcome) -> str | None:
    loss = float(out.loss)
    if not math.isfinite(loss):
        return f"loss:{value_class(loss)}"
    bad = ~torch.isfinite(out.grad)
    if bool(bad.any()):
        return f"grad:{value_class(float(out.grad[bad][0]))}"
    return None


def judge(subject, batch: Batch, log) -> Verdict:
    """One all-masked batch. `log` is the subject's CrashLog."""
    try:
        out = subject(batch, torch.float32)
    except SubjectRaised as raised:
        crash = log.record(raised, CHECK)
        if crash is None:
            return Verdict(
                "pass", batch, note=f"refused with {type(raised.error).__name__} (allowed): {raised.error}".strip()
            )
        return Verdict("raise", batch)
    kind = _nonfinite(out)
    if kind is None:
        return Verdict("pass", batch)
    try:
        same_on_policy = _nonfinite(subject(batch.on_policy(), torch.float32)) == kind
    except SubjectRaised:
        same_on_policy = False
    quantity, value = kind.split(":")
    if same_on_policy:
        return Verdict(
            "pass",
            batch,
            note=f"{quantity} {value} on an all-masked batch with on-policy inputs too: "
            "the reduction divides by zero tokens, whatever the correction does",
        )
    return Verdict(
        "fail", batch, Violation(f"all-masked batch gives {quantity} {value}; on-policy the same batch is finite", kind)
    )


def check(subject, profile: InputProfile, log) -> Verdict:
    verdicts = [judge(subject, b, log) for b in all_masked_cases(profile)]
    for status in ("fail", "raise"):
        found = next((v for v in verdicts if v.status == status), None)
        if found:
            return found
    notes = [v.note for v in verdicts if v.note]
    return Verdict("pass", note=notes[0] if notes else None)
