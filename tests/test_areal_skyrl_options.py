"""The algebra options that AReaL's and SkyRL's remaining modes brought (runner/core/corrections.py), each on a
small batch it decides, with the number derived by hand in the docstring: AReaL's KL statistics (k1, k2, k3 of
the raw log-ratio), agg=max and M2PO; SkyRL's high-side veto, token pre-mask, NaN-keeping band and its order of
operations (the sequence statistics read the mask that the earlier masks left). The presets themselves are
checked against the released code in tests/test_framework_presets.py."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from runner.core.corrections import Correction, apply_correction, apply_correction_split, m2po_keep
from runner.errors import UserError

pytestmark = pytest.mark.usefixtures("one_thread")  # small tensors: see conftest.py

INF, NAN = math.inf, math.nan


def _batch(lr_rows):
    """old = lr, roll = 0: the log-ratio is exactly the given numbers (old − 0)."""
    old = torch.tensor(lr_rows, dtype=torch.float32)
    return old, torch.zeros_like(old), torch.ones_like(old)


def _coef(corr, old, roll, mask):
    return apply_correction(corr, old, roll, mask, metrics=False)


# ------------------------------------------------------------------------------------- SkyRL: the order of operations
SKYRL = dict(reject="multiply", padding="multiply", token_mask_low=0.5, token_mask_high=2.0)


def test_the_geometric_mask_reads_only_the_tokens_the_token_mask_kept():
    """lr = [0.01, 1.0, −0.005]: the token mask [0.5, 2] drops the middle token (e^1 = 2.72). SkyRL's geometric
    mean then runs over the other two, (0.01 − 0.005)/2 = 0.0025, e^0.0025 = 1.0025 inside [0.99, 1.01]: the
    sequence is kept. Over all three tokens (statistics_mask=original) the mean is 0.335, e^0.335 = 1.40: rejected."""
    old = torch.tensor([[-0.5, -1.0, -0.7]])
    roll = torch.tensor([[-0.51, -2.0, -0.695]])
    mask = torch.ones_like(old)
    geo = Correction(
        name="g", filter="geometric", filter_nan="keep", low=0.99, high=1.01, statistics_mask="masked", **SKYRL
    )
    assert _coef(geo, old, roll, mask).coef.tolist() == [[1.0, 0.0, 1.0]]
    assert _coef(replace(geo, statistics_mask="original"), old, roll, mask).coef.tolist() == [[0.0, 0.0, 0.0]]


def test_a_token_the_token_mask_removed_with_an_infinite_log_ratio_makes_the_sequence_weight_nan():
    """lr = [0, +inf, 0] (a −inf rollout log-prob): the token mask removes the inf token, and SkyRL's sequence
    TIS sums lr_t · mask' = inf · 0 = NaN: every coefficient of the sequence is NaN. Summed over the original
    mask, L_i = inf is clamped to 20 and the weight is min(e^20, 5) = 5 on the two kept tokens."""
    old = torch.tensor([[-0.5, -1.0, -0.7]])
    roll = torch.tensor([[-0.5, -INF, -0.7]])
    mask = torch.ones_like(old)
    tis = Correction(
        name="t", weight="sequence", log_clamp=20.0, weight_op="clamp-high", high=5.0, statistics_mask="masked", **SKYRL
    )
    assert all(math.isnan(c) for c in _coef(tis, old, roll, mask).coef[0].tolist())
    assert _coef(replace(tis, statistics_mask="original"), old, roll, mask).coef.tolist() == [[5.0, 0.0, 5.0]]


def test_a_vetoed_sequence_leaves_the_statistics_of_the_masks_after_it():
    """Row lr = [6, 0.3]: the outlier veto (ρ = e^6 = 403 > 100) rejects it before the token mask and the TIS
    weight; its weight is then computed over an empty mask (L_i = 0, weight 1), coefficient 1 · 0 = 0 either way,
    while the kept row lr = [0.1, 0.2] has weight e^0.3 = 1.3498588."""
    old, roll, mask = _batch([[6.0, 0.3], [0.1, 0.2]])
    tis = Correction(
        name="t", weight="sequence", log_clamp=20.0, weight_op="clamp-high", high=5.0, statistics_mask="masked",
        veto=1e-4, veto_high=100.0, **SKYRL,
    )  # fmt: skip
    res = _coef(tis, old, roll, mask)
    assert res.coef[0].tolist() == [0.0, 0.0]
    assert res.coef[1].tolist() == pytest.approx([1.3498588] * 2, abs=1e-6)


def test_skyrl_keeps_a_nan_sequence_statistic_where_a_closed_band_rejects_it():
    """lr = [+inf, −inf]: the mean is NaN. (s ≥ low) ∧ (s ≤ high) is false for NaN, ¬(s > high) ∧ ¬(s < low) true."""
    old = torch.tensor([[0.0, -INF]])
    roll = torch.tensor([[-INF, 0.0]])
    mask = torch.ones_like(old)
    geo = Correction(name="g", filter="geometric", low=0.99, high=1.01, reject="multiply", padding="multiply")
    assert _coef(geo, old, roll, mask).keep.tolist() == [[False, False]]
    assert _coef(replace(geo, filter_nan="keep"), old, roll, mask).keep.tolist() == [[True, True]]


def test_the_high_side_veto_rejects_a_sequence_with_any_ratio_above_it_and_not_a_nan():
    """Rows lr = [log 200, 0], [−10, 0], [NaN, 0], [log 50, 0] with veto 1e-4 and veto_high 100: the first is
    above 100, the second below 1e-4 (e^−10 = 4.5e-5), NaN is neither, e^log 50 = 50 is inside."""
    old, roll, mask = _batch([[math.log(200), 0.0], [-10.0, 0.0], [NAN, 0.0], [math.log(50), 0.0]])
    outlier = Correction(name="o", veto=1e-4, veto_high=100.0, reject="multiply", padding="multiply")
    assert _coef(outlier, old, roll, mask).keep[:, 0].tolist() == [False, False, True, True]
    assert _coef(replace(outlier, veto_high=None), old, roll, mask).keep[:, 0].tolist() == [True, False, True, True]


def test_the_token_mask_rejects_tokens_outside_its_band_and_a_nan_one():
    """lr = [log 0.4, 0, log 2.5, NaN] against [0.5, 2]: the middle one is kept; NaN fails both comparisons."""
    old, roll, mask = _batch([[math.log(0.4), 0.0, math.log(2.5), NAN]])
    tm = Correction(name="m", token_mask_low=0.5, token_mask_high=2.0, reject="multiply", padding="multiply")
    assert _coef(tm, old, roll, mask).keep.tolist() == [[False, True, False, False]]


# -------------------------------------------------------------------------------------------------- AReaL: the KL metrics
AREAL = dict(weight="token", filter="token", padding="masked-sum", nonfinite="zero-logratio")


@pytest.mark.parametrize(
    "metric,kept",
    [
        # k1 = lr = [1, −1, 0.1]; k2 = lr²/2 = [0.5, 0.5, 0.005]; k3 = e^−lr − 1 + lr = [0.3679, 0.7183, 0.0048]
        ("k1", [False, True, True]),
        ("k2", [True, True, True]),
        ("k3", [True, False, True]),
    ],
)
def test_each_kl_estimator_is_compared_with_the_band_as_it_is(metric, kept):
    """Band [—, 0.6] on the KL estimator itself (not its exp); the weight of a kept token is ρ_t."""
    old, roll, mask = _batch([[1.0, -1.0, 0.1]])
    res = _coef(Correction(name="k", filter_metric=metric, high=0.6, **AREAL), old, roll, mask)
    assert res.keep[0].tolist() == kept
    rho = [math.e, math.exp(-1), math.exp(0.1)]
    assert res.coef[0].tolist() == pytest.approx([r if k else 0.0 for r, k in zip(rho, kept)], abs=1e-6)


def test_the_kl_statistic_reads_the_raw_log_ratio_while_the_weight_reads_the_sanitised_one():
    """lr = [NaN, 0]: AReaL zeroes the non-finite lr for its ratio (ρ = 1, kept by a ratio band) but computes
    the KL estimators from the raw log-probs, so k2 = NaN fails the band and the token is rejected."""
    old, roll, mask = _batch([[NAN, 0.0]])
    ratio = Correction(name="r", low=0.5, high=5.0, **AREAL)
    assert _coef(ratio, old, roll, mask).coef.tolist() == [[1.0, 1.0]]
    assert _coef(replace(ratio, filter_metric="k2", low=None, high=2.0), old, roll, mask).coef.tolist() == [[0.0, 1.0]]


def test_a_sequence_kl_statistic_is_the_arithmetic_mean_over_the_masked_in_tokens():
    """lr = [1, −1, 50 (padding)]: mean k3 over the two masked-in tokens = (0.3679 + 0.7183)/2 = 0.5431; the
    padding (k3 = 49) is removed by a where. Band high 0.5 rejects the sequence, 0.6 keeps it (weights ρ_t)."""
    old = torch.tensor([[1.0, -1.0, 50.0]])
    roll, mask = torch.zeros_like(old), torch.tensor([[1.0, 1.0, 0.0]])
    seq = Correction(name="s", weight="token", filter="geometric", filter_metric="k3", high=0.5, padding="masked-sum")
    assert _coef(seq, old, roll, mask).keep.tolist() == [[False] * 3]
    assert _coef(replace(seq, high=0.6), old, roll, mask).keep.tolist() == [[True] * 3]


def test_agg_max_reads_the_largest_masked_in_ratio_and_keeps_an_empty_sequence():
    """Rows lr = [0.1, 1.0, 0.2], [0.1, 0.2, 0.3] and an all-masked row, band [—, 2]: e^1.0 = 2.72 rejects the
    first row, e^0.3 = 1.35 keeps the second (its mean e^0.2 would keep the first too); the empty row's
    statistic is 0 (AReaL's), in the band."""
    old, roll, _ = _batch([[0.1, 1.0, 0.2], [0.1, 0.2, 0.3], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0] * 3, [1.0] * 3, [0.0] * 3])
    top = Correction(name="m", weight="geometric", filter="max", high=2.0, padding="masked-sum")
    assert _coef(top, old, roll, mask).keep[:, 0].tolist() == [False, True, True]
    assert _coef(replace(top, filter="geometric"), old, roll, mask).keep[:, 0].tolist() == [True, True, True]


# ---------------------------------------------------------------------------------------------------------- AReaL: M2PO
def test_m2po_drops_the_largest_squares_until_the_mean_of_the_rest_is_under_the_threshold():
    """lr² = [0.25, 0.09, 0.01, 0, 0, 0] at threshold 0.04: the means of the sorted tails are 0.0583 (all six),
    0.02 (without 0.25): one token is dropped, and it leaves the action mask (AReaL's token count)."""
    old, roll, mask = _batch([[0.5, 0.3, 0.1], [0.0, 0.0, 0.0]])
    m2 = Correction(name="m2", m2_threshold=0.04, padding="masked-sum")
    res = _coef(m2, old, roll, mask)
    assert res.coef.tolist() == [[0.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
    assert res.mask.tolist() == [[0.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
    assert m2po_keep(old - roll, mask > 0, 0.02).tolist() == [[False, False, True], [True, True, True]]  # 0.002


def test_m2po_drops_a_nan_first_and_keeps_the_smallest_when_no_tail_is_under_the_threshold():
    """A NaN lr² sorts first and is dropped (the rest, [0.01, 0], has mean 0.005); lr = 1 everywhere (lr² = 1,
    every tail mean 1 ≥ 0.04) keeps one token only, as AReaL does rather than mask them all."""
    inside = torch.ones(1, 3, dtype=torch.bool)
    assert m2po_keep(torch.tensor([[0.1, NAN, 0.0]]), inside, 0.04).tolist() == [[True, False, True]]
    assert m2po_keep(torch.ones(1, 3), inside, 0.04).sum().item() == 1
    assert m2po_keep(torch.ones(1, 3), torch.zeros(1, 3, dtype=torch.bool), 0.04).all()  # nothing masked in


def test_m2po_without_padding_drops_the_same_tokens_as_with_it():
    """The no-padding shortcut (no boolean gather) keeps what the gathered path keeps: a random batch of 40
    tokens with ties and outliers, alone and with a padding column appended (which stays kept)."""
    gen = torch.Generator().manual_seed(3)
    lr = torch.randn(5, 8, generator=gen) * 0.3
    lr[0, :3] = 0.2  # ties at the cut
    lr[4, 7] = 4.0
    full = m2po_keep(lr, torch.ones(5, 8, dtype=torch.bool), 0.04)
    padded_inside = torch.cat([torch.ones(5, 8, dtype=torch.bool), torch.zeros(5, 1, dtype=torch.bool)], 1)
    padded = m2po_keep(torch.cat([lr, torch.full((5, 1), 9.0)], 1), padded_inside, 0.04)
    assert 0 < int((~full).sum()) < 40
    assert torch.equal(padded[:, :8], full) and padded[:, 8].all()


def _m2po_by_torch_sort(lr, inside, threshold):
    """M2PO as AReaL writes it: one torch.sort of the masked-in lr² from the largest, drop its first n_drop."""
    selected = (lr * lr)[inside]
    keep, n = torch.ones_like(inside), selected.numel()
    if n == 0:
        return keep
    ordered, order = torch.sort(selected, descending=True)
    tail = ordered.flip(0).cumsum(0).flip(0) / torch.arange(n, 0, -1, dtype=ordered.dtype)
    under = torch.nonzero(tail < threshold)
    n_drop = int(under[0, 0]) if len(under) else n - 1
    kept = torch.empty(n, dtype=torch.bool)
    kept[order] = torch.arange(n) >= n_drop
    keep[inside] = kept
    return keep


def test_m2po_sorting_values_with_numpy_keeps_what_torch_sort_keeps():
    """The mask sorts values with NumPy and asks torch.sort only when the cut splits equal values: on 600
    random batches x 5 thresholds (ties from rounding, NaN, inf, float64, padding), the same mask as one
    torch.sort, and both kinds of cut (between distinct values, inside a run of ties) occur."""
    gen = torch.Generator().manual_seed(0)
    cuts_in_ties = 0
    for trial in range(600):
        B, T = int(torch.randint(1, 12, (1,), generator=gen)), int(torch.randint(1, 30, (1,), generator=gen))
        lr = torch.randn(B, T, generator=gen) * float(torch.rand(1, generator=gen))
        u = torch.rand(B, T, generator=gen)
        if trial % 3 == 0:
            lr = torch.round(lr * 4) / 4
        if trial % 5 == 0:
            lr[u < 0.05] = NAN
        if trial % 7 == 0:
            lr[u > 0.97] = math.inf
        if trial % 11 == 0:
            lr = lr.double()
        inside = torch.rand(B, T, generator=gen) < (1.0 if trial % 2 else 0.8)
        for threshold in (0.0, 0.01, 0.04, 0.2, 5.0):
            expected = _m2po_by_torch_sort(lr, inside, threshold)
            assert torch.equal(m2po_keep(lr, inside, threshold), expected), (trial, threshold)
            m2 = (lr * lr)[inside]
            dropped = m2[~expected[inside]]
            if len(dropped) and bool((m2[expected[inside]] == dropped.nan_to_num(math.inf).min()).any()):
                cuts_in_ties += 1
    assert cuts_in_ties > 10


def test_m2po_is_computed_over_the_batch_it_is_given_so_each_mini_batch_is_its_own():
    """Row 0 lr = [0.3, 0.3], row 1 eight zeros: over both rows the tail mean 0.18/10 = 0.018 < 0.04 keeps all;
    row 0 alone (its own mini-batch) never gets under 0.04 (0.09, 0.09), so one of its tokens is dropped."""
    old = torch.tensor([[0.3, 0.3] + [0.0] * 6, [0.0] * 8])
    mask = torch.tensor([[1.0, 1.0] + [0.0] * 6, [1.0] * 8])
    roll = torch.zeros_like(old)
    m2 = Correction(name="m2", m2_threshold=0.04, padding="masked-sum")
    assert _coef(m2, old, roll, mask).mask.sum().item() == 10
    parts = apply_correction_split(m2, old, roll, mask, [slice(0, 1), slice(1, 2)], metrics=False)
    assert parts[0].mask.sum().item() == 1 and parts[1].mask.sum().item() == 8


# ------------------------------------------------------------------------------------------------------------ validation
@pytest.mark.parametrize(
    "fields,message",
    [
        (
            {"token_mask_low": 2.0, "token_mask_high": 0.5},
            r"correction.token_mask_low \(2.0\) > correction.token_mask_high",
        ),
        ({"filter": "token", "filter_metric": "k2", "band_space": "log"}, "band_space=log is for log-ratios"),
        ({"filter_metric": "k4"}, "correction.filter_metric='k4' is not one of: log-ratio, k1, k2, k3"),
        ({"m2_threshold": -0.1}, "correction.m2_threshold must be non-negative"),
        ({"statistics_mask": "after"}, "correction.statistics_mask='after' is not one of: original, masked"),
    ],
)
def test_bad_values_of_the_new_fields_are_one_line_errors(fields, message):
    with pytest.raises(UserError, match=message):
        Correction(name="x", **fields).validate()


@pytest.mark.parametrize(
    "metric,high,kept",
    [("log-ratio", 5.0, [True, True, True]), ("k2", 2.0, [False, True, False]), ("k1", 2.0, [False, True, True])],
)
def test_nonfinite_log_ratios_under_each_metric_as_areal_rejects_them(metric, high, kept):
    """lr = [NaN, 0, −inf] (old = [NaN, −1, −inf], roll = −1): AReaL 1.0.4's apply_rejection_sampling, run through
    examples/audit/areal.py, keeps all three under the ratio metric (weights 1: the log-ratio is sanitised), and
    under the KL metrics, which read the raw log-ratio, rejects NaN (both) and −inf (k2 = inf) but keeps −inf
    under k1 with no lower bound, with weight 1."""
    old = torch.tensor([[NAN, -1.0, -INF]])
    roll = torch.full_like(old, -1.0)
    corr = Correction(name="k", filter_metric=metric, high=high, **AREAL)
    res = _coef(corr, old, roll, torch.ones_like(old))
    assert res.keep[0].tolist() == kept
    assert res.coef[0].tolist() == [1.0 if k else 0.0 for k in kept]


def test_a_zeroed_padding_weight_keeps_an_overflowing_padded_ratio_out_of_the_gradient():
    """A kept sequence (mean k3 over its one masked-in token: lr = 0.1, k3 = 0.0048) with finite padding at
    lr = 100: the padding's token weight ρ = e^100 = inf. Reduced by a where (masked-sum), the backward still
    multiplies the where's 0 by that inf: NaN there. AReaL zeroes its weight at padding first (weight_padding:
    zero), so the gradient there is 0 and the kept token's is −ρ·A/1 = −e^0.1 = −1.1051709."""
    from runner.core.losses import LossSpec, policy_loss

    old = torch.tensor([[0.1, 100.0]])
    roll, mask, adv = torch.zeros_like(old), torch.tensor([[1.0, 0.0]]), torch.ones_like(old)
    seq = Correction(name="s", weight="token", filter="geometric", filter_metric="k3", high=2.0, padding="masked-sum")

    def grad(corr):
        lp = old.clone().requires_grad_(True)
        policy_loss(LossSpec(), corr, lp, old, roll, adv, mask).loss.backward()
        return lp.grad[0].tolist()

    assert math.isnan(grad(seq)[1])
    assert grad(replace(seq, weight_padding="zero")) == pytest.approx([-1.1051709, 0.0], abs=1e-6)
