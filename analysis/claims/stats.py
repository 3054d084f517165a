"""The statistics every claim shares, and how a verdict and its numbers are written.

The unit of replication is the seed, and runs that share a seed are paired (same prompts, same random
stream). With 2–10 seeds a normal "±2 SE" is far too narrow (the two-sided 95% Student-t quantile is 12.71 at
n = 2, 4.30 at n = 3, 3.18 at n = 4), so every interval here is exact for its n:
  - paired differences d (a training claim's effect): mean ± t_{n−1} · SE, SE = sd / √n (sd with n − 1), the
    two-sided 95% Student-t interval (`t_interval`). `effect(d, margin)` "holds" when the interval's lower end
    is > 0 and mean ≥ margin (significant and large enough to matter), "does not hold" when its upper end is
    < margin (an effect of the claimed size is ruled out), else "inconclusive". `effect(..., method="bootstrap")`
    is the paired percentile bootstrap instead, for a skewed distribution of d (with n < 8 it is narrower than t:
    use it only where a statement says why);
  - collapse counts (k of n seeds): Fisher's exact test on the 2×2 table (`fisher_exact`) and Clopper–Pearson
    intervals (`clopper_pearson`); `collapse_effect` reads them as a verdict, and 0/2 against 0/2 is
    "inconclusive" (nothing to compare), never "does not hold";
  - time to collapse: Kaplan–Meier survival curves (`kaplan_meier`, for the figures) and the log-rank test
    (`logrank`), a run that never collapses censored at its last step.
The quantiles come from the regularised incomplete beta function (a continued fraction, `betainc`), so no
table and no SciPy: tests/test_claims.py pins them to the published tables.

A verdict has four values: holds, does not hold, inconclusive, and untestable here (the claim's positive
control failed: the world never shows the effect the claim is about, so the claim is not tested). Parts of a
claim combine with `all_of` (every part must hold) or `any_of` (for claims that are existential, e.g. "under a
bf16 OR a noise mismatch"); how they treat "untestable here" is in their docstrings.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

HOLDS, FAILS, UNSURE = "holds", "does not hold", "inconclusive"
# A claim whose positive control failed (the world never shows the effect the claim is about) is not tested.
UNTESTABLE = "untestable here"
VERDICTS = (HOLDS, FAILS, UNSURE, UNTESTABLE)
ALPHA = 0.05  # every exact test: significant at p < 0.05 (not 1 − LEVEL = 0.050000000000000044, which would
# count 3/3 against 0/3's p = 1/20 = 0.05 as significant)
LEVEL = 1 - ALPHA  # every interval: two-sided 95%
# The old ±2 SE rule, kept for the rules and error bars that still read it (with many tokens, not seeds, behind
# a mean, t ≈ 2); a verdict on seeds uses t_quantile.
SIGMAS = 2.0
EPS = 1e-12

# Shared by the run summaries below and the claims' rules and figures.
SPIKE_FACTOR = 5.0  # a grad-norm spike: above 5× the median of the trailing window (as analysis.figures)
SPIKE_WINDOW = 20
FINAL_FRACTION = 0.25  # the "final objective" is the mean J over the last quarter of the updates
# A band that rejects at least this fraction of the tokens leaves an arm that learns from almost nothing: a
# degenerate arm. Training arms are judged on token_masked_fraction; probe arms carry probe.csv's own
# `degenerate` flag (runner/core/schema.py: ≥ 90% masked or a mean estimate under 10% of ‖∇J‖), the stricter one.
DEGENERATE_REJECTED = 0.97
# summary.json's collapse_reason, by the wording of runner/training/faults.py, as one word per kind.
COLLAPSE_KINDS = (("drop", "below its peak"), ("spike", "consecutive updates"), ("nan", "non-finite parameters"))


@dataclass
class Verdict:
    verdict: str
    statement: str  # every number behind the verdict, one line (VERDICTS.md's detail lines)
    parts: dict[str, Any] = field(default_factory=dict)
    key: str = ""  # the few numbers a table cell has room for (VERDICTS.md's claim × world table)
    n: int | None = None  # replicates per arm behind the verdict (registry.evaluate fills in the seeds if unset)
    n_unit: str = "seeds"  # what n counts: seeds, or a probe's repeats

    def n_text(self) -> str:
        """'n = 4 seeds' for a cell or a title ('' when n is unknown)."""
        if self.n is None:
            return ""
        return f"n = {self.n} {self.n_unit if self.n != 1 else self.n_unit.rstrip('s')}"

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


def effect(diffs, margin: float, method: str = "t") -> str:
    """Paired differences (positive = the claimed direction) against a practical margin, by their two-sided 95%
    interval (`method` "t": Student-t with n − 1 degrees of freedom; "bootstrap": the paired percentile
    bootstrap); see the module doc."""
    lo, hi, n = interval(diffs, method)
    m = mean_se(diffs)[0]
    if n < 2 or not (math.isfinite(lo) and math.isfinite(hi)):
        return UNSURE
    if lo > 0 and m >= margin:
        return HOLDS
    if hi < margin:
        return FAILS
    return UNSURE


def all_of(verdicts: Sequence[str]) -> str:
    """Every part must hold. A part that does not hold (on tested evidence) sinks the claim; otherwise a part that
    is untestable here makes the claim untestable (it cannot hold without that part, and more seeds would not
    help); otherwise holds when every part holds, else inconclusive (also with no parts)."""
    if any(v == FAILS for v in verdicts):
        return FAILS
    if any(v == UNTESTABLE for v in verdicts):
        return UNTESTABLE
    return HOLDS if verdicts and all(v == HOLDS for v in verdicts) else UNSURE


def any_of(verdicts: Sequence[str]) -> str:
    """An existential claim: holds when some part holds. An untestable part is left out: "does not hold" when every
    testable part does not hold (at least one was tested), "untestable here" when no part could be tested,
    inconclusive otherwise (also with no parts)."""
    if any(v == HOLDS for v in verdicts):
        return HOLDS
    tested = [v for v in verdicts if v != UNTESTABLE]
    if verdicts and not tested:
        return UNTESTABLE
    return FAILS if tested and all(v == FAILS for v in tested) else UNSURE


# ----------------------------------------------------------------------------------------- exact distributions
def betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b), by its continued fraction (modified Lentz; Numerical
    Recipes §6.4), on the side of x where it converges fast; relative error < 1e-13 for the a, b used here."""
    if not (a > 0 and b > 0):
        raise ValueError(f"betainc needs a, b > 0, got {a}, {b}")
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x > (a + 1) / (a + b + 2):  # the symmetry I_x(a, b) = 1 − I_{1−x}(b, a) puts x where the fraction converges
        return 1.0 - betainc(b, a, 1.0 - x)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 500):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return math.exp(log_front) * f / a


def t_cdf(t: float, df: float) -> float:
    """P(T ≤ t) for Student's t with df degrees of freedom: 1 − I_{df/(df+t²)}(df/2, 1/2) / 2 for t ≥ 0."""
    if not math.isfinite(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * betainc(df / 2, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def _invert(cdf, p: float, lo: float, hi: float) -> float:
    """The x in [lo, hi] with cdf(x) = p for an increasing cdf, by bisection to machine precision."""
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if cdf(mid) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-14 * max(1.0, abs(mid)):
            break
    return 0.5 * (lo + hi)


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with df degrees of freedom (t_quantile(0.975, 1) = 12.706)."""
    if not (0 < p < 1) or not df > 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    hi = 1.0
    while t_cdf(hi, df) < p:
        hi *= 2
    return _invert(lambda t: t_cdf(t, df), p, 0.0, hi)


def beta_quantile(p: float, a: float, b: float) -> float:
    """The p-quantile of the Beta(a, b) distribution."""
    return _invert(lambda x: betainc(a, b, x), p, 0.0, 1.0)


def chi2_1_sf(x: float) -> float:
    """P(χ²₁ > x): the p-value of a one-degree-of-freedom chi-square statistic (the log-rank test's)."""
    return math.erfc(math.sqrt(max(x, 0.0) / 2))


# ----------------------------------------------------------------------------------------- intervals
def t_interval(values, level: float = LEVEL) -> tuple[float, float, float, int]:
    """(mean, low, high, n): the two-sided Student-t interval mean ± t_{n−1} · SE of the finite values (NaN ends
    with fewer than 2)."""
    m, se, n = mean_se(values)
    if n < 2 or not math.isfinite(se):
        return m, math.nan, math.nan, n
    half = t_quantile(0.5 + level / 2, n - 1) * se
    return m, m - half, m + half, n


BOOT_RESAMPLES = 10_000
BOOT_SEED = 0  # a fixed stream: the same differences give the same interval


def bootstrap_interval(values, level: float = LEVEL, resamples: int = BOOT_RESAMPLES) -> tuple[float, float, int]:
    """(low, high, n): the percentile bootstrap of the mean of the finite (paired) values, resampling seeds."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    n = len(x)
    if n < 2:
        return math.nan, math.nan, n
    rng = np.random.default_rng(BOOT_SEED)
    means = x[rng.integers(0, n, size=(resamples, n))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi), n


def interval(values, method: str = "t", level: float = LEVEL) -> tuple[float, float, int]:
    """(low, high, n) of the mean of paired values by `method`: "t" (Student-t) or "bootstrap" (percentile)."""
    if method == "t":
        return t_interval(values, level)[1:]
    if method == "bootstrap":
        return bootstrap_interval(values, level)
    raise ValueError(f"unknown interval method {method!r}; valid: t, bootstrap")


def interval_text(values, method: str = "t") -> str:
    """A paired effect for a statement: 'mean ± SE, 95% t CI [lo, hi], n = 4' (the method named)."""
    m, se, n = mean_se(values)
    lo, hi, _ = interval(values, method)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return f"{sig(m)} (n = {n}: no interval)"
    name = "t" if method == "t" else "bootstrap"
    return f"{plus_minus(m, se)}, 95% {name} CI [{sig(lo, 2)}, {sig(hi, 2)}], n = {n}"


def clopper_pearson(k: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """The exact (Clopper–Pearson) two-sided interval of a binomial rate from k events in n trials."""
    if n <= 0:
        return math.nan, math.nan
    a = (1 - level) / 2
    lo = 0.0 if k == 0 else beta_quantile(a, k, n - k + 1)
    hi = 1.0 if k == n else beta_quantile(1 - a, k + 1, n - k)
    return lo, hi


# ----------------------------------------------------------------------------------------- counts
def _hypergeom(x: int, k_a: int, n_a: int, n_b: int, total_events: int) -> float:
    """P(X = x): x of the `total_events` events in arm a (n_a runs) when the arms' n_a + n_b runs are exchangeable."""
    return math.comb(n_a, x) * math.comb(n_b, total_events - x) / math.comb(n_a + n_b, total_events)


def fisher_exact(k_a: int, n_a: int, k_b: int, n_b: int, alternative: str = "greater") -> float:
    """Fisher's exact test on the 2×2 table (k_a of n_a runs against k_b of n_b): the p-value that arm a has
    more events than arm b ("greater": P(X ≥ k_a) under the hypergeometric law of the fixed margins), fewer
    ("less") or a different rate ("two-sided": the tables no more likely than the one observed)."""
    if not (0 <= k_a <= n_a and 0 <= k_b <= n_b):
        raise ValueError(f"fisher_exact: counts {k_a}/{n_a}, {k_b}/{n_b}")
    events = k_a + k_b
    support = range(max(0, events - n_b), min(n_a, events) + 1)
    probs = {x: _hypergeom(x, k_a, n_a, n_b, events) for x in support}
    if alternative == "greater":
        p = sum(v for x, v in probs.items() if x >= k_a)
    elif alternative == "less":
        p = sum(v for x, v in probs.items() if x <= k_a)
    elif alternative == "two-sided":
        p = sum(v for v in probs.values() if v <= probs[k_a] * (1 + 1e-7))
    else:
        raise ValueError(f"unknown alternative {alternative!r}; valid: greater, less, two-sided")
    return min(1.0, p)


def collapse_effect(k_more: int, n_more: int, k_less: int, n_less: int) -> str:
    """ "Arm 1 collapses more often than arm 2", from collapse counts by Fisher's exact test: holds at a one-sided
    p < 0.05; does not hold when arm 2 collapses significantly more often (p < 0.05 the other way); else
    inconclusive: 0/2 against 0/2 (or any count too small to show a difference) is not evidence of no effect."""
    if n_more == 0 or n_less == 0:
        return UNSURE
    if fisher_exact(k_more, n_more, k_less, n_less, "greater") < ALPHA:
        return HOLDS
    if fisher_exact(k_more, n_more, k_less, n_less, "less") < ALPHA:
        return FAILS
    return UNSURE


def sign_test(m: int, n: int) -> float:
    """The exact one-sided sign test: P(at least m of n paired seeds on one side) when either side is equally
    likely, Σ_{i ≥ m} C(n, i) / 2ⁿ (every one of n seeds below needs n ≥ 5 for p < 0.05)."""
    if not 0 <= m <= n:
        raise ValueError(f"sign_test: {m} of {n}")
    return sum(math.comb(n, i) for i in range(m, n + 1)) / 2**n


def count_text(k: int, n: int) -> str:
    """'3/4 collapsed [19%, 99%]': a count with its exact 95% interval."""
    lo, hi = clopper_pearson(k, n)
    return f"{k}/{n} collapsed [{pct(lo)}, {pct(hi)}]" if n else "0/0 collapsed"


# ----------------------------------------------------------------------------------------- time to collapse
def kaplan_meier(times, events) -> tuple[list[float], list[float]]:
    """The Kaplan–Meier survival curve of time to collapse: (times, S) as a step function starting at (0, 1),
    one point per distinct collapse time; `events` 1 for a run that collapsed at `times`, 0 for one censored
    there (it ran that far without collapsing)."""
    t = np.asarray(times, dtype=float)
    e = np.asarray(events, dtype=float) > 0
    xs, ss, s = [0.0], [1.0], 1.0
    for u in np.unique(t[e]):
        at_risk = int((t >= u).sum())
        died = int(((t == u) & e).sum())
        s *= 1 - died / at_risk
        xs.append(float(u))
        ss.append(s)
    return xs, ss


def logrank(times_a, events_a, times_b, events_b) -> tuple[float, float]:
    """The log-rank test of two arms' times to collapse: (χ² statistic with 1 df, p-value). At each distinct
    collapse time the collapses in arm a are compared with their expectation under one shared hazard
    (hypergeometric mean and variance); NaN p with no collapse in either arm."""
    ta, tb = np.asarray(times_a, dtype=float), np.asarray(times_b, dtype=float)
    ea, eb = np.asarray(events_a, dtype=float) > 0, np.asarray(events_b, dtype=float) > 0
    observed = expected = var = 0.0
    for u in np.unique(np.concatenate([ta[ea], tb[eb]])):
        r_a, r_b = float((ta >= u).sum()), float((tb >= u).sum())
        d_a, d_b = float(((ta == u) & ea).sum()), float(((tb == u) & eb).sum())
        r, d = r_a + r_b, d_a + d_b
        observed += d_a
        expected += d * r_a / r
        if r > 1:
            var += d * (r_a / r) * (r_b / r) * (r - d) / (r - 1)
    if var <= 0:
        return math.nan, math.nan
    chi2 = (observed - expected) ** 2 / var
    return chi2, chi2_1_sf(chi2)


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
