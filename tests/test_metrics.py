"""Per-batch metrics against values computed by hand from their definitions."""

from __future__ import annotations

import math

import pytest
import torch

from runner.corrections import Correction, apply_correction
from runner.losses import LossSpec, policy_loss

OLD = torch.tensor([[-1.0, -1.5, -0.4, 2.0], [-2.0, -0.1, -1.0, 4.0]])
ROLL = torch.tensor([[-2.9, -1.2, -0.5, -6.0], [-0.9, -0.12, 5.0, -3.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
LR = [[1.9, -0.3, 0.1], [-1.1, 0.02]]  # old − roll on the masked-in tokens
TIS = Correction(name="tis", weight="token", weight_op="clamp", low=0.5, high=5.0)


def test_weight_moments_ess_and_clamping():
    m = apply_correction(TIS, OLD, ROLL, MASK).metrics
    w = [min(max(math.exp(x), 0.5), 5.0) for row in LR for x in row]  # [5, .741, 1.105, .5, 1.020]
    mean = sum(w) / 5
    assert m["is_weight_mean"].item() == pytest.approx(mean, rel=1e-6)
    assert m["is_weight_std"].item() == pytest.approx(math.sqrt(sum((x - mean) ** 2 for x in w) / 5), rel=1e-5)
    assert m["is_weight_min"].item() == pytest.approx(0.5)
    assert m["is_weight_max"].item() == pytest.approx(5.0)
    assert m["ess"].item() == pytest.approx(sum(w) ** 2 / (5 * sum(x * x for x in w)), rel=1e-6)
    assert m["clamped_fraction"].item() == pytest.approx(2 / 5)  # e^1.9 → 5 and e^-1.1 → 0.5
    assert m["token_masked_fraction"].item() == 0.0


def test_divergence_metrics():
    m = apply_correction(TIS, OLD, ROLL, MASK).metrics
    flat = [x for row in LR for x in row]
    assert m["kl_k1"].item() == pytest.approx(-sum(flat) / 5, rel=1e-5)
    assert m["kl_k3"].item() == pytest.approx(sum(math.exp(x) - 1 - x for x in flat) / 5, rel=1e-5)
    assert m["chi2_token"].item() == pytest.approx(sum(math.exp(2 * x) for x in flat) / 5 - 1, rel=1e-5)
    L = [sum(row) for row in LR]
    assert m["chi2_seq"].item() == pytest.approx(sum(math.exp(2 * x) - 1 for x in L) / 2, rel=1e-5)
    assert m["log_ppl_diff"].item() == pytest.approx((L[0] / 3 + L[1] / 2) / 2, rel=1e-5)
    probs = [abs(math.exp(o) - math.exp(r)) for o, r, k in zip(OLD.flatten().tolist(), ROLL.flatten().tolist(),
                                                              MASK.flatten().tolist()) if k]
    assert m["max_abs_prob_diff"].item() == pytest.approx(max(probs), rel=1e-5)


def test_masked_fractions_for_a_sequence_filter():
    seq_mis = Correction(name="seq-mis", weight="sequence", log_clamp=20.0, filter="sequence", low=0.5, high=2.0)
    m = apply_correction(seq_mis, OLD, ROLL, MASK).metrics
    # L = 1.7 (ρ 5.47, rejected) and −1.08 (ρ 0.34, rejected): every token and sequence rejected
    assert m["token_masked_fraction"].item() == 1.0
    assert m["seq_masked_fraction"].item() == 1.0
    assert m["ess"].item() == 0.0  # every weight zero: 0, not a ZeroDivisionError or NaN


def test_empty_batch_metrics_and_loss_are_zero_not_nan():
    mask = torch.zeros(2, 3)
    lp = torch.zeros(2, 3, requires_grad=True)
    geo = Correction(name="geo-mask", filter="geometric", denominator="drop", low=0.999, high=1.001)
    out = policy_loss(LossSpec(), geo, lp, torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), mask)
    out.loss.backward()
    assert out.loss.item() == 0.0 and out.all_rejected
    assert torch.equal(lp.grad, torch.zeros(2, 3))
    for name, value in out.metrics.items():
        assert math.isfinite(value.item()), name


def test_all_rejected_flag_from_drop():
    lp = torch.tensor([[0.0, -1000.0]], requires_grad=True)
    geo = Correction(name="geo-mask", filter="geometric", denominator="drop", low=0.999, high=1.001)
    out = policy_loss(LossSpec(), geo, lp, lp.detach(), torch.tensor([[-1000.0, -4.0]]), torch.ones(1, 2), torch.ones(1, 2))
    out.loss.backward()
    assert out.loss.item() == 0.0 and out.all_rejected and out.metrics["all_rejected"].item() == 1.0
    assert lp.grad.tolist() == [[0.0, 0.0]]


def test_ppo_clip_fraction_and_dual_clip():
    lp = torch.tensor([[0.5, 0.0, -0.5]], requires_grad=True)  # r = e^.5 (clipped for A>0), 1, e^-.5
    zeros = torch.zeros(1, 3)
    adv = torch.tensor([[1.0, 1.0, -2.0]])
    out = policy_loss(LossSpec(), Correction(), lp, zeros, zeros, adv, torch.ones(1, 3))
    assert out.metrics["ppo_clip_fraction"].item() == pytest.approx(2 / 3)  # e^.5>1.2 (A>0), e^-.5<0.8 (A<0)
    expected = (-1.2 - 1.0 + 2 * 0.8) / 3
    assert out.loss.item() == pytest.approx(expected, rel=1e-6)
    # dual clip c=3: where A<0 the loss is capped at −c·A = 6; here 2·0.8 = 1.6 < 6, unchanged
    dual = policy_loss(LossSpec(dual_clip=3.0), Correction(), lp, zeros, zeros, adv, torch.ones(1, 3))
    assert dual.loss.item() == pytest.approx(expected, rel=1e-6)
    big = torch.tensor([[0.0, 0.0, 2.0]], requires_grad=True)  # r = e^2 with A = −2: −min(...) = 2e^2 ≈ 14.8 > 6
    capped = policy_loss(LossSpec(dual_clip=3.0), Correction(), big, zeros, zeros, adv, torch.ones(1, 3))
    assert capped.loss.item() == pytest.approx((-1.0 - 1.0 + 6.0) / 3, rel=1e-6)


def test_reductions():
    per_token_lp = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    zeros = torch.zeros(2, 3)
    def loss(reduction):
        return policy_loss(LossSpec(reduction=reduction), Correction(), per_token_lp, zeros, zeros, adv, mask).loss.item()
    assert loss("token-mean") == pytest.approx(-(1 + 2 + 4) / 3)
    assert loss("seq-mean-token-mean") == pytest.approx(-((1 + 2) / 2 + 4 / 1) / 2)
    assert loss("seq-mean-token-sum") == pytest.approx(-((1 + 2) + 4) / 2)


def test_gspo_and_reinforce():
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = torch.tensor([[-1.1, -2.1]])
    roll = torch.tensor([[-1.2, -2.2]])
    adv = torch.ones(1, 2)
    mask = torch.ones(1, 2)
    # GSPO with no correction: s = exp(mean(lp − old)) = e^0.1 ≈ 1.105 inside the clip
    g = policy_loss(LossSpec(name="gspo"), Correction(), lp, old, roll, adv, mask)
    assert g.loss.item() == pytest.approx(-math.exp(0.1), rel=1e-6)
    # with an active correction the base is roll: s = e^0.2 → clipped at 1.2
    tis = Correction(name="tis", weight="token", weight_op="clamp", low=0.5, high=5.0)
    g2 = policy_loss(LossSpec(name="gspo"), tis, lp, old, roll, adv, mask)
    assert g2.loss.item() == pytest.approx(-1.2, rel=1e-6)
    r = policy_loss(LossSpec(name="reinforce"), tis, lp, old, roll, adv, mask)
    r.loss.backward()
    # −ρ·A·lp with ρ = e^0.1 on both tokens, token-mean
    assert r.loss.item() == pytest.approx(math.exp(0.1) * (1.0 + 2.0) / 2, rel=1e-6)
    assert lp.grad.tolist() == [pytest.approx([-math.exp(0.1) / 2] * 2, rel=1e-6)]
