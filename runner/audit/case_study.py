"""The `case` study: run a case file's tensors through one loss and correction, in float32, and
backpropagate to log_probs. This is the repro card of a bug report."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from runner.audit.case_files import Case, decode_number, encode_nested, encode_number

CHECK_TOLERANCE = 1e-5


def evaluate(case: Case, spec, corr) -> dict[str, Any]:
    """One case → {name, loss, grad, finite, weights, metrics}, non-finite numbers as strings."""
    import torch

    from runner.core.losses import policy_loss

    t = case.tensors(torch.float32)
    lp = t["log_probs"].clone().requires_grad_(True)
    result = policy_loss(spec, corr, lp, t["old_log_probs"], t["rollout_log_probs"], t["advantages"], t["action_mask"])
    if result.loss.requires_grad:
        result.loss.backward()
    grad = lp.grad if lp.grad is not None else torch.zeros_like(lp)
    loss = float(result.loss.detach())
    metrics = {k: encode_number(float(v)) for k, v in result.metrics.items()}
    metrics["nonfinite_loss"] = float(not math.isfinite(loss))
    metrics["nonfinite_grad"] = float(not bool(torch.isfinite(grad).all()))
    metrics["all_rejected"] = float(result.all_rejected)
    return {
        "name": case.name,
        "loss": encode_number(loss),
        "grad": encode_nested(grad.tolist()),
        "finite": math.isfinite(loss) and bool(torch.isfinite(grad).all()),
        "weights": encode_nested(result.correction.coef.tolist()),
        "metrics": metrics,
    }


@dataclass
class Mismatch:
    case: str
    field: str
    expected: Any
    actual: Any

    def __str__(self) -> str:
        return f"{self.case}: {self.field} expected {self.expected}, got {self.actual}"


def _same(expected: Any, actual: Any) -> bool:
    e = decode_number(expected, "expect")
    a = decode_number(actual, "result")
    if math.isnan(e) or math.isnan(a):
        return math.isnan(e) and math.isnan(a)
    if math.isinf(e) or math.isinf(a):
        return e == a
    return abs(e - a) <= CHECK_TOLERANCE


def compare(results: list[dict[str, Any]], expected: list[dict[str, Any]]) -> list[Mismatch]:
    """Compare results with one `expect:` entry's `results` (loss, and grad where given)."""
    out: list[Mismatch] = []
    if len(expected) != len(results):
        return [Mismatch("(file)", "results", f"{len(expected)} results", f"{len(results)} cases")]
    for res, exp in zip(results, expected):
        if "loss" in exp and not _same(exp["loss"], res["loss"]):
            out.append(Mismatch(res["name"], "loss", exp["loss"], res["loss"]))
        if "grad" in exp:
            flat_e = [v for row in exp["grad"] for v in row]
            flat_a = [v for row in res["grad"] for v in row]
            if len(flat_e) != len(flat_a):
                out.append(Mismatch(res["name"], "grad", f"{len(flat_e)} values", f"{len(flat_a)} values"))
                continue
            bad = [i for i, (e, a) in enumerate(zip(flat_e, flat_a)) if not _same(e, a)]
            if bad:
                width = len(res["grad"][0])
                i = bad[0]
                out.append(Mismatch(res["name"], f"grad[{i // width}][{i % width}]", flat_e[i], flat_a[i]))
    return out
