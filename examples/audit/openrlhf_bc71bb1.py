"""OpenRLHF's PolicyLoss as of commit bc71bb19, for `is-study audit`, written for this project.

That commit is not on PyPI (0.11.2, the release, reworked the correction), and CI can reach only
PyPI, so this adapter stands in for it: same constructor and call as bc71bb19's
`openrlhf.models.loss.PolicyLoss` (`enable_vllm_is_correction`, `vllm_is_truncated_threshold`,
`vllm_is_correction_type` = tis | icepop | seq-mask-tis), and the arithmetic of our faithful
presets `openrlhf-bc71bb1/*`, which reproduce that commit's correction bugs included (no clamp in
seq-mask-tis, rejection by multiplying with a 0/1 mask, padding removed by multiplying with the
mask). The loss is reduced as OpenRLHF's `aggregate_loss` reduces it: a masked token mean (or a
mean of per-sequence means) that divides by the token count unguarded.

What auditing it shows is therefore what the faithful presets claim about bc71bb19; to audit the
commit itself, point --target at its `openrlhf/models/loss.py` with `--stub deepspeed` (the test
suite does when IS_STUDY_OPENRLHF_BC71BB1 names a checkout of it).

    is-study audit --target examples/audit/openrlhf_bc71bb1.py:PolicyLoss \\
        --target-kwargs '{"enable_vllm_is_correction": true, "vllm_is_truncated_threshold": [0.5, 5.0],
                          "vllm_is_correction_type": "seq-mask-tis"}' --reference correction=seq-mask-tis
"""

from __future__ import annotations

import torch

from runner.core.corrections import Correction
from runner.core.losses import LossSpec, policy_loss
from runner.hydra_app import app as hydra_app

TYPES = ("tis", "icepop", "seq-mask-tis")


def _masked_mean(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    return (x * mask).sum(dim=dim) / mask.sum(dim=dim)


class PolicyLoss(torch.nn.Module):
    def __init__(
        self,
        clip_eps_low: float = 0.2,
        clip_eps_high: float = 0.2,
        dual_clip: float | None = None,
        token_level_loss: bool = True,
        policy_loss_type: str = "ppo",
        enable_vllm_is_correction: bool = False,
        vllm_is_truncated_threshold: list | None = None,
        vllm_is_correction_type: str = "tis",
    ):
        super().__init__()
        if policy_loss_type != "ppo":
            raise ValueError("this adapter reproduces policy_loss_type='ppo' only")
        if vllm_is_correction_type not in TYPES:
            raise ValueError(f"vllm_is_correction_type must be one of {'/'.join(TYPES)}")
        self.token_level_loss = token_level_loss
        self.spec = LossSpec(eps_low=clip_eps_low, eps_high=clip_eps_high, dual_clip=dual_clip)
        self.corr = Correction(name="none")
        if enable_vllm_is_correction:
            low, high = vllm_is_truncated_threshold
            cfg = hydra_app.compose([f"correction=openrlhf-bc71bb1/{vllm_is_correction_type}"]).correction
            self.corr = Correction.from_config(hydra_app.to_container(cfg)).with_band(low, high)

    def forward(self, log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None):
        mask = torch.ones_like(log_probs) if action_mask is None else action_mask
        roll = old_log_probs if rollout_log_probs is None else rollout_log_probs
        res = policy_loss(self.spec, self.corr, log_probs, old_log_probs, roll, advantages, mask, metrics=False)
        if self.token_level_loss:
            loss = _masked_mean(res.per_token, mask)
        else:
            counts = mask.sum(-1)
            per_seq = (res.per_token * mask).sum(-1) / (counts + 1e-8)
            loss = _masked_mean(per_seq, (counts > 0).to(per_seq.dtype))
        ratio = (log_probs - old_log_probs).detach().clamp(-20.0, 20.0).exp()
        clipped = ratio.clamp(1 - self.spec.eps_low, 1 + self.spec.eps_high) * advantages < ratio * advantages
        clip_ratio = _masked_mean(clipped.to(mask.dtype), mask)
        ppo_kl = _masked_mean(-(log_probs - old_log_probs).detach(), mask)
        vllm_kl = _masked_mean(roll - old_log_probs, mask) if self.corr.active else None
        return loss, clip_ratio, ppo_kl, vllm_kl
