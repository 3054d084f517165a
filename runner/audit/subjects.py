"""What the audit feeds and what it audits: a `Batch` of [B, T] tensors, and a subject that turns a
batch into an `Outcome` (loss, gradient with respect to log_probs and, where known, the
correction's coefficients and keep mask). A subject is one preset under one loss, or an external
target: a loss called under a convention (runner/audit/conventions.py), optionally fed by an
external weights function, or an external weights function composed with one of our losses.

Anything a subject raises reaches the audit as `SubjectRaised`, which carries the batch and dtype
of the call, so a crash is reported (and shrunk) as what it is rather than as a violation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from runner.audit.case_files import Case
from runner.core.corrections import Correction
from runner.core.losses import LossSpec, policy_loss

FIELDS = ("lp", "old", "roll", "adv", "mask")
CASE_KEYS = {
    "lp": "log_probs",
    "old": "old_log_probs",
    "roll": "rollout_log_probs",
    "adv": "advantages",
    "mask": "action_mask",
}


@dataclass(frozen=True)
class Batch:
    """[B, T] float64 tensors; for the float32 checks every value is float32-representable, so a
    saved case file reproduces bit for bit in `is-study case`."""

    lp: torch.Tensor
    old: torch.Tensor
    roll: torch.Tensor
    adv: torch.Tensor
    mask: torch.Tensor
    name: str = "audit"

    @classmethod
    def of(cls, lp, old, roll, adv, mask=None, name: str = "audit") -> Batch:
        def t(x):
            return (
                torch.as_tensor(x, dtype=torch.float64).reshape(len(x), -1)
                if not torch.is_tensor(x)
                else x.to(torch.float64)
            )

        lp_t = t(lp)
        mask_t = torch.ones_like(lp_t) if mask is None else t(mask)
        return cls(lp_t, t(old), t(roll), t(adv), mask_t, name)

    @classmethod
    def from_case(cls, case: Case) -> Batch:
        return cls.of(
            case.log_probs, case.old_log_probs, case.rollout_log_probs, case.advantages, case.action_mask, case.name
        )

    def to_case(self, name: str | None = None) -> Case:
        return Case(name=name or self.name, **{CASE_KEYS[k]: getattr(self, k).tolist() for k in FIELDS})

    def key(self) -> bytes:
        """The values, bit for bit (NaN included), to recognise a batch seen before."""
        return b"".join(getattr(self, k).numpy().tobytes() for k in FIELDS) + repr(self.shape).encode()

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.lp.shape)  # type: ignore[return-value]

    def tensors(self, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        return {k: getattr(self, k).to(dtype) for k in FIELDS}

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor], name: str | None = None) -> Batch:
        return Batch(*(fn(getattr(self, k)) for k in FIELDS), name=name or self.name)

    def rows(self, idx: Sequence[int], name: str | None = None) -> Batch:
        index = torch.as_tensor(list(idx), dtype=torch.long)
        return self.map(lambda t: t[index], name)

    def cols(self, idx: Sequence[int]) -> Batch:
        index = torch.as_tensor(list(idx), dtype=torch.long)
        return self.map(lambda t: t[:, index])

    def on_policy(self) -> Batch:
        return replace(self, old=self.lp.clone(), roll=self.lp.clone())

    def with_padding(
        self, value: float, name: str | None = None, fields: Sequence[str] = ("lp", "old", "roll", "adv")
    ) -> Batch:
        """Every masked-out entry of `fields` (all four by default) set to `value`."""
        out = {
            k: torch.where(self.mask > 0, getattr(self, k), torch.tensor(value, dtype=torch.float64))
            if k in fields
            else getattr(self, k)
            for k in ("lp", "old", "roll", "adv")
        }
        return Batch(**out, mask=self.mask, name=name or self.name)

    def clean_padding(self) -> Batch:
        return self.with_padding(0.0, name=f"{self.name}-clean-padding")

    def add_padding_column(self, value: float) -> Batch:
        B = self.shape[0]

        def grow(t, v):
            return torch.cat([t, torch.full((B, 1), v, dtype=torch.float64)], dim=1)

        return Batch(
            grow(self.lp, value),
            grow(self.old, value),
            grow(self.roll, value),
            grow(self.adv, value),
            grow(self.mask, 0.0),
            name=self.name,
        )

    @property
    def has_padding(self) -> bool:
        return bool((self.mask == 0).any())

    @property
    def all_masked(self) -> bool:
        return not bool((self.mask > 0).any())

    @property
    def left_aligned(self) -> bool:
        """Each row's mask is ones then zeros, as a trainer pads responses."""
        m = self.mask > 0
        return not bool((~m[:, :-1] & m[:, 1:]).any())


@dataclass
class Outcome:
    loss: torch.Tensor  # 0-d, detached
    grad: torch.Tensor  # [B, T]: d loss / d log_probs
    coef: torch.Tensor | None = None  # [B, T] the correction's coefficient (our presets only)
    keep: torch.Tensor | None = None  # [B, T] bool: the unit survived the filter/veto
    per_token: torch.Tensor | None = None  # [B, T] coefficient × per-token loss, before reduction


class TargetError(Exception):
    """An external target returned something that is not a loss, or weights that are not [B, T]."""


class SubjectRaised(Exception):
    """`subject` raised on `batch` (evaluated in `dtype`); the original exception is `error`."""

    def __init__(self, error: BaseException, batch: Batch, dtype: torch.dtype, subject: Any = None):
        super().__init__(str(error))
        self.error, self.batch, self.dtype, self.subject = error, batch, dtype, subject


def _backward(lp: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
    if loss.requires_grad:
        (grad,) = torch.autograd.grad(loss, lp, allow_unused=True)
        if grad is not None:
            return grad.detach()
    return torch.zeros_like(lp.detach())


def _as_loss(res: Any, dtype: torch.dtype) -> torch.Tensor:
    if not torch.is_tensor(res):
        try:
            res = torch.tensor(float(res), dtype=dtype)
        except (TypeError, ValueError):
            raise TargetError(f"returned {type(res).__name__}, not a loss tensor") from None
    if res.numel() != 1:
        raise TargetError(f"returned a loss of shape {list(res.shape)}, expected a scalar")
    return res.reshape(())


class PresetSubject:
    """One of our presets under one loss."""

    kind = "preset"

    def __init__(self, corr: Correction, spec: LossSpec, overrides: Sequence[str] = ()):
        self.corr = corr
        self.spec = spec
        self.name = corr.name
        self.faithful = corr.faithful
        self.loss_name = spec.name
        self.overrides = list(overrides)  # extra overrides (beyond correction= and loss=) for repro

    def __call__(self, batch: Batch, dtype: torch.dtype = torch.float32) -> Outcome:
        try:
            t = batch.tensors(dtype)
            lp = t["lp"].clone().requires_grad_(True)
            res = policy_loss(self.spec, self.corr, lp, t["old"], t["roll"], t["adv"], t["mask"], metrics=False)
            grad = _backward(lp, res.loss)
        except Exception as exc:
            raise SubjectRaised(exc, batch, dtype, self) from exc
        return Outcome(
            loss=res.loss.detach(),
            grad=grad,
            coef=res.correction.coef.detach(),
            keep=res.correction.keep,
            per_token=res.per_token.detach(),
        )

    def none(self) -> PresetSubject:
        """Plain PPO (the `none` preset) under the same loss spec: the on-policy reference."""
        return PresetSubject(Correction(name="none"), self.spec, self.overrides)

    def reduction(self) -> str:
        return self.spec.effective_reduction


class ExternalSubject:
    """An external target: `fn` called through `caller` (OpenRLHF's convention by default), or,
    with `fn=None`, our loss `spec` on the coefficients of the external `weights` function."""

    kind = "external"
    faithful = False

    def __init__(
        self,
        name: str,
        fn: Callable[..., Any] | None,
        caller=None,
        weights: Callable[..., Any] | None = None,
        band: tuple[float | None, float | None] | None = None,
        spec: LossSpec | None = None,
    ):
        from runner.audit.conventions import Caller

        if fn is None and (weights is None or spec is None):
            raise ValueError("an external subject needs a loss, or a weights function and one of our losses")
        self.name = name
        self.fn = fn
        self.caller = caller or Caller.build("openrlhf")
        self.weights = weights
        self.band = band
        self.spec = spec
        self.loss_name = spec.name if fn is None and spec is not None else None
        self.overrides: list[str] = []
        self.target_spec = None  # the TargetSpec it was resolved from (None: built in Python)
        self._reduction: str | None | bool = False  # False: not calibrated yet

    @property
    def has_coef(self) -> bool:
        return self.weights is not None

    def _coefficients(self, t: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        tensors = {"old": t["old"], "roll": t["roll"], "mask": t["mask"], "log_ratio": t["old"] - t["roll"]}
        args, kwargs = self.caller.weights_kwargs(self.weights, tensors)
        res = self.weights(*args, **kwargs)
        items = list(res) if isinstance(res, (tuple, list)) else [res]
        coef = items[0]
        if not torch.is_tensor(coef):
            raise TargetError(f"the weights function returned {type(coef).__name__}, not a tensor of coefficients")
        coef = coef.detach().to(t["mask"].dtype).expand_as(t["mask"])
        keep = next(
            (
                x
                for x in items[1:]
                if torch.is_tensor(x) and x.dtype == torch.bool and x.shape[-1] in (1, coef.shape[-1])
            ),
            None,
        )
        keep = keep.expand_as(coef) if keep is not None else coef != 0  # no keep mask: weight 0 = rejected
        return coef, keep

    def __call__(self, batch: Batch, dtype: torch.dtype = torch.float32) -> Outcome:
        coef = keep = None
        try:
            t = batch.tensors(dtype)
            lp = t["lp"].clone().requires_grad_(True)
            if self.weights is not None:
                coef, keep = self._coefficients(t)
            if self.fn is None:
                from runner.core.corrections import CorrectionResult

                res = policy_loss(
                    self.spec,
                    Correction(name="weights-fn"),
                    lp,
                    t["old"],
                    t["roll"],
                    t["adv"],
                    t["mask"],
                    metrics=False,
                    correction=CorrectionResult(coef, t["mask"], keep),
                )
                loss = res.loss
            else:
                tensors = {"lp": lp, "old": t["old"], "roll": t["roll"], "adv": t["adv"], "mask": t["mask"]}
                if coef is not None:
                    tensors["weights"] = coef
                loss = _as_loss(self.caller.pick_loss(self.caller(self.fn, tensors)), dtype)
            grad = _backward(lp, loss)
        except Exception as exc:
            raise SubjectRaised(exc, batch, dtype, self) from exc
        return Outcome(loss=loss.detach(), grad=grad, coef=coef, keep=keep)

    # The on-policy reference of invariant 5: our `none` under the reduction the target uses.
    # B = 3 rows of 4, 1 and 2 tokens (7 in all): the three reductions differ, and by no simple factor.
    CALIBRATION = dict(
        lp=[[-0.5, -1.0, -2.0, -0.3], [-0.25, -3.0, -1.5, -1.0], [-1.0, -0.75, -4.0, -2.0]],
        adv=[[1.0, 0.5, -1.0, 2.0], [-2.0, 3.0, 1.0, 1.0], [0.25, 1.5, -0.5, 1.0]],
        mask=[[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]],
    )

    def calibration_batch(self) -> Batch:
        c = self.CALIBRATION
        return Batch.of(c["lp"], c["lp"], c["lp"], c["adv"], c["mask"], name="on-policy-calibration")

    def reduction(self) -> str | None:
        """Which of our reductions reproduces the target's on-policy loss; None when none does."""
        if self.spec is not None and self.fn is None:
            return self.spec.effective_reduction
        if self._reduction is False:
            from runner.core.losses import REDUCTIONS

            batch = self.calibration_batch()
            try:
                got = float(self(batch).loss)
            except SubjectRaised:
                got = math.nan
            self._reduction = None
            for how in REDUCTIONS:
                ref = PresetSubject(Correction(name="none"), LossSpec(reduction=how))
                want = float(ref(batch).loss)
                if math.isfinite(got) and abs(got - want) <= 1e-5 * (1 + abs(want)):
                    self._reduction = how
                    break
        return self._reduction  # type: ignore[return-value]

    def none(self) -> PresetSubject:
        if self.spec is not None and self.fn is None:
            return PresetSubject(Correction(name="none"), self.spec)
        return PresetSubject(Correction(name="none"), LossSpec(reduction=self.reduction() or "token-mean"))
