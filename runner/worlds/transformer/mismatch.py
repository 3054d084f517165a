"""The engine–trainer mismatch of the transformer world at one θ, token by token: what the study's
metrics (kl_k3, max_abs_prob_diff) will see, measured without the training loop, for calibration,
the tests and the bench.

The engine samples responses with the KV cache in `precision` and reports its log-probs (`roll`);
the trainer recomputes them in fp32 teacher-forced (`old`). Per response token (mask 1):

    lr = old − roll,  k3 = e^lr − 1 − lr  (≥ 0; its mean estimates KL(π_roll ‖ π_old)),
    |Δp| = |e^old − e^roll|

`by_probability` bins the tokens by the trainer's probability of the sampled token, to show where
the mismatch sits (the field reports it concentrated on low-probability tokens).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from runner.worlds.precision import Precision
from runner.worlds.transformer.sft import sample

if TYPE_CHECKING:
    from runner.worlds.transformer.world import TransformerWorld

PROB_BINS = (0.0, 0.1, 0.5, 0.9, 0.99, 1.0 + 1e-9)


@torch.no_grad()
def token_mismatch(
    world: TransformerWorld,
    params: dict[str, torch.Tensor],
    prompts: torch.Tensor,
    precision: Precision,
    generator: torch.Generator,
) -> dict[str, torch.Tensor]:
    """Per-token tensors over the engine's sampled response tokens (flattened, mask 1 only):
    old, roll (log-probs), p_old, k3, abs_dp, entropy (the trainer's, nats)."""
    tokens, mask, roll = sample(world, params, prompts, generator, precision)
    stats = world.token_stats(params, prompts, tokens)
    on = mask > 0
    old, roll = stats.logp[on].double(), roll[on].double()
    lr = old - roll
    return {
        "old": old,
        "roll": roll,
        "p_old": old.exp(),
        "k3": torch.expm1(lr) - lr,
        "abs_dp": (old.exp() - roll.exp()).abs(),
        "entropy": stats.entropy[on].double(),
    }


def summarize(tok: dict[str, torch.Tensor]) -> dict[str, float]:
    return {
        "tokens": int(tok["k3"].numel()),
        "kl_k3": tok["k3"].mean().item(),
        "kl_k3_se": (tok["k3"].std() / tok["k3"].numel() ** 0.5).item(),
        "max_abs_prob_diff": tok["abs_dp"].max().item(),
        "mean_abs_prob_diff": tok["abs_dp"].mean().item(),
        "mean_entropy": tok["entropy"].mean().item(),
    }


def by_probability(tok: dict[str, torch.Tensor]) -> list[dict[str, float]]:
    """One row per bin of p_old: its share of tokens, mean k3, mean and max |Δp|, mean |Δ log p|."""
    rows = []
    for lo, hi in zip(PROB_BINS[:-1], PROB_BINS[1:]):
        sel = (tok["p_old"] >= lo) & (tok["p_old"] < hi)
        n = int(sel.sum())
        row = {"p_low": lo, "p_high": min(hi, 1.0), "share": n / max(1, tok["p_old"].numel())}
        if n:
            row.update(
                kl_k3=tok["k3"][sel].mean().item(),
                mean_abs_dp=tok["abs_dp"][sel].mean().item(),
                max_abs_dp=tok["abs_dp"][sel].max().item(),
                mean_abs_dlogp=(tok["old"][sel] - tok["roll"][sel]).abs().mean().item(),
            )
        rows.append(row)
    return rows
