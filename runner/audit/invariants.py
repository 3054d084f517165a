"""The seven invariants. Each has `applies(subject) -> reason | None` (a reason makes it n/a) and
`check(subject, batch) -> violation | None`, where a violation is one line saying what went wrong.

    1 finite     finite inputs (log-ratios of ±1000, log-probs of −1e4) → finite loss and gradient
    2 reject→0   a rejected unit (token or sequence) gets exactly zero gradient (not 0·inf = NaN)
    3 bounds     clamped coefficients lie in [low, high] (clamp) or ≤ high (clamp-high)
    4 padding    values at mask = 0, even NaN/±inf, change neither the loss nor the gradient
    5 on-policy  roll = old = lp → coefficient 1 and the loss (and gradient) of `none`
    6 permute    permuting the batch permutes per-sequence results; the loss is unchanged
    7 grad=FD    the gradient matches central finite differences where the loss is smooth

Checks 1-5 run in float32, as `is-study case` does; 6 and 7 in float64 (6 so that the summation
order cannot matter beyond 1e-6, 7 so that finite differences mean something).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

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


# --------------------------------------------------------------------------------- helpers
def _fmt(x: float) -> str:
    return f"{x:.6g}"


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


def _compare(what: str, got: Outcome, want: Outcome, rtol: float, atol: float, grad: bool = True,
             perm: list[int] | None = None) -> str | None:
    if not bool(_same(got.loss, want.loss, rtol, atol)):
        return f"{what}: loss {_fmt(float(got.loss))}, expected {_fmt(float(want.loss))}"
    if grad:
        ok = _same(got.grad, want.grad, rtol, atol)
        if not bool(ok.all()):
            i, j = (~ok).nonzero()[0].tolist()
            return (f"{what}: grad{_where(~ok)} {_fmt(float(got.grad[i, j]))}, expected "
                    f"{_fmt(float(want.grad[i, j]))}")
    return None


def _uses_coef(subject) -> bool:
    return subject.kind == "preset" and subject.loss_name != "gspo"


# --------------------------------------------------------------------------------- 1 finite
def _applies_always(subject) -> str | None:
    return None


def check_finite(subject, batch: Batch) -> str | None:
    out = subject(batch, F32)
    if not math.isfinite(float(out.loss)):
        return f"loss {_fmt(float(out.loss))} on finite inputs"
    bad = ~torch.isfinite(out.grad)
    if bool(bad.any()):
        i, j = bad.nonzero()[0].tolist()
        return f"grad{_where(bad)} {_fmt(float(out.grad[i, j]))} on finite inputs (loss {_fmt(float(out.loss))})"
    return None


# --------------------------------------------------------------------------------- 2 reject→0
def applies_rejection(subject) -> str | None:
    if subject.kind == "external":
        return None
    if subject.loss_name == "gspo":
        return "gspo does not apply the correction"
    if subject.corr.filter == "none" and subject.corr.veto is None:
        return "no filter and no veto: nothing is rejected"
    return None


def check_rejection(subject, batch: Batch) -> str | None:
    if subject.kind == "external":
        # Rejected = exactly zero gradient in float64, where e^±709 are still finite.
        ref = subject(batch, F64)
        zero = (ref.grad == 0) & (batch.mask > 0)
        if not bool(zero.any()):
            return None
        out = subject(batch, F32)
        bad = zero & ~torch.isfinite(out.grad)
        if bool(bad.any()):
            i, j = bad.nonzero()[0].tolist()
            return (f"unit{_where(bad)} contributes 0 in float64 but has gradient {_fmt(float(out.grad[i, j]))} "
                    f"in float32 (0·inf)")
        return None
    out = subject(batch, F32)
    rejected = (batch.mask > 0) & ~out.keep
    bad = rejected & (out.grad != 0)
    if bool(bad.any()):
        i, j = bad.nonzero()[0].tolist()
        return f"rejected unit{_where(bad)} has gradient {_fmt(float(out.grad[i, j]))}, expected exactly 0"
    return None


# --------------------------------------------------------------------------------- 3 bounds
def applies_bounds(subject) -> str | None:
    if subject.kind == "external":
        return "needs our coefficients"
    if subject.loss_name == "gspo":
        return "gspo does not apply the correction"
    corr = subject.corr
    if corr.weight_op == "clamp" and (corr.low is not None or corr.high is not None):
        return None
    if corr.weight_op == "clamp-high" and corr.high is not None:
        return None
    return "weight_op raw: no declared bounds"


def check_bounds(subject, batch: Batch) -> str | None:
    out = subject(batch, F32)
    corr = subject.corr
    live = (batch.mask > 0) & out.keep
    coef = out.coef
    ok = torch.ones_like(live)
    low = corr.low if corr.weight_op == "clamp" else None
    if low is not None:
        ok &= coef >= torch.tensor(low, dtype=coef.dtype)
    if corr.high is not None:
        ok &= coef <= torch.tensor(corr.high, dtype=coef.dtype)
    bad = live & ~ok
    if bool(bad.any()):
        i, j = bad.nonzero()[0].tolist()
        band = f"[{'—' if low is None else _fmt(low)}, {_fmt(corr.high) if corr.high is not None else '—'}]"
        return f"coefficient{_where(bad)} {_fmt(float(coef[i, j]))} outside {band}"
    return None


# --------------------------------------------------------------------------------- 4 padding
def check_padding(subject, batch: Batch) -> str | None:
    if not batch.has_padding:
        return None
    clean = batch.clean_padding()
    return _compare("padding values leak", subject(batch, F32), subject(clean, F32), rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------------- 5 on-policy
def check_on_policy(subject, batch: Batch) -> str | None:
    batch = batch.on_policy()
    out = subject(batch, F32)
    inside = batch.mask > 0
    if _uses_coef(subject):
        bad = inside & (out.coef != 1)
        if bool(bad.any()):
            i, j = bad.nonzero()[0].tolist()
            return f"on-policy coefficient{_where(bad)} {_fmt(float(out.coef[i, j]))}, expected 1"
    ref = subject.none()
    if subject.kind == "external" and subject.reduction() is None:
        return ("on-policy loss matches `none` under no reduction (token-mean, seq-mean-token-mean, "
                "seq-mean-token-sum) on the calibration batch")
    return _compare("on-policy differs from none", out, ref(batch, F32), rtol=1e-5, atol=1e-5,
                    grad=subject.kind == "preset")


# --------------------------------------------------------------------------------- 6 permute
def permutations(B: int) -> list[list[int]]:
    if B < 2:
        return []
    perms = [list(reversed(range(B)))]
    if B > 2:
        perms.append(list(range(1, B)) + [0])
    return perms


def check_permutation(subject, batch: Batch) -> str | None:
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
                problem = f"rows permuted as {perm}: coefficient{_where(~ok)} does not follow its row"
        if problem:
            return problem
    return None


# --------------------------------------------------------------------------------- 7 grad=FD
def applies_fd(subject) -> str | None:
    if subject.kind == "preset" and subject.corr.ratio == "bypass":
        return "bypass ratio: the detached coefficient depends on log_probs by design"
    return None


FD_STEP = 1e-4


def check_fd(subject, batch: Batch) -> str | None:
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
            return (f"directional derivative {_fmt(analytic)} (autograd) vs {_fmt(fine)} (central differences, "
                    f"h={FD_STEP / 4:g}, direction {k})")
    return None


INVARIANTS: dict[int, Invariant] = {
    1: Invariant(1, "finite", "finite inputs give a finite loss and gradient", "finite", _applies_always,
                 check_finite),
    2: Invariant(2, "reject→0", "a rejected unit contributes exactly zero gradient", "finite", applies_rejection,
                 check_rejection),
    3: Invariant(3, "bounds", "truncated coefficients stay inside their declared bounds", "finite", applies_bounds,
                 check_bounds),
    4: Invariant(4, "padding", "values at mask = 0 (even NaN/±inf) change neither loss nor gradient", "padding",
                 _applies_always, check_padding),
    5: Invariant(5, "on-policy", "on-policy inputs give coefficient 1 and the loss of `none`", "on-policy",
                 _applies_always, check_on_policy),
    6: Invariant(6, "permute", "permuting the batch permutes per-sequence results, loss unchanged", "moderate",
                 _applies_always, check_permutation),
    7: Invariant(7, "grad=FD", "the gradient matches central finite differences where smooth", "smooth",
                 applies_fd, check_fd),
}


def violation(inv: Invariant, subject, batch: Batch) -> str | None:
    """The check, with any exception turned into a violation (a loss that raises is not finite)."""
    try:
        return inv.check(subject, batch)
    except Exception as exc:  # noqa: BLE001 - the subject may be anyone's code
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"raised {type(exc).__name__}{': ' + text if text else ''}"
