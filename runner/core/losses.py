"""Policy losses and reductions (docs/corrections.md, §4 "Policy losses" and §5 "Reductions").

The per-token policy loss is computed first, multiplied by the correction's coefficient, and only
then reduced. PPO's ratio compares lp with old (`loss.ratio_against: old`, the default), or with the
rollout's own log-probs roll (`behaviour`: verl's bypass mode and M2PO, whose clip then bounds how far
θ is from the stale engine, not from θ_old).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch

from runner.core.corrections import Correction, CorrectionResult, apply_correction, opsm_keep
from runner.core.loss_families import PER_TOKEN_2026
from runner.core.masking import SAFETY_BOUND, zero_padding
from runner.errors import UserError

LOSSES = (
    "ppo",
    "gspo",
    "reinforce",
    "cispo",
    "dppo-tv",
    "dppo-kl",
    "ipo",
    "sapo",
    "gmpo",
    "topr",
    "rollout-is",
    "kimi15",
)
REDUCTIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
# What PPO's (and GSPO's) ratio is taken against: `old`, the trainer's fp32 log-probs under θ_t (decoupled
# PPO: the clip bounds the updates made within a step), or `behaviour`, the engine's reported log-probs
# `roll` (old := roll, as verl's bypass mode and M2PO: the ratio π_θ / π_behaviour is itself the importance
# weight, and the clip bounds the whole distance to the policy that sampled, staleness included).
RATIO_AGAINST = ("old", "behaviour")
PPO_LOG_RATIO_BOUND = 20.0
# False: PPO always takes the plain autograd formula (scripts/bench_metrics.py times both)
FUSED_PPO = True


@dataclass(frozen=True)
class LossSpec:
    name: str = "ppo"
    description: str = ""
    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float | None = None  # c > 1: where A < 0, the loss is capped at −c·A
    reduction: str = "token-mean"
    ratio_against: str = "old"  # old | behaviour (RATIO_AGAINST)
    # The 2026 losses' own settings (runner/core/loss_families/; each YAML in conf/loss/ names its source).
    # eps_low/eps_high are CISPO's weight bounds [1 − ε_low, 1 + ε_high] and GMPO's log-ratio clip.
    mask_low: float = 0.2  # DPPO's trust region δ_low (A < 0) and δ_high (A > 0)
    mask_high: float = 0.2
    ipo_threshold: float = 0.1  # IPO drops a token where |π_θ − μ| exceeds it
    adv_tau: float = 1.0  # prime-rl's scale on A (dppo-*, ipo)
    kl_tau: float = 0.0  # the kl_tau·(log r)² term: prime-rl's (dppo-*, ipo), Kimi k1.5's τ/2 (kimi15)
    tau_pos: float = 1.0  # SAPO's gate temperatures, A > 0 and A ≤ 0
    tau_neg: float = 1.05
    positive_weight: float = 1.0  # TOPR's weights on positive and negative samples
    negative_weight: float = 1.0

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> LossSpec:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(cfg) - known)
        if unknown:
            raise UserError(f"loss: unknown key(s) {', '.join(unknown)}; valid: {', '.join(sorted(known))}")
        spec = cls(**dict(cfg))
        if spec.name not in LOSSES:
            raise UserError(f"loss.name={spec.name!r} is not one of: {', '.join(LOSSES)}")
        if spec.reduction not in REDUCTIONS:
            raise UserError(f"loss.reduction={spec.reduction!r} is not one of: {', '.join(REDUCTIONS)}")
        if spec.eps_low < 0 or spec.eps_high < 0:
            raise UserError("loss.eps_low and loss.eps_high must be non-negative")
        if spec.dual_clip is not None and spec.dual_clip <= 1:
            raise UserError(f"loss.dual_clip must be > 1 (or null), got {spec.dual_clip}")
        if spec.ratio_against not in RATIO_AGAINST:
            raise UserError(f"loss.ratio_against={spec.ratio_against!r} is not one of: {', '.join(RATIO_AGAINST)}")
        for key in (
            "mask_low",
            "mask_high",
            "ipo_threshold",
            "adv_tau",
            "kl_tau",
            "positive_weight",
            "negative_weight",
        ):
            if getattr(spec, key) < 0:
                raise UserError(f"loss.{key} must be non-negative, got {getattr(spec, key)}")
        if spec.tau_pos <= 0 or spec.tau_neg <= 0:
            raise UserError("loss.tau_pos and loss.tau_neg must be positive")
        if spec.dual_clip is not None and spec.name not in ("ppo", "gspo"):
            raise UserError(f"loss.dual_clip applies to loss=ppo and loss=gspo only, not loss={spec.name}")
        if spec.ratio_against == "behaviour" and spec.name == "reinforce":
            raise UserError(
                "loss.ratio_against=behaviour: loss=reinforce has no ratio to take against the behaviour "
                "policy (use loss=ppo, or a correction with ratio: bypass)"
            )
        return spec

    def check_correction(self, corr: Correction) -> None:
        """Against the behaviour policy, a loss's ratio π_θ / π_behaviour already is the importance weight, so
        a correction's weight would count the mismatch twice (verl's bypass mode passes no IS weights to its
        ppo_clip loss, SkyRL refuses TIS with cispo_anchor=rollout, and prime-rl's DPPO/IPO losses have no
        correction besides their own ratio); its filter (rejection) still applies. GSPO (whose correction only
        chooses the ratio base) and REINFORCE (no ratio) are not concerned."""
        if self.name not in ("gspo", "reinforce") and self.ratio_against == "behaviour" and corr.weight != "none":
            owner = "PPO" if self.name == "ppo" else f"loss={self.name}"
            raise UserError(
                f"loss.ratio_against=behaviour with correction={corr.name} (weight: {corr.weight}): {owner}'s "
                "ratio against the behaviour policy already is the importance weight, and the "
                "correction's weight would count it twice; use loss.ratio_against=old, or a correction "
                "with weight: none (its filter still applies)"
            )

    @property
    def effective_reduction(self) -> str:
        # GSPO averages sequences; GMPO's loss is per sequence, laid out so that seq-mean-token-sum is verl's
        # torch.mean over the batch's sequences (it ignores loss_agg_mode)
        return {"gspo": "seq-mean-token-mean", "gmpo": "seq-mean-token-sum"}.get(self.name, self.reduction)


@dataclass
class LossResult:
    loss: torch.Tensor  # 0-d, differentiable
    per_token: torch.Tensor  # [B, T] coefficient × per-token loss, before reduction
    correction: CorrectionResult
    all_rejected: bool
    # 0-d counts for ppo_clip_fraction, left as tensors so that a caller converting other numbers
    # converts these with them (the train study's one .tolist() a row); None with metrics=False
    clipped_tokens: torch.Tensor | None = None  # masked-in tokens where the clipped branch binds
    tokens: torch.Tensor | None = None  # masked-in tokens
    policy_k3: torch.Tensor | None = None  # Σ over masked-in tokens of k3(lp − old): how far θ moved from θ_old

    @property
    def counts(self) -> list[torch.Tensor]:
        """[clipped tokens, tokens, Σ k3] as 0-d tensors, for `loss_metrics` after one conversion."""
        return [self.clipped_tokens, self.tokens, self.policy_k3]

    @property
    def metrics(self) -> dict[str, float]:
        """The correction's metrics, ppo_clip_fraction and policy_kl_k3; empty with metrics=False."""
        if self.tokens is None:
            return {}
        return {**self.correction.metrics, **loss_metrics(*torch.stack(self.counts).tolist())}


def loss_metrics(clipped: float, tokens: float, policy_k3: float) -> dict[str, float]:
    """ppo_clip_fraction: the share of masked-in tokens where PPO's clipped branch is the active one (its
    ratio against old, or against roll under loss.ratio_against=behaviour).
    policy_kl_k3: the mean k3 = e^d − 1 − d of d = lp − old (±20 bound), an estimate of KL(π_old ‖ π_θ)
    per token on the batch's tokens: 0 at a step's first update, then how far the updates have moved θ
    within the step (the field calibrates its learning rates to about 1e-3 nats here)."""
    if not tokens:
        return {"ppo_clip_fraction": 0.0, "policy_kl_k3": 0.0}
    return {"ppo_clip_fraction": clipped / tokens, "policy_kl_k3": policy_k3 / tokens}


def clipped_surrogate(
    ratio: torch.Tensor, adv: torch.Tensor, spec: LossSpec, want_clipped: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """−min(r·A, clip(r, 1−ε_low, 1+ε_high)·A), with the optional dual clip. Returns the per-token
    loss and (if wanted) where the clipped branch is the active one. Plain autograd (GSPO)."""
    surr1 = ratio * adv
    surr2 = ratio.clamp(1 - spec.eps_low, 1 + spec.eps_high) * adv
    pessimistic = torch.minimum(surr1, surr2)
    clipped = (surr2 < surr1) if want_clipped else None
    if spec.dual_clip is not None:
        pessimistic = torch.where(adv < 0, torch.maximum(pessimistic, spec.dual_clip * adv), pessimistic)
    return -pessimistic, clipped


def reduce(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    how: str,
    count: torch.Tensor | None = None,
    premasked: bool = False,
    where_first: bool = False,
) -> torch.Tensor:
    """Reduce [B, T] to a scalar. An empty mask gives 0 (never 0/0). `premasked` says per_token is
    already exactly 0 wherever mask is 0 (our presets sanitise first), so no multiply is needed;
    released code multiplies by the mask, and its faithful presets do the same (NaN·0 = NaN).
    `where_first`: token-mean selects the masked-in values before multiplying (verl's masked_sum)."""
    if where_first and how == "token-mean":
        per_token = torch.where(mask > 0, per_token, 0.0)
    masked = per_token if premasked else per_token * mask
    if how == "token-mean":
        return masked.sum() / (mask.sum() if count is None else count).clamp(min=1)
    per_seq = masked.sum(-1)
    if how == "seq-mean-token-sum":
        return per_seq.mean() if per_seq.numel() else per_seq.sum()
    counts = mask.sum(-1)
    nonempty = counts > 0
    seq_means = per_seq / counts.clamp(min=1)
    return torch.where(nonempty, seq_means, 0.0).sum() / nonempty.sum().clamp(min=1)


def _all_finite(*tensors: torch.Tensor) -> bool:
    return bool(torch.isfinite(torch.stack([t.detach().sum() for t in tensors]).sum()))


def ratio_base(spec: LossSpec, old: torch.Tensor, roll: torch.Tensor) -> torch.Tensor:
    """What PPO's ratio divides by: `old` (θ_t, recomputed) or `roll` (the behaviour policy; old := roll)."""
    return roll if spec.ratio_against == "behaviour" else old


def ppo_per_token(spec, corr, cres, lp, old, roll, adv, mask, sanitise, metrics):
    """coef · PPO's clipped surrogate per token: −coef·min(r·A, clip(r, 1−ε_low, 1+ε_high)·A), with
    r = exp(clamp(lp − old, ±20)) (lp − roll under ratio_against=behaviour) and the optional dual clip."""
    log_ratio = lp - ratio_base(spec, old, roll)
    if sanitise:
        log_ratio = zero_padding(log_ratio, mask)
    if not (FUSED_PPO and _all_finite(log_ratio, adv, cres.coef)):
        ratio = torch.exp(log_ratio.clamp(-PPO_LOG_RATIO_BOUND, PPO_LOG_RATIO_BOUND))
        token_loss, clipped = clipped_surrogate(ratio, adv, spec, want_clipped=metrics)
        return token_loss * cres.coef, clipped, cres.mask
    # Finite inputs: the same loss with its backward formed in the forward pass (_WeightedPPO below).
    sink = [] if metrics else None  # a list, not a second output: autograd need not track it
    per_token = _WeightedPPO.apply(log_ratio, adv, cres.coef, spec.eps_low, spec.eps_high, spec.dual_clip, sink)
    return per_token, (sink[0] if sink else None), cres.mask


def gspo_per_token(spec, corr, cres, lp, old, roll, adv, mask, sanitise, metrics):
    """GSPO: one length-normalised sequence ratio, clipped; the sequence ratio already is the
    correction (against `roll` when a correction is active, or under ratio_against=behaviour), so no
    coefficient multiplies it."""
    diff = lp - (roll if corr.active else ratio_base(spec, old, roll))
    diff = zero_padding(diff, mask) if sanitise else diff * mask
    seq_log_ratio = diff.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    # The same ±20 bound as PPO's token ratio (verl clamps this log-ratio too): without it a
    # finite but extreme sequence overflows to inf, and 0·inf in the backward gives NaN.
    ratio = torch.exp(seq_log_ratio.clamp(-PPO_LOG_RATIO_BOUND, PPO_LOG_RATIO_BOUND)) * mask
    token_loss, clipped = clipped_surrogate(ratio, adv, spec, want_clipped=metrics)
    return token_loss, clipped, mask


def reinforce_per_token(spec, corr, cres, lp, old, roll, adv, mask, sanitise, metrics):
    """−coef · A · log π: the plain policy gradient, corrected."""
    live = zero_padding(lp, mask) if sanitise else lp
    return -adv * live * cres.coef, None, cres.mask


class _WeightedPPO(torch.autograd.Function):
    """An optimisation of ppo_per_token's formula on finite inputs: coef · (PPO's per-token loss) as a
    function of the log-ratio lp − old, with its derivative formed in the forward pass. Autograd would
    keep about six [B, T] tensors for the backward (and spend a dozen passes in it); this keeps one, and
    its backward is one multiply.

    d/dx of −min(r·A, clip(r)·A) with r = exp(clamp(x, ±20)) is −A·r where the unclipped branch is
    the minimum (inside the clip range both branches are equal and the gradient is the same), 0
    where the clipped branch binds, the dual clip binds, or |x| > 20: what autograd gives. The forward
    is the formula's bit for bit; the gradient's products are taken in another order, so it differs
    from autograd's in the last bits.

    It stays for today's bytes, not for speed: at the default sizes the readable formula costs the same
    (one mini-batch's loss forward and backward, readable / fused: 1.00x in bigram and in mlp, 1.02x in the
    transformer; scripts/bench_metrics.py), but its last bits change the pinned runs' metrics.csv and
    tokens.csv (tests/test_behaviour_unchanged.py with FUSED_PPO = False; bigram and mlp tis-tames-mismatch
    tried). Non-finite inputs (a faithful preset's inf or 0·inf coefficient, NaN padding) take the readable
    formula, whose min/clamp backward *selects* a branch rather than multiplying by 0, so the gradient's NaN
    pattern is the original code's element for element."""

    @staticmethod
    def forward(ctx, log_ratio, adv, coef, eps_low, eps_high, dual_clip, clipped_sink):
        # In-place where a temporary is not needed again: at most four [B, T] floats live at once.
        bound = PPO_LOG_RATIO_BOUND
        inbound = log_ratio.abs().le_(bound)  # 1.0 / 0.0: clamp passes the gradient inside
        ratio = log_ratio.clamp(-bound, bound).exp_()
        surr1 = ratio * adv
        surr2 = ratio.clamp_(1 - eps_low, 1 + eps_high).mul_(adv)
        del ratio
        if clipped_sink is not None:  # where the clipped branch is the active one (for the metrics)
            clipped_sink.append(torch.lt(surr2, surr1))
        pessimistic = torch.minimum(surr1, surr2)
        # 1.0 / 0.0 in surr2's own storage: a bool tensor would take torch's slow mixed-dtype multiply
        active = torch.le(surr1, surr2, out=surr2)
        del surr2
        slope = surr1.mul_(active).mul_(inbound)
        del active, inbound
        if dual_clip is not None:
            floor = adv * dual_clip
            capped = (adv < 0) & (floor > pessimistic)
            pessimistic = torch.where(capped, floor, pessimistic)
            slope.masked_fill_(capped, 0.0)
            del floor, capped
        ctx.save_for_backward(slope.mul_(coef).neg_())  # d per_token / d log_ratio
        return pessimistic.neg_().mul_(coef)

    @staticmethod
    def backward(ctx, grad_out):
        (slope,) = ctx.saved_tensors
        return grad_out * slope, None, None, None, None, None, None


PER_TOKEN = {"ppo": ppo_per_token, "gspo": gspo_per_token, "reinforce": reinforce_per_token, **PER_TOKEN_2026}
assert tuple(PER_TOKEN) == LOSSES


def policy_loss(
    spec: LossSpec,
    corr: Correction,
    lp: torch.Tensor,
    old: torch.Tensor,
    roll: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    metrics: bool = True,
    correction: CorrectionResult | None = None,
    generator: torch.Generator | None = None,
) -> LossResult:
    """The corrected policy loss for one batch of [B, T] tensors; lp carries the gradient.
    `correction`: this batch's already evaluated correction (apply_correction_split of a larger
    batch), used instead of evaluating it here; its metrics are passed on. `generator`: the random stream
    of a correction with filter_shuffle."""
    mask = mask.to(lp.dtype)
    cres = (
        correction
        if correction is not None
        else apply_correction(corr, old, roll, mask, lp=lp, metrics=metrics, generator=generator)
    )
    old, roll, adv = old.detach(), roll.detach(), adv.detach()
    # Our presets: NaN/inf at masked positions must not reach the loss or any gradient. Zeroing each
    # difference (not each input) is enough: the backward of x·mask (or of a where) sends exactly 0
    # to padding.
    sanitise = corr.padding == "ignore"
    if sanitise:
        adv = zero_padding(adv, mask)

    per_token, clipped, red_mask = PER_TOKEN[spec.name](spec, corr, cres, lp, old, roll, adv, mask, sanitise, metrics)
    if corr.opsm_delta is not None:  # slime multiplies the per-token loss by the mask (NaN·0 = NaN)
        per_token = per_token * opsm_keep(corr, lp, old, roll, adv, mask, sanitise)

    # Under sanitisation every masked or rejected (where) position is already exactly 0.
    premasked = sanitise and (corr.reject == "where" or red_mask is mask)
    count = red_mask.sum()
    loss = reduce(
        per_token,
        red_mask,
        spec.effective_reduction,
        count=count,
        premasked=premasked,
        where_first=corr.padding == "masked-sum",
    )
    all_rejected = bool(count == 0)
    out = LossResult(loss=loss, per_token=per_token, correction=cres, all_rejected=all_rejected)
    if metrics:
        out.tokens = mask.sum()
        if clipped is None:
            out.clipped_tokens = torch.zeros((), dtype=mask.dtype)
        else:  # under sanitisation the clipped flags are already False at padding (A = 0 there)
            out.clipped_tokens = (clipped if sanitise else clipped & (mask > 0)).sum()
        with torch.no_grad():
            moved = zero_padding(lp.detach() - old, mask).clamp(-SAFETY_BOUND, SAFETY_BOUND)
            out.policy_k3 = (torch.expm1(moved) - moved).sum()  # 0 at padding: e^0 − 1 − 0
    return out
