"""The 2026 losses (runner/core/loss_families/, docs/corrections.md §4.1) against numbers derived from their
formulas, never from the implementation:

- the worked example of the docs (four tokens), loss and gradient written out by hand;
- a random batch with padding, element for element against a scalar reference written here from each
  source's formula (double precision), with no correction and with `tis`'s coefficients;
- an extreme batch (log-ratios ±50 and an overflowing +100), an all-masked batch and NaN/inf padding, with
  the stated behaviour pinned: finite inputs give a finite loss and gradient; padding never leaks;
- every correction preset × every new loss (finite, or refused with one line and exit 2 through the CLI);
- a tiny `is-study run loss=NAME` on the bigram world for each.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml

from runner.core.corrections import Correction
from runner.core.losses import LossSpec, policy_loss
from runner.errors import UserError

pytestmark = pytest.mark.usefixtures("one_thread")

CONF = Path(__file__).resolve().parent.parent / "conf"
NEW_LOSSES = ("cispo", "dppo-tv", "dppo-kl", "ipo", "sapo", "gmpo", "topr", "rollout-is", "kimi15")
TIS = Correction(name="tis", weight="token", weight_op="clamp", low=0.5, high=5.0)


def shipped(name: str, **overrides) -> LossSpec:
    """The loss as conf/loss/NAME.yaml ships it (its source's defaults), with overrides."""
    cfg = yaml.safe_load((CONF / "loss" / f"{name}.yaml").read_text())
    return LossSpec.from_config({**cfg, **overrides})


def run(spec, lp, old, roll, adv, mask, corr=None):
    lp = lp.clone().requires_grad_(True)
    res = policy_loss(spec, corr or Correction(), lp, old, roll, adv, mask)
    res.loss.backward()
    return res, lp.grad


# ----------------------------------------------------------------------------------------- worked example
# Two sequences of two tokens, A = [+1, +1 | −1, −1], every token masked in (docs/corrections.md §4.1):
#   π_θ = [0.5, 0.45 | 0.28, 0.55], π_old = [0.4, 0.5 | 0.4, 0.5], μ (engine) = [0.25, 0.4 | 0.5, 0.4]
# so r = π_θ/π_old = [1.25, 0.9 | 0.7, 1.1], π_θ/μ = [2, 1.125 | 0.56, 1.375], π_θ − μ = [0.25, 0.05 | −0.22, 0.15].
P, P_OLD, MU = [0.5, 0.45, 0.28, 0.55], [0.4, 0.5, 0.4, 0.5], [0.25, 0.4, 0.5, 0.4]


def worked_batch():
    def logs(ps):
        return torch.tensor([ps[:2], ps[2:]]).log()

    return logs(P), logs(P_OLD), logs(MU), torch.tensor([[1.0, 1.0], [-1.0, -1.0]]), torch.ones(2, 2)


WORKED = {
    # −A·clip(r, 0.8, 1.2)·lp at slime's literal default ε = 0.2: w = [1.2 (clipped), 0.9 | 0.8 (clipped), 1.1],
    # per token [1.2·ln 2, 0.9·(−ln 0.45) | 0.8·ln 0.28, 1.1·ln 0.55] = [0.831777, 0.718657 | −1.018373, −0.657621];
    # the gradient −A·w/4 keeps the clipped tokens' (PPO would zero them).
    "cispo": ({"eps_low": 0.2, "eps_high": 0.2}, -0.0313899, [-0.3, -0.225, 0.2, 0.275]),
    # TV drops t1 (A > 0, Δp = 0.25 > 0.2) and t3 (A < 0, Δp = −0.22 < −0.2); t4's Δp = +0.15 is the safe
    # direction for A < 0. Per token −keep·A·(π_θ/μ) + 1e-3·(ln π_θ/μ)²:
    # [1e-3·ln²2, −1.125 + 1e-3·ln²1.125 | 1e-3·ln²0.56, 1.375 + 1e-3·ln²1.375]; gradient
    # (−keep·A·π_θ/μ + 2e-3·ln π_θ/μ)/4 = [0.000347, −0.281191 | −0.000290, 0.343909].
    "dppo-tv": ({}, 0.0627330, [0.000346574, -0.281191, -0.000289909, 0.343909]),
    # Binary KL μ·ln(μ/π) + (1−μ)·ln((1−μ)/(1−π)) = [0.130812, 0.005094 | 0.107588, 0.045228] with the
    # recommended δ = 0.05: t1 (A > 0, π rose) and t3 (A < 0, π fell) dropped; no squared term (SkyRL).
    # Loss (−1.125 + 1.375)/4; gradient −keep·A·(π_θ/μ)/4.
    "dppo-kl": ({"mask_low": 0.05, "mask_high": 0.05}, 0.0625, [0.0, -0.28125, 0.0, 0.34375]),
    # |Δp| > 0.1 drops t1, t3 and t4 (symmetric: t4's rise counts too); only t2 keeps its policy gradient.
    "ipo": ({}, -0.281017, [0.000346574, -0.281191, -0.000289909, 0.000159227]),
    # −A·σ(τ(r − 1))·4/τ, τ = 1 (A > 0) or 1.05: [−4σ(0.25), −4σ(−0.1) | (4/1.05)σ(−0.315), (4/1.05)σ(0.105)]
    # = [−2.248706, −1.900083 | 1.607218, 2.004670]; gradient −A·4σ(1−σ)·r/4.
    "sapo": ({"reduction": "token-mean"}, -0.134225, [-0.307668, -0.224438, 0.170730, 0.274243]),
    # verl's default clip 0.2: ln r = [0.2231 → 0.2 (A > 0 caps the rise), −0.1054 | −0.3567 → −0.2 (A < 0 caps
    # the fall), 0.0953]; sequence ratios exp(0.047320) = 1.048457 and exp(−0.052345) = 0.949001; loss
    # (−1.048457 + 0.949001)/2; gradient −A·ratio/(2 tokens · 2 sequences), 0 at the two clipped tokens.
    "gmpo": ({"eps_low": 0.2, "eps_high": 0.2}, -0.0497279, [0.0, -0.262114, 0.0, 0.237250]),
    # Positive: −A·lp = [ln 2, −ln 0.45]; negative: clamp(r, 0, 1)·lp = [0.7·ln 0.28, 1·ln 0.55] (r = 1.1 capped);
    # gradient −A·taper/4.
    "topr": ({}, 0.000685476, [-0.25, -0.25, 0.175, 0.25]),
    # π_θ/μ = [2, 1.125 | 0.56, 1.375]: only t2 lies inside (0.8, 1.2); −A·1.125·ln 0.45 / 4, gradient −1.125/4 there.
    "rollout-is": ({}, 0.224580, [0.0, -0.28125, 0.0, 0.0]),
    # −A·lp + 0.05·(ln r)², ln r = [0.22314, −0.10536 | −0.35667, 0.09531]: [0.695637, 0.799063 | −1.266605,
    # −0.597383]; gradient (−A + 0.1·ln r)/4.
    "kimi15": ({}, -0.0923220, [-0.244421, -0.252634, 0.241083, 0.252383]),
}


@pytest.mark.parametrize("name", NEW_LOSSES)
def test_worked_example_by_hand(name):
    overrides, loss, grad = WORKED[name]
    res, g = run(shipped(name, **overrides), *worked_batch())
    assert res.loss.item() == pytest.approx(loss, rel=2e-5, abs=1e-8)
    assert g.flatten().tolist() == pytest.approx(grad, rel=2e-5, abs=1e-8)


def test_worked_clip_fractions():
    """The share of tokens where each loss's own clip or trust-region mask binds (ppo_clip_fraction): CISPO's
    clamp at t1 and t3; TV and KL drop 2 of 4, IPO 3 of 4; GMPO clips 2; TOPR caps t4's r = 1.1; SAPO has none."""
    want = {"cispo": 0.5, "dppo-tv": 0.5, "dppo-kl": 0.5, "ipo": 0.75, "sapo": 0.0, "gmpo": 0.5, "topr": 0.25}
    want |= {"rollout-is": 0.75, "kimi15": 0.0}
    for name, fraction in want.items():
        res, _ = run(shipped(name, **WORKED[name][0]), *worked_batch())
        assert res.metrics["ppo_clip_fraction"] == fraction, name


# ----------------------------------------------------------------------------------------- scalar references
# Each takes one sequence's tokens as floats (lp, old, roll, a, c: the correction's coefficient) and returns
# [(per-token loss, d per-token loss / d lp)] for its masked-in tokens; a token-mean divides by n later.
def _sigmoid(z):
    return 1 / (1 + math.exp(-z))


def ref_cispo(s, t):
    r = math.exp(t["lp"] - t["old"])
    w = min(max(r, 1 - s.eps_low), 1 + s.eps_high)
    return -t["a"] * w * t["lp"] * t["c"], -t["a"] * w * t["c"]


def _trust_region(s, t, drop):
    x = t["lp"] - t["roll"]
    keep = 0.0 if drop else 1.0
    r = math.exp(max(min(x, 20.0), -20.0))
    inside = 1.0 if abs(x) <= 20 else 0.0
    loss = -keep * s.adv_tau * t["a"] * r + s.kl_tau * x * x
    grad = -keep * s.adv_tau * t["a"] * r * inside + 2 * s.kl_tau * x
    return loss * t["c"], grad * t["c"]


def ref_dppo_tv(s, t):
    dp = math.exp(t["lp"]) - math.exp(t["roll"])
    return _trust_region(s, t, dp > s.mask_high if t["a"] > 0 else dp < -s.mask_low)


def ref_dppo_kl(s, t):
    p, mu = math.exp(t["lp"]), math.exp(t["roll"])
    kl = mu * (t["roll"] - t["lp"]) + (1 - mu) * math.log((1 - mu + 1e-8) / (1 - p + 1e-8))
    drop = (t["a"] > 0 and p > mu and kl > s.mask_high) or (t["a"] < 0 and p < mu and kl > s.mask_low)
    return _trust_region(s, t, drop)


def ref_ipo(s, t):
    return _trust_region(s, t, abs(math.exp(t["lp"]) - math.exp(t["roll"])) > s.ipo_threshold)


def ref_sapo(s, t):
    r = math.exp(t["lp"] - t["old"])
    tau = s.tau_pos if t["a"] > 0 else s.tau_neg
    g = _sigmoid(tau * (r - 1))
    return -t["a"] * g * 4 / tau * t["c"], -t["a"] * 4 * g * (1 - g) * r * t["c"]


def ref_topr(s, t):
    taper = s.positive_weight if t["a"] > 0 else s.negative_weight * min(math.exp(t["lp"] - t["old"]), 1.0)
    return -t["a"] * taper * t["lp"] * t["c"], -t["a"] * taper * t["c"]


def ref_rollout_is(s, t):
    r = math.exp(max(min(t["lp"] - t["roll"], 20.0), -20.0))
    w = r if 1 - s.eps_low < r < 1 + s.eps_high else 0.0
    return -t["a"] * w * t["lp"] * t["c"], -t["a"] * w * t["c"]


def ref_kimi15(s, t):
    x = t["lp"] - t["old"]
    return (-t["a"] * t["lp"] + s.kl_tau * x * x) * t["c"], (-t["a"] + 2 * s.kl_tau * x) * t["c"]


TOKEN_REFS = {
    "cispo": ref_cispo,
    "dppo-tv": ref_dppo_tv,
    "dppo-kl": ref_dppo_kl,
    "ipo": ref_ipo,
    "sapo": ref_sapo,
    "topr": ref_topr,
    "rollout-is": ref_rollout_is,
    "kimi15": ref_kimi15,
}


def ref_gmpo_sequence(s, toks, weighted):
    """verl's geo_mean for one sequence: (loss_i, [d loss_i / d lp_t])."""
    n = len(toks)
    a = sum(t["a"] for t in toks) / n
    sign = (a > 0) - (a < 0)
    xs, active = [], []
    for t in toks:
        x = t["lp"] - t["old"]
        c = min(max(x, -s.eps_low), s.eps_high)
        v = sign * min(sign * x, sign * c)
        xs.append(v)
        active.append(1.0 if v == x and sign else 0.0)  # the gradient flows where the unclipped branch is taken
    ratio = math.exp(sum(xs) / n)
    w = math.exp(sum(math.log(t["c"] + 1e-10) for t in toks) / n) if weighted else 1.0
    return -a * ratio * w, [-a * ratio * w * act / n for act in active]


def reference(name, spec, lp, old, roll, adv, mask, coef, weighted=False):
    """(loss, gradient [B][T]) of `name` with `spec`'s default reduction, from the scalar formulas."""
    B, T = lp.shape
    grad = [[0.0] * T for _ in range(B)]
    rows = []
    for i in range(B):
        toks = [
            dict(
                lp=lp[i, t].item(),
                old=old[i, t].item(),
                roll=roll[i, t].item(),
                a=adv[i, t].item(),
                c=coef[i, t].item(),
                t=t,
            )
            for t in range(T)
            if mask[i, t] > 0
        ]
        rows.append(toks)
    if name == "gmpo":  # mean over the B sequences of each sequence's loss
        total = 0.0
        for i, toks in enumerate(rows):
            if toks:
                loss_i, g_i = ref_gmpo_sequence(spec, toks, weighted)
                total += loss_i
                for tok, g in zip(toks, g_i):
                    grad[i][tok["t"]] = g / B
        return total / B, grad
    terms = [(i, tok, *TOKEN_REFS[name](spec, tok)) for i, toks in enumerate(rows) for tok in toks]
    if spec.effective_reduction == "token-mean":
        n = len(terms)
        for i, tok, _, g in terms:
            grad[i][tok["t"]] = g / n
        return sum(v for _, _, v, _ in terms) / n, grad
    assert spec.effective_reduction == "seq-mean-token-mean"
    live = [toks for toks in rows if toks]
    total = 0.0
    for i, toks in enumerate(rows):
        if not toks:
            continue
        vals = [TOKEN_REFS[name](spec, tok) for tok in toks]
        total += sum(v for v, _ in vals) / len(toks)
        for tok, (_, g) in zip(toks, vals):
            grad[i][tok["t"]] = g / len(toks) / len(live)
    return total / len(live), grad


def random_batch(seed=0, B=4, T=6):
    """Log-probs in (−3, 0), log-ratios up to about ±1.5, per-sequence advantages of both signs (one 0),
    ragged padding (the last row empty), and NaN/inf written into the padding."""
    g = torch.Generator().manual_seed(seed)
    lp = -3 * torch.rand(B, T, generator=g, dtype=torch.float64)
    old = (lp + 0.6 * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    roll = (lp + 0.6 * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    adv = torch.tensor([[1.3], [-0.7], [0.0], [0.4]], dtype=torch.float64).expand(B, T).clone()
    lengths = torch.tensor([6, 4, 5, 0])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(torch.float64)
    for t in (old, roll, adv):
        t[1, 5] = float("nan")
        t[2, 5] = float("inf")
    return lp, old, roll, adv, mask


@pytest.mark.parametrize("name", NEW_LOSSES)
@pytest.mark.parametrize("corr", [Correction(), TIS], ids=["none", "tis"])
def test_random_batch_element_for_element(name, corr):
    """Double precision, tolerance 1e-12 relative: the loss and every element of its gradient (0 at padding,
    whatever NaN/inf it holds). The losses against the engine cannot take tis (a weight on their own IS
    weight), so those are taken against old here, where they compose."""
    spec = shipped(name)
    if spec.ratio_against == "behaviour" and corr.weight != "none":
        spec = shipped(name, ratio_against="old")
    lp, old, roll, adv, mask = random_batch()
    if spec.ratio_against == "old":  # the references read `roll` as the ratio's base: hand them old there
        ref_roll = old
    else:
        ref_roll = roll
    res, grad = run(spec, lp, old, roll, adv, mask, corr)
    coef = res.correction.coef
    want_loss, want_grad = reference(name, spec, lp, old, ref_roll, adv, mask, coef, weighted=corr.active)
    assert res.loss.item() == pytest.approx(want_loss, rel=1e-12, abs=1e-14)
    assert torch.isfinite(grad).all()
    assert grad.tolist() == [pytest.approx(row, rel=1e-12, abs=1e-14) for row in want_grad]


def test_random_batch_is_not_trivial():
    """The random batch exercises each branch: some tokens dropped by every trust region, some kept; CISPO's
    clip binds at ε = 0.2; GMPO's clip binds at 0.4; TOPR's negative ratio is above and below 1."""
    lp, old, roll, adv, mask = random_batch()
    for name, overrides in (("dppo-tv", {}), ("dppo-kl", {"mask_low": 0.05, "mask_high": 0.05}), ("ipo", {})):
        res, _ = run(shipped(name, **overrides), lp, old, roll, adv, mask)
        assert 0 < res.metrics["ppo_clip_fraction"] < 1, name
    for name, overrides in (("cispo", {"eps_low": 0.2, "eps_high": 0.2}), ("gmpo", {}), ("topr", {})):
        res, _ = run(shipped(name, **overrides), lp, old, roll, adv, mask)
        assert 0 < res.metrics["ppo_clip_fraction"] < 1, name


def test_dppo_kl_random_batch_at_the_recommended_delta():
    """δ = 0.05 (SkyRL's recommendation for KL) drops more than the shipped 0.2, still element for element."""
    spec = shipped("dppo-kl", mask_low=0.05, mask_high=0.05)
    lp, old, roll, adv, mask = random_batch(seed=3)
    res, grad = run(spec, lp, old, roll, adv, mask)
    want_loss, want_grad = reference("dppo-kl", spec, lp, old, roll, adv, mask, res.correction.coef)
    assert res.loss.item() == pytest.approx(want_loss, rel=1e-12)
    assert grad.tolist() == [pytest.approx(row, rel=1e-12, abs=1e-14) for row in want_grad]


def test_the_references_catch_a_wrong_formula():
    """The reference is not the implementation restated: a loss with another setting (CISPO at ε = 0.2
    instead of its shipped [0, 5]) disagrees with it on the random batch."""
    lp, old, roll, adv, mask = random_batch()
    res, _ = run(shipped("cispo", eps_low=0.2, eps_high=0.2), lp, old, roll, adv, mask)
    want, _ = reference("cispo", shipped("cispo"), lp, old, old, adv, mask, res.correction.coef)
    assert res.loss.item() != pytest.approx(want, rel=1e-6)


# ----------------------------------------------------------------------------------------- extreme batches
def extreme_batch(dtype=torch.float32):
    """One sequence per case, A = +1 then −1: lp − base = +50 (lp = 0, base = −50), −50 (lp = −50, base = 0)
    and +100 (lp = 0, base = −100: exp overflows float32 to inf), with old = roll so that every loss's base
    sees the same log-ratios."""
    lp = torch.tensor([[0.0, -50.0, 0.0], [0.0, -50.0, 0.0]], dtype=dtype)
    base = torch.tensor([[-50.0, 0.0, -100.0], [-50.0, 0.0, -100.0]], dtype=dtype)
    adv = torch.tensor([[1.0] * 3, [-1.0] * 3], dtype=dtype)
    return lp, base, base.clone(), adv, torch.ones(2, 3, dtype=dtype)


# Pinned by hand (float32, token-mean over 6 tokens unless said). Element order [A=+1: +50, −50, +100 | A=−1: same].
EXTREME_GRAD = {
    # w = clamp(e^x, 0, 5) = [5, e^−50 = 1.9e-22, 5 (inf clamped)]; gradient −A·w/6
    "cispo": [-5 / 6, -math.exp(-50) / 6, -5 / 6, 5 / 6, math.exp(-50) / 6, 5 / 6],
    # Δp = [1 − e^−50 ≈ 1, e^−50 − 1 ≈ −1, 1]: A > 0 drops the rises (t1, t3), keeps the fall; A < 0 the reverse.
    # Kept: −A·e^clamp(x) with the ±20 bound binding (gradient 0) plus 2e-3·x: [0.1, −0.1, 0.2] / 6.
    "dppo-tv": [0.1 / 6, -0.1 / 6, 0.2 / 6, 0.1 / 6, -0.1 / 6, 0.2 / 6],
    # |Δp| ≈ 1 > 0.1 everywhere: only the squared term, 2e-3·x / 6
    "ipo": [0.1 / 6, -0.1 / 6, 0.2 / 6, 0.1 / 6, -0.1 / 6, 0.2 / 6],
    # the gate saturates (σ' = 0) at r = e^20, and at r = e^−20 the gradient 4σ(1−σ)·r is e^−20-small
    "sapo": [0.0] * 6,
    # positive: −A/6; negative: clamp(e^x, 0, 1) = [1, e^−50, 1]·(1/6)
    "topr": [-1 / 6, -1 / 6, -1 / 6, 1 / 6, math.exp(-50) / 6, 1 / 6],
    # every ratio (e^±20 after the bound) is out of the band: weight 0, gradient 0
    "rollout-is": [0.0] * 6,
    # (−A + 0.1·x)/6 with x = [50, −50, 100]
    "kimi15": [4 / 6, -6 / 6, 9 / 6, 6 / 6, -4 / 6, 11 / 6],
}


@pytest.mark.parametrize("name", NEW_LOSSES)
def test_extreme_batch_is_finite(name):
    """Finite inputs, however extreme, give a finite loss and gradient for every new loss (stated in
    docs/corrections.md §4.1); where the number is pinned by hand above, element for element."""
    spec = shipped(name, reduction="token-mean") if name == "sapo" else shipped(name)
    res, grad = run(spec, *extreme_batch())
    assert math.isfinite(res.loss.item()) and torch.isfinite(grad).all(), (res.loss, grad)
    if EXTREME_GRAD.get(name) is not None:
        assert grad.flatten().tolist() == pytest.approx(EXTREME_GRAD[name], rel=1e-5, abs=1e-30)


def test_extreme_batch_gmpo_by_hand():
    """GMPO, A = +1: x̃ = [min(50, 0.4), −50, min(100, 0.4)] = [0.4, −50, 0.4], mean −16.4, ratio e^−16.4; A = −1:
    x̃ = [50, max(−50, −0.4), 100] = [50, −0.4, 100], mean 49.87 → bounded to 20, ratio e^20 (gradient 0).
    Loss (−e^−16.4 + e^20)/2; the A = +1 sequence's gradient −e^−16.4/(3·2) at its unclipped −50 token only."""
    res, grad = run(shipped("gmpo"), *extreme_batch())
    assert res.loss.item() == pytest.approx((-math.exp(-16.4) + math.exp(20)) / 2, rel=1e-5)
    want = [0.0, -math.exp(-16.4) / 6, 0.0, 0.0, 0.0, 0.0]
    assert grad.flatten().tolist() == pytest.approx(want, rel=1e-4, abs=1e-30)


def test_extreme_dppo_ratio_is_bounded_where_prime_rl_overflows():
    """With A < 0 a rise is the safe direction, so the +50 and +100 tokens are kept and weigh e^20 each, not
    e^50 and inf; with A > 0 the −50 token is kept, −e^−20. Loss (2·e^20 − e^−20 + 1e-3·Σx²)/6, Σx² over all six
    tokens = 2·(50² + 50² + 100²). prime-rl's unbounded exp would give +inf at the kept +100 token and
    0·inf = NaN at the dropped one."""
    res, _ = run(shipped("dppo-tv"), *extreme_batch())
    kl = 1e-3 * (50**2 + 50**2 + 100**2) * 2
    assert res.loss.item() == pytest.approx((2 * math.exp(20) - math.exp(-20) + kl) / 6, rel=1e-5)


def test_cispo_unified_mask_drops_where_ppos_clip_would_by_hand():
    """loss=roll/cispo (ε = 0.1) on the worked batch at a step's first update against π_old: r = [1.25, 0.9 | 0.7,
    1.1]. Plain CISPO weighs [1.1, 0.9 | 0.9, 1.1]; the unified mask also drops token 1 (A > 0, r > 1.1) and token 3
    (A < 0, r < 0.9), so the gradient −w·A·m / N per token (seq-mean-token-mean, N = 2 per sequence, 2 sequences)
    is [0, −0.225 | 0, 0.275] where it was [−0.275, −0.225 | 0.225, 0.275]."""
    lp, old, roll, adv, mask = worked_batch()
    _, plain = run(shipped("roll/cispo"), lp, old, roll, adv, mask)
    _, masked = run(shipped("roll/cispo", cispo_mask=True), lp, old, roll, adv, mask)
    assert plain.flatten().tolist() == pytest.approx([-0.275, -0.225, 0.225, 0.275], rel=1e-6)
    assert masked.flatten().tolist() == pytest.approx([0.0, -0.225, 0.0, 0.275], rel=1e-6)
    with pytest.raises(UserError, match="loss.cispo_mask applies to loss=cispo only, not loss=topr"):
        shipped("topr", cispo_mask=True)


def test_prime_rl_losses_keep_its_unbounded_ratio_and_its_0_times_inf():
    """loss=prime-rl/default and prime-rl/ipo (loss.log_ratio_bound: null) are prime-rl's exp(lp − roll): at
    lp − roll = 100 the ratio is inf. With A = +1 the token rose by Δp ≈ 1 > 0.2 and is dropped, 0·inf = NaN;
    with A = −1 it is kept, −(−1)·inf = +inf (the squared term adds 1e-3·100² = 10); IPO drops it either way. The shipped dppo-tv bounds
    log r to 20 first: the kept token costs e^20 + 10, the dropped one 10."""
    lp, roll, mask = torch.tensor([[0.0]]), torch.tensor([[-100.0]]), torch.ones(1, 1)
    dropped, _ = run(shipped("prime-rl/default"), lp, lp, roll, torch.ones(1, 1), mask)
    kept, _ = run(shipped("prime-rl/default"), lp, lp, roll, -torch.ones(1, 1), mask)
    assert math.isnan(dropped.loss.item()) and kept.loss.item() == math.inf
    for adv in (1.0, -1.0):  # IPO drops |Δp| > 0.1 whatever A's sign: NaN both ways
        res, _ = run(shipped("prime-rl/ipo"), lp, lp, roll, torch.full((1, 1), adv), mask)
        assert math.isnan(res.loss.item()), adv
    bounded_dropped, _ = run(shipped("dppo-tv"), lp, lp, roll, torch.ones(1, 1), mask)
    bounded_kept, _ = run(shipped("dppo-tv"), lp, lp, roll, -torch.ones(1, 1), mask)
    assert bounded_dropped.loss.item() == pytest.approx(10.0, rel=1e-6)
    assert bounded_kept.loss.item() == pytest.approx(math.exp(20) + 10.0, rel=1e-6)
    with pytest.raises(UserError, match=r"loss.log_ratio_bound applies to loss=dppo-tv\|dppo-kl\|ipo only"):
        shipped("cispo", log_ratio_bound=None)
    with pytest.raises(UserError, match="loss.log_ratio_bound must be a non-negative number or null"):
        shipped("dppo-tv", log_ratio_bound=-1.0)


@pytest.mark.parametrize("name", NEW_LOSSES)
def test_all_masked_batch_gives_exactly_zero(name):
    """Nothing masked in, NaN and inf in every input but lp: the loss is exactly 0 and so is every gradient
    element (never 0/0)."""
    lp, old, roll, adv, mask = random_batch()
    for t in (old, roll, adv):
        t[:, 0] = float("nan")
        t[:, 1] = float("inf")
        t[:, 2] = -float("inf")
    res, grad = run(shipped(name), lp, old, roll, adv, torch.zeros_like(mask))
    assert res.loss.item() == 0.0 and res.all_rejected
    assert grad.abs().sum().item() == 0.0 and torch.isfinite(grad).all()


@pytest.mark.parametrize("name", NEW_LOSSES)
def test_nonfinite_padding_never_leaks(name):
    """NaN/±inf in every input at padding, lp included (lp carries the gradient), under our presets: the loss
    and the gradient are those of the batch without the padded tokens (the worked batch's), and the gradient
    is exactly 0 at padding."""
    lp, old, roll, adv, mask = worked_batch()
    pad = lambda t, v: torch.cat([t, torch.full((2, 2), v)], dim=1)  # noqa: E731
    padded = [pad(lp, -float("inf")), pad(old, float("nan")), pad(roll, float("inf")), pad(adv, float("nan"))]
    padded[0][1, 3] = float("nan")
    spec = shipped(name, **WORKED[name][0])
    res, grad = run(spec, *padded, pad(mask, 0.0))
    want_loss, want_grad = WORKED[name][1:]
    assert res.loss.item() == pytest.approx(want_loss, rel=2e-5, abs=1e-8)
    assert grad[:, 2:].abs().sum().item() == 0.0
    assert grad[:, :2].flatten().tolist() == pytest.approx(want_grad, rel=2e-5, abs=1e-8)


@pytest.mark.parametrize("name", NEW_LOSSES)
def test_nan_in_a_masked_in_token_is_reported_not_hidden(name):
    """A NaN advantage at a masked-in token gives a NaN loss (train.on_nonfinite then skips or raises): the
    losses sanitise padding, not the data."""
    lp, old, roll, adv, mask = worked_batch()
    adv[0, 0] = float("nan")
    res, _ = run(shipped(name), lp, old, roll, adv, mask)
    assert math.isnan(res.loss.item())


# ----------------------------------------------------------------------------------------- composition
def _presets():
    from runner import registry

    return registry.group_options("correction")


def _preset(name: str) -> Correction:
    from runner.probe.settings import load_preset

    return load_preset(name)


def refused(spec: LossSpec, corr: Correction) -> bool:
    """The one combination that makes no sense: a loss whose ratio is taken against the engine (its own IS
    weight) with a correction that weights by the engine's ratio again."""
    return spec.name in NEW_LOSSES and spec.ratio_against == "behaviour" and corr.weight != "none"


@pytest.mark.parametrize("name", NEW_LOSSES)
def test_every_preset_composes_or_is_refused(name):
    """Every correction preset × the loss on a normal batch (the worked one, mild engine mismatch): a finite
    loss and gradient, or check_correction's UserError exactly where the ratio is against the engine and the
    preset weights."""
    spec = shipped(name)
    lp, old, roll, adv, mask = worked_batch()
    ran = set()
    for preset in _presets():
        corr = _preset(preset)
        if refused(spec, corr):
            with pytest.raises(UserError, match="count it twice"):
                spec.check_correction(corr)
            continue
        spec.check_correction(corr)
        res, grad = run(spec, lp, old, roll, adv, mask, corr)
        assert math.isfinite(res.loss.item()) and torch.isfinite(grad).all(), preset
        ran.add(preset)
    assert {"none", "geo-mask", "verl/geo-rs"} <= ran  # the weight-free presets compose with every loss


def test_against_old_every_weighted_preset_composes():
    """dppo-tv, dppo-kl and ipo with loss.ratio_against=old (SkyRL's fallback when there are no rollout
    log-probs) take any correction."""
    for name in ("dppo-tv", "dppo-kl", "ipo"):
        spec = shipped(name, ratio_against="old")
        for preset in _presets():
            spec.check_correction(_preset(preset))


def test_cispo_against_the_engine_refuses_a_weight():
    """SkyRL's cispo_anchor=rollout raises on TIS; here the same as one UserError."""
    with pytest.raises(UserError, match="loss=cispo's ratio against the behaviour policy"):
        shipped("cispo", ratio_against="behaviour").check_correction(TIS)


def test_gmpo_takes_the_geometric_mean_of_the_coefficients():
    """verl multiplies GMPO's sequence loss by exp(mean_t log(c_t + 1e-10)): on the worked batch at lp = old
    (ratio 1) with tis, c = clamp(π_old/μ, 0.5, 5) = [1.6, 1.25 | 0.8, 1.25], so the loss is
    (−√(1.6·1.25) + √(0.8·1.25))/2 = (−√2 + 1)/2."""
    lp, old, roll, adv, mask = worked_batch()
    res, _ = run(shipped("gmpo"), old, old, roll, adv, mask, TIS)
    assert res.loss.item() == pytest.approx((1 - math.sqrt(2)) / 2, rel=1e-6)


def test_loss_spec_refusals():
    with pytest.raises(UserError, match="dual_clip applies to loss=ppo and loss=gspo only"):
        shipped("cispo", dual_clip=3.0)
    for bad in ({"mask_low": -0.1}, {"kl_tau": -1.0}, {"ipo_threshold": -0.5}, {"negative_weight": -1.0}):
        with pytest.raises(UserError, match="must be non-negative"):
            shipped("dppo-tv", **bad)
    with pytest.raises(UserError, match="must be positive"):
        shipped("sapo", tau_neg=0.0)


def test_every_loss_yaml_names_its_command_and_source():
    """Each YAML opens with the command that uses it, and names the released commit it follows."""
    for name in NEW_LOSSES:
        lines = (CONF / "loss" / f"{name}.yaml").read_text().splitlines()
        assert lines[0].startswith(f"# is-study run loss={name}"), name
        header = "\n".join(line for line in lines if line.startswith("#"))
        words = [w.strip(",.;:()") for w in header.split()]
        assert any(len(w) == 40 and all(c in "0123456789abcdef" for c in w) for w in words)


# ----------------------------------------------------------------------------------------- through the CLI
def test_refused_combination_is_one_line_and_exit_2(cli, tmp_path):
    code, _, err = cli("run", "loss=dppo-tv", "correction=tis", "train.steps=1", f"hydra.run.dir={tmp_path / 'r'}")
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("is-study: error: loss.ratio_against=behaviour with correction=tis")
    assert not (tmp_path / "r" / "metrics.csv").exists()


@pytest.mark.parametrize("name", NEW_LOSSES)
def test_tiny_run_on_the_bigram_world(cli, tmp_path, name):
    """Two steps of the default study with the loss: exit 0, its rows finite."""
    import pandas as pd

    code, _, err = cli("run", f"loss={name}", "train.steps=2", f"hydra.run.dir={tmp_path / 'r'}")
    assert code == 0, err
    rows = pd.read_csv(tmp_path / "r" / "metrics.csv")
    updates = rows[rows["step"] < 2]  # the last row holds only the final objective
    assert len(updates) == 4 and updates["loss"].notna().all() and (updates["nonfinite_loss"] == 0).all()
    assert updates["loss"].map(math.isfinite).all() and updates["grad_norm"].gt(0).all()


def test_the_docs_worked_table_is_the_pinned_one():
    """docs/corrections.md §4.1's worked table gives, for each loss, the loss and gradient pinned above (to the
    digits the table prints)."""
    text = (CONF.parent / "docs" / "corrections.md").read_text()
    section = text.split("### 4.1 The 2026 losses", 1)[1].split("**Worked example**", 1)[1].split("\n## ", 1)[0]
    seen = set()
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        name = cells[0].split("`")[1] if cells[0].startswith("`") else None
        if name not in WORKED or len(cells) != 4 or "," not in cells[3]:
            continue
        _, loss, grad = WORKED[name]
        assert float(cells[2].replace("−", "-")) == pytest.approx(loss, abs=1e-6), name
        assert [float(g.replace("−", "-")) for g in cells[3].split(",")] == pytest.approx(grad, abs=1e-6), name
        seen.add(name)
    assert seen == set(NEW_LOSSES)
