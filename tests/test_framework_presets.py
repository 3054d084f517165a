"""The framework presets against their released code: each conf/cases/FRAMEWORK.yaml holds worked cases
(random, extreme, non-finite and all-masked batches) whose loss and gradient were computed by running the
framework's own loss through `is-study case --target` (the adapters in examples/audit/); every preset must
give the same numbers element for element, NaN and inf included (tolerance 1e-5). And the algebra options
those presets brought, each on a case it decides."""

from __future__ import annotations

import dataclasses
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

FRAMEWORK_CASES = ("nemo-rl", "areal", "skyrl", "roll", "prime-rl", "slime")
# case files for modes beside a framework's first presets (conf/cases/FRAMEWORK-*.yaml), replayed the same way
EXTRA_CASES = ("verl-rs-batch-norm", "trl-off-policy-mask")


def _composed(preset: str, overrides: list[str] = ()) -> tuple[Correction, LossSpec]:
    cfg = hydra_app.compose([f"correction={preset}", *overrides])
    corr = Correction.from_config(hydra_app.to_container(cfg.correction))
    return corr, LossSpec.from_config(hydra_app.to_container(cfg.loss))


def _entries():
    for name in (*FRAMEWORK_CASES, *EXTRA_CASES):
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
    from runner.core.corrections import off_policy_sequence_keep
    from runner.core.losses import policy_loss

    lp = torch.tensor([[-1.1, -0.6, -0.9], [-0.51, -1.01, -0.71], [-1.1, -0.6, -0.9]])
    old = torch.tensor([[-1.0, -0.5, -0.8], [-0.5, -1.0, -0.7], [-1.0, -0.5, -0.8]])
    adv = torch.tensor([[-1.0] * 3, [-1.0] * 3, [1.0] * 3])
    mask = torch.ones_like(lp)
    corr = Correction(name="o", padding="multiply", opsm_delta=0.05, opsm_reference="old", opsm_nan="keep")
    keep = off_policy_sequence_keep(corr, lp, old, old, adv, mask)
    assert keep.tolist() == [[False] * 3, [True] * 3, [True] * 3]
    x = lp.clone().requires_grad_(True)
    out = policy_loss(LossSpec(), corr, x, old, old, adv, mask)
    out.loss.backward()
    assert x.grad[0].tolist() == [0.0, 0.0, 0.0] and bool((x.grad[1:] != 0).all())
    poisoned, pad = old.clone(), torch.tensor([[1.0, 1.0, 0.0]] * 3)
    poisoned[0, 2] = math.nan
    assert off_policy_sequence_keep(corr, lp, poisoned, old, adv, pad)[0].tolist() == [True] * 3
    ignored = dataclasses.replace(corr, padding="ignore")
    assert off_policy_sequence_keep(ignored, lp, poisoned, old, adv, pad)[0].tolist() == [False] * 3
    # TRL's treatment (opsm_nan: zero) passes the NaN through nan_to_num: 0 for that token, the drift decides
    trl = dataclasses.replace(corr, opsm_nan="zero")
    assert off_policy_sequence_keep(trl, lp, poisoned, old, adv, pad)[0].tolist() == [False] * 3
    with pytest.raises(UserError, match="correction.opsm_delta must be a finite number or null"):
        Correction(name="o", opsm_delta=math.inf).validate()


def test_readme_groups_the_faithful_presets_by_framework_with_their_counts():
    import re

    from runner import registry

    readme = (REPO / "README.md").read_text()
    rows = dict(re.findall(r"^\| ([\w-]+) \((\d+)\) \|", readme, re.M))
    expected = {name: str(len(group)) for name, group in registry.presets_by_framework() if name != registry.OWN}
    assert rows == expected


# ------------------------------------------------- verl 0.9.1: batch-normalised weights, seq_max divergence rejection
def _verl(name: str, low=None, high=None) -> Correction:
    return _composed(f"verl/{name}", [f"correction.low={'null' if low is None else low}", f"correction.high={high}"])[0]


def test_seq_max_k3_vetoes_a_sequence_k2_keeps():
    """lr = [0.9, −0.9, 0]: the largest k2 is ½·0.81 = 0.405 ≤ 0.5 (kept), the largest k3 is e^0.9 − 1.9 = 0.5596
    > 0.5 (rejected, and out of the mask); the second sequence (lr = ±0.1) is kept by both."""
    old = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
    roll = torch.tensor([[-1.9, -0.1, -1.0], [-1.1, -0.9, -1.0]])
    mask = torch.ones_like(old)
    k2 = apply_correction(_verl("seq-max-k2", high=0.5), old, roll, mask)
    k3 = apply_correction(_verl("seq-max-k3", high=0.5), old, roll, mask)
    assert k2.keep[:, 0].tolist() == [True, True] and k2.mask.tolist() == [[1.0] * 3] * 2
    assert k3.keep[:, 0].tolist() == [False, True] and k3.mask.tolist() == [[0.0] * 3, [1.0] * 3]
    assert k3.metrics["seq_masked_fraction"] == pytest.approx(0.5)
    # the threshold is the statistic's own value (band_space: value): at exactly 0.5596 it is kept
    assert apply_correction(_verl("seq-max-k3", high=math.exp(0.9) - 1.9 + 1e-6), old, roll, mask).keep.all()


def test_seq_max_takes_only_masked_in_tokens_an_empty_sequence_passes_and_nan_rejects():
    """Padding with lr = 5 (k2 = 12.5) does not count; an empty row's max is 0 (kept, verl's _sequence_max); a NaN
    masked-in log-prob makes the max NaN, which every band rejects."""
    old = torch.tensor([[-1.0, -1.0], [-1.0, -1.0], [-1.0, math.nan]])
    roll = torch.tensor([[-1.1, -6.0], [-6.0, -6.0], [-1.0, -1.0]])
    mask = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    res = apply_correction(_verl("seq-max-k2", high=0.5), old, roll, mask)
    assert res.keep[:, 0].tolist() == [True, True, False]


def test_batch_normalise_gives_mean_one_over_masked_in_tokens_or_sequences():
    """lr = [1, 0, −ln 2 | ln 2, NaN at padding], TIS high 2: token weights [2, 1, 0.5 | 2] over their mean
    5.5/4 on the 4 masked-in tokens (NaN padding left out); sequence weights min(e^L_i, 2) = [e^(1 − ln 2) | 2]
    over their mean over the two sequences, not over the 4 tokens."""
    old = torch.tensor([[0.0, 0.0, 0.0], [0.0, math.nan, 0.0]])
    roll = torch.tensor([[-1.0, 0.0, math.log(2.0)], [-math.log(2.0), 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    token = apply_correction(_verl("token-tis-batch-norm", high=2.0), old, roll, mask).coef
    assert token[0].tolist() == pytest.approx([2 / 1.375, 1 / 1.375, 0.5 / 1.375], rel=1e-6)
    assert token[1, 0].item() == pytest.approx(2 / 1.375, rel=1e-6)
    seq = apply_correction(_verl("seq-tis-batch-norm", high=2.0), old, roll, mask).coef
    w0 = math.exp(1 - math.log(2.0))
    assert seq[0].tolist() == pytest.approx([w0 / ((w0 + 2) / 2)] * 3, rel=1e-6)
    assert seq[1, 0].item() == pytest.approx(2 / ((w0 + 2) / 2), rel=1e-6)


def test_batch_normalise_leaves_an_all_zero_batch_and_refuses_a_missing_weight():
    """verl divides only when the mean is above 1e-8: weights exp(−20) (the clamp) average 2e-9, so they stay."""
    old, roll = torch.full((1, 2), -30.0), torch.full((1, 2), -5.0)
    coef = apply_correction(_verl("token-tis-batch-norm", high=2.0), old, roll, torch.ones(1, 2)).coef
    assert coef[0].tolist() == pytest.approx([math.exp(-20.0)] * 2, rel=1e-6)
    with pytest.raises(UserError, match="normalize=batch needs a weight"):
        Correction(name="n", normalize="batch").validate()
    with pytest.raises(UserError, match="filter_statistic=k3 is a divergence"):
        Correction(name="k", filter="max", filter_statistic="k3").validate()


def test_masked_sum_keeps_nan_padding_out_of_a_sequence_weight_and_statistic():
    """verl's masked_sum selects before it sums: NaN at padding leaves L_i (seq-tis) and the rejection statistic
    (seq-mis) finite, as verl 0.9.1 gives (conf/cases/verl-rs-batch-norm.yaml, nan-padding: loss −1.0525855)."""
    old = torch.tensor([[-0.5, -1.1, math.nan]])
    roll = torch.tensor([[-0.6, -1.0, math.nan]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    for name, band in (("seq-tis", (None, 2.0)), ("seq-mis", (0.5, 2.0))):
        coef = apply_correction(_verl(name, *band), old, roll, mask).coef
        assert coef[0, :2].tolist() == pytest.approx([1.0] * 2), name  # L_i = 0.1 − 0.1 = 0


# ---------------------------------------------------------------- TRL 1.16.0: off-policy sequence masking (OPSM)
def _opsm(**fields) -> Correction:
    return Correction(**{"name": "o", "weight": "token", "padding": "multiply", "opsm_delta": 0.5, **fields})


def test_opsm_drops_only_negative_advantage_sequences_past_delta_measured_from_the_current_policy():
    """Rows: A < 0 with mean(roll − lp) = 0.6 (dropped), the same with A > 0 (kept), A < 0 at exactly 0.5
    (kept: TRL keeps mean ≤ δ). old = roll, so a KL measured against old would be 0 and drop nothing."""
    roll = torch.tensor([[-1.0, -2.0], [-1.0, -2.0], [-1.0, -2.0]])
    lp = roll - torch.tensor([[0.6], [0.6], [0.5]])
    adv = torch.tensor([[-1.0], [1.0], [-1.0]]).expand(3, 2)
    mask = torch.ones(3, 2)
    res = apply_correction(_opsm(), roll, roll, mask, lp=lp, adv=adv)
    assert res.keep.tolist() == [[False, False], [True, True], [True, True]]
    assert res.coef.tolist() == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]
    assert res.metrics["seq_masked_fraction"] == pytest.approx(1 / 3)
    against_old = apply_correction(_opsm(opsm_reference="old"), roll, roll + 1.0, mask, lp=lp, adv=adv)
    assert against_old.keep[0].tolist() == [False, False]  # old − lp = 0.6 although roll − lp = −0.4
    # without advantages (a dump that has none) it masks nothing
    assert apply_correction(_opsm(), roll, roll, mask, lp=lp).keep.all()


def test_opsm_zeroes_a_nan_token_and_multiplies_an_infinite_weight():
    """A NaN rollout log-prob counts as KL 0 (TRL's nan_to_num), so the mean of [0.9, NaN→0] = 0.45 keeps the
    sequence; a dropped token whose weight overflowed to inf becomes inf·0 = NaN, as TRL's product gives."""
    lp = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]])
    roll = torch.tensor([[-0.1, math.nan], [-0.1, -0.1]])
    old = torch.tensor([[-1.0, -1.0], [-1.0, 100.0]])
    adv = torch.full((2, 2), -1.0)
    res = apply_correction(_opsm(), old, roll, torch.ones(2, 2), lp=lp, adv=adv)
    assert res.keep.tolist() == [[True, True], [False, False]]
    assert res.coef[1, 0].item() == 0.0 and math.isnan(res.coef[1, 1].item())
    with pytest.raises(UserError, match="correction.opsm_delta must be non-negative"):
        _opsm(opsm_delta=-1.0).validate()
    with pytest.raises(UserError, match="correction.opsm_reference='sampler' is not one of: roll, old"):
        _opsm(opsm_reference="sampler").validate()


def test_a_training_run_applies_opsm_to_each_update_current_policy(tmp_path):
    """The train study evaluates an OPSM preset per update (it reads that update's lp): a short run with several
    mini-batches finishes, and with δ = 0 (every negative-advantage sequence whose policy moved away from the
    engine is dropped) some updates reject sequences."""
    import csv

    from tests.helpers.cli import run_cli

    out = tmp_path / "run"
    code, _, err = run_cli(
        "run",
        "correction=trl/off-policy-mask",
        "correction.opsm_delta=0.0",
        "train.steps=3",
        "log.timing=false",
        f"hydra.run.dir={out}",
        "--quiet",
    )
    assert code == 0, err
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    assert max(float(r["seq_masked_fraction"]) for r in rows[:-1]) > 0


# ------------------------------------------------------------- NeMo-RL 7ea279a: force_on_policy_ratio
def test_ratio_against_current_is_one_with_the_gradient_of_lp_and_ppo_only():
    """lp − old = [1.5, −2] would clip both tokens (A > 0: r = e^1.5 > 1.2 binds, gradient 0; A < 0: r = e^−2 < 0.8
    binds, gradient 0). Against the current policy r = exp(lp − sg(lp)) = 1: loss −mean(A·c) = −(2 − 1)/2 and
    gradient −A/2 on both, as NeMo-RL's force_on_policy_ratio gives (conf/cases/nemo-rl.yaml)."""
    from runner.core.losses import policy_loss

    lp = torch.tensor([[-0.5, -3.0]], requires_grad=True)
    old, adv, mask = torch.tensor([[-2.0, -1.0]]), torch.tensor([[2.0, -1.0]]), torch.ones(1, 2)
    corr = Correction(name="none")
    clipped = policy_loss(LossSpec(), corr, lp, old, old, adv, mask)
    clipped.loss.backward()
    assert lp.grad.tolist() == [[0.0, 0.0]]
    lp.grad = None
    forced = policy_loss(LossSpec(ratio_against="current"), corr, lp, old, old, adv, mask)
    forced.loss.backward()
    assert forced.loss.item() == pytest.approx(-0.5) and lp.grad.tolist() == [[-1.0, 0.5]]
    with pytest.raises(UserError, match="ratio_against=current .* applies to loss=ppo only, not loss=cispo"):
        LossSpec.from_config({"name": "cispo", "ratio_against": "current"})


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
