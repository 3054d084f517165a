"""The seven invariants. Each has `applies(subject) -> reason | None` (a reason makes it n/a) and
`check(subject, batch) -> Violation | None`, where a violation is one line saying what went wrong
and carries its kind (which quantity went wrong, and how: "loss:-inf", "grad:nan", "coef:above"),
so that shrinking can keep the failure it found instead of drifting to a neighbour.

    1 finite     finite inputs (log-ratios of ±1000, log-probs of −1e4) → finite loss and gradient
    2 reject→0   a rejected unit (token or sequence) gets exactly zero gradient (not 0·inf = NaN)
    3 bounds     clamped coefficients lie in [low, high] (clamp) or ≤ high (clamp-high)
    4 padding    values at mask = 0, even NaN/±inf, change neither the loss nor the gradient
    5 on-policy  roll = old = lp → coefficient 1 and the loss (and gradient) of `none`
    6 permute    permuting the batch permutes per-sequence results; the loss is unchanged
    7 grad=FD    the gradient matches central finite differences where the loss is smooth

Checks 1-5 run in float32, as `is-study case` does; 6 and 7 in float64 (6 so that the summation
order cannot matter beyond 1e-6, 7 so that finite differences mean something). A batch with no
token at all is never checked here: it has its own check (runner/audit/all_masked.py). A subject
that raises is not a violation either: the audit reports each exception once (runner/audit/crashes.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from runner.audit.subjects import Batch, Outcome

F32, F64 = torch.float32, torch.float64


@dataclass(frozen=True)
class Invariant:
    number: int
    short: str
    text: str
    generator: str  # the strategy kind in runner/audit/generators.py
    applies: Callable[[object], str | None]
    check: Callable[[object, Batch], str | None]


class Violation(str):
    """A violation's text, with its kind (compared when shrinking: the kind must not change)."""

    kind: str

    def __new__(cls, text: str, kind: str) -> Violation:
        out = super().__new__(cls, text)
        out.kind = kind
        return out


# --------------------------------------------------------------------------------- helpers
def _fmt(x: float) -> str:
    return f"{x + 0.0:.6g}"  # + 0.0: −0 prints as 0


def value_class(x: float) -> str:
    """nan, inf, -inf, zero or finite: what kind of wrong a number is."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return "zero" if x == 0 else "finite"


def _where(mask: torch.Tensor) -> str:
    idx = mask.nonzero()
    if idx.numel() == 0:
        return "?"
    i, j = idx[0].tolist()
    more = f" (+{idx.shape[0] - 1} more)" if idx.shape[0] > 1 else ""
    return f"[{i}][{j}]{more}"


def _same(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float) -> torch.Tensor:
    """Elementwise: equal as floats, NaN equal to NaN, ±inf equal only to itself."""
    a, b = a.to(F64), b.to(F64)
    both_nan = torch.isnan(a) & torch.isnan(b)
    finite = torch.isfinite(a) & torch.isfinite(b)
    close = (a - b).abs() <= atol + rtol * b.abs()
    return both_nan | (finite & close) | (~finite & (a == b))


def _compare(what: str, got: Outcome, want: Outcome, rtol: float, atol: float, grad: bool = True) -> Violation | None:
    if not bool(_same(got.loss, want.loss, rtol, atol)):
        loss = float(got.loss)
        return Violation(f"{what}: loss {_fmt(loss)}, expected {_fmt(float(want.loss))}", f"loss:{value_class(loss)}")
    if grad:
        ok = _same(got.grad, want.grad, rtol, atol)
        if not bool(ok.all()):
            i, j = (~ok).nonzero()[0].tolist()
            value = float(got.grad[i, j])
            return Violation(
                f"{what}: grad{_where(~ok)} {_fmt(value)}, expected {_fmt(float(want.grad[i, j]))}",
                f"grad:{value_class(value)}",
            )
    return None


def _uses_coef(subject) -> bool:
    """The subject reports coefficients that multiply the per-token loss."""
    if subject.kind == "preset":
        return subject.loss_name != "gspo"
    return subject.has_coef and subject.loss_name != "gspo"


def declared_band(subject) -> tuple[float | None, float | None] | None:
    """The bounds a kept coefficient must respect: a preset's clamp, or an external --band."""
    if subject.kind == "external":
        return subject.band if subject.has_coef else None
    corr = subject.corr
    if corr.weight_op == "clamp" and (corr.low is not None or corr.high is not None):
        return corr.low, corr.high
    if corr.weight_op == "clamp-high" and corr.high is not None:
        return None, corr.high
    return None


# --------------------------------------------------------------------------------- 1 finite
def _applies_always(subject) -> str | None:
    return None


def check_finite(subject, batch: Batch) -> Violation | None:
    out = subject(batch, F32)
    loss = float(out.loss)
    if not math.isfinite(loss):
        return Violation(f"loss {_fmt(loss)} on finite inputs", f"loss:{value_class(loss)}")
    bad = ~torch.isfinite(out.grad)
    if bool(bad.any()):
        i, j = bad.nonzero()[0].tolist()
        value = float(out.grad[i, j])
        masked = " (a masked position)" if float(batch.mask[i, j]) == 0 else ""
        return Violation(
            f"grad{_where(bad)}{masked} {_fmt(value)} on finite inputs (loss {_fmt(loss)})",
            f"grad:{value_class(value)}",
        )
    return None


# --------------------------------------------------------------------------------- 2 reject→0
def applies_rejection(subject) -> str | None:
    if subject.kind == "external":
        return None if subject.loss_name != "gspo" else "gspo does not apply the correction"
    if subject.loss_name == "gspo":
        return "gspo does not apply the correction"
    if (
        subject.corr.filter == "none"
        and subject.corr.veto is None
        and not subject.corr.has_masks
        and subject.corr.diff_filter == "none"
    ):
        return "no filter and no veto: nothing is rejected"
    return None


def check_rejection(subject, batch: Batch) -> Violation | None:
    if subject.kind == "external" and not subject.has_coef:
        # No keep mask to read: a unit counts as rejected when the target gives it exactly zero
        # gradient in float64 (where e^±709 are still finite) and plain PPO does not, so a token
        # that PPO's clip silenced is not taken for a rejected one.
        ref = subject(batch, F64)
        plain = subject.none()(batch, F64)
        rejected = (ref.grad == 0) & (plain.grad != 0) & (batch.mask > 0)
        if not bool(rejected.any()):
            return None
        out = subject(batch, F32)
        bad = rejected & (out.grad != 0)
        if bool(bad.any()):
            i, j = bad.nonzero()[0].tolist()
            value = float(out.grad[i, j])
            why = " (0·inf)" if math.isnan(value) else ""
            return Violation(
                f"rejected unit{_where(bad)} (gradient exactly 0 in float64, where plain PPO's is not) "
                f"has gradient {_fmt(value)} in float32{why}",
                f"rejected-grad:{value_class(value)}",
            )
        return None
    out = subject(batch, F32)
    rejected = (batch.mask > 0) & ~out.keep
    bad = rejected & (out.grad != 0)
    if bool(bad.any()):
        i, j = bad.nonzero()[0].tolist()
        value = float(out.grad[i, j])
        return Violation(
            f"rejected unit{_where(bad)} has gradient {_fmt(value)}, expected exactly 0",
            f"rejected-grad:{value_class(value)}",
        )
    return None


# --------------------------------------------------------------------------------- 3 bounds
def applies_bounds(subject) -> str | None:
    if subject.kind == "external" and not subject.has_coef:
        return "needs the coefficients: give the weights function with --weights-fn"
    if subject.loss_name == "gspo":
        return "gspo does not apply the correction"
    if declared_band(subject) is None:
        return (
            "no declared bounds (--band LOW,HIGH)"
            if subject.kind == "external"
            else "weight_op raw: no declared bounds"
        )
    return None


def check_bounds(subject, batch: Batch) -> Violation | None:
    out = subject(batch, F32)
    low, high = declared_band(subject)
    live = (batch.mask > 0) & out.keep
    coef = out.coef
    below = torch.zeros_like(live) if low is None else coef < torch.tensor(low, dtype=coef.dtype)
    above = torch.zeros_like(live) if high is None else coef > torch.tensor(high, dtype=coef.dtype)
    bad = live & (below | above | torch.isnan(coef))
    if bool(bad.any()):
        i, j = bad.nonzero()[0].tolist()
        value = float(coef[i, j])
        band = f"[{'—' if low is None else _fmt(low)}, {'—' if high is None else _fmt(high)}]"
        side = "above" if bool(above[i, j]) else "below" if bool(below[i, j]) else "nan"
        return Violation(f"kept coefficient{_where(bad)} {_fmt(value)} outside {band}", f"coef:{side}")
    return None


# --------------------------------------------------------------------------------- 4 padding
def check_padding(subject, batch: Batch) -> Violation | None:
    if not batch.has_padding:
        return None
    clean = batch.clean_padding()
    return _compare("padding values leak", subject(batch, F32), subject(clean, F32), rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------------- 5 on-policy
def check_on_policy(subject, batch: Batch) -> Violation | None:
    batch = batch.on_policy()
    out = subject(batch, F32)
    inside = batch.mask > 0
    if _uses_coef(subject):
        bad = inside & (out.coef != 1)
        if bool(bad.any()):
            i, j = bad.nonzero()[0].tolist()
            return Violation(f"on-policy coefficient{_where(bad)} {_fmt(float(out.coef[i, j]))}, expected 1", "coef")
    ref = subject.none()
    if subject.kind == "external" and subject.reduction() is None:
        return Violation(
            "on-policy loss matches `none` under no reduction (token-mean, seq-mean-token-mean, "
            "seq-mean-token-sum) on the calibration batch",
            "reduction",
        )
    return _compare(
        "on-policy differs from none", out, ref(batch, F32), rtol=1e-5, atol=1e-5, grad=subject.kind == "preset"
    )


# --------------------------------------------------------------------------------- 6 permute
def permutations(B: int) -> list[list[int]]:
    if B < 2:
        return []
    perms = [list(reversed(range(B)))]
    if B > 2:
        perms.append(list(range(1, B)) + [0])
    return perms


def check_permutation(subject, batch: Batch) -> Violation | None:
    perms = permutations(batch.shape[0])
    if not perms:
        return None
    base = subject(batch, F64)
    scale = 0.0
    if base.per_token is not None:
        finite = base.per_token[torch.isfinite(base.per_token)]
        scale = float(finite.abs().max()) * base.per_token.numel() if finite.numel() else 0.0
    rtol, atol = 1e-6, 1e-6 + 1e-12 * scale
    for perm in perms:
        got = subject(batch.rows(perm), F64)
        idx = torch.as_tensor(perm)
        want = Outcome(loss=base.loss, grad=base.grad[idx])
        problem = _compare(f"rows permuted as {perm}", got, want, rtol, atol)
        if problem is None and base.coef is not None:
            ok = _same(got.coef, base.coef[idx], rtol, atol)
            if not bool(ok.all()):
                problem = Violation(
                    f"rows permuted as {perm}: coefficient{_where(~ok)} does not follow its row", "coef"
                )
        if problem:
            return problem
    return None


# --------------------------------------------------------------------------------- 7 grad=FD
def applies_fd(subject) -> str | None:
    if subject.kind == "preset" and subject.corr.ratio == "bypass":
        return "bypass ratio: the detached coefficient depends on log_probs by design"
    return None


FD_STEP = 1e-4


def check_fd(subject, batch: Batch) -> Violation | None:
    base = subject(batch, F64)
    if not math.isfinite(float(base.loss)) or not bool(torch.isfinite(base.grad).all()):
        return None  # not smooth here; invariant 1 speaks about non-finite values
    gen = torch.Generator().manual_seed(0)
    for k in range(2):
        v = torch.randn(batch.shape, generator=gen, dtype=F64)

        def f(h: float) -> float:
            return float(subject(replace(batch, lp=batch.lp + h * v), F64).loss)

        def fd(h: float) -> float:
            return (f(h) - f(-h)) / (2 * h)

        analytic = float((base.grad * v).sum())
        coarse, fine = fd(FD_STEP), fd(FD_STEP / 4)
        if not (math.isfinite(coarse) and math.isfinite(fine)):
            continue
        if abs(coarse - fine) > 1e-6 * (1 + abs(fine)):
            continue  # a kink (clip edge, clamp, filter edge) within the step: not smooth here
        if abs(fine - analytic) > 1e-5 * (1 + abs(fine)):
            return Violation(
                f"directional derivative {_fmt(analytic)} (autograd) vs {_fmt(fine)} (central "
                f"differences, h={FD_STEP / 4:g}, direction {k})",
                "fd",
            )
    return None


INVARIANTS: dict[int, Invariant] = {
    1: Invariant(1, "finite", "finite inputs give a finite loss and gradient", "finite", _applies_always, check_finite),
    2: Invariant(
        2, "reject→0", "a rejected unit contributes exactly zero gradient", "finite", applies_rejection, check_rejection
    ),
    3: Invariant(
        3, "bounds", "truncated coefficients stay inside their declared bounds", "finite", applies_bounds, check_bounds
    ),
    4: Invariant(
        4,
        "padding",
        "values at mask = 0 (even NaN/±inf) change neither loss nor gradient",
        "padding",
        _applies_always,
        check_padding,
    ),
    5: Invariant(
        5,
        "on-policy",
        "on-policy inputs give coefficient 1 and the loss of `none`",
        "on-policy",
        _applies_always,
        check_on_policy,
    ),
    6: Invariant(
        6,
        "permute",
        "permuting the batch permutes per-sequence results, loss unchanged",
        "moderate",
        _applies_always,
        check_permutation,
    ),
    7: Invariant(
        7, "grad=FD", "the gradient matches central finite differences where smooth", "smooth", applies_fd, check_fd
    ),
}


def violation(inv: Invariant, subject, batch: Batch) -> Violation | None:
    """The check on one batch. A batch with no token is not this check's business (None); what a
    subject raises propagates as runner.audit.subjects.SubjectRaised for the caller to report."""
    if batch.all_masked:
        return None
    return inv.check(subject, batch)
