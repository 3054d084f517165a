"""What a NaN/inf does to a run, and when a run has collapsed.

`train.on_nonfinite`: skip drops the optimizer step of an update whose loss or gradient is NaN/inf
(and logs it); raise stops the run after that update's row (exit 1, a finding); apply lets the NaN/inf
reach the parameters, the poisoning the seed report warns about.

Collapse is relative, so one rule serves every world whatever the scale of its objective and its
gradients (`train.collapse.*`):
- drop:  J at least `drop` (a fraction, 0.3) below its running peak for at least `window` (20) steps;
         the collapse step is the first step of that stretch. The peak is J's; on steps where J is not
         evaluated (train.objective_every > 1) the step's mean sampled reward stands in for the level,
         so a drop between two evaluations, or in a run's last stretch, is still seen;
- spike: at least `spike_updates` (3) consecutive updates whose grad_norm (before clipping) exceeds
         `spike_factor` (10) × the running median of the run's earlier finite, non-zero grad norms
         (judged once `min_history` (10) are known; an update with no signal, e.g. a sparse reward that
         gave every response 0, has norm 0 and is no evidence of scale); the collapse step is the
         first of them;
- NaN/inf parameters (the run then stops: nothing can be sampled from them).
The first collapse of any kind is the run's collapse (summary.json: collapse_step, collapse_reason);
each kind is logged as a `collapse` event the first time it happens. A run whose J never rose more
than `learned_margin` (0.01) above its initial value "never learned": a flat run is not a stable one.

The wording of every event is here too, so the loop computes and the study writes.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from runner.config_checks import as_float, as_int, check_keys

ON_NONFINITE = ("skip", "raise", "apply")
ACTIONS = {"skip": "skip update", "raise": "raise", "apply": "apply"}


def skips(policy: str, nonfinite: bool) -> bool:
    """Whether this update's optimizer step is dropped (raise drops it too: its row is written, then the run stops)."""
    return nonfinite and policy in ("skip", "raise")


@dataclass
class Event:
    step: int
    kind: str  # one of runner.core.schema.EVENT_KINDS
    detail: str
    action: str


def indices(flags: torch.Tensor, offset: int = 0, limit: int = 20) -> str:
    """'[3,17,…]': the first indices where `flags` is set."""
    idx = [i + offset for i in flags.nonzero().flatten().tolist()]
    shown = ",".join(str(i) for i in idx[:limit])
    return f"[{shown}{',…' if len(idx) > limit else ''}]"


def nonfinite_loss_detail(where: str, per_token: torch.Tensor, offset: int, outliers: torch.Tensor) -> str:
    bad = ~torch.isfinite(per_token.detach())
    seqs = bad.any(-1)
    return (
        f"{where}: {int(bad.sum())} token(s) in {int(seqs.sum())} sequence(s) {indices(seqs, offset=offset)}; "
        f"injected outliers in batch: {int(outliers.sum())}"
    )


def nonfinite_grad_detail(where: str, grads: dict[str, torch.Tensor]) -> str:
    total = sum(g.numel() for g in grads.values())
    bad = {name: ~torch.isfinite(g) for name, g in grads.items()}
    n_bad = sum(int(b.sum()) for b in bad.values())
    rows = "; ".join(
        f"{name if len(grads) > 1 else 'parameter'} rows {indices(b.reshape(b.shape[0], -1).any(-1))}"
        for name, b in bad.items()
        if b.any()
    )
    return f"{where}: {n_bad} of {total} entries, {rows}"


def nonfinite_params_detail(where: str, params: dict[str, torch.Tensor]) -> str:
    n_bad = sum(int((~torch.isfinite(p.detach())).sum()) for p in params.values())
    return f"{where}: {n_bad} of {sum(p.numel() for p in params.values())} parameters are NaN/inf"


@dataclass(frozen=True)
class CollapseRules:
    drop: float = 0.3
    window: int = 20
    spike_factor: float = 10.0
    spike_updates: int = 3
    min_history: int = 10
    learned_margin: float = 0.01

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | None) -> CollapseRules:
        s = "train.collapse"
        cfg = dict(cfg or {})
        check_keys(s, cfg, cls.__dataclass_fields__)
        d = cls()
        return cls(
            drop=as_float(s, cfg, "drop", low=0.0, high=1.0, low_open=True, default=d.drop),
            window=as_int(s, cfg, "window", low=1, default=d.window),
            spike_factor=as_float(s, cfg, "spike_factor", low=1.0, low_open=True, default=d.spike_factor),
            spike_updates=as_int(s, cfg, "spike_updates", low=1, default=d.spike_updates),
            min_history=as_int(s, cfg, "min_history", low=1, default=d.min_history),
            learned_margin=as_float(s, cfg, "learned_margin", low=0.0, default=d.learned_margin),
        )


class CollapseWatch:
    """Applies CollapseRules to a run's objective values and grad norms, as they come."""

    def __init__(self, rules: CollapseRules, initial: float):
        self.rules = rules
        self.initial = initial
        self.peak, self.peak_step = initial, 0
        self.reason: str | None = None
        self.step: int | None = None
        self.kinds_seen: set[str] = set()
        self._below_since: int | None = None
        self._norms: list[float] = []  # sorted: the running median's history
        self._spike_run: list[tuple[int, int, float, float]] = []  # (step, update, norm, median)

    @property
    def learned(self) -> bool:
        return math.isfinite(self.peak) and self.peak > self.initial + self.rules.learned_margin

    def observe_objective(self, step: int, value: float, estimate: bool = False) -> Event | None:
        """A new objective value J(θ_step), or with `estimate` a noisy stand-in for it (never a peak);
        an event when it completes a sustained drop."""
        if not math.isfinite(value):
            return None
        if not estimate and (not math.isfinite(self.peak) or value > self.peak):
            self.peak, self.peak_step = value, step
        threshold = (1 - self.rules.drop) * self.peak
        if value >= threshold or self.peak <= 0:
            self._below_since = None
            return None
        if self._below_since is None:
            self._below_since = step
        if step - self._below_since >= self.rules.window:
            return self._collapse(
                "drop",
                self._below_since,
                f"objective {value:.4g} has stayed more than {self.rules.drop:.0%} below its peak "
                f"{self.peak:.4g} (step {self.peak_step}) since step {self._below_since}",
            )
        return None

    def observe_grad_norm(self, step: int, update: int, norm: float) -> Event | None:
        """An update's grad norm (before clipping); an event when it completes a run of spikes."""
        if not math.isfinite(norm):
            self._spike_run.clear()
            return None
        if norm == 0:
            return None
        history = self._norms
        if len(history) >= self.rules.min_history:
            median = (
                history[len(history) // 2]
                if len(history) % 2
                else 0.5 * (history[len(history) // 2 - 1] + history[len(history) // 2])
            )
            if norm > self.rules.spike_factor * median:
                self._spike_run.append((step, update, norm, median))
            else:
                self._spike_run.clear()
        bisect.insort(history, norm)
        if len(self._spike_run) >= self.rules.spike_updates:
            first_step, first_update, first_norm, median = self._spike_run[0]
            run = self._spike_run
            self._spike_run = []
            return self._collapse(
                "spike",
                first_step,
                f"{len(run)} consecutive updates from step {first_step} update {first_update} had "
                f"grad_norm above {self.rules.spike_factor:g}× the running median ({median:.3g}); "
                f"the first was {first_norm:.3g}",
            )
        return None

    def nonfinite_params(self, step: int, where: str) -> Event | None:
        return self._collapse("nonfinite_params", step, f"non-finite parameters at step {step} {where}", "stop")

    def _collapse(self, kind: str, step: int, reason: str, action: str = "continue") -> Event | None:
        if kind in self.kinds_seen:
            return None
        self.kinds_seen.add(kind)
        if self.reason is None:
            self.reason, self.step = reason, step
        return Event(step, "collapse", reason, action)
