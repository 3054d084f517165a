"""summary.json's `mismatch` block: how far apart the trainer and the rollout engine were over a run.

Per step, from the tensors the step already holds (the trainer's fp32 log-probs `old`, the engine's `roll`,
the action mask), with lr = old − roll and ρ = e^lr, as metrics.csv's kl_k3 (runner/core/metrics.py):

    token_kl_k3          mean over the batch's masked-in tokens of k3 = ρ − 1 − lr
    seq_kl_k3            each sequence's sum of k3 over its masked-in tokens, averaged over the sequences that
                         have one (a long response carries more mismatch than a short one: this keeps it)
    ratio_outside_0.5_2  the fraction of masked-in tokens whose ρ is outside [0.5, 2] (a NaN ρ counts as outside)
    max_abs_prob_diff    max |e^old − e^roll| over masked-in tokens

k3 uses the ±20 safety bound on lr that kl_k3 uses, so an injected −1000-nat outlier does not make it inf;
the fraction and the probability difference need no bound. Sums are taken in float64.

The run's block gives the first three as {"first": …, "last": …}: their means over the first and the last
10% of the run's updates (ceil, at least one update). A step's updates share its batch, so its value counts
once per update it had; a step without an update (a run stopped before its first) counts not at all, and a
step without a masked-in token has no value and is left out of its window. With no update at all, or no
value in a window, the mean is null; a NaN (non-finite log-probs) makes it NaN, which summary.json writes as
null. max_abs_prob_diff is the maximum over all steps, and zero_grad_fraction is summary.json's own.
"""

from __future__ import annotations

import math

import torch

from runner.core.masking import SAFETY_BOUND

WINDOW_FRACTION_DENOMINATOR = 10  # the first and last 10% of updates
RATIO_BAND = (0.5, 2.0)
WINDOWED = ("token_kl_k3", "seq_kl_k3", "ratio_outside_0.5_2")


def window_size(updates: int) -> int:
    """ceil(10% of updates), at least 1, in integers (exact for any count)."""
    return max(1, -(-updates // WINDOW_FRACTION_DENOMINATOR))


def window_means(per_update: list[float | None]) -> dict[str, float | None]:
    """The means of the first and the last window_size(n) values (None values left out); both None when
    there are no values."""
    if not per_update:
        return {"first": None, "last": None}
    w = window_size(len(per_update))
    return {"first": _mean(per_update[:w]), "last": _mean(per_update[-w:])}


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return math.fsum(present) / len(present) if present else None


def step_mismatch(old: torch.Tensor, roll: torch.Tensor, mask: torch.Tensor) -> dict[str, float | None]:
    """One step's four values, from [N, T] log-probs and mask; None for all four when no token is masked in."""
    keep = mask > 0
    old64, roll64 = old.double(), roll.double()
    zero = torch.zeros((), dtype=torch.float64, device=old.device)
    lr = torch.where(keep, old64 - roll64, zero)
    bounded = lr.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    k3 = torch.where(keep, torch.expm1(bounded) - bounded, zero)  # expm1: a tiny k3 does not cancel away
    rho = torch.exp(lr)
    inside = (rho >= RATIO_BAND[0]) & (rho <= RATIO_BAND[1])
    seq_tokens = keep.sum(-1)
    nonempty = (seq_tokens > 0).double()
    prob_diff = torch.where(keep, (old64.exp() - roll64.exp()).abs(), zero)
    tokens, sequences, k3_total, seq_total, outside, max_diff = torch.stack(
        [
            seq_tokens.sum().double(),
            nonempty.sum(),
            k3.sum(),
            (k3.sum(-1) * nonempty).sum(),
            (keep & ~inside).sum().double(),
            prob_diff.amax() if prob_diff.numel() else zero,
        ]
    ).tolist()  # one device-to-host copy a step
    if tokens == 0:
        return {"token_kl_k3": None, "seq_kl_k3": None, "ratio_outside_0.5_2": None, "max_abs_prob_diff": None}
    return {
        "token_kl_k3": k3_total / tokens,
        "seq_kl_k3": seq_total / sequences,
        "ratio_outside_0.5_2": outside / tokens,
        "max_abs_prob_diff": max_diff,
    }


class MismatchSummary:
    """Collects each step's values (add) and gives the run's block (block)."""

    def __init__(self) -> None:
        self.steps: list[tuple[dict[str, float | None], int]] = []  # (the step's values, its updates)

    def add(self, old: torch.Tensor, roll: torch.Tensor, mask: torch.Tensor, updates: int) -> None:
        self.add_values(step_mismatch(old, roll, mask), updates)

    def add_values(self, values: dict[str, float | None], updates: int) -> None:
        self.steps.append((values, updates))

    def block(self, zero_grad_fraction: float) -> dict:
        out: dict = {}
        for name in WINDOWED:
            out[name] = window_means([values[name] for values, updates in self.steps for _ in range(updates)])
        diffs = [values["max_abs_prob_diff"] for values, _ in self.steps if values["max_abs_prob_diff"] is not None]
        # a NaN anywhere makes the maximum NaN (Python's max would depend on where it came)
        out["max_abs_prob_diff"] = (math.nan if any(map(math.isnan, diffs)) else max(diffs)) if diffs else None
        out["zero_grad_fraction"] = zero_grad_fraction
        return out
