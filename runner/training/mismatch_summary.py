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
    return steps_mismatch(old.unsqueeze(0), roll.unsqueeze(0), mask.unsqueeze(0))[0]


def steps_mismatch(old: torch.Tensor, roll: torch.Tensor, mask: torch.Tensor) -> list[dict[str, float | None]]:
    """Each step's four values from [S, N, T] log-probs and masks (S steps stacked): the same dozen
    elementwise ops for S steps at once, which is what makes the block cheap (runner/studies/train.py's
    Writer hands them over in batches)."""
    keep = mask > 0
    old64, roll64 = old.double(), roll.double()
    zero = torch.zeros((), dtype=torch.float64, device=old.device)
    lr = torch.where(keep, old64 - roll64, zero)
    bounded = lr.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    k3 = torch.where(keep, torch.expm1(bounded) - bounded, zero)  # expm1: a tiny k3 does not cancel away
    rho = torch.exp(lr)
    inside = (rho >= RATIO_BAND[0]) & (rho <= RATIO_BAND[1])
    seq_tokens = keep.sum(-1)  # [S, N]
    nonempty = (seq_tokens > 0).double()
    prob_diff = torch.where(keep, (old64.exp() - roll64.exp()).abs(), zero)
    empty = prob_diff.shape[-1] * prob_diff.shape[-2] == 0
    columns = torch.stack(
        [
            seq_tokens.sum(-1).double(),
            nonempty.sum(-1),
            k3.sum((-2, -1)),
            (k3.sum(-1) * nonempty).sum(-1),
            (keep & ~inside).sum((-2, -1)).double(),
            zero.expand(old.shape[0]) if empty else prob_diff.flatten(1).amax(-1),
        ],
        dim=1,
    ).tolist()  # one device-to-host copy for the S steps
    out = []
    for tokens, sequences, k3_total, seq_total, outside, max_diff in columns:
        if tokens == 0:
            out.append(dict.fromkeys(("token_kl_k3", "seq_kl_k3", "ratio_outside_0.5_2", "max_abs_prob_diff")))
        else:
            out.append(
                {
                    "token_kl_k3": k3_total / tokens,
                    "seq_kl_k3": seq_total / sequences,
                    "ratio_outside_0.5_2": outside / tokens,
                    "max_abs_prob_diff": max_diff,
                }
            )
    return out


class MismatchSummary:
    """Collects each step's values (add) and gives the run's block (block). A step's tensors wait until
    PENDING_ELEMENTS of them have come (or the shape changes, or the block is asked for), then every waiting
    step is computed in one batched pass: per step, a dozen small ops cost more than the values are worth."""

    PENDING_ELEMENTS = 1 << 20  # [S, N, T] elements per batched pass: a few MB of float64 temporaries

    def __init__(self) -> None:
        self.steps: list[tuple[dict[str, float | None], int]] = []  # (the step's values, its updates)
        self._pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]] = []

    def add(self, old: torch.Tensor, roll: torch.Tensor, mask: torch.Tensor, updates: int) -> None:
        if self._pending and self._pending[0][0].shape != old.shape:
            self._flush()
        self._pending.append((old.detach(), roll.detach(), mask.detach(), updates))
        if len(self._pending) * old.numel() >= self.PENDING_ELEMENTS:
            self._flush()

    def add_values(self, values: dict[str, float | None], updates: int) -> None:
        self._flush()
        self.steps.append((values, updates))

    def _flush(self) -> None:
        if not self._pending:
            return
        olds, rolls, masks, updates = zip(*self._pending)
        self._pending = []
        values = steps_mismatch(torch.stack(olds), torch.stack(rolls), torch.stack(masks))
        self.steps += list(zip(values, updates))

    def block(self, zero_grad_fraction: float) -> dict:
        self._flush()
        out: dict = {}
        for name in WINDOWED:
            out[name] = window_means([values[name] for values, updates in self.steps for _ in range(updates)])
        diffs = [values["max_abs_prob_diff"] for values, _ in self.steps if values["max_abs_prob_diff"] is not None]
        # a NaN anywhere makes the maximum NaN (Python's max would depend on where it came)
        out["max_abs_prob_diff"] = (math.nan if any(map(math.isnan, diffs)) else max(diffs)) if diffs else None
        out["zero_grad_fraction"] = zero_grad_fraction
        return out
