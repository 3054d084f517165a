"""Adam (torch's defaults: betas (0.9, 0.999), eps 1e-8, no weight decay) or plain SGD over a dict of
parameter tensors, with torch.optim's single-tensor update formulas, operation for operation (a test
checks the results are identical to torch.optim's).

Why not torch.optim itself: constructing any torch.optim optimizer imports torch._dynamo, about 1 s
of CPU, a third of a default bigram run (on the machine of
docs/performance.md)."""

from __future__ import annotations

import torch

from runner.worlds.protocol import Params

OPTIMIZERS = ("adam", "sgd")


class Optimizer:
    def __init__(
        self, params: Params, kind: str, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8
    ):
        self.params = list(params.values())
        self.kind, self.lr, self.betas, self.eps = kind, lr, betas, eps
        self.t = 0
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self) -> None:
        for p in self.params:
            if p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        if self.kind == "sgd":
            for p in self.params:
                p.add_(p.grad, alpha=-self.lr)
            return
        beta1, beta2 = self.betas
        self.t += 1
        step_size = self.lr / (1 - beta1**self.t)
        bias_correction2_sqrt = (1 - beta2**self.t) ** 0.5
        for p, exp_avg, exp_avg_sq in zip(self.params, self.exp_avg, self.exp_avg_sq):
            grad = p.grad
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(self.eps)
            p.addcdiv_(exp_avg, denom, value=-step_size)


def global_norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    """‖(t₁, t₂, …)‖₂ as a 0-d tensor; one tensor's own norm when there is one (bit for bit)."""
    norms = [torch.linalg.vector_norm(t) for t in tensors]
    return norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.stack(norms))


def clip_(grads: list[torch.Tensor], max_norm: float, norm: torch.Tensor) -> None:
    """clip_grad_norm_'s formula, reusing a norm already computed; NaN stays NaN (on_nonfinite=apply)."""
    with torch.no_grad():
        factor = (max_norm / (norm + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(factor)
