"""`is-study run study=train`: train the configured world's policy with a PPO-style loss while a stale,
mismatched rollout engine feeds it, and log every optimizer update.

The training itself is runner/training/ (one step: sample, recompute `old`, correct, update); this
study turns each step's record into the files below and writes the summary.

Outputs in the run dir:
  metrics.csv   one row per update, flushed as written, then one final row (step = train.steps,
                update 0): J(θ_T) after the last update in `objective` (and objective_se), every
                per-update cell empty. "Final J" means this value everywhere: summary.json's
                final_objective, the last J of metrics.csv / sweep.csv, the report's final J(θ).
                A run stopped early (NaN/inf parameters, on_nonfinite=raise) has no final row, and
                its final_objective is null: J of non-finite parameters is undefined.
                - ids: step, update, seed, correction, staleness, precision
                - training: reward (mean over the step's whole batch), objective (the exact J(θ_t) at
                  the start of the step: one exact evaluation a step), loss, grad_norm (before clipping),
                  update_norm (‖Δθ‖ of this update; 0 when skipped), entropy (of π_θ, mean over
                  the mini-batch's tokens)
                - faults: nonfinite_loss, nonfinite_grad, skipped, all_rejected (0/1)
                - the correction's per-batch metrics (is_weight_*, ess, *_masked_fraction,
                  clamped_fraction, kl_k1, kl_k3, chi2_*, log_ppl_diff, max_abs_prob_diff) and
                  ppo_clip_fraction and policy_kl_k3 (runner/core/losses.py); dropped when log.metrics=false
                - wall_ms: ms since training began; dropped when log.timing=false, and then the
                  file is byte-identical across runs of the same config and seed
  tokens.csv    step, seed, correction, staleness, precision (the run's keys, as in metrics.csv, so
                concatenated runs stay self-describing), seq, pos, token, old, roll: every generated
                token's trainer (fp32) and engine
                log-probs, at step 0 and every `log.tokens_every` steps (0 turns it off): the raw
                material of the mismatch diagnostics (log-ratio histogram, p_roll vs p_train).
                Both are float32 values, written with the 9 significant digits that give them back
                exactly (repr of their float64 widening would print 17)
  events.csv    step, kind, detail, action. Kinds: nonfinite_loss, nonfinite_grad (detail: how
                many tokens / entries, which sequences / parameter rows), all_rejected (every
                token of a mini-batch rejected by the correction), nonfinite_params, collapse
  summary.json  initial, final and best objective, events by kind, collapsed, wall time, steps run;
                objective_kind says how J was computed (exact | monte-carlo); zero_grad_fraction (the share
                of updates whose gradient was exactly 0, grad_norm = 0: every advantage 0, or every token
                rejected; θ does not move there, so ESS and grad norm in those stretches say nothing about
                stability); mismatch: where the run sits between trainer and engine, whatever log.* writes
                (runner/training/mismatch_summary.py): token_kl_k3, seq_kl_k3 (k3 summed over a sequence,
                averaged over sequences) and ratio_outside_0.5_2 (fraction of tokens), each as {first, last}:
                means over the first and last 10% of updates (a step's value once per update it had, since
                they share its batch), plus max_abs_prob_diff (the run's maximum) and zero_grad_fraction
  DONE          written last, only when the run completed (it is absent after on_nonfinite=raise)
  and with log.format=parquet metrics.parquet and tokens.parquet, with log.trackers=[...] each tracker's
  files (runner/tracking/, docs/tracking.md), fed each metrics.csv row after the CSV has it

`train.on_nonfinite` and collapse: see runner/training/faults.py. A collapse is logged once as a
`collapse` event; summary.json says which.
"""

from __future__ import annotations

import csv
import io
import sys
import time
from pathlib import Path

import torch
from omegaconf import DictConfig

from runner.core.losses import loss_metrics
from runner.core.schema import CONSTANT_COLUMNS, EVENT_KINDS, TOKEN_COLUMNS, metrics_columns
from runner.errors import StudyFailed, UserError
from runner.progress import Progress
from runner.records import CsvWriter, EventWriter, NumberCsvWriter, fmt, mark_done, write_json_atomic
from runner.studies import plain_config
from runner.tracking import open_trackers
from runner.training.config import Setup
from runner.training.config import load as load_setup
from runner.training.loop import StepRecord, Trainer
from runner.training.mismatch_summary import MismatchSummary

# tokens.csv's cells by column: the run's constants are formatted once (token_row_template), the rest per row
TOKEN_FORMATS = {"step": "%d", "seq": "%d", "pos": "%d", "token": "%d", "old": "%.9g", "roll": "%.9g"}


class NonfiniteError(StudyFailed):
    """train.on_nonfinite=raise met a NaN/inf; the CLI prints it as one line and exits 1."""


def load(cfg: DictConfig) -> Setup:
    """Validate the whole config; every bad value raises a one-line UserError."""
    return load_setup(plain_config(cfg))


def validate(cfg: DictConfig) -> None:
    """Raise the UserError `run` would raise for this config, without writing anything."""
    load(cfg)


def run(cfg: DictConfig, run_dir: Path) -> dict:
    config = plain_config(cfg)
    s = load_setup(config)
    # The tensors are tiny, so an intra-op parallel region only costs; and when several runs share
    # the cores (a parallel sweep, a test runner) OpenMP's spinning threads oversubscribe them:
    # three concurrent default runs took 60–80 s with 2 threads each against 2–7 s with 1.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(s, Path(run_dir), config)
    finally:
        torch.set_num_threads(threads)


def run_constants(s: Setup) -> dict:
    """The run's keys, repeated on every row of metrics.csv and tokens.csv (CONSTANT_COLUMNS)."""
    constants = {
        "seed": s.seed,
        "correction": s.correction.name,
        "staleness": s.mismatch.staleness,
        "precision": s.mismatch.precision,
    }
    assert tuple(constants) == CONSTANT_COLUMNS
    return constants


def open_writers(
    s: Setup, run_dir: Path, monte_carlo: bool = False
) -> tuple[NumberCsvWriter, EventWriter, CsvWriter | None]:
    """metrics.csv, events.csv and (unless log.tokens_every=0) tokens.csv in run_dir."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        constants = run_constants(s)
        metrics_csv = NumberCsvWriter(
            run_dir / "metrics.csv", metrics_columns(s.metrics, s.timing, monte_carlo), constants=constants
        )
        events = EventWriter(run_dir / "events.csv")
        tokens_csv = CsvWriter(run_dir / "tokens.csv", TOKEN_COLUMNS) if s.tokens_every else None
    except OSError as exc:
        raise UserError(f"cannot write to the run dir {run_dir}: {exc.strerror or exc}") from None
    return metrics_csv, events, tokens_csv


def token_row_template(constants: dict) -> str:
    """One %-format for a tokens.csv row: the run's constants (seed, correction, ...) written in, quoted
    as the csv module would quote them, and a format per variable cell (TOKEN_FORMATS)."""
    line = io.StringIO()
    csv.writer(line, lineterminator="").writerow(
        [fmt(constants[c]).replace("%", "%%") if c in constants else "\0" for c in TOKEN_COLUMNS]
    )
    parts = line.getvalue().split("\0")
    variable = [c for c in TOKEN_COLUMNS if c not in constants]
    return "".join(p + f for p, f in zip(parts, [TOKEN_FORMATS[c] for c in variable] + [""])) + "\n"


class Writer:
    """One step's record → metrics.csv rows, events.csv rows and tokens.csv rows."""

    def __init__(self, s: Setup, run_dir: Path, monte_carlo: bool = False, config: dict | None = None):
        self.s = s
        self.metrics_csv, self.events, self.tokens_csv = open_writers(s, run_dir, monte_carlo)
        # after the CSV files: a tracker sees a row only once metrics.csv holds it
        self.trackers = open_trackers(s.trackers, run_dir, config or {}, s.train.updates_per_step)
        self.token_row = token_row_template(run_constants(s))
        self.parquet = s.log_format == "parquet"  # metrics.parquet on close, tokens.parquet as it goes
        self.tokens_parquet = None
        if self.parquet and self.tokens_csv is not None:
            from runner.tracking.parquet import TokenParquetWriter

            self.tokens_parquet = TokenParquetWriter(run_dir / "tokens.parquet", run_constants(s))
        self.t0 = time.perf_counter()
        self.updates_written = self.zero_grad_updates = 0
        self.mismatch = MismatchSummary()  # summary.json's block, whatever log.* writes

    def write(self, rec: StepRecord) -> None:
        s = self.s
        self.mismatch.add(rec.old, rec.rollout.roll, rec.rollout.mask, len(rec.updates))
        if self.tokens_csv is not None and s.tokens_every and rec.step % s.tokens_every == 0:
            columns = _token_columns(rec)
            self.tokens_csv.write_number_rows(list(zip(*columns)), self.token_row)
            if self.tokens_parquet is not None:
                self.tokens_parquet.write_columns(columns)
        objective = {} if rec.objective is None else {"objective": rec.objective}
        if rec.objective_se is not None:
            objective["objective_se"] = rec.objective_se
        for u in rec.updates:
            # one stack (it promotes to float64, the objective's dtype) and one .tolist() for the row;
            # the correction metrics already are Python floats
            named = {
                "reward": rec.reward,
                **objective,
                "loss": u.loss,
                "grad_norm": u.grad_norm,
                "clipped": u.clipped,
                "update_norm": u.update_norm,
                "entropy": u.entropy,
            }
            values = torch.stack([*named.values(), *u.loss_counts]).tolist()
            row = {"objective": "", "objective_se": "", **dict(zip(named, values))}  # "": not evaluated this step
            loss_counts = values[len(named) :]
            row["clipped"] = int(row["clipped"])
            self.updates_written += 1
            self.zero_grad_updates += row["grad_norm"] == 0.0  # exactly: a NaN norm is not a zero gradient
            # metrics.csv's writer takes the constant cells (seed, correction, ...) from the run, the rest by name
            row.update(
                {
                    "step": rec.step,
                    "update": u.update,
                    "nonfinite_loss": int(not u.loss_finite),
                    "nonfinite_grad": int(not u.grad_finite),
                    "skipped": int(u.skipped),
                    "all_rejected": int(u.all_rejected),
                    **u.correction_metrics,
                }
            )
            if s.metrics:
                row.update(loss_metrics(*loss_counts))
            if s.timing:
                row["wall_ms"] = round((time.perf_counter() - self.t0) * 1000, 3)
            self.metrics_csv.write(row)
            self.trackers.row(row)
        for e in rec.events:
            self.events.event(e.step, e.kind, e.detail, e.action)

    def write_final(self, step: int, objective: torch.Tensor, objective_se: torch.Tensor | None) -> None:
        """metrics.csv's last row: J(θ_T) after the last update, at step T = train.steps, update 0, with
        every per-update cell empty (no update was made). It is summary.json's final_objective, so the
        table's last J is the summary's final J."""
        row = dict.fromkeys(self.metrics_csv.columns, "")
        row.update({"step": step, "update": 0, "objective": float(objective)})
        if objective_se is not None:
            row["objective_se"] = float(objective_se)
        self.metrics_csv.write(row)
        self.trackers.row(row)

    def close(self) -> None:
        self.trackers.close()
        self.metrics_csv.close()
        self.events.close()
        if self.tokens_csv is not None:
            self.tokens_csv.close()
        if self.tokens_parquet is not None:
            self.tokens_parquet.close()
            self.tokens_parquet = None
        if self.parquet:
            self.parquet = False  # close() runs twice after an error; one metrics.parquet
            from runner.tracking.parquet import csv_to_parquet

            csv_to_parquet(self.metrics_csv.path)


def _token_columns(rec: StepRecord) -> list[list]:
    """tokens.csv's variable columns (step, seq, pos, token, old, roll) over the generated (masked-in)
    tokens; one tolist() per tensor, not one .item() per value."""
    ro, old = rec.rollout, rec.old
    seq, pos = ro.mask.nonzero(as_tuple=True)
    columns = [
        seq.tolist(),
        pos.tolist(),
        ro.tokens[seq, pos].tolist(),
        old[seq, pos].tolist(),
        ro.roll[seq, pos].tolist(),
    ]
    return [[rec.step] * len(columns[0]), *columns]


class Run:
    """The study's loop around the Trainer: what happened, for the summary."""

    def __init__(self, s: Setup, run_dir: Path, config: dict | None = None):
        self.s, self.run_dir = s, run_dir
        self.trainer = Trainer(s)
        self.writer = Writer(s, run_dir, monte_carlo=self.trainer.objective_fn.monte_carlo, config=config)
        self.steps_run = 0
        self.last_reward = self.final_objective = float("nan")

    def train(self, progress: Progress) -> None:
        s, trainer = self.s, self.trainer
        last_objective = trainer.initial_objective
        for step in range(s.train.steps):
            rec = trainer.step(step)
            self.writer.write(rec)
            self.steps_run = step + 1
            self.last_reward = float(rec.reward)
            if rec.stop == "nonfinite":
                u = rec.updates[-1]
                raise NonfiniteError(
                    f"step {step} update {u.update}: non-finite "
                    f"{'loss' if not u.loss_finite else 'gradient'} (train.on_nonfinite=raise)"
                )
            if rec.stop is not None:
                return
            if rec.objective is not None:
                last_objective = float(rec.objective)
            progress.advance(f"J {last_objective:.3f}")
        final, final_se, events = trainer.finish()
        self.final_objective = float(final)
        self.writer.write_final(s.train.steps, final, final_se)
        for e in events:
            self.writer.events.event(e.step, e.kind, e.detail, e.action)

    def summary(self, status: str) -> dict:
        s, trainer = self.s, self.trainer
        zero_grad_fraction = (
            self.writer.zero_grad_updates / self.writer.updates_written if self.writer.updates_written else 0.0
        )
        return {
            "study": "train",
            "status": status,
            "run_dir": str(self.run_dir),
            "seed": s.seed,
            "policy": s.world.name,
            "correction": s.correction.name,
            "loss": s.loss.name,
            "task": s.task.name,
            "staleness": s.mismatch.staleness,
            "precision": s.mismatch.precision,
            "steps": s.train.steps,
            "steps_run": self.steps_run,
            "updates_run": trainer.updates_run,
            "updates_skipped": trainer.updates_skipped,
            "dynamic_sampling_batches": trainer.extra_batches,  # extra batches drawn (rollout.dynamic_sampling)
            "zero_grad_fraction": zero_grad_fraction,
            "mismatch": self.writer.mismatch.block(zero_grad_fraction),
            "initial_objective": trainer.initial_objective,
            "final_objective": self.final_objective,
            "peak_objective": trainer.collapse.peak,
            "peak_step": trainer.collapse.peak_step,
            "final_reward": self.last_reward,
            "events": {kind: self.writer.events.counts.get(kind, 0) for kind in EVENT_KINDS},
            "nonfinite_params": trainer.params_nonfinite,
            "learned": trainer.collapse.learned,
            "collapsed": trainer.collapse.reason is not None,
            "collapse_step": trainer.collapse.step,
            "collapse_reason": trainer.collapse.reason,
            "objective_kind": "monte-carlo" if trainer.objective_fn.monte_carlo else "exact",
            "objective_every": s.train.objective_every,
            "device": str(s.device),
            "world": s.world.summary(),  # its shape, and a warm start's measurements where it has one
            "wall_s": round(time.perf_counter() - self.writer.t0, 3),
        }


def _run(s: Setup, run_dir: Path, config: dict | None = None) -> dict:
    runner = Run(s, run_dir, config)
    try:
        with Progress("train", s.train.steps, enabled=sys.stderr.isatty() and not s.quiet, info=True) as progress:
            runner.train(progress)
    except NonfiniteError as exc:
        runner.writer.close()
        write_json_atomic(run_dir / "summary.json", runner.summary(status="error"))
        raise NonfiniteError(f"{exc}; metrics.csv, events.csv and summary.json are in {run_dir}") from None
    finally:
        runner.writer.close()
    summary = runner.summary(status="stopped" if runner.trainer.params_nonfinite else "ok")
    write_json_atomic(run_dir / "summary.json", summary)
    mark_done(run_dir)
    if not s.quiet:
        _print_summary(summary)
    return summary


def _print_summary(summary: dict) -> None:
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    events = ", ".join(f"{k} {v}" for k, v in summary["events"].items() if v) or "none"
    if summary["collapsed"]:
        collapsed = f"[red]yes[/red] at step {summary['collapse_step']}: {summary['collapse_reason']}"
    else:
        collapsed = "no" if summary["learned"] else "no, but it never learned (J never rose above its start)"
    console.print(
        f"[bold]train[/bold]  {summary['policy']} · {summary['correction']} · {summary['loss']} · "
        f"k={summary['staleness']} {summary['precision']} · seed {summary['seed']}"
    )
    console.print(
        f"  objective {summary['initial_objective']:.4f} → {summary['final_objective']:.4f}, "
        f"peak {summary['peak_objective']:.4f} at step {summary['peak_step']}"
    )
    console.print(
        f"  {summary['steps_run']} steps · {summary['updates_skipped']} updates skipped · {summary['wall_s']:.1f} s"
    )
    console.print(f"  events: {events} · collapsed: {collapsed}")
