"""`is-study run study=probe`: the exact bias, variance and MSE of every correction's gradient.

The synthetic world knows the exact on-policy gradient ∇J(θ) (runner/synthetic/task.py), so the
probe measures each correction's gradient estimate against it instead of reading training curves:

  1. θ: the initial policy, or `probe.pretrain_steps` on-policy steps of the train study's Trainer.
     The engine samples from θ' = θ after `mismatch.staleness` = k optimizer steps of drift DOWN
     the exact J (so the trainer is k ascent steps ahead), with the rest of `mismatch.*` (precision,
     noise, top-p, faults) applied by the engine as in the train study. runner/probe/world.py.
  2. The exact ∇J(θ), in float64.
  3. `probe.repeats` R batches of B rollouts (B = `probe.batch_size`, or rollout.batch_size ×
     rollout.group_size when null; groups of rollout.group_size responses per prompt). Every arm
     (preset × band) sees the same R batches: common random numbers, so differences between arms
     are paired.
  4. Per batch, every arm's estimate of ∇J: the gradient of −(PPO surrogate) at lp = old, with
     RLOO advantages (probe.baseline) and the seq-mean-token-sum reduction (probe.reduction), which
     is exactly unbiased on-policy. Computed for all arms at once from one set of per-token scores
     (runner/probe/estimator.py); the slow per-arm policy_loss + backward path is kept as the
     reference the tests compare it with.
  5. Per arm: bias_norm and its CI, variance, MSE, cosine, ... (runner/probe/stats.py).

Outputs in the run dir:
  probe.csv     one row per preset × band: preset, faithful, low, high, the figures, and the
                world's config values (seed, staleness, precision, seq_len, vocab_size, ...)
  summary.json  the world, the exact J and ‖∇J‖, one entry per arm, wall time
  DONE          written last
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from runner.core.schema import (
    DEGENERATE_MASKED,
    DEGENERATE_NORM_RATIO,
    PROBE_COLUMNS,
    PROBE_FIGURES,
    PROBE_INTEGER,
    PROBE_WORLD,
)
from runner.errors import UserError
from runner.progress import Progress
from runner.records import CsvWriter, mark_done, write_json_atomic
from runner.studies import plain_config

FIGURES, WORLD, COLUMNS, INTEGER = PROBE_FIGURES, PROBE_WORLD, PROBE_COLUMNS, PROBE_INTEGER


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """The probe's tensors are small: on a shared 2-core machine one intra-op thread is several
    times faster than two. `probe.threads: null` leaves torch's setting alone."""
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def estimate_all(world, arms, progress: Progress | None = None) -> dict[str, torch.Tensor]:
    """The R batches through the fast path: {'grad': [R, K, S·V], 'ess'/'masked'/'seq_masked'/
    'clamped': [R, K], 'engine_kl': [R]}."""
    from runner.probe.estimator import fast_estimates, plan

    probe, policy = world.probe, world.policy
    R, K = probe.repeats, len(arms)
    groups = plan(arms)
    gen, noise_gen = world.generators()
    out = {
        "grad": torch.empty(R, K, world.grad.numel()),
        "ess": torch.empty(R, K),
        "masked": torch.empty(R, K),
        "seq_masked": torch.empty(R, K),
        "clamped": torch.empty(R, K),
        "engine_kl": torch.empty(R, dtype=torch.float64),
    }
    for r in range(R):
        batch = world.sample(gen, noise_gen)
        est = fast_estimates(groups, K, batch, policy, world.params, probe.reduction, policy.seq_len)
        out["grad"][r] = est.grad
        out["ess"][r], out["masked"][r], out["seq_masked"][r] = est.ess, est.masked, est.seq_masked
        out["clamped"][r] = est.clamped
        # k1 estimate of KL(π_engine ‖ π_θ) per token, faults left out: the drift, precision and noise
        clean = (batch.mask > 0) & ~batch.outliers
        out["engine_kl"][r] = float(torch.where(clean, batch.roll - batch.old, 0.0).sum() / clean.sum().clamp(min=1))
        if progress is not None:
            progress.advance()
    return out


def _value(v: torch.Tensor | float, integer: bool = False) -> Any:
    v = float(v)
    if integer and math.isfinite(v):
        return int(v)
    return v


def run(cfg: Any, run_dir: Path) -> dict:
    from runner.probe.stats import summarise
    from runner.probe.world import build, validate

    t0 = time.perf_counter()
    setup, probe, batch_size = validate(plain_config(cfg))  # every check before any file is written
    arms = probe.arms()
    run_dir = Path(run_dir)
    with torch_threads(probe.threads):
        world = build(setup, probe, batch_size)
        t_build = time.perf_counter()
        progress = Progress("probe", probe.repeats, enabled=sys.stderr.isatty() and not setup.quiet)
        try:
            raw = estimate_all(world, arms, progress)
        finally:
            progress.close()
        t_probe = time.perf_counter()
        stats = summarise(
            raw["grad"],
            world.grad,
            probe.ci,
            probe.ci_level,
            probe.n_boot,
            torch.Generator().manual_seed(setup.seed),
            grad_noise=world.reference_noise,
        )
    stats["mean_ess"] = raw["ess"].double().nanmean(0)
    stats["mean_masked_fraction"] = raw["masked"].double().mean(0)
    stats["mean_seq_masked_fraction"] = raw["seq_masked"].double().mean(0)
    stats["clamped_fraction"] = raw["clamped"].double().mean(0)
    stats["degenerate"] = (
        (stats["mean_masked_fraction"] >= DEGENERATE_MASKED) | (stats["norm_ratio"] < DEGENERATE_NORM_RATIO)
    ).double()

    m = setup.mismatch
    policy = setup.world
    world_values = {
        "seed": setup.seed,
        "task": setup.task.name,
        "loss": setup.loss.name,
        "reduction": probe.reduction,
        "baseline": probe.baseline,
        "staleness": m.staleness,
        "precision": m.precision,
        "logit_noise": m.logit_noise,
        "temperature": m.temperature,
        "top_p": m.top_p,
        "outlier_rate": m.outlier_rate,
        "outlier_shift": m.outlier_shift,
        "vocab_size": policy.vocab_size,
        "seq_len": policy.seq_len,
        "prompt_len": policy.prompt_len,
        "eos_token": policy.eos_token,
        "group_size": world.group_size,
        "batch_size": batch_size,
        "repeats": probe.repeats,
        "pretrain_steps": probe.pretrain_steps,
        "drift_lr": probe.drift_lr if probe.drift_lr is not None else setup.train.lr,
        "ci": probe.ci,
        "ci_level": probe.ci_level,
        "objective": world.objective,
        "exact_grad_norm": float(world.grad.norm()),
        "engine_kl": float(raw["engine_kl"].mean()),
        "policy": policy.name,
        "reference": world.reference,
        "reference_noise": world.reference_noise,
    }
    rows = []
    for k, arm in enumerate(arms):
        row = {"preset": arm.preset, "faithful": int(arm.faithful), "low": arm.low, "high": arm.high}
        row.update({name: _value(stats[name][k], name in INTEGER) for name in FIGURES})
        row.update(world_values)
        rows.append(row)

    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with CsvWriter(run_dir / "probe.csv", COLUMNS) as csv_out:
            for row in rows:
                csv_out.write(row)
    except OSError as exc:
        raise UserError(f"cannot write to the run dir {run_dir}: {exc.strerror or exc}") from None
    t_end = time.perf_counter()
    summary = {
        "study": "probe",
        "status": "ok",
        "run_dir": str(run_dir),
        "world": world_values,
        "n_arms": len(arms),
        # the full table is probe.csv; the summary keeps scalars, so a sweep's summary table stays flat
        "best_mse": _best(rows),
        "n_degenerate": sum(1 for r in rows if r["degenerate"] == 1),
        "n_biased": sum(1 for r in rows if r["bias_significant"] == 1),
        "n_nonfinite": sum(1 for r in rows if r["nonfinite_rate"] > 0),
        "build_s": round(t_build - t0, 3),
        "probe_s": round(t_probe - t_build, 3),
        "wall_s": round(t_end - t0, 3),
    }
    write_json_atomic(run_dir / "summary.json", summary)
    mark_done(run_dir)
    if not setup.quiet:
        _print_summary(summary, rows, train_reduction=setup.loss.reduction)
    return summary


def _best(rows: list[dict]) -> dict | None:
    """The arm with the lowest MSE among those that learn: a degenerate arm (it masks nearly every
    token, or its mean update nearly vanishes) can have the lowest MSE by doing nothing."""
    finite = [r for r in rows if math.isfinite(r["mse"]) and r["degenerate"] != 1]
    if not finite:
        return None
    best = min(finite, key=lambda r: r["mse"])
    return {k: best[k] for k in ("preset", "low", "high", "mse", "rel_mse", "bias_norm", "variance")}


def _print_summary(summary: dict, rows: list[dict], train_reduction: str = "token-mean") -> None:
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    w = summary["world"]

    def band(lo, hi):
        return escape(f"[{'—' if lo is None else f'{lo:g}'}, {'—' if hi is None else f'{hi:g}'}]")

    def num(v, fmt=".3g"):
        return "nan" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, fmt)

    console = Console(stderr=True, highlight=False)
    if not console.is_terminal:
        console.width = max(console.width, 130)  # a log file: do not squeeze the table into 80 columns
    console.print(
        f"[bold]probe[/bold] staleness={w['staleness']} precision={w['precision']} "
        f"seq_len={w['seq_len']} vocab={w['vocab_size']} seed={w['seed']}: {w['repeats']} batches × "
        f"{w['batch_size']} rollouts; J={w['objective']:.4f} ‖∇J‖={w['exact_grad_norm']:.4g} "
        + (
            ""
            if w["reference"] == "exact"
            else f"(Monte Carlo reference, its own error ≈{w['reference_noise']:.2g}, added to every CI) "
        )
        + f"engine KL={w['engine_kl']:.3g}/token; CI {w['ci']} {w['ci_level']:g}"
    )
    if (w["reduction"], w["baseline"]) != (train_reduction, "group-mean"):
        # the probe's defaults are chosen for an unbiased on-policy estimate, not to match training
        console.print(
            f"  estimator: {w['reduction']} reduction, {w['baseline']} baseline; not study=train's "
            f"(loss.reduction={train_reduction}, group-mean advantages): probe.reduction / "
            f"probe.baseline set it",
            soft_wrap=True,
        )
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("preset", "band", "bias ± ci", "MSE/‖∇J‖²", "masked", "clamped", "NaN/inf", ""):
        table.add_column(col, no_wrap=True, justify="left" if col in ("preset", "band", "") else "right")
    for a in rows:
        biased = a["bias_significant"] == 1
        bias = f"{num(a['bias_norm'])} ± {num(a['bias_norm_ci'], '.2g')}"
        table.add_row(
            escape(a["preset"]),
            band(a["low"], a["high"]),
            f"[red]{bias}[/red]" if biased else bias,
            num(a["rel_mse"]),
            num(a["mean_masked_fraction"], ".0%"),
            num(a["clamped_fraction"], ".0%"),
            num(a["nonfinite_rate"], ".0%"),
            "[yellow]degenerate[/yellow]" if a["degenerate"] == 1 else "",
        )
    console.print(table)
    if summary["n_degenerate"]:
        console.print(
            f"  degenerate: masks ≥ {DEGENERATE_MASKED:.0%} of tokens or ‖E ĝ‖ < "
            f"{DEGENERATE_NORM_RATIO:g}·‖∇J‖ (it barely updates; never picked as the best MSE)"
        )
    console.print(f"  {summary['wall_s']:.1f} s; probe.csv in {escape(summary['run_dir'])}")
