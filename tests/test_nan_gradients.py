"""Faithful presets give, element for element, the gradient torch autograd gives for the original
formula, NaN pattern included, also where the loss itself is already NaN (issue: a rejected token
whose weight overflows, ρ = inf, gets 0·inf = NaN upstream; where PPO's clipped branch is the active
one, min/clamp's backward *selects* that branch and the token's gradient is exactly 0, not NaN).

The reference is each preset's original formula (shared maths in docs/corrections.md) written with
plain torch ops: the spec's PPO surrogate, the coefficient by multiplication, token-mean by mask."""

from __future__ import annotations

import math

import pytest
import torch

from runner.core.losses import LossSpec, policy_loss
from runner.probe.settings import load_preset

OLD = torch.tensor([[-1.0, -1.0, -1.0, -1.0]])
LP = OLD + torch.tensor([[0.5, -0.5, 0.1, 0.4]])  # token 0: r = e^0.5 > 1.2 with A = +1, so PPO clips it
ROLL = OLD - torch.tensor([[800.0, 0.0, 0.3, -0.2]])  # token 0: old − roll = 800, ρ = inf
ADV = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
MASK = torch.ones(1, 4)


def ppo_per_token(lp, old, adv, eps=0.2):
    ratio = torch.exp((lp - old).clamp(-20, 20))
    return -torch.min(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv)


def icepop_bc71bb1(old, roll, low=0.5, high=5.0):
    rho = torch.exp(old - roll)
    return rho * ((rho >= low) & (rho <= high)).float()  # released code: by multiplication


def seq_mask_tis_bc71bb1(old, roll, mask, low=0.5, high=5.0):
    lr = old - roll
    rho_geo = torch.exp((lr * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True))
    return ((rho_geo >= low) & (rho_geo <= high)).float() * torch.exp(lr)  # no clamp: the seed bug


REFERENCES = {
    "openrlhf-bc71bb1/icepop": lambda old, roll, mask: icepop_bc71bb1(old, roll),
    "openrlhf-bc71bb1/seq-mask-tis": seq_mask_tis_bc71bb1,
}


@pytest.mark.parametrize("preset", sorted(REFERENCES))
def test_faithful_gradient_nan_pattern_matches_the_original_formula(preset):
    lp_ref = LP.clone().requires_grad_(True)
    coef = REFERENCES[preset](OLD, ROLL, MASK)
    loss_ref = (ppo_per_token(lp_ref, OLD, ADV) * coef * MASK).sum() / MASK.sum()
    loss_ref.backward()

    lp = LP.clone().requires_grad_(True)
    res = policy_loss(LossSpec(), load_preset(preset), lp, OLD, ROLL, ADV, MASK)
    res.loss.backward()

    assert math.isnan(loss_ref.item()) and math.isnan(res.loss.item())  # the loss is already NaN
    assert float(lp_ref.grad[0, 0]) == 0.0  # the clipped, rejected, overflowed token: 0, not NaN
    torch.testing.assert_close(lp.grad, lp_ref.grad, equal_nan=True, atol=1e-7, rtol=1e-6)
    assert torch.equal(torch.isnan(lp.grad), torch.isnan(lp_ref.grad))


def test_the_fast_path_still_serves_finite_inputs():
    """Finite inputs keep the fused PPO Function and give autograd's gradient to float rounding."""
    g = torch.Generator().manual_seed(0)
    lp0 = -torch.rand(8, 16, generator=g) * 3
    old = lp0 + 0.3 * torch.randn(8, 16, generator=g)
    roll = old + 0.3 * torch.randn(8, 16, generator=g)
    adv = torch.randn(8, 1, generator=g).expand(8, 16)
    mask = torch.ones(8, 16)
    for preset in ("tis", "openrlhf-bc71bb1/seq-mask-tis", "icepop"):
        corr = load_preset(preset)
        lp = lp0.clone().requires_grad_(True)
        res = policy_loss(LossSpec(), corr, lp, old, roll, adv, mask)
        assert res.per_token.grad_fn.name().endswith("_WeightedPPOBackward")  # the fused Function ran
        res.loss.backward()
        lp_ref = lp0.clone().requires_grad_(True)
        coef = res.correction.coef
        ((ppo_per_token(lp_ref, old, adv) * coef).sum() / mask.sum()).backward()
        torch.testing.assert_close(lp.grad, lp_ref.grad, atol=1e-7, rtol=1e-5)


def test_verl_presets_reduce_padding_as_the_released_masked_sum():
    """verl 0.9.1's token-mean is masked_sum (torch.where(mask, x, 0)) / mask.sum(): NaN padding leaves the
    loss finite. The numbers were recorded from the released compute_policy_loss_vanilla fed by
    compute_rollout_correction_weights (token IcePop [0.5, 5]) through `is-study case --target`:
    loss −1.0484347343444824, gradient [−0.40713429, −0.36839026, −0.27291024, 0], NaN at the padded
    position only when the padded advantage is NaN."""
    lp = torch.tensor([[-1.0, -2.0, -1.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    released_grad = torch.tensor([[-0.4071342945098877, -0.3683902621269226, -0.2729102373123169, 0.0]])
    nan = float("nan")
    cases = {  # name: (old, roll, adv, NaN at the padded gradient)
        "nan-padding": ([[-1.1, -1.9, -1.4, nan]], [[-1.2, -2.1, -1.3, nan]], [[1.0, 1.0, 1.0, 1.0]], False),
        "nan-advantage": ([[-1.1, -1.9, -1.4, -1.0]], [[-1.2, -2.1, -1.3, -1.0]], [[1.0, 1.0, 1.0, nan]], True),
    }
    for name, (old, roll, adv, nan_grad) in cases.items():
        leaf = lp.clone().requires_grad_(True)
        res = policy_loss(
            LossSpec(), load_preset("verl/icepop"), leaf, torch.tensor(old), torch.tensor(roll), torch.tensor(adv), mask
        )
        res.loss.backward()
        assert res.loss.item() == pytest.approx(-1.0484347343444824, abs=1e-7), name
        torch.testing.assert_close(leaf.grad[:, :3], released_grad[:, :3], atol=1e-7, rtol=0)
        assert math.isnan(leaf.grad[0, 3].item()) == nan_grad, name
        if not nan_grad:
            assert leaf.grad[0, 3].item() == 0.0
