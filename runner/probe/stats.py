"""Summaries of R gradient estimates per arm, for all arms at once (float64).

Batches whose estimate holds a NaN/inf are counted in `nonfinite_rate` and left out of every other
figure: they are what `train.on_nonfinite=skip` drops, so the figures describe the updates a run
would apply. With fewer than 2 finite batches the figures are NaN.

- bias_norm      ‖x̄ − ∇J‖, x̄ the mean estimate over the finite batches
- bias_norm_ci   the radius r of the `ci_level` confidence ball for E[x̂] around x̄: the
                 `ci_level` quantile of ‖x̄* − x̄‖, where x̄* is a bootstrap mean (ci=bootstrap:
                 resampling the R batches) or a draw from the CLT's N(x̄, S/n) (ci=clt, sampled with
                 Gaussian multipliers). bias_norm > r means ∇J is outside the ball: significant bias.
- bias_norm_lo/hi  max(0, bias_norm − r), bias_norm + r: a CI for the true ‖E[x̂] − ∇J‖ (by the
                 triangle inequality it holds whenever the ball does); lo = 0 ⇔ not significant
- bias_norm_debiased  sqrt(max(0, bias_norm² − variance/n)): ‖x̄ − ∇J‖² overstates the squared bias
                 by tr(Cov)/n on average
- variance       tr of the sample covariance of one batch's estimate (unbiased, n − 1)
- mse            mean over batches of ‖x̂ − ∇J‖² (one batch's MSE = bias² + variance)
- rel_mse        mse / ‖∇J‖²: 1 is the MSE of the estimator that always returns 0, so an arm at
                 or above 1 does no better than not updating at all
- norm_ratio     ‖x̄‖ / ‖∇J‖: near 0 when the arm's mean update vanishes (everything masked), which
                 can win on MSE when ‖∇J‖² is smaller than one batch's variance
- cosine         cos(x̄, ∇J);  mean_grad_norm = mean ‖x̂‖;  rel_bias = bias_norm / ‖∇J‖
"""

from __future__ import annotations

import math

import torch


def summarise(
    est: torch.Tensor,
    grad: torch.Tensor,
    ci: str,
    level: float,
    n_boot: int,
    generator: torch.Generator,
    grad_noise: float = 0.0,
) -> dict[str, torch.Tensor]:
    """est [R, K, D] (any float dtype), grad [D] → dict of [K] float64 tensors. `grad_noise`: the
    estimated norm of grad's own error when grad is a Monte Carlo reference (0 when exact); it widens
    every bias CI radius, so a bias is called significant only beyond both uncertainties."""
    est = est.to(torch.float64)
    grad = grad.to(torch.float64).reshape(-1)
    R, K, D = est.shape
    finite = torch.isfinite(est).all(-1)  # [R, K]
    f = finite.to(torch.float64)
    n = f.sum(0)  # [K]
    x = torch.where(finite.unsqueeze(-1), est, 0.0)
    mean = x.sum(0) / n.clamp(min=1).unsqueeze(-1)  # [K, D]
    dev = torch.where(finite.unsqueeze(-1), x - mean, 0.0)
    variance = (dev * dev).sum((0, 2)) / (n - 1).clamp(min=1)
    err = torch.where(finite.unsqueeze(-1), x - grad, 0.0)
    mse = (err * err).sum((0, 2)) / n.clamp(min=1)
    bias = mean - grad
    bias_norm = bias.norm(dim=-1)
    g_norm = grad.norm()
    cosine = (mean @ grad) / (mean.norm(dim=-1) * g_norm).clamp(min=torch.finfo(torch.float64).tiny)
    grad_norm = torch.where(finite, x.norm(dim=-1), 0.0).sum(0) / n.clamp(min=1)
    radius = _radius(dev, f, n, ci, level, n_boot, generator) + grad_noise
    ok = n >= 2
    nan = torch.full((K,), math.nan, dtype=torch.float64)

    def keep(t):
        return torch.where(ok, t, nan)

    return {
        "bias_norm": keep(bias_norm),
        "bias_norm_ci": keep(radius),
        "bias_norm_lo": keep((bias_norm - radius).clamp(min=0)),
        "bias_norm_hi": keep(bias_norm + radius),
        "bias_significant": keep((bias_norm > radius).to(torch.float64)),
        "bias_norm_debiased": keep((bias_norm**2 - variance / n.clamp(min=1)).clamp(min=0).sqrt()),
        "rel_bias": keep(bias_norm / g_norm if g_norm > 0 else nan),
        "variance": keep(variance),
        "mse": keep(mse),
        "rel_mse": keep(mse / g_norm**2 if g_norm > 0 else nan),
        "norm_ratio": keep(mean.norm(dim=-1) / g_norm if g_norm > 0 else nan),
        "cosine": keep(cosine),
        "mean_grad_norm": keep(grad_norm),
        "nonfinite_rate": 1.0 - n / R,
        "n_finite": n,
    }


def _radius(
    dev: torch.Tensor, f: torch.Tensor, n: torch.Tensor, ci: str, level: float, n_boot: int, generator: torch.Generator
) -> torch.Tensor:
    """The `level` quantile of ‖x̄* − x̄‖ per arm. dev [R, K, D] is x − x̄ (0 on non-finite
    batches), f [R, K] the finite indicator. The draws are [n_boot, R] weights times dev, in
    chunks so memory stays bounded."""
    R, K, D = dev.shape
    flat = dev.reshape(R, K * D)
    chunk = max(1, min(n_boot, int(2e7 // max(K * D, 1))))
    norms = []
    done = 0
    while done < n_boot:
        m = min(chunk, n_boot - done)
        if ci == "bootstrap":
            idx = torch.randint(R, (m, R), generator=generator)
            w = torch.zeros(m, R, dtype=torch.float64).scatter_add_(1, idx, torch.ones(m, R, dtype=torch.float64))
            # x̄* − x̄ = Σ_r w_r f_r (x_r − x̄) / Σ_r w_r f_r  (resampled finite batches only)
            counts = (w @ f).clamp(min=1)  # [m, K]
            draw = (w @ flat).view(m, K, D) / counts.unsqueeze(-1)
        else:
            z = torch.randn(m, R, generator=generator, dtype=torch.float64)
            draw = (z @ flat).view(m, K, D) / (n * (n - 1)).clamp(min=1).sqrt().unsqueeze(-1)
        norms.append(draw.norm(dim=-1))
        done += m
    return torch.quantile(torch.cat(norms), level, dim=0)
