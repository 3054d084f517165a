"""The loss's edges that the golden cases never reach, each pinned by a number derived by hand below:
the ±20 bound on the PPO log-ratio (in GSPO and on the non-finite path too) and an asymmetric clip range.
The correction's edges (band ends, the weight's ±20 bound, the veto, a bypass coefficient) are in
tests/test_corrections.py.

Each test was written against a planted bug that the rest of the suite let through (issue 20):
the PPO bound 20 → 10, eps_low and eps_high swapped. The mutant's number is given beside the true
one where it helps.
"""

from __future__ import annotations

import math

import pytest
import torch

from runner.core.corrections import Correction
from runner.core.losses import LossSpec, policy_loss

pytestmark = pytest.mark.usefixtures("one_thread")


# ----------------------------------------------------------------------------------------- the PPO log-ratio bound
E15, E20 = math.exp(15), math.exp(20)  # 3,269,017.37 and 485,165,195.4


def _ppo_one_token(log_ratio: float, loss: str = "ppo"):
    """lp − old = log_ratio on one token with A = −1, no correction, token-mean: (loss, d loss / d lp)."""
    lp = torch.tensor([[log_ratio]], requires_grad=True)
    zero = torch.zeros(1, 1)
    out = policy_loss(LossSpec(name=loss), Correction(), lp, zero, zero, -torch.ones(1, 1), torch.ones(1, 1))
    out.loss.backward()
    return out.loss.item(), lp.grad.item()


@pytest.mark.parametrize("loss", ["ppo", "gspo"])
def test_the_ppo_ratio_is_bounded_at_20_nats(loss):
    """A = −1 makes the unclipped branch r·A the minimum, so the loss is r and d loss / d lp = r.
    At lp − old = 15 (inside the bound): loss = gradient = e^15 ≈ 3,269,017 (a bound of 10 gives
    e^10 and a gradient of 0). At 25: r = e^20 and the gradient is exactly 0 (the clamp is flat).
    GSPO's sequence ratio of a one-token sequence is the same ratio, under the same bound."""
    value, grad = _ppo_one_token(15.0, loss)
    assert value == pytest.approx(E15, rel=1e-6) and grad == pytest.approx(E15, rel=1e-6)
    value, grad = _ppo_one_token(25.0, loss)
    assert value == pytest.approx(E20, rel=1e-6) and grad == 0.0


def test_the_non_finite_path_has_the_same_bound():
    """A NaN in the padding sends PPO down its plain-autograd path (the released code's NaN
    pattern): the loss is NaN there, but the masked-in token's gradient is still e^15 at 15, 0 at 25."""
    for log_ratio, expected in ((15.0, E15), (25.0, 0.0)):
        lp = torch.tensor([[log_ratio, 0.0]], requires_grad=True)
        old = torch.tensor([[0.0, math.nan]])
        out = policy_loss(
            LossSpec(), Correction(padding="multiply"), lp, old, old, -torch.ones(1, 2), torch.tensor([[1.0, 0.0]])
        )
        out.loss.backward()
        assert math.isnan(out.loss.item())
        assert lp.grad[0, 0].item() == pytest.approx(expected, rel=1e-6)


# ----------------------------------------------------------------------------------------- asymmetric clipping
ASYMMETRIC = LossSpec(eps_low=0.1, eps_high=0.3)  # DAPO-style clip-higher: the range is [0.9, 1.3]


def test_asymmetric_clip_uses_eps_low_below_and_eps_high_above():
    """lp − old = [0.4, −0.3] with A = [+1, −1]: r = [1.4918, 0.7408] are clipped to 1.3 and 0.9,
    so the per-token losses are [−1.3, +0.9], the loss −0.2, both tokens clipped (fraction 1.0) and
    the gradient 0. With eps_low and eps_high swapped ([0.7, 1.1]): −1.1 and +0.7408, loss
    −0.17959 (issue 20 rounds it to −0.1795) and clip fraction 0.5."""
    lp = torch.tensor([[0.4, -0.3]], requires_grad=True)
    zero = torch.zeros(1, 2)
    out = policy_loss(ASYMMETRIC, Correction(), lp, zero, zero, torch.tensor([[1.0, -1.0]]), torch.ones(1, 2))
    out.loss.backward()
    assert out.per_token.tolist() == [pytest.approx([-1.3, 0.9], abs=1e-6)]
    assert out.loss.item() == pytest.approx(-0.2, abs=1e-6)
    assert out.metrics["ppo_clip_fraction"] == 1.0
    assert lp.grad.tolist() == [[0.0, 0.0]]


def test_asymmetric_clip_in_gspo_and_on_the_non_finite_path():
    """The same two ratios through the plain clipped surrogate: as GSPO's sequence ratios (two
    one-token sequences, seq-mean-token-mean) and as PPO's path for non-finite inputs (a NaN at
    padding): per-token losses −1.3 and +0.9 in both."""
    adv = torch.tensor([[1.0], [-1.0]])
    zero = torch.zeros(2, 1)
    lp = torch.tensor([[0.4], [-0.3]])
    gspo = policy_loss(
        LossSpec(name="gspo", eps_low=0.1, eps_high=0.3), Correction(), lp, zero, zero, adv, torch.ones(2, 1)
    )
    assert gspo.loss.item() == pytest.approx(-0.2, abs=1e-6)
    assert gspo.metrics["ppo_clip_fraction"] == 1.0
    old = torch.tensor([[0.0, math.nan], [0.0, math.nan]])
    nan_padded = policy_loss(
        ASYMMETRIC,
        Correction(padding="multiply"),
        torch.tensor([[0.4, 0.0], [-0.3, 0.0]]),
        old,
        old,
        torch.tensor([[1.0, 1.0], [-1.0, -1.0]]),
        torch.tensor([[1.0, 0.0], [1.0, 0.0]]),
    )
    assert nan_padded.per_token[:, 0].tolist() == pytest.approx([-1.3, 0.9], abs=1e-6)
    assert nan_padded.metrics["ppo_clip_fraction"] == 1.0
