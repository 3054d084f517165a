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

FRAMEWORK_CASES = ("nemo-rl", "areal", "skyrl", "slime")


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


# ---------------------------------------------------------------------------- self_normalize (slime's tis_batch_normalize)
def _truncate(**fields) -> Correction:
    return Correction(name="n", weight="token", weight_op="clamp-high", high=2.0, padding="multiply", **fields)


def test_self_normalize_token_divides_by_the_mean_over_masked_in_tokens():
    """ρ = [1, 2, 4 → 2 (truncated), padding]: the token mean of the truncated weights is (1 + 2 + 2) / 3, so the
    weights become [0.6, 1.2, 1.2]; rejected tokens count in the mean as in slime (masked_sum over loss_mask)."""
    old = torch.tensor([[0.0, math.log(2.0), math.log(4.0), 0.0]])
    roll = torch.zeros_like(old)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    coef = apply_correction(_truncate(self_normalize="token"), old, roll, mask, metrics=False).coef
    assert coef[0, :3].tolist() == pytest.approx([0.6, 1.2, 1.2], abs=1e-6)
    masked = _truncate(self_normalize="token", filter="token", low=0.5, reject="multiply")
    old_masked = torch.tensor([[0.0, math.log(2.0), math.log(4.0), 0.0]])
    coef = apply_correction(masked, old_masked, roll, mask, metrics=False).coef
    assert coef[0, :3].tolist() == pytest.approx([0.6, 1.2, 0.0], abs=1e-6)  # 4 is rejected, its 2 still counted


def test_self_normalize_sequence_averages_each_sequences_mean_all_sequences_counted():
    """Sequence weights 2 and 0.5 and an all-masked row (mean 0): (2 + 0.5 + 0) / 3 = 5/6, as slime's
    sum(masked_mean) / len; the token mean would be (2·2 + 0.5·1) / 3 = 1.5."""
    old = torch.tensor([[math.log(2.0) / 2, math.log(2.0) / 2], [math.log(0.5), 0.0], [0.0, 0.0]])
    roll = torch.zeros_like(old)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
    seq = Correction(name="s", weight="sequence", padding="multiply", self_normalize="sequence")
    coef = apply_correction(seq, old, roll, mask, metrics=False).coef
    assert coef[0].tolist() == pytest.approx([2.4, 2.4], abs=1e-6) and coef[1, 0].item() == pytest.approx(0.6)
    coef = apply_correction(replace(seq, self_normalize="token"), old, roll, mask, metrics=False).coef
    assert coef[0, 0].item() == pytest.approx(2 / 1.5, abs=1e-6)


def test_self_normalize_leaves_weights_alone_on_a_nan_or_tiny_mean_and_splits_by_group():
    """A NaN weight makes the mean NaN: slime's `mean > 1e-8` is false, nothing is divided. A mean of e^-20
    (the ±20 bound) is under 1e-8: nothing divided either. apply_correction_split normalises each group by
    its own mean (slime normalises per micro-batch)."""
    corr = _truncate(self_normalize="token")
    old = torch.tensor([[math.nan, 0.0]])
    coef = apply_correction(corr, old, torch.zeros_like(old), torch.ones_like(old), metrics=False).coef
    assert math.isnan(coef[0, 0]) and coef[0, 1].item() == 1.0
    tiny = replace(corr, log_clamp=20.0)
    old = torch.tensor([[-30.0]])
    coef = apply_correction(tiny, old, torch.zeros_like(old), torch.ones_like(old), metrics=False).coef
    assert coef.item() == pytest.approx(math.exp(-20), rel=1e-6)
    old = torch.tensor([[0.0], [math.log(2.0)], [math.log(0.5)], [math.log(0.25)]])
    roll, mask = torch.zeros_like(old), torch.ones_like(old)
    from runner.core.corrections import apply_correction_split

    groups = [slice(0, 2), slice(2, 4)]
    split = apply_correction_split(corr, old, roll, mask, groups, metrics=False)
    assert torch.cat([r.coef for r in split]).flatten().tolist() == pytest.approx([2 / 3, 4 / 3, 4 / 3, 2 / 3])
    with pytest.raises(UserError, match="correction.self_normalize='batch' is not one of: none, token, sequence"):
        _truncate(self_normalize="batch").validate()


# ------------------------------------------------------------------------- opsm_delta (slime's --use-opsm)
def test_opsm_drops_the_negative_advantage_tokens_of_sequences_that_drifted_more_than_delta():
    """Mean old − lp per sequence: 0.1 (A < 0: dropped), 0.01 (A < 0, under δ = 0.05: kept), 0.1 (A > 0: kept);
    the dropped sequence's loss and gradient are 0. A NaN drift (NaN padding multiplied in) keeps its sequence,
    as slime's comparison does; under padding=ignore the NaN is zeroed first and the drift decides."""
    from runner.core.corrections import opsm_keep
    from runner.core.losses import policy_loss

    lp = torch.tensor([[-1.1, -0.6, -0.9], [-0.51, -1.01, -0.71], [-1.1, -0.6, -0.9]])
    old = torch.tensor([[-1.0, -0.5, -0.8], [-0.5, -1.0, -0.7], [-1.0, -0.5, -0.8]])
    adv = torch.tensor([[-1.0] * 3, [-1.0] * 3, [1.0] * 3])
    mask = torch.ones_like(lp)
    corr = Correction(name="o", padding="multiply", opsm_delta=0.05)
    keep = opsm_keep(corr, lp, old, old, adv, mask, sanitise=False)
    assert keep.tolist() == [[0.0] * 3, [1.0] * 3, [1.0] * 3]
    x = lp.clone().requires_grad_(True)
    out = policy_loss(LossSpec(), corr, x, old, old, adv, mask)
    out.loss.backward()
    assert x.grad[0].tolist() == [0.0, 0.0, 0.0] and bool((x.grad[1:] != 0).all())
    poisoned, pad = old.clone(), torch.tensor([[1.0, 1.0, 0.0]] * 3)
    poisoned[0, 2] = math.nan
    assert opsm_keep(corr, lp, poisoned, old, adv, pad, sanitise=False)[0].tolist() == [1.0] * 3
    assert opsm_keep(corr, lp, poisoned, old, adv, pad, sanitise=True)[0].tolist() == [0.0] * 3
    with pytest.raises(UserError, match="correction.opsm_delta must be a finite number or null"):
        Correction(name="o", opsm_delta=math.inf).validate()


def test_readme_groups_the_faithful_presets_by_framework_with_their_counts():
    import re

    from runner import registry

    readme = (REPO / "README.md").read_text()
    rows = dict(re.findall(r"^\| ([\w-]+) \((\d+)\) \|", readme, re.M))
    expected = {name: str(len(group)) for name, group in registry.presets_by_framework() if name != registry.OWN}
    assert rows == expected
