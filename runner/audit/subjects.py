"""What the audit feeds and what it audits: a `Batch` of [B, T] tensors, and a subject that turns a
batch into an `Outcome` (loss, gradient with respect to log_probs and, for our presets, the
correction's coefficients and keep mask). A subject is one preset under one loss, or an external
callable in OpenRLHF's PolicyLoss convention (see runner/audit/__init__.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch

from runner.cases import Case
from runner.corrections import Correction
from runner.losses import LossSpec, policy_loss

FIELDS = ("lp", "old", "roll", "adv", "mask")
CASE_KEYS = {"lp": "log_probs", "old": "old_log_probs", "roll": "rollout_log_probs", "adv": "advantages",
             "mask": "action_mask"}


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
    def of(cls, lp, old, roll, adv, mask=None, name: str = "audit") -> "Batch":
        def t(x):
            return torch.as_tensor(x, dtype=torch.float64).reshape(len(x), -1) if not torch.is_tensor(x) \
                else x.to(torch.float64)
        lp_t = t(lp)
        mask_t = torch.ones_like(lp_t) if mask is None else t(mask)
        return cls(lp_t, t(old), t(roll), t(adv), mask_t, name)

    @classmethod
    def from_case(cls, case: Case) -> "Batch":
        return cls.of(case.log_probs, case.old_log_probs, case.rollout_log_probs, case.advantages,
                      case.action_mask, case.name)

    def to_case(self, name: str | None = None) -> Case:
        return Case(name=name or self.name, **{CASE_KEYS[k]: getattr(self, k).tolist() for k in FIELDS})

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.lp.shape)  # type: ignore[return-value]

    def tensors(self, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        return {k: getattr(self, k).to(dtype) for k in FIELDS}

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor], name: str | None = None) -> "Batch":
        return Batch(*(fn(getattr(self, k)) for k in FIELDS), name=name or self.name)

    def rows(self, idx: Sequence[int], name: str | None = None) -> "Batch":
        index = torch.as_tensor(list(idx), dtype=torch.long)
        return self.map(lambda t: t[index], name)

    def cols(self, idx: Sequence[int]) -> "Batch":
        index = torch.as_tensor(list(idx), dtype=torch.long)
        return self.map(lambda t: t[:, index])

    def on_policy(self) -> "Batch":
        return replace(self, old=self.lp.clone(), roll=self.lp.clone())

    def with_padding(self, value: float, name: str | None = None) -> "Batch":
        """Every masked-out entry of lp, old, roll and adv set to `value`."""
        out = {k: torch.where(self.mask > 0, getattr(self, k), torch.tensor(value, dtype=torch.float64))
               for k in ("lp", "old", "roll", "adv")}
        return Batch(**out, mask=self.mask, name=name or self.name)

    def clean_padding(self) -> "Batch":
        return self.with_padding(0.0, name=f"{self.name}-clean-padding")

    def add_padding_column(self, value: float) -> "Batch":
        B = self.shape[0]
        def grow(t, v):
            return torch.cat([t, torch.full((B, 1), v, dtype=torch.float64)], dim=1)
        return Batch(grow(self.lp, value), grow(self.old, value), grow(self.roll, value), grow(self.adv, value),
                     grow(self.mask, 0.0), name=self.name)

    @property
    def has_padding(self) -> bool:
        return bool((self.mask == 0).any())


@dataclass
class Outcome:
    loss: torch.Tensor  # 0-d, detached
    grad: torch.Tensor  # [B, T]: d loss / d log_probs
    coef: torch.Tensor | None = None  # [B, T] the correction's coefficient (our presets only)
    keep: torch.Tensor | None = None  # [B, T] bool: the unit survived the filter/veto
    per_token: torch.Tensor | None = None  # [B, T] coefficient × per-token loss, before reduction


class TargetError(Exception):
    """An external target returned something that is not a loss."""


def _backward(lp: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
    if loss.requires_grad:
        (grad,) = torch.autograd.grad(loss, lp, allow_unused=True)
        if grad is not None:
            return grad.detach()
    return torch.zeros_like(lp.detach())


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
        t = batch.tensors(dtype)
        lp = t["lp"].clone().requires_grad_(True)
        res = policy_loss(self.spec, self.corr, lp, t["old"], t["roll"], t["adv"], t["mask"], metrics=False)
        grad = _backward(lp, res.loss)
        return Outcome(loss=res.loss.detach(), grad=grad, coef=res.correction.coef.detach(),
                       keep=res.correction.keep, per_token=res.per_token.detach())

    def none(self) -> "PresetSubject":
        """Plain PPO (the `none` preset) under the same loss spec: the on-policy reference."""
        return PresetSubject(Correction(name="none"), self.spec, self.overrides)


class ExternalSubject:
    """A callable in OpenRLHF's PolicyLoss convention."""

    kind = "external"
    faithful = False
    loss_name = None

    def __init__(self, name: str, fn: Callable[..., Any]):
        self.name = name
        self.fn = fn
        self.overrides: list[str] = []
        self._reduction: str | None | bool = False  # False: not calibrated yet

    def __call__(self, batch: Batch, dtype: torch.dtype = torch.float32) -> Outcome:
        t = batch.tensors(dtype)
        lp = t["lp"].clone().requires_grad_(True)
        res = self.fn(lp, t["old"], t["adv"], action_mask=t["mask"], rollout_log_probs=t["roll"])
        if isinstance(res, (tuple, list)):
            if not res:
                raise TargetError("returned an empty tuple")
            res = res[0]
        if not torch.is_tensor(res):
            try:
                res = torch.tensor(float(res), dtype=dtype)
            except (TypeError, ValueError):
                raise TargetError(f"returned {type(res).__name__}, not a loss tensor") from None
        if res.numel() != 1:
            raise TargetError(f"returned a loss of shape {list(res.shape)}, expected a scalar")
        loss = res.reshape(())
        grad = _backward(lp, loss)
        return Outcome(loss=loss.detach(), grad=grad)

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
        if self._reduction is False:
            from runner.losses import REDUCTIONS

            batch = self.calibration_batch()
            got = float(self(batch).loss)
            self._reduction = None
            for how in REDUCTIONS:
                ref = PresetSubject(Correction(name="none"), LossSpec(reduction=how))
                want = float(ref(batch).loss)
                if math.isfinite(got) and abs(got - want) <= 1e-5 * (1 + abs(want)):
                    self._reduction = how
                    break
        return self._reduction  # type: ignore[return-value]

    def none(self) -> PresetSubject:
        return PresetSubject(Correction(name="none"), LossSpec(reduction=self.reduction() or "token-mean"))
