"""runner/core/losses.py at the edges the golden cases never reach, each number derived by hand below:
the dual clip on all three PPO paths (fused, plain autograd, GSPO), the lower ±20 bound of the log
ratio, padding under `ignore` and `multiply` in GSPO and REINFORCE, the reductions' empty rows and
batches, a correction passed in, policy_kl_k3, and LossSpec's validation.

Each test was written against a mutmut survivor (`make mutation`, issue 20): the mutant's number is
given beside the true one where it helps. tests/mutation_equivalents.md lists the mutants no test
can kill, and why.
"""

from __future__ import annotations

import math

import pytest
import torch

from runner.core.corrections import Correction, CorrectionResult
from runner.core.losses import LossSpec, clipped_surrogate, loss_metrics, policy_loss, reduce
from runner.errors import UserError

pytestmark = pytest.mark.usefixtures("one_thread")

E_MINUS_20 = math.exp(-20)  # 2.0611536e-9; e^-25 would be 1.3887944e-11


# ----------------------------------------------------------------------------------------- LossSpec
def test_loss_spec_validation_edges():
    """Zero clip widths are allowed (the ratio is clamped to exactly 1 on that side); negative ones,
    a dual clip c ≤ 1 and unknown keys are refused; c just above 1 is allowed."""
    assert LossSpec.from_config({"eps_low": 0.0, "eps_high": 0.0}) == LossSpec(eps_low=0.0, eps_high=0.0)
    assert LossSpec.from_config({"dual_clip": 1.5}).dual_clip == 1.5
    assert LossSpec.from_config({"dual_clip": None}).dual_clip is None
    for bad in ({"eps_low": -0.1}, {"eps_high": -0.1}, {"dual_clip": 1.0}, {"dual_clip": 0.5}):
        with pytest.raises(UserError):
            LossSpec.from_config(bad)
    with pytest.raises(UserError, match="unknown key"):
        LossSpec.from_config({"name": "ppo", "clip_eps": 0.2})


# ----------------------------------------------------------------------------------------- loss metrics
def test_loss_metrics_keys_and_values():
    """The empty batch gives both keys at 0.0 (the same keys as a non-empty one); otherwise
    clipped / tokens and Σk3 / tokens: 3/4 = 0.75 and 0.5/4 = 0.125."""
    assert loss_metrics(0.0, 0.0, 0.0) == {"ppo_clip_fraction": 0.0, "policy_kl_k3": 0.0}
    assert loss_metrics(3.0, 4.0, 0.5) == {"ppo_clip_fraction": 0.75, "policy_kl_k3": 0.125}


def _k3(d: float) -> float:
    return math.exp(d) - 1 - d


def test_policy_kl_k3_is_the_mean_bounded_k3_of_lp_minus_old():
    """lp − old = [0.5, −0.5, −25 | pad 3.0] with old ≠ 0: k3 = e^d − 1 − d with d bounded to ±20 is
    [0.148721, 0.106531, e^-20 + 19] (unbounded, k3(−25) would be 24), mean 6.418417 over the three
    masked-in tokens; the padding's k3(3) = 16.09 counts for nothing. d = +25 alone gives
    k3(20) = e^20 − 21 = 485,165,174 (unbounded: e^25 − 26 ≈ 7.2e10)."""
    old = torch.tensor([[-1.0, -2.0, -0.5, -1.0]])
    lp = old + torch.tensor([[0.5, -0.5, -25.0, 3.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    for loss in ("ppo", "gspo", "reinforce"):
        out = policy_loss(LossSpec(name=loss), Correction(), lp, old, old, torch.ones(1, 4), mask)
        assert out.metrics["policy_kl_k3"] == pytest.approx((_k3(0.5) + _k3(-0.5) + _k3(-20)) / 3, rel=1e-6)
        assert out.metrics["policy_kl_k3"] == pytest.approx(6.418417, rel=1e-6)
    far = policy_loss(
        LossSpec(),
        Correction(),
        torch.tensor([[24.0]]),
        torch.tensor([[-1.0]]),
        torch.zeros(1, 1),
        torch.ones(1, 1),
        torch.ones(1, 1),
    )
    assert far.metrics["policy_kl_k3"] == pytest.approx(_k3(20.0), rel=1e-6)


def test_reinforce_reports_no_clipped_tokens():
    """REINFORCE has no clip: ppo_clip_fraction is 0.0 (a 0-d zero, not a missing count)."""
    lp = torch.tensor([[-1.0, -2.0]])
    out = policy_loss(LossSpec(name="reinforce"), Correction(), lp, lp, lp, torch.ones(1, 2), torch.ones(1, 2))
    assert out.clipped_tokens.item() == 0.0 and out.tokens.item() == 2.0
    assert out.metrics["ppo_clip_fraction"] == 0.0 and out.metrics["policy_kl_k3"] == 0.0


# ----------------------------------------------------------------------------------------- the dual clip
# lp − old = [2, 0.1, 2] with A = [−2, −1, +0.5] and c = 3 (the clip range is [0.8, 1.2]):
#   token 0: r = e^2, A = −2: −min(−2e^2, −2.4) = 14.78 > −c·A = 6, so the dual clip caps it at 6;
#            gradient 0. (c / A in place of c·A would cap at 1.5 instead.)
#   token 1: r = e^0.1 inside the clip range, A = −1: loss e^0.1 = 1.105171 < 3, not capped;
#            d/d lp = −A·r = 1.105171.
#   token 2: r = e^2, A = +0.5: the clipped branch, −0.6; gradient 0. The dual clip is for A < 0
#            only (applied here, it would give −max(0.6, 1.5) = −1.5).
# token-mean: (6 + 1.105171 − 0.6) / 3 = 2.168390, gradient [0, 0.368390, 0].
DUAL = LossSpec(dual_clip=3.0)
DUAL_LOG_RATIO = [2.0, 0.1, 2.0]
DUAL_ADV = [-2.0, -1.0, 0.5]
DUAL_PER_TOKEN = [6.0, math.exp(0.1), -0.6]
DUAL_LOSS = (6.0 + math.exp(0.1) - 0.6) / 3  # 2.168390
DUAL_GRAD = [0.0, math.exp(0.1) / 3, 0.0]  # 0.368390


def test_dual_clip_on_the_fused_path():
    lp = torch.tensor([DUAL_LOG_RATIO], requires_grad=True)
    zero = torch.zeros(1, 3)
    out = policy_loss(DUAL, Correction(), lp, zero, zero, torch.tensor([DUAL_ADV]), torch.ones(1, 3))
    assert out.per_token.grad_fn.name().endswith("_WeightedPPOBackward")
    out.loss.backward()
    assert out.per_token.tolist() == [pytest.approx(DUAL_PER_TOKEN, rel=1e-6)]
    assert out.loss.item() == pytest.approx(DUAL_LOSS, rel=1e-6)
    assert lp.grad.tolist() == [pytest.approx(DUAL_GRAD, rel=1e-6, abs=1e-9)]
    assert lp.grad[0, 0].item() == 0.0 and lp.grad[0, 2].item() == 0.0


def test_dual_clip_on_the_non_finite_path():
    """The same three tokens with a NaN in old at padding (padding: multiply) take the plain
    autograd formula: the same per-token losses and masked-in gradients; the loss is NaN (NaN·0)."""
    lp = torch.tensor([DUAL_LOG_RATIO + [0.0]], requires_grad=True)
    old = torch.tensor([[0.0, 0.0, 0.0, math.nan]])
    out = policy_loss(
        DUAL,
        Correction(padding="multiply"),
        lp,
        old,
        old,
        torch.tensor([DUAL_ADV + [-1.0]]),
        torch.tensor([[1.0, 1.0, 1.0, 0.0]]),
    )
    out.loss.backward()
    assert math.isnan(out.loss.item())
    assert out.per_token[0, :3].tolist() == pytest.approx(DUAL_PER_TOKEN, rel=1e-6)
    assert lp.grad[0, :3].tolist() == pytest.approx(DUAL_GRAD, rel=1e-6, abs=1e-9)
    assert lp.grad[0, 0].item() == 0.0 and lp.grad[0, 2].item() == 0.0


def test_dual_clip_in_gspo():
    """Three one-token sequences: each sequence ratio is its token's ratio, and seq-mean-token-mean
    over three one-token sequences is the token mean, so GSPO gives the same numbers."""
    lp = torch.tensor([[x] for x in DUAL_LOG_RATIO], requires_grad=True)
    zero = torch.zeros(3, 1)
    out = policy_loss(
        LossSpec(name="gspo", dual_clip=3.0),
        Correction(),
        lp,
        zero,
        zero,
        torch.tensor([[a] for a in DUAL_ADV]),
        torch.ones(3, 1),
    )
    out.loss.backward()
    assert out.per_token[:, 0].tolist() == pytest.approx(DUAL_PER_TOKEN, rel=1e-6)
    assert out.loss.item() == pytest.approx(DUAL_LOSS, rel=1e-6)
    assert lp.grad[:, 0].tolist() == pytest.approx(DUAL_GRAD, rel=1e-6, abs=1e-9)


def test_the_dual_clip_binds_only_strictly_above():
    """r = c exactly (c = e^1.1 as float32 rounds it) with A = −1: PPO's loss r equals the cap
    −c·A, so the value is c either way. The fused Function caps only where the cap is strictly
    above (`floor > pessimistic`), so the unclipped branch's gradient −A·r = c stays (capping at the
    tie too would give 0)."""
    c = torch.tensor(1.1).exp().item()
    lp = torch.tensor([[1.1]], requires_grad=True)
    zero = torch.zeros(1, 1)
    out = policy_loss(LossSpec(dual_clip=c), Correction(), lp, zero, zero, -torch.ones(1, 1), torch.ones(1, 1))
    out.loss.backward()
    assert out.loss.item() == c
    assert lp.grad.item() == pytest.approx(c, rel=1e-6)


def test_clipped_surrogate_returns_the_clip_flags_only_when_wanted():
    """r = [1.5, 1.0, 0.5] with A = [1, 1, −1]: the clipped branch binds on tokens 0 and 2."""
    ratio, adv = torch.tensor([[1.5, 1.0, 0.5]]), torch.tensor([[1.0, 1.0, -1.0]])
    loss, clipped = clipped_surrogate(ratio, adv, LossSpec())
    assert loss.tolist() == [pytest.approx([-1.2, -1.0, 0.8])]
    assert clipped.tolist() == [[True, False, True]]
    loss, none = clipped_surrogate(ratio, adv, LossSpec(), want_clipped=False)
    assert none is None and loss.tolist() == [pytest.approx([-1.2, -1.0, 0.8])]


# ----------------------------------------------------------------------------------------- the lower ±20 bound
def test_the_log_ratio_is_bounded_below_at_minus_20_on_every_path():
    """lp − old = −25 with A = +1: r = e^-20 (not e^-25), below the clip range, so the unclipped
    branch r·A is the minimum and the per-token loss is −e^-20 = −2.0611536e-9; the gradient is 0
    (the clamp is flat there). Fused PPO, PPO's plain-autograd path (a NaN at padding) and GSPO."""
    zero = torch.zeros(1, 1)
    lp = torch.tensor([[-25.0]], requires_grad=True)
    for loss in ("ppo", "gspo"):
        lp.grad = None
        out = policy_loss(LossSpec(name=loss), Correction(), lp, zero, zero, torch.ones(1, 1), torch.ones(1, 1))
        out.loss.backward()
        assert out.per_token.item() == pytest.approx(-E_MINUS_20, rel=1e-6), loss
        assert lp.grad.item() == 0.0, loss
    lp2 = torch.tensor([[-25.0, 0.0]], requires_grad=True)
    old = torch.tensor([[0.0, math.nan]])
    out = policy_loss(
        LossSpec(), Correction(padding="multiply"), lp2, old, old, torch.ones(1, 2), torch.tensor([[1.0, 0.0]])
    )
    out.loss.backward()
    assert out.per_token[0, 0].item() == pytest.approx(-E_MINUS_20, rel=1e-6)
    assert lp2.grad[0, 0].item() == 0.0


# ----------------------------------------------------------------------------------------- which PPO path
def test_a_nan_log_ratio_at_padding_takes_the_plain_formula():
    """padding: multiply, old = NaN at one padded position (lp − old = NaN there): the plain
    autograd formula's clamp and min backward *select*, so the padded gradient is exactly 0, and
    the masked-in token's is −A·r = −e^0.1 / 1 (one masked-in token). The fused Function would
    multiply its NaN slope by 0 and give NaN there."""
    lp = torch.tensor([[0.1, 0.0]], requires_grad=True)
    old = torch.tensor([[0.0, math.nan]])
    out = policy_loss(
        LossSpec(), Correction(padding="multiply"), lp, old, old, torch.ones(1, 2), torch.tensor([[1.0, 0.0]])
    )
    out.loss.backward()
    assert lp.grad.tolist() == [[pytest.approx(-math.exp(0.1), rel=1e-6), 0.0]]


def test_an_infinite_advantage_takes_the_plain_formula():
    """A = +inf at lp − old = 25 (beyond the ±20 bound): the loss is −inf, and the plain formula's
    clamp backward selects 0 for the gradient; the fused Function would form inf·0 = NaN."""
    lp = torch.tensor([[25.0]], requires_grad=True)
    zero = torch.zeros(1, 1)
    out = policy_loss(LossSpec(), Correction(), lp, zero, zero, torch.tensor([[math.inf]]), torch.ones(1, 1))
    out.loss.backward()
    assert out.loss.item() == -math.inf
    assert lp.grad.item() == 0.0


# ----------------------------------------------------------------------------------------- padding
# Two sequences, T = 3: lp − old = [0.1, 0.2 | pad] and [−0.2 | pad, pad], A = +1 and −1.5.
# GSPO: s = e^0.15 = 1.161834 and e^-0.2 = 0.818731, both inside [0.8, 1.2]; per-sequence losses
# −1.161834 and 1.5·0.818731 = 1.228096, mean 0.033131. d/d lp_t = −A·s/|y_i| / 2 sequences:
# −0.290459 on each token of the first, 0.614048 on the second, 0 at padding.
GSPO_LOSS = (-math.exp(0.15) + 1.5 * math.exp(-0.2)) / 2  # 0.033131
GSPO_GRAD = [[-math.exp(0.15) / 4] * 2 + [0.0], [0.75 * math.exp(-0.2), 0.0, 0.0]]
PAD_MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
PAD_ADV = torch.tensor([[1.0] * 3, [-1.5] * 3])


def _gspo(padding: str, pad_old: float):
    lp = torch.tensor([[0.1, 0.2, 0.0], [-0.2, 0.0, 0.0]], requires_grad=True)
    old = torch.tensor([[0.0, 0.0, pad_old], [0.0, pad_old, pad_old]])
    out = policy_loss(LossSpec(name="gspo"), Correction(padding=padding), lp, old, old, PAD_ADV, PAD_MASK)
    out.loss.backward()
    return out, lp.grad


@pytest.mark.parametrize("padding,pad_old", [("ignore", math.nan), ("ignore", 7.0), ("multiply", 7.0)])
def test_gspo_padding_counts_for_nothing(padding, pad_old):
    """Our presets zero padding before any arithmetic (NaN there included); the released `multiply`
    zeroes a finite padding by the mask product (a ratio divided by the mask would be inf there).
    Under `ignore` the per-token loss is already 0 at padding (A is zeroed there); under `multiply`
    the padded ratio is 0, below the clip range, so with A = −1.5 the padded tokens of the second
    sequence hold −min(0, 0.8·A) = 1.2 until the reduction's mask product."""
    out, grad = _gspo(padding, pad_old)
    assert out.loss.item() == pytest.approx(GSPO_LOSS, rel=1e-5)
    assert grad.tolist() == [pytest.approx(row, rel=1e-5, abs=1e-9) for row in GSPO_GRAD]
    padded = [0.0, 0.0] if padding == "ignore" else [pytest.approx(1.2)] * 2
    assert abs(out.per_token[0, 2].item()) == 0.0 and out.per_token[1, 1:].tolist() == padded


def test_gspo_multiply_lets_nan_padding_through_like_released_code():
    """padding: multiply with a NaN at padding: NaN·0 = NaN in the sequence sum, so the loss is NaN."""
    out, _ = _gspo("multiply", math.nan)
    assert math.isnan(out.loss.item())


@pytest.mark.parametrize("padding", ["ignore", "multiply"])
def test_reinforce_padding_with_an_infinite_log_prob(padding):
    """lp = −inf at a padded position, lp = [−1, −2] on the masked-in ones, A = 1: our `ignore`
    zeroes lp there first, so the loss is −A·mean(lp) = 1.5 and the gradient [−0.5, −0.5, 0];
    the released `multiply` forms −A·(−inf)·0 = NaN, as the released code does."""
    lp = torch.tensor([[-1.0, -2.0, -math.inf]], requires_grad=True)
    old = torch.tensor([[-1.0, -2.0, 0.0]])
    out = policy_loss(
        LossSpec(name="reinforce"),
        Correction(padding=padding),
        lp,
        old,
        old,
        torch.ones(1, 3),
        torch.tensor([[1.0, 1.0, 0.0]]),
    )
    if padding == "multiply":
        assert math.isnan(out.loss.item())
        return
    out.loss.backward()
    assert out.loss.item() == pytest.approx(1.5)
    assert lp.grad.tolist() == [[-0.5, -0.5, 0.0]]


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.long, torch.float64])
def test_the_mask_takes_lp_dtype(mask_dtype):
    """A bool, integer or float64 mask with float32 lp: the loss and the token count are float32,
    with the float mask's numbers (REINFORCE, lp = [−1, −2 | pad], A = 1: loss 1.5)."""
    lp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0]]).to(mask_dtype)
    out = policy_loss(LossSpec(name="reinforce"), Correction(), lp, lp.detach(), lp.detach(), torch.ones(1, 3), mask)
    assert out.loss.dtype == torch.float32 and out.tokens.dtype == torch.float32
    assert out.loss.item() == pytest.approx(1.5) and out.tokens.item() == 2.0


# ----------------------------------------------------------------------------------------- reductions
def test_reduce_token_mean_count_and_premasked():
    """per_token = [1, 2 | 100]: token-mean multiplies by the mask, (1 + 2)/2 = 1.5; a given count
    (a whole step's tokens) replaces the mask's, 3/6 = 0.5; `premasked` trusts the caller and sums
    as is, 103/2 = 51.5."""
    per_token = torch.tensor([[1.0, 2.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert reduce(per_token, mask, "token-mean").item() == 1.5
    assert reduce(per_token, mask, "token-mean", count=torch.tensor(6.0)).item() == 0.5
    assert reduce(per_token, mask, "token-mean", premasked=True).item() == 51.5


def test_reduce_with_an_empty_row_or_an_empty_batch():
    """per_token = [[1, 3], [5, 7]] with the second row empty: seq-mean-token-mean averages the
    non-empty sequences only, 2.0 (an empty row counted as 1 would give 3.0); seq-mean-token-sum
    averages every row's sum, (4 + 0)/2 = 2.0. A batch of no rows gives 0.0, never NaN."""
    per_token = torch.tensor([[1.0, 3.0], [5.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    assert reduce(per_token, mask, "seq-mean-token-mean").item() == 2.0
    assert reduce(per_token, mask, "seq-mean-token-sum").item() == 2.0
    empty = torch.zeros(0, 3)
    for how in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        assert reduce(empty, empty, how).item() == 0.0, how


# ----------------------------------------------------------------------------------------- a correction passed in
def test_a_passed_correction_is_used_as_is():
    """REINFORCE with a precomputed coefficient of 2 (as apply_correction_split gives a
    mini-batch): loss −2·A·mean(lp) = 2·1.5 = 3.0, gradient [−1, −1], and its metrics are passed
    on; evaluating the (inactive) correction here instead would give coefficient 1 and loss 1.5."""
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    given = CorrectionResult(
        coef=torch.full((1, 2), 2.0),
        mask=torch.ones(1, 2),
        keep=torch.ones(1, 2, dtype=torch.bool),
        metrics={"is_weight_mean": 2.0},
    )
    out = policy_loss(
        LossSpec(name="reinforce"),
        Correction(),
        lp,
        lp.detach(),
        lp.detach(),
        torch.ones(1, 2),
        torch.ones(1, 2),
        correction=given,
    )
    out.loss.backward()
    assert out.loss.item() == 3.0
    assert lp.grad.tolist() == [[-1.0, -1.0]]
    assert out.metrics["is_weight_mean"] == 2.0


# ----------------------------------------------------------------------------------------- ratio against the behaviour policy
# Two sequences of two tokens, the first update of a step (lp = old), token-mean, ε = 0.2. The engine's
# log-probs roll are chosen so that the ratio against the behaviour policy is r = lp − roll → e^· =
# [1.25, 0.9 | 0.7, 1.1], with A = [+1 | −1]:
#   1.25, A = +1: min(1.25, 1.2) = 1.2, clipped (derivative 0);   0.9, A = +1: 0.9 (derivative −0.9)
#   0.7,  A = −1: min(−0.7, −0.8) = −0.8, clipped (derivative 0);  1.1, A = −1: −1.1 (derivative +1.1)
# loss = −(1.2 + 0.9 − 0.8 − 1.1) / 4 = −0.05; ∂loss/∂lp = [0, −0.225 | 0, 0.275]; clip fraction 2/4.
# Against old the ratio is exactly 1 everywhere: loss −(1 + 1 − 1 − 1)/4 = 0, ∂loss/∂lp = ±0.25, clip 0.
BEHAVIOUR_P = [[0.5, 0.3], [0.2, 0.55]]
BEHAVIOUR_R = [[1.25, 0.9], [0.7, 1.1]]


def _behaviour_case():
    lp = torch.tensor(BEHAVIOUR_P).log()
    roll = lp - torch.tensor(BEHAVIOUR_R).log()
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    return lp, lp.clone(), roll, adv, torch.ones(2, 2)


@pytest.mark.parametrize("finite_path", [True, False])
def test_ppo_ratio_against_the_behaviour_policy(finite_path):
    """The hand-computed case above, on the fused path and (an inf advantage at padding sends it to plain
    autograd) on the plain one; ratio_against=old on the same inputs gives the ratio-1 numbers."""
    lp, old, roll, adv, mask = _behaviour_case()
    if not finite_path:  # a padded third column whose advantage is inf: the plain formula, same numbers
        pad = lambda x, v: torch.cat([x, torch.full((2, 1), v)], 1)  # noqa: E731
        lp, old, roll, adv, mask = pad(lp, -1.0), pad(old, -1.0), pad(roll, -1.0), pad(adv, math.inf), pad(mask, 0.0)
    for against, loss, grad, clip in (
        ("behaviour", -0.05, [[0.0, -0.225], [0.0, 0.275]], 0.5),
        ("old", 0.0, [[-0.25, -0.25], [0.25, 0.25]], 0.0),
    ):
        x = lp.clone().requires_grad_(True)
        out = policy_loss(LossSpec(ratio_against=against), Correction(), x, old, roll, adv, mask)
        out.loss.backward()
        assert float(out.loss.detach()) == pytest.approx(loss, abs=1e-6)
        assert x.grad[:, :2].flatten().tolist() == pytest.approx(torch.tensor(grad).flatten().tolist(), abs=1e-6)
        assert out.metrics["ppo_clip_fraction"] == clip
        # policy_kl_k3 stays against old (how far θ moved within the step): 0 at the first update
        assert out.metrics["policy_kl_k3"] == 0.0


def test_gspo_without_a_correction_takes_the_behaviour_ratio():
    """GSPO's sequence ratio exp(mean(lp − base)): against old it is 1 (loss −(1 − 1)/2 = 0); against the
    behaviour policy it is s = [√(1.25·0.9), √(0.7·1.1)] = [1.0606602, 0.8774964], both inside [0.8, 1.2],
    so loss = −(1.0606602 − 0.8774964)/2 = −0.0915819."""
    lp, old, roll, adv, mask = _behaviour_case()
    for against, expected in (("old", 0.0), ("behaviour", -(math.sqrt(1.25 * 0.9) - math.sqrt(0.7 * 1.1)) / 2)):
        out = policy_loss(LossSpec(name="gspo", ratio_against=against), Correction(), lp, old, roll, adv, mask)
        assert float(out.loss) == pytest.approx(expected, abs=1e-6)
    assert -(math.sqrt(1.25 * 0.9) - math.sqrt(0.7 * 1.1)) / 2 == pytest.approx(-0.0915819, abs=1e-7)


def test_ratio_against_validation_and_its_pairing_with_a_correction():
    """behaviour with loss=reinforce (no ratio) and with a weighted correction (the weight would count the
    mismatch twice) is refused in one line; a filter-only correction (geo-mask: weight none) is allowed, and
    so is any correction against old; GSPO ignores coefficients, so it pairs with any correction."""
    assert LossSpec.from_config({"ratio_against": "behaviour"}).ratio_against == "behaviour"
    with pytest.raises(UserError, match="ratio_against='roll' is not one of: old, behaviour"):
        LossSpec.from_config({"ratio_against": "roll"})
    with pytest.raises(UserError, match="loss=reinforce has no ratio"):
        LossSpec.from_config({"name": "reinforce", "ratio_against": "behaviour"})
    behaviour = LossSpec(ratio_against="behaviour")
    for weight in ("token", "sequence", "geometric"):
        with pytest.raises(UserError, match="count it twice"):
            behaviour.check_correction(Correction(name="w", weight=weight))
    behaviour.check_correction(Correction(name="geo-mask", filter="geometric", low=0.999, high=1.001))
    behaviour.check_correction(Correction())
    LossSpec().check_correction(Correction(name="tis", weight="token"))
    LossSpec(name="gspo", ratio_against="behaviour").check_correction(Correction(name="tis", weight="token"))


@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_the_fused_ppo_is_the_readable_formula_with_another_backward(dual_clip, monkeypatch):
    """On finite inputs the fused Function's per-token loss is the readable formula's, bit for bit; its
    gradient agrees to float32 rounding (the products are taken in another order). FUSED_PPO=False takes
    the readable formula itself."""
    from runner.core import losses

    g = torch.Generator().manual_seed(3)
    lp0 = -torch.rand(8, 16, generator=g) * 3
    old = lp0 + 0.3 * torch.randn(8, 16, generator=g)
    roll = old + 0.3 * torch.randn(8, 16, generator=g)
    adv = torch.randn(8, 1, generator=g).expand(8, 16)
    mask = (torch.rand(8, 16, generator=g) < 0.8).float()
    spec, corr = LossSpec(dual_clip=dual_clip), Correction(name="tis", weight="token", weight_op="clamp", high=2.0)
    runs = {}
    for fused in (True, False):
        monkeypatch.setattr(losses, "FUSED_PPO", fused)
        lp = lp0.clone().requires_grad_(True)
        out = policy_loss(spec, corr, lp, old, roll, adv, mask)
        out.loss.backward()
        runs[fused] = out, lp.grad
    (fused, fused_grad), (readable, readable_grad) = runs[True], runs[False]
    assert fused.per_token.grad_fn.name().endswith("_WeightedPPOBackward")
    assert readable.per_token.grad_fn.name() == "MulBackward0"
    assert torch.equal(fused.per_token, readable.per_token) and fused.loss.item() == readable.loss.item()
    assert fused.metrics == readable.metrics
    torch.testing.assert_close(fused_grad, readable_grad, rtol=1e-6, atol=1e-9)
    assert 0 < fused.metrics["ppo_clip_fraction"] < 1  # both branches of the clip occur
