"""What a NaN/inf does to a run, and when a run has collapsed.

`train.on_nonfinite`: skip drops the optimizer step of an update whose loss or gradient is NaN/inf
(and logs it); raise stops the run after that update's row (exit 1, a finding); apply lets the NaN/inf
reach the parameters, the poisoning the seed report warns about.

Collapse: a run has collapsed when θ holds a NaN/inf (the run then stops: nothing can be sampled from
it), or when the objective has at some point fallen more than `train.collapse_drop` (absolute, J is in
[0, 1]) below the best objective seen before it. The first of either is the run's collapse.

The wording of every event is here too, so the loop computes and the study writes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

ON_NONFINITE = ("skip", "raise", "apply")
ACTIONS = {"skip": "skip update", "raise": "raise", "apply": "apply"}


def skips(policy: str, nonfinite: bool) -> bool:
    """Whether this update's optimizer step is dropped (raise drops it too: its row is written, then the run stops)."""
    return nonfinite and policy in ("skip", "raise")


@dataclass
class Event:
    step: int
    kind: str  # one of runner.schema.EVENT_KINDS
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
    return (f"{where}: {int(bad.sum())} token(s) in {int(seqs.sum())} sequence(s) {indices(seqs, offset=offset)}; "
            f"injected outliers in batch: {int(outliers.sum())}")


def nonfinite_grad_detail(where: str, grads: dict[str, torch.Tensor]) -> str:
    total = sum(g.numel() for g in grads.values())
    bad = {name: ~torch.isfinite(g) for name, g in grads.items()}
    n_bad = sum(int(b.sum()) for b in bad.values())
    rows = "; ".join(f"{name if len(grads) > 1 else 'parameter'} rows {indices(b.reshape(b.shape[0], -1).any(-1))}"
                     for name, b in bad.items() if b.any())
    return f"{where}: {n_bad} of {total} entries, {rows}"


def nonfinite_params_detail(where: str, params: dict[str, torch.Tensor]) -> str:
    n_bad = sum(int((~torch.isfinite(p.detach())).sum()) for p in params.values())
    return f"{where}: {n_bad} of {sum(p.numel() for p in params.values())} parameters are NaN/inf"


class CollapseWatch:
    """Tracks the best objective and the first collapse of a run."""

    def __init__(self, drop: float | None, initial: float):
        self.drop = drop
        self.best, self.best_step = initial, 0
        self.reason: str | None = None
        self.step: int | None = None

    def observe(self, step: int, value: float) -> str | None:
        """A new objective value; returns the collapse reason if this value is the run's collapse."""
        if not math.isfinite(value):
            return None
        found = None
        if self.drop is not None and value < self.best - self.drop:
            found = self.collapse(step, f"objective {value:.4f} fell more than {self.drop:g} below its best "
                                        f"{self.best:.4f} (step {self.best_step})")
        if value > self.best:
            self.best, self.best_step = value, step
        return found

    def collapse(self, step: int, reason: str) -> str | None:
        """Record a collapse (the first one counts); returns the reason when it is the first."""
        if self.reason is not None:
            return None
        self.reason, self.step = reason, step
        return reason
