"""The framework presets against their released code: each conf/cases/FRAMEWORK.yaml holds worked cases
(random, extreme, non-finite and all-masked batches) whose loss and gradient were computed by running the
framework's own loss through `is-study case --target` (the adapters in examples/audit/); every preset must
give the same numbers element for element, NaN and inf included (tolerance 1e-5). And the algebra options
those presets brought, each on a case it decides."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import yaml

from runner.audit.case_files import load_case_file
from runner.audit.case_study import compare, evaluate
from runner.core.corrections import Correction, apply_correction
from runner.core.losses import LossSpec
from runner.errors import UserError
from runner.hydra_app import app as hydra_app
from tests.helpers.repo import REPO

pytestmark = pytest.mark.usefixtures("one_thread")  # small tensors: see conftest.py

FRAMEWORK_CASES = ("nemo-rl", "areal", "skyrl", "roll", "prime-rl")


def _composed(preset: str, overrides: list[str] = ()) -> tuple[Correction, LossSpec]:
    cfg = hydra_app.compose([f"correction={preset}", *overrides])
    corr = Correction.from_config(hydra_app.to_container(cfg.correction))
    return corr, LossSpec.from_config(hydra_app.to_container(cfg.loss))


def _entries():
    for name in FRAMEWORK_CASES:
        path = REPO / "conf" / "cases" / f"{name}.yaml"
        for i, entry in enumerate(yaml.safe_load(path.read_text())["expect"]):
            yield pytest.param(path, entry, id=f"{name}:{entry['preset']}:{i}")


@pytest.mark.parametrize("path,entry", list(_entries()))
def test_preset_matches_the_released_code_element_for_element(path, entry):
    corr, spec = _composed(entry["preset"], entry.get("overrides", []))
    assert corr.faithful
    results = [evaluate(c, spec, corr) for c in load_case_file(path).cases]
    assert compare(results, entry["results"]) == []


def test_every_framework_case_file_covers_random_extreme_nonfinite_and_all_masked_batches():
    for name in FRAMEWORK_CASES:
        case_file = load_case_file(REPO / "conf" / "cases" / f"{name}.yaml")
        names = {c.name for c in case_file.cases}
        assert {"random-padded", "overflowing-ratio", "nan-padding", "all-masked"} <= names, name
        presets = {e["preset"] for e in case_file.expect}
        shipped = {f"{name}/{p.stem}" for p in (REPO / "conf" / "correction" / name).glob("*.yaml")}
        assert presets == shipped, name  # every shipped preset of the framework is checked


# ---------------------------------------------------------------------------------- nonfinite=zero-ratio (NeMo-RL)
def _token_tis(**fields) -> Correction:
    return Correction(name="t", weight="token", weight_op="clamp", high=2.0, padding="multiply", **fields)


def test_zero_ratio_makes_an_overflowing_ratio_zero_before_the_clamp():
    """lr = [0, 100, −200, +inf, NaN]: exp overflows float32 at 100. Without nan_to_num the clamp caps inf
    at 2 and NaN stays NaN; with it every non-finite ratio is 0 first, and 0 stays 0 under the clamp."""
    old = torch.tensor([[-1.0, -1.0, -1.0, -1.0, math.nan]])
    roll = torch.tensor([[-1.0, -101.0, 199.0, -math.inf, -1.0]])
    mask = torch.ones_like(old)
    plain = apply_correction(_token_tis(), old, roll, mask, metrics=False).coef
    zeroed = apply_correction(_token_tis(nonfinite="zero-ratio"), old, roll, mask, metrics=False).coef
    assert plain[0, :4].tolist() == [1.0, 2.0, 0.0, 2.0] and math.isnan(plain[0, 4])
    assert zeroed.tolist() == [[1.0, 0.0, 0.0, 0.0, 0.0]]


def test_zero_ratio_zeroes_each_log_ratio_a_sequence_statistic_sums():
    """A −inf rollout log-prob makes lr = +inf: the geometric mean is inf and the sequence rejected,
    unless nan_to_num counts that token as lr = 0 (mean of [0, 0.003, 0] = 0.001, inside [0.999, 1.002])."""
    old = torch.tensor([[-1.0, -1.0, -1.0]])
    roll = torch.tensor([[-1.0, -1.003, -math.inf]])
    mask = torch.ones_like(old)
    geo = Correction(name="g", weight="token", filter="geometric", low=0.999, high=1.002, padding="multiply")
    assert apply_correction(geo, old, roll, mask, metrics=False).keep.tolist() == [[False] * 3]
    kept = apply_correction(replace(geo, nonfinite="zero-ratio"), old, roll, mask, metrics=False)
    assert kept.keep.tolist() == [[True] * 3]
    assert kept.coef[0].tolist() == pytest.approx([1.0, math.exp(0.003), 0.0], abs=1e-6)


def test_zero_ratio_zeroes_an_overflowing_sequence_weight_and_must_be_a_bool():
    """NeMo-RL's sequence-level weights exp(Σ lr) take the same nan_to_num: Σ lr = 100 overflows."""
    old, roll = torch.tensor([[-1.0, -1.0]]), torch.tensor([[-51.0, -51.0]])
    seq = Correction(name="s", weight="sequence", padding="multiply")
    coef = apply_correction(seq, old, roll, torch.ones_like(old), metrics=False).coef
    assert coef.tolist() == [[math.inf, math.inf]]
    coef = apply_correction(replace(seq, nonfinite="zero-ratio"), old, roll, torch.ones_like(old), metrics=False).coef
    assert coef.tolist() == [[0.0, 0.0]]
    with pytest.raises(UserError, match="correction.nonfinite='yes' is not one of: keep, zero-ratio, zero-logratio"):
        Correction(name="s", weight="token", nonfinite="yes").validate()


# ------------------------------------------------------------------------------------ nonfinite=zero-logratio (AReaL)
def test_zero_logratio_makes_a_nonfinite_log_ratio_on_policy_while_a_finite_overflow_stays():
    """lr = [+inf, NaN, 100]: AReaL's where(isfinite(lr), lr, 0) gives ratios [1, 1, inf]; a token mask with
    band [0.5, 5] then keeps the first two (weight 1) and rejects the overflow, where `keep` rejects all three."""
    old = torch.tensor([[-1.0, math.nan, -1.0]])
    roll = torch.tensor([[-math.inf, -1.0, -101.0]])
    mask = torch.ones_like(old)
    icepop = Correction(name="i", weight="token", filter="token", low=0.5, high=5.0, padding="masked-sum")
    assert apply_correction(icepop, old, roll, mask, metrics=False).keep.tolist() == [[False] * 3]
    kept = apply_correction(replace(icepop, nonfinite="zero-logratio"), old, roll, mask, metrics=False)
    assert kept.keep.tolist() == [[True, True, False]]
    assert kept.coef.tolist() == [[1.0, 1.0, 0.0]]
    clamped = Correction(name="c", weight="token", weight_op="clamp", high=5.0, nonfinite="zero-logratio")
    assert apply_correction(clamped, old, roll, mask, metrics=False).coef.tolist() == [[1.0, 1.0, 5.0]]


def test_readme_groups_the_faithful_presets_by_framework_with_their_counts():
    import re

    from runner import registry

    readme = (REPO / "README.md").read_text()
    rows = dict(re.findall(r"^\| ([\w-]+) \((\d+)\) \|", readme, re.M))
    expected = {name: str(len(group)) for name, group in registry.presets_by_framework() if name != registry.OWN}
    assert rows == expected


# ------------------------------------------------------------------------------------ ROLL: segments, Δp, drop-tokens
def test_segment_mean_gives_each_run_of_masked_in_tokens_its_own_mean():
    """mask [1, 1, 0, 1, 1, 1 | 0, 1, 0, 1]: runs {0, 1}, {3, 4, 5} and {1}, {3}; a masked-out token is 0 and its
    value, NaN here, is never read."""
    from runner.core.segments import segment_mean

    x = torch.tensor([[1.0, 3.0, math.nan, 2.0, 4.0, 9.0], [math.nan, 5.0, 7.0, -1.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0, 1, 1, 1], [0, 1, 0, 1, 0, 0]])
    assert segment_mean(x, mask).tolist() == [[2.0, 2.0, 0.0, 5.0, 5.0, 5.0], [0.0, 5.0, 0.0, -1.0, 0.0, 0.0]]


def test_a_segment_weight_is_the_geometric_weight_of_each_run():
    """lr = [0.2, 0.4, ·, −0.3, −0.1]: the runs' means are 0.3 and −0.2, so the weight is e^0.3 on the first two
    tokens and e^−0.2 on the last two (geometric: one mean, e^0.05, on all four), 1 at the gap."""
    old = torch.tensor([[0.2, 0.4, 5.0, -0.3, -0.1]]) - 1.0
    roll = torch.full_like(old, -1.0)
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0, 1.0]])
    seg = apply_correction(Correction(name="s", weight="segment", padding="multiply"), old, roll, mask, metrics=False)
    expected = [math.exp(0.3)] * 2 + [1.0] + [math.exp(-0.2)] * 2
    assert seg.coef[0].tolist() == pytest.approx(expected, rel=1e-6)
    geo = apply_correction(Correction(name="g", weight="geometric", padding="multiply"), old, roll, mask, metrics=False)
    assert geo.coef[0, 0].item() == pytest.approx(math.exp(0.05), rel=1e-6)


def test_a_segment_filter_rejects_one_run_and_keeps_the_other():
    """Band [0.8, 1.2]: run means e^0.3 = 1.35 (rejected) and e^−0.05 = 0.95 (kept)."""
    old = torch.tensor([[0.2, 0.4, 0.0, 0.0, -0.1]]) - 1.0
    roll = torch.full_like(old, -1.0)
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0, 1.0]])
    corr = Correction(name="f", filter="segment", low=0.8, high=1.2, padding="multiply")
    assert apply_correction(corr, old, roll, mask, metrics=False).keep[0, [0, 1, 3, 4]].tolist() == [
        False,
        False,
        True,
        True,
    ]


def test_the_probability_difference_filter_reads_exp_old_minus_exp_roll_at_each_level():
    """p_old = [0.5, 0.5, 0.2], p_roll = [0.2, 0.6, 0.2]: Δp = [0.3, −0.1, 0]. Token band [−0.2, 0.2] keeps the
    last two, the asymmetric [−0.05, 0.35] the first and the last (roll − old would keep the last two); the sequence sum 0.2 is kept by [−0.2, 0.2] and rejected by [−0.1, 0.1]; the geometric mean 0.0667
    is kept by [−0.1, 0.1]. A unit must pass both filters: a ratio band that rejects token 0 changes nothing,
    one that rejects token 1 (ρ = 0.83 outside [0.9, 5]) also removes it."""
    old = torch.log(torch.tensor([[0.5, 0.5, 0.2]]))
    roll = torch.log(torch.tensor([[0.2, 0.6, 0.2]]))
    mask = torch.ones_like(old)

    def keep(**fields):
        corr = Correction(name="d", padding="multiply", **fields)
        return apply_correction(corr, old, roll, mask, metrics=False).keep[0].tolist()

    assert keep(diff_filter="token", diff_low=-0.2, diff_high=0.2) == [False, True, True]
    assert keep(diff_filter="token", diff_low=-0.05, diff_high=0.35) == [True, False, True]  # the sign: old − roll
    assert keep(diff_filter="sequence", diff_low=-0.2, diff_high=0.2) == [True] * 3
    assert keep(diff_filter="sequence", diff_low=-0.1, diff_high=0.1) == [False] * 3
    assert keep(diff_filter="geometric", diff_low=-0.1, diff_high=0.1) == [True] * 3
    assert keep(diff_filter="token", diff_low=-0.2, diff_high=0.2, filter="token", low=0.9, high=5.0) == [
        False,
        False,
        True,
    ]
    with pytest.raises(UserError, match=r"correction.diff_low \(0.2\) > correction.diff_high \(-0.2\)"):
        Correction(name="d", diff_filter="token", diff_low=0.2, diff_high=-0.2).validate()


def test_drop_tokens_keeps_an_emptied_sequence_among_seq_mean_token_means_sequences():
    """Two sequences, A = 1, lp = old: the token filter rejects every token of the second. `drop` averages the
    first sequence's mean over one sequence (loss −1); `drop-tokens` over both (−1/2), as ROLL's sample count
    is taken before the filter; `keep` would also divide the first by its own 2 tokens."""
    from runner.core.losses import policy_loss

    lp = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]])
    roll = torch.tensor([[-1.0, -1.0], [-3.0, -3.0]])
    mask, adv = torch.ones_like(lp), torch.ones_like(lp)
    spec = LossSpec(reduction="seq-mean-token-mean")
    losses = {}
    for denominator in ("drop", "drop-tokens"):
        corr = Correction(name="f", filter="token", low=0.8, high=1.2, denominator=denominator, padding="multiply")
        losses[denominator] = policy_loss(spec, corr, lp.clone().requires_grad_(True), lp, roll, adv, mask).loss.item()
    assert losses == {"drop": -1.0, "drop-tokens": -0.5}
