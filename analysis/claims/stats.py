"""The statistics every claim shares, and how a verdict and its numbers are written.

The unit of replication is the seed, and runs that share a seed are paired (same prompts, same random
stream). mean ± SE with SE = sd / √n (sd with n − 1); `effect(d, margin)` is the test every training claim
uses on paired differences d: "holds" when mean − 2 SE > 0 and mean ≥ margin (significant and large enough to
matter), "does not hold" when mean + 2 SE < margin (an effect of the claimed size is ruled out), else
"inconclusive". Parts of a claim combine with `all_of` (every part must hold; any part that does not hold sinks
the claim) or `any_of` (for claims that are existential, e.g. "under a bf16 OR a noise mismatch").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

HOLDS, FAILS, UNSURE = "holds", "does not hold", "inconclusive"
# A claim whose positive control failed (the world never shows the effect the claim is about) is not tested.
UNTESTABLE = "untestable here"
VERDICTS = (HOLDS, FAILS, UNSURE, UNTESTABLE)
SIGMAS = 2.0  # "significant" = beyond 2 standard errors
EPS = 1e-12

# Shared by the run summaries below and the claims' rules and figures.
SPIKE_FACTOR = 5.0  # a grad-norm spike: above 5× the median of the trailing window (as analysis.plots)
SPIKE_WINDOW = 20
FINAL_FRACTION = 0.25  # the "final objective" is the mean J over the last quarter of the updates
# A band that rejects at least this fraction of the tokens leaves an arm that learns from almost nothing: a
# degenerate arm. Training arms are judged on token_masked_fraction; probe arms carry probe.csv's own
# `degenerate` flag (runner/schema.py: ≥ 90% masked or a mean estimate under 10% of ‖∇J‖), the stricter one.
DEGENERATE_REJECTED = 0.97
# summary.json's collapse_reason, by the wording of runner/training/faults.py, as one word per kind.
COLLAPSE_KINDS = (("drop", "below its peak"), ("spike", "consecutive updates"), ("nan", "non-finite parameters"))


@dataclass
class Verdict:
    verdict: str
    statement: str  # every number behind the verdict, one line (VERDICTS.md's detail lines)
    parts: dict[str, Any] = field(default_factory=dict)
    key: str = ""  # the few numbers a table cell has room for (VERDICTS.md's claim × world table)

    def __post_init__(self) -> None:
        assert self.verdict in VERDICTS, self.verdict


# ----------------------------------------------------------------------------------------- the tests
def mean_se(values) -> tuple[float, float, int]:
    """(mean, standard error, n) of the finite values; SE is NaN with fewer than 2."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    n = len(x)
    if n == 0:
        return math.nan, math.nan, 0
    se = float(np.std(x, ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    return float(np.mean(x)), se, n


def effect(diffs, margin: float) -> str:
    """Paired differences (positive = the claimed direction) against a practical margin; see the module doc."""
    m, se, n = mean_se(diffs)
    if n < 2 or not math.isfinite(se):
        return UNSURE
    if m - SIGMAS * se > 0 and m >= margin:
        return HOLDS
    if m + SIGMAS * se < margin:
        return FAILS
    return UNSURE


def all_of(verdicts: Sequence[str]) -> str:
    if any(v == FAILS for v in verdicts):
        return FAILS
    return HOLDS if verdicts and all(v == HOLDS for v in verdicts) else UNSURE


def any_of(verdicts: Sequence[str]) -> str:
    if any(v == HOLDS for v in verdicts):
        return HOLDS
    return FAILS if verdicts and all(v == FAILS for v in verdicts) else UNSURE


# ----------------------------------------------------------------------------------------- run summaries
def spikes_of(grad_norm) -> int:
    """Grad-norm spikes of one run, in update order: updates above SPIKE_FACTOR × the median of the previous
    SPIKE_WINDOW positive finite norms (at least 3 of them), plus every NaN/inf norm."""
    import pandas as pd

    g = pd.Series(np.asarray(grad_norm, dtype=float))
    bad = ~np.isfinite(g)
    gn = g.where(np.isfinite(g) & (g > 0))
    ref = gn.shift(1).rolling(SPIKE_WINDOW, min_periods=3).median()
    spike = (gn > SPIKE_FACTOR * ref) & (ref > 0)
    return int(spike.sum() + bad.sum())


def drawdown_of(objective) -> float:
    """The worst fall of J below its running best (0 for a run that never goes down)."""
    j = np.asarray(objective, dtype=float)
    j = j[np.isfinite(j)]
    if len(j) == 0:
        return math.nan
    return float(np.max(np.maximum.accumulate(j) - j))


def final_of(objective) -> float:
    """The mean J over the last FINAL_FRACTION of the updates (at least one)."""
    j = np.asarray(objective, dtype=float)
    j = j[np.isfinite(j)]
    if len(j) == 0:
        return math.nan
    k = max(1, int(math.ceil(len(j) * FINAL_FRACTION)))
    return float(np.mean(j[-k:]))


def relative_drop(peak: float, final: float) -> float:
    """How far J ended below its peak, as a fraction of the peak (0 when it ended at it; NaN without a peak):
    the same scale as the collapse rule's 30%, so worlds whose J lives on different scales compare."""
    if not (math.isfinite(peak) and math.isfinite(final)) or peak <= 0:
        return math.nan
    return max(0.0, (peak - final) / peak)


def collapse_kind(reason: Any) -> str:
    """summary.json's collapse_reason as one word: drop | spike | nan ("" for none, "other" if unknown)."""
    if not isinstance(reason, str) or not reason:
        return ""
    for kind, words in COLLAPSE_KINDS:
        if words in reason:
            return kind
    return "other"


def rate(flags) -> float:
    """The fraction of true values (NaN for none)."""
    x = np.asarray(flags, dtype=float)
    return float(x.mean()) if len(x) else math.nan


def steps_text(steps) -> str:
    """Collapse steps for a statement: 'at steps 40, 120' (finite ones, sorted), or '' for none."""
    s = sorted(int(v) for v in steps if v is not None and math.isfinite(float(v)))
    if not s:
        return ""
    return f" at step{'s' if len(s) > 1 else ''} " + ", ".join(str(v) for v in s)


# ----------------------------------------------------------------------------------------- numbers in statements
def sig(v: float, digits: int = 3) -> str:
    """A number for a statement: 3 significant digits, no exponent noise for ordinary sizes."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "∞" if v == math.inf else ("nan" if v is None or math.isnan(v) else "−∞")
    v = float(v)
    if v == 0:
        return "0"
    if 1e-3 <= abs(v) < 1e4:
        return f"{v:.{digits}g}"
    return f"{v:.{max(digits - 1, 1)}e}".replace("e-0", "e-").replace("e+0", "e")


def as_float(v: Any) -> float:
    """A number from summary.json / a CSV cell: None, "" and unparsable values are NaN."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def plus_minus(m: float, se: float) -> str:
    return f"{sig(m)} ± {sig(se, 2)}" if math.isfinite(se) else sig(m)


def pct(v: float) -> str:
    """A fraction as a percentage for a statement: 62%, 0.4%, 100%."""
    if not math.isfinite(v):
        return "nan"
    p = 100 * v
    return f"{p:.0f}%" if p >= 9.5 or p == 0 else f"{p:.1g}%"

