"""Inputs for the audit: hand-written batches, hypothesis strategies, and a greedy shrinker that
removes rows and columns while a failure (of the same kind) persists.

Two input profiles say what the inputs may hold:

- adversarial (the default): log-probs from a few special values (0, −1, −100, −1000, −1e4, ...)
  or floats in [−1e4, 0], so log-ratios up to ±1e4 appear early and shrink towards 0; NaN, ±inf
  and 1e30 at masked positions; any 0/1 mask.
- realistic: what a trainer can feed. Log-probs in [−100, 0] (a float32 softmax cannot give a
  probability below e^−103), |lp − old| ≤ 20, masks left-aligned with at least one token a row.
  At masked positions the values are finite and every log-prob is a model's view of the same pad
  token, so lp, old and roll differ by at most 20 nats there too. A finding under this profile is reachable in
  training; one only under the adversarial profile needs input no trainer produces.

Every value is float32-representable, so a saved case file reproduces bit for bit. The action mask
shrinks towards 1, the advantage towards 1, B and T towards 1. Search budgets (default, thorough,
fast) set how many examples each kind draws.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from runner.audit.subjects import Batch

NAN, INF = math.nan, math.inf
LOGPROB_SPECIALS = (0.0, -1.0, -1000.0, -10000.0, -100.0, -0.5, -4.0, -200.0, -20.0, -500.0)
REALISTIC_SPECIALS = (0.0, -1.0, -100.0, -0.5, -4.0, -20.0, -50.0)
ADV_SPECIALS = (1.0, -1.0, 0.0, 0.5, -2.0)
GARBAGE = (NAN, INF, -INF, 1e30, -10000.0, 1000.0)
REALISTIC_FLOOR = -100.0  # the lowest log-prob of the realistic profile
REALISTIC_STEP = 20.0  # the largest |lp − old| of the realistic profile


@dataclass(frozen=True)
class Budget:
    name: str
    examples: dict[str, int]  # hypothesis examples per generator kind (shared by every subject)
    max_b: int
    max_t: int


KINDS = ("finite", "padding", "on-policy", "moderate", "smooth", "ordinary")
BUDGETS = {
    "default": Budget(
        "default",
        {"finite": 80, "padding": 50, "on-policy": 30, "moderate": 30, "smooth": 12, "ordinary": 40},
        max_b=3,
        max_t=4,
    ),
    "thorough": Budget(
        "thorough",
        {"finite": 1000, "padding": 600, "on-policy": 300, "moderate": 300, "smooth": 100, "ordinary": 300},
        max_b=4,
        max_t=8,
    ),
    # For tests and quick looks: still derandomized and still finds every failure the hand cases show.
    "fast": Budget(
        "fast",
        {"finite": 25, "padding": 15, "on-policy": 10, "moderate": 10, "smooth": 4, "ordinary": 10},
        max_b=2,
        max_t=3,
    ),
}


@dataclass(frozen=True)
class InputProfile:
    name: str
    summary: str

    @property
    def realistic(self) -> bool:
        return self.name == "realistic"

    def admits(self, batch: Batch) -> bool:
        """Whether a (hand-written) batch is input of this profile."""
        if not self.realistic:
            return True
        logprobs = torch.stack([batch.lp, batch.old, batch.roll])
        if not bool(torch.isfinite(logprobs).all() & torch.isfinite(batch.adv).all()):
            return False
        if bool((logprobs > 0).any() | (logprobs < REALISTIC_FLOOR).any()):
            return False
        if bool(((batch.lp - batch.old).abs() > REALISTIC_STEP).any()):
            return False
        if bool(((batch.roll - batch.old).abs() > REALISTIC_STEP)[batch.mask == 0].any()):
            return False
        return batch.left_aligned and bool((batch.mask > 0).any(dim=1).all())


PROFILES = {
    "adversarial": InputProfile("adversarial", "log-probs down to −1e4, NaN/±inf at masked positions, any mask"),
    "realistic": InputProfile(
        "realistic", "log-probs in [−100, 0], |lp − old| ≤ 20, finite padding, left-aligned masks"
    ),
}


def hypothesis_settings(max_examples: int):
    """The deterministic profile: derandomized, no example database, no deadline, no health checks."""
    from hypothesis import HealthCheck, Phase, Verbosity, settings

    return settings(
        max_examples=max_examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=(Phase.generate, Phase.shrink),
        verbosity=Verbosity.quiet,
        report_multiple_bugs=False,
        print_blob=False,
    )


def _f32(x: float) -> float:
    return float(np.float32(x))


# --------------------------------------------------------------------------------- strategies
def strategy(kind: str, budget: Budget, profile: InputProfile = PROFILES["adversarial"]):
    """kind: finite (inv 1-3), padding (4: garbage at mask=0), on-policy (5), moderate (6: B ≥ 2,
    |log-ratio| ≤ 10 so float64 sums stay exact enough), smooth (7: float64, PPO ratios away from
    the clip edges), ordinary (the reference comparison: |old − roll| ≤ 3, |lp − old| ≤ 0.125 so
    PPO never clips, whatever the profile)."""
    from hypothesis import strategies as st

    f32 = dict(width=32, allow_nan=False, allow_infinity=False, allow_subnormal=False)
    real = profile.realistic
    if real:
        finite_lp = st.one_of(st.sampled_from(REALISTIC_SPECIALS), st.floats(REALISTIC_FLOOR, 0.0, **f32))
        garbage = st.one_of(st.sampled_from((0.0, -100.0, -1.0, 5.0)), st.floats(REALISTIC_FLOOR, 0.0, **f32))
    else:
        finite_lp = st.one_of(st.sampled_from(LOGPROB_SPECIALS), st.floats(-1e4, 0.0, **f32))
        garbage = st.sampled_from(GARBAGE)
    finite_adv = st.one_of(st.sampled_from(ADV_SPECIALS), st.floats(-10.0, 10.0, **f32))
    step = st.one_of(st.sampled_from((0.0, 1.0, -1.0, 20.0, -20.0)), st.floats(-REALISTIC_STEP, REALISTIC_STEP, **f32))
    moderate_lp = st.one_of(st.sampled_from((0.0, -1.0, -0.5, -10.0, -3.0)), st.floats(-10.0, 0.0, **f32))
    min_b = 2 if kind == "moderate" else 1

    @st.composite
    def draw_batch(draw) -> Batch:
        B = draw(st.integers(min_b, max(min_b, budget.max_b)))
        T = draw(st.integers(1, budget.max_t))
        if real or kind == "ordinary":
            lengths = [draw(st.integers(1, T).map(lambda n, T=T: T + 1 - n)) for _ in range(B)]  # shrinks to T
            mask = [1.0 if j < n else 0.0 for n in lengths for j in range(T)]
        else:
            mask = [draw(st.sampled_from((1.0, 0.0))) for _ in range(B * T)]

        def grid(inside, outside=None):
            flat = [draw(inside if m or outside is None else outside) for m in mask]
            return [flat[i * T : (i + 1) * T] for i in range(B)]

        def near(base, steps):  # lp = old + step, kept inside the profile's range
            return [
                [_f32(min(0.0, max(REALISTIC_FLOOR, b + s))) for b, s in zip(rb, rs)] for rb, rs in zip(base, steps)
            ]

        m = [mask[i * T : (i + 1) * T] for i in range(B)]
        if kind == "finite":
            old = grid(finite_lp)
            if not real:
                return Batch.of(grid(finite_lp), old, grid(finite_lp), grid(finite_adv), m)
            roll = [
                [r if mm else p for r, p, mm in zip(rr, rp, rm)]
                for rr, rp, rm in zip(grid(finite_lp), near(old, grid(step)), m)
            ]
            return Batch.of(near(old, grid(step)), old, roll, grid(finite_adv), m)
        if kind == "padding":
            old = grid(finite_lp, garbage)
            if not real:
                return Batch.of(grid(finite_lp, garbage), old, grid(finite_lp, garbage), grid(finite_adv, garbage), m)
            roll = [
                [r if mm else p for r, p, mm in zip(rr, rp, rm)]  # at padding, roll is near old too
                for rr, rp, rm in zip(grid(finite_lp), near(old, grid(step)), m)
            ]
            return Batch.of(near(old, grid(step)), old, roll, grid(finite_adv), m)
        if kind == "on-policy":
            lp = grid(finite_lp)
            return Batch.of(lp, lp, lp, grid(finite_adv), m)
        if kind == "moderate":
            return Batch.of(grid(moderate_lp), grid(moderate_lp), grid(moderate_lp), grid(finite_adv), m)
        if kind == "ordinary":
            old = grid(st.floats(-8.0, -3.0, **f32))
            roll = near(old, grid(st.floats(-3.0, 3.0, **f32)))
            lp = near(old, grid(st.floats(-0.125, 0.125, **f32)))
            return Batch.of(lp, old, roll, grid(st.floats(-2.0, 2.0, **f32)), m)
        if kind == "smooth":
            f64 = dict(allow_nan=False, allow_infinity=False, allow_subnormal=False)
            # lp in [−10, −5]: old and roll stay below 0, as log-probs do
            lp = torch.tensor(grid(st.floats(-10.0, -5.0, **f64)), dtype=torch.float64)
            # lp − old inside the clip band (|·| ≤ 0.15) or clearly outside it (0.3 … 1.5)
            d = torch.tensor(
                grid(
                    st.one_of(st.floats(-0.15, 0.15, **f64), st.floats(0.3, 1.5, **f64), st.floats(-1.5, -0.3, **f64))
                ),
                dtype=torch.float64,
            )
            e = torch.tensor(grid(st.floats(-3.0, 3.0, **f64)), dtype=torch.float64)
            adv = grid(st.floats(-2.0, 2.0, **f64))
            old = lp - d
            return Batch.of(lp, old, old - e, adv, m)
        raise ValueError(kind)

    return draw_batch()


_POOLS: dict[tuple[str, str, str], tuple[Batch, ...]] = {}


def pool(kind: str, budget: Budget, profile: InputProfile = PROFILES["adversarial"]) -> tuple[Batch, ...]:
    """The examples hypothesis generates for `kind`, collected once per process and shared by
    every subject: the search is derandomized, so each subject would see the same sequence anyway,
    and drawing is the expensive part. A subject that fails one of them gets its own `find`, which
    replays the same sequence up to the failure and then shrinks it."""
    key = (kind, budget.name, profile.name)
    if key not in _POOLS:
        from hypothesis import find
        from hypothesis.errors import NoSuchExample

        seen: list[Batch] = []

        def collect(batch: Batch) -> bool:
            seen.append(batch)
            return False

        try:
            find(strategy(kind, budget, profile), collect, settings=hypothesis_settings(budget.examples[kind]))
        except NoSuchExample:
            pass
        _POOLS[key] = tuple(seen)
    return _POOLS[key]


# --------------------------------------------------------------------------------- hand cases
def _seed_cases() -> list[Batch]:
    from runner import registry
    from runner.audit.case_files import load_case_file

    path = registry.shipped_case("openrlhf-seq-mask-tis")
    if path is None:
        return []
    return [Batch.from_case(c) for c in load_case_file(path).cases]


def hand_cases() -> list[Batch]:
    """Finite adversarial batches, in the order they are tried (the first failure is shrunk)."""
    seed = _seed_cases()
    out = list(seed)
    if seed:
        widest = max(b.shape[1] for b in seed)
        if all(b.shape[1] == widest for b in seed):
            out.append(
                Batch(
                    *(torch.cat([getattr(b, k) for b in seed]) for k in ("lp", "old", "roll", "adv", "mask")),
                    name="seed-cases-stacked",
                )
            )
    # float32 overflows (e^100) where float64 does not: row 0 kept (ρ_geo = 1), row 1 rejected; the
    # kept row alone first, so a loss that turns it into −inf is not reported by its NaN twin
    out.append(Batch.of([[0.0, -100.0]], [[0.0, -100.0]], [[-100.0, 0.0]], [[1.0, 1.0]], name="float32-overflow-kept"))
    out.append(
        Batch.of(
            [[0.0, -100.0], [0.0, -1.0]],
            [[0.0, -100.0], [0.0, -1.0]],
            [[-100.0, 0.0], [-100.0, -1.0]],
            [[1.0, 1.0], [1.0, 1.0]],
            name="float32-overflow",
        )
    )
    # a fully masked row (finite but extreme values under the mask) next to a normal one
    out.append(
        Batch.of(
            [[0.0, -1.0, -1000.0], [-0.1, -2.0, -0.5]],
            [[0.0, -1.0, -1000.0], [-0.1, -2.0, -0.5]],
            [[-1000.0, -10000.0, 0.0], [-0.2, -1.5, -0.5]],
            [[1.0, -1.0, 1.0], [1.0, -1.0, 0.5]],
            [[0, 0, 0], [1, 1, 1]],
            name="all-masked-row",
        )
    )
    # length-1 rows: ρ = e^1000, e^−1000, 1
    out.append(
        Batch.of(
            [[0.0], [-1000.0], [-1.0]],
            [[0.0], [-1000.0], [-1.0]],
            [[-1000.0], [0.0], [-1.0]],
            [[1.0], [1.0], [-1.0]],
            name="length-1-rows",
        )
    )
    # T = 8192 with a per-token mismatch of ±0.02: ρ_seq = e^±164 overflows float32, ρ_geo ≈ 1.02
    T = 8192
    old = torch.full((2, T), -1.0, dtype=torch.float64)
    roll = torch.stack([torch.full((T,), -1.02), torch.full((T,), -0.98)]).to(torch.float64)
    roll = roll.to(torch.float32).to(torch.float64)
    out.append(
        Batch(
            old.clone(),
            old.clone(),
            roll,
            torch.ones(2, T, dtype=torch.float64),
            torch.ones(2, T, dtype=torch.float64),
            name="long-rows-tiny-mismatch",
        )
    )
    # zero-probability tokens: log-probs of −1e4 on either side of the ratio
    out.append(
        Batch.of(
            [[-10000.0, 0.0], [-10000.0, -10000.0]],
            [[-10000.0, 0.0], [-10000.0, -10000.0]],
            [[0.0, -10000.0], [-10000.0, -10000.0]],
            [[1.0, -1.0], [-1.0, 1.0]],
            name="zero-probability",
        )
    )
    # finite but extreme values under the mask of kept rows
    out.append(
        Batch.of(
            [[0.0, -1.0, 0.0], [-0.5, 0.0, 0.0]],
            [[0.0, -1.0, 0.0], [-0.5, 0.0, -10000.0]],
            [[0.0, -1.0, -1000.0], [-0.5, -1000.0, 0.0]],
            [[1.0, 1.0, 1.0], [-1.0, 1.0, 1.0]],
            [[1, 1, 0], [1, 0, 0]],
            name="extreme-padding",
        )
    )
    # an ordinary batch with padding (ratios near 1): a target that raises on extreme input still
    # gets a padding check from the hand cases
    out.append(
        Batch.of(
            [[-0.5, -1.2, -0.3], [-2.0, -0.7, -1.0]],
            [[-0.6, -1.1, -0.3], [-1.9, -0.7, -1.0]],
            [[-0.55, -1.0, -0.3], [-2.1, -0.8, -1.0]],
            [[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]],
            [[1, 1, 0], [1, 0, 0]],
            name="ordinary-with-padding",
        )
    )
    return out


def all_masked_cases(profile: InputProfile) -> list[Batch]:
    """The all-masked check's batches: nothing is generated, so nothing may be non-finite (or the
    target refuses the batch, as documented)."""
    if profile.realistic:
        return [
            Batch.of([[-0.5]], [[-0.5]], [[-0.7]], [[1.0]], [[0]], name="all-masked-1x1"),
            # every log-prob a model's view of a pad token: within 20 nats of each other
            Batch.of(
                [[-1.0, -2.0, -0.1], [-0.3, -60.0, -4.0]],
                [[-1.2, -2.0, -0.1], [-0.3, -50.0, -4.0]],
                [[-0.2, -21.0, -0.1], [-0.3, -30.0, -24.0]],
                [[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]],
                [[0, 0, 0], [0, 0, 0]],
                name="all-masked-2x3",
            ),
        ]
    return [
        Batch.of([[0.0]], [[0.0]], [[-1000.0]], [[1.0]], [[0]], name="all-masked-1x1"),
        Batch.of(
            [[0.0, -1.0, -1000.0], [-0.1, -2.0, -0.5]],
            [[0.0, -1.0, -1000.0], [-0.1, -2.0, -0.5]],
            [[-1000.0, -10000.0, 0.0], [-0.2, -1.5, -0.5]],
            [[1.0, -1.0, 1.0], [1.0, -1.0, 0.5]],
            [[0, 0, 0], [0, 0, 0]],
            name="all-masked-2x3",
        ),
    ]


def ordinary_cases() -> list[Batch]:
    """The reference comparison's hand cases: plain inputs a trainer sees every step. One kept
    sequence holds token ratios 10 and 1 (geometric mean √10, inside [0.5, 5]); PPO does not clip
    (lp = old)."""
    old = [[-1.0, -2.0]]
    roll = [[-1.0 - math.log(10.0), -2.0]]
    return [Batch.of(old, old, roll, [[1.0, 1.0]], [[1, 1]], name="kept-sequence-token-ratio-10")]


def padding_variants(batches: list[Batch], realistic: bool = False) -> list[Batch]:
    """Invariant 4: each batch with garbage at its masked positions, and with one more masked
    column holding it. Adversarial garbage is NaN, +inf and −inf; realistic garbage is what a model
    puts there: finite log-probs (−100 and 0)."""
    values = ((-100.0, "-100"), (0.0, "zero")) if realistic else ((NAN, "nan"), (INF, "inf"), (-INF, "-inf"))
    out = []
    for value, label in values:
        for b in batches:
            if b.has_padding:
                out.append(b.with_padding(value, name=f"{b.name}-{label}-padding"))
    if not realistic:
        # NaN in one field only: a log-ratio of NaN can hide an advantage of NaN (clamp's backward
        # zeroes it), while a finite log-ratio next to it lets 0·NaN through
        for b in batches:
            if b.has_padding:
                out.append(b.with_padding(0.0).with_padding(NAN, f"{b.name}-nan-advantage-padding", fields=("adv",)))
    for value, label in values:
        for b in batches:
            if b.shape[1] < 64:
                out.append(b.add_padding_column(value).with_padding(value, name=f"{b.name}+{label}-padding"))
    return out


# --------------------------------------------------------------------------------- shrinking
def shrink(batch: Batch, fails: Callable[[Batch], bool], budget: int = 400) -> Batch:
    """Greedy: drop rows, then chunks of columns (halves, quarters, …, single columns), while the
    failure persists. Hypothesis has usually shrunk already; this also shrinks the hand cases."""
    calls = 0

    def still(b: Batch) -> bool:
        nonlocal calls
        calls += 1
        return fails(b)

    progress = True
    while progress and calls < budget:
        progress = False
        B, T = batch.shape
        for i in range(B):
            if B > 1 and calls < budget:
                cand = batch.rows([j for j in range(B) if j != i])
                if still(cand):
                    batch, progress = cand, True
                    break
        if progress:
            continue
        size = max(T // 2, 1)
        while size >= 1 and not progress and T > 1 and calls < budget:
            for start in range(0, T, size):
                keep = [j for j in range(T) if not start <= j < start + size]
                if keep and calls < budget:
                    cand = batch.cols(keep)
                    if still(cand):
                        batch, progress = cand, True
                        break
            size //= 2
    return batch
