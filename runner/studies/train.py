"""`is-study run study=train`: train the synthetic bigram policy with a PPO-style loss while a stale,
mismatched rollout engine feeds it, and log every optimizer update.

One step:
  1. push θ into the ring buffer; the engine samples `rollout.batch_size` prompts ×
     `rollout.group_size` responses from θ_{t−k} and reports `roll` (runner/synthetic/engine.py);
  2. rewards, then GRPO advantages (reward − group mean, optionally / group std);
  3. `old` = the trainer's fp32 log-probs under θ_t, once, before any update;
  4. `train.updates_per_step` mini-batch updates (contiguous slices of whole groups when the sizes
     allow): `lp` under the live θ, `runner.losses.policy_loss(...)`, backward, clip, step.

Outputs in the run dir:
  metrics.csv   one row per update, flushed as written:
                - ids: step, update, seed, correction, staleness, precision
                - training: reward (mean over the step's whole batch), objective (the exact J(θ_t) at
                  the start of the step: one exact evaluation a step), loss, grad_norm (before clipping),
                  update_norm (‖Δθ‖ of this update; 0 when skipped), entropy (of π_θ, mean over
                  the mini-batch's tokens)
                - faults: nonfinite_loss, nonfinite_grad, skipped, all_rejected (0/1)
                - the correction's per-batch metrics (is_weight_*, ess, *_masked_fraction,
                  clamped_fraction, kl_k1, kl_k3, chi2_*, log_ppl_diff, max_abs_prob_diff) and
                  ppo_clip_fraction; dropped when log.metrics=false
                - wall_ms: ms since training began; dropped when log.timing=false, and then the
                  file is byte-identical across runs of the same config and seed
  tokens.csv    step, seq, pos, token, old, roll: every generated token's trainer (fp32) and engine
                log-probs, at step 0 and every `log.tokens_every` steps (0 turns it off): the raw
                material of the mismatch diagnostics (log-ratio histogram, p_roll vs p_train).
                Both are float32 values, written with the 9 significant digits that give them back
                exactly (repr of their float64 widening would print 17)
  events.csv    step, kind, detail, action. Kinds: nonfinite_loss, nonfinite_grad (detail: how
                many tokens / entries, which sequences / parameter rows), all_rejected (every
                token of a mini-batch rejected by the correction), nonfinite_params, collapse
  summary.json  initial, final and best objective, events by kind, collapsed, wall time, steps run
  DONE          written last, only when the run completed (it is absent after on_nonfinite=raise)

`train.on_nonfinite`: skip drops the optimizer step of an update whose loss or gradient is NaN/inf
(and logs it); raise writes the files so far and stops with a one-line error; apply lets the
NaN/inf reach the parameters, the poisoning the seed report warns about.

Collapse: a run has collapsed when θ holds a NaN/inf (the run then stops: nothing can be sampled
from it), or when the objective has at some point fallen more than `train.collapse_drop`
(absolute, J is in [0, 1]) below the best objective seen before it. Either is logged once as a
`collapse` event; summary.json says which.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from runner.corrections import Correction, CorrectionResult, apply_correction_split
from runner.errors import StudyFailed, UserError
from runner.losses import LossSpec, policy_loss
from runner.records import CsvWriter, EventWriter, NumberCsvWriter, mark_done, write_json_atomic
from runner.synthetic.engine import Engine, Mismatch, ParamHistory, Rollout
from runner.synthetic.policy import Bigram, as_bool, as_choice, as_float, as_int, check_keys
from runner.synthetic.task import Task, grpo_advantages, make_task

METRICS = ("is_weight_mean", "is_weight_std", "is_weight_min", "is_weight_max", "ess",
           "token_masked_fraction", "seq_masked_fraction", "clamped_fraction", "kl_k1", "kl_k3",
           "chi2_token", "chi2_seq", "log_ppl_diff", "max_abs_prob_diff", "ppo_clip_fraction")
EVENT_KINDS = ("nonfinite_loss", "nonfinite_grad", "all_rejected", "nonfinite_params", "collapse")
ROLLOUT_KEYS = ("vocab_size", "seq_len", "batch_size", "group_size", "prompt_len", "eos_token", "adv_std_norm")
OPTIMIZERS = ("adam", "sgd")
ON_NONFINITE = ("skip", "raise", "apply")


class NonfiniteError(StudyFailed):
    """train.on_nonfinite=raise met a NaN/inf; the CLI prints it as one line and exits 1."""


@dataclass(frozen=True)
class TrainSettings:
    steps: int
    lr: float
    optimizer: str
    updates_per_step: int
    grad_clip: float | None
    on_nonfinite: str
    collapse_drop: float | None

    @classmethod
    def from_config(cls, cfg: dict) -> "TrainSettings":
        s = "train"
        check_keys(s, cfg, cls.__dataclass_fields__)
        clip = cfg.get("grad_clip")
        drop = cfg.get("collapse_drop")
        return cls(
            steps=as_int(s, cfg, "steps", low=1),
            lr=as_float(s, cfg, "lr", low=0.0, low_open=True),
            optimizer=as_choice(s, cfg, "optimizer", OPTIMIZERS),
            updates_per_step=as_int(s, cfg, "updates_per_step", low=1),
            grad_clip=None if clip is None else as_float(s, cfg, "grad_clip", low=0.0, low_open=True),
            on_nonfinite=as_choice(s, cfg, "on_nonfinite", ON_NONFINITE),
            collapse_drop=None if drop is None else as_float(s, cfg, "collapse_drop", low=0.0, low_open=True),
        )


@dataclass(frozen=True)
class Setup:
    """Everything the study needs, validated: built before any file is written."""

    seed: int
    world: Bigram
    task: Task
    mismatch: Mismatch
    correction: Correction
    loss: LossSpec
    train: TrainSettings
    batch_size: int
    group_size: int
    adv_std_norm: bool
    timing: bool
    metrics: bool
    quiet: bool
    tokens_every: int


def _section(cfg: DictConfig, key: str) -> dict:
    node = cfg.get(key)
    if node is None:
        raise UserError(f"config: the {key!r} section is missing")
    return OmegaConf.to_container(node, resolve=True)


def load(cfg: DictConfig) -> Setup:
    """Validate the whole config; every bad value raises a one-line UserError."""
    rollout = _section(cfg, "rollout")
    check_keys("rollout", rollout, ROLLOUT_KEYS)
    world = Bigram.from_config(rollout, _section(cfg, "policy"))
    seed = as_int("config", {"seed": cfg.get("seed")}, "seed", low=0)
    train = TrainSettings.from_config(_section(cfg, "train"))
    batch_size = as_int("rollout", rollout, "batch_size", low=1)
    group_size = as_int("rollout", rollout, "group_size", low=1)
    if train.updates_per_step > batch_size * group_size:
        raise UserError(f"train.updates_per_step ({train.updates_per_step}) > rollout.batch_size × "
                        f"rollout.group_size ({batch_size * group_size}): a mini-batch would be empty")
    log = _section(cfg, "log")
    return Setup(
        seed=seed,
        world=world,
        task=make_task(_section(cfg, "task"), world),
        mismatch=Mismatch.from_config(_section(cfg, "mismatch")),
        correction=Correction.from_config(_section(cfg, "correction")),
        loss=LossSpec.from_config(_section(cfg, "loss")),
        train=train,
        batch_size=batch_size,
        group_size=group_size,
        adv_std_norm=as_bool("rollout", rollout, "adv_std_norm", default=False),
        timing=as_bool("log", log, "timing", default=True),
        metrics=as_bool("log", log, "metrics", default=True),
        quiet=as_bool("log", log, "quiet", default=False),
        tokens_every=as_int("log", log, "tokens_every", low=0, default=50),
    )


def validate(cfg: DictConfig) -> None:
    """Raise the UserError `run` would raise for this config, without writing anything."""
    load(cfg)


def _indices(flags: torch.Tensor, offset: int = 0, limit: int = 20) -> str:
    """'[3,17,…]': the first indices where `flags` is set (sequence indices within the step)."""
    idx = [i + offset for i in flags.nonzero().flatten().tolist()]
    shown = ",".join(str(i) for i in idx[:limit])
    return f"[{shown}{',…' if len(idx) > limit else ''}]"


class Progress:
    """A rich progress bar on a TTY; nothing otherwise."""

    def __init__(self, total: int, enabled: bool):
        self._bar = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeElapsedColumn

            self._bar = Bar(TextColumn("[bold]train[/bold]"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                            console=Console(stderr=True), transient=True)
            self._task = self._bar.add_task("train", total=total, info="")
            self._bar.start()

    def advance(self, info: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, advance=1, info=info)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def run(cfg: DictConfig, run_dir: Path) -> dict:
    s = load(cfg)
    # The tensors are tiny, so an intra-op parallel region only costs; and when several runs share
    # the cores (a parallel sweep, a test runner) OpenMP's spinning threads oversubscribe them:
    # three concurrent default runs took 60–80 s with 2 threads each against 2–7 s with 1.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(s, Path(run_dir))
    finally:
        torch.set_num_threads(threads)


def open_writers(s: Setup, run_dir: Path) -> tuple[NumberCsvWriter, EventWriter, CsvWriter | None]:
    """metrics.csv, events.csv and (unless log.tokens_every=0) tokens.csv in run_dir."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        metrics_csv = NumberCsvWriter(run_dir / "metrics.csv", _columns(s), constants=_constant_cells(s))
        events = EventWriter(run_dir / "events.csv")
        tokens_csv = CsvWriter(run_dir / "tokens.csv", TOKEN_COLUMNS) if s.tokens_every else None
    except OSError as exc:
        raise UserError(f"cannot write to the run dir {run_dir}: {exc.strerror or exc}") from None
    return metrics_csv, events, tokens_csv


def _run(s: Setup, run_dir: Path) -> dict:
    metrics_csv, events, tokens_csv = open_writers(s, run_dir)
    trainer = Trainer(s, metrics_csv, events, tokens_csv)
    progress = Progress(s.train.steps, enabled=sys.stderr.isatty() and not s.quiet)
    try:
        trainer.train(progress)
    except NonfiniteError as exc:
        write_json_atomic(run_dir / "summary.json", trainer.summary(run_dir, status="error"))
        raise NonfiniteError(f"{exc}; metrics.csv, events.csv and summary.json are in {run_dir}") from None
    finally:
        progress.close()
        metrics_csv.close()
        events.close()
        if tokens_csv is not None:
            tokens_csv.close()
    summary = trainer.summary(run_dir, status="stopped" if trainer.params_nonfinite else "ok")
    write_json_atomic(run_dir / "summary.json", summary)
    mark_done(run_dir)
    if not s.quiet:
        _print_summary(summary)
    return summary


TOKEN_COLUMNS = ("step", "seq", "pos", "token", "old", "roll")
TOKEN_ROW = "%d,%d,%d,%d,%.9g,%.9g\n"


def _columns(s: Setup) -> list[str]:
    cols = ["step", "update", "seed", "correction", "staleness", "precision", "reward", "objective", "loss",
            "grad_norm", "update_norm", "entropy", "nonfinite_loss", "nonfinite_grad", "skipped", "all_rejected"]
    if s.metrics:
        cols += METRICS
    if s.timing:
        cols.append("wall_ms")
    return cols


def _constant_cells(s: Setup) -> dict:
    """The metrics.csv cells that are the same in every row of a run."""
    return {"seed": s.seed, "correction": s.correction.name, "staleness": s.mismatch.staleness,
            "precision": s.mismatch.precision}


def _token_rows(step: int, ro: Rollout, old: torch.Tensor) -> list[tuple]:
    """One row per generated (masked-in) token; one tolist() per tensor, not one .item() per value."""
    seq, pos = ro.mask.nonzero(as_tuple=True)
    columns = [seq.tolist(), pos.tolist(), ro.tokens[seq, pos].tolist(), old[seq, pos].tolist(), ro.roll[seq, pos].tolist()]
    return [(step, *values) for values in zip(*columns)]


class Optimizer:
    """Adam (torch's defaults: betas (0.9, 0.999), eps 1e-8, no weight decay) or plain SGD on the
    one parameter tensor, with torch.optim's single-tensor update formulas, operation for operation
    (a test checks the results are identical). Why not torch.optim itself: constructing any
    torch.optim optimizer imports torch._dynamo, about 1 s of CPU, a third of a default run."""

    def __init__(self, param: torch.Tensor, kind: str, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8):
        self.param, self.kind, self.lr, self.betas, self.eps = param, kind, lr, betas, eps
        self.t = 0
        self.exp_avg = torch.zeros_like(param)
        self.exp_avg_sq = torch.zeros_like(param)

    def zero_grad(self) -> None:
        if self.param.grad is not None:
            self.param.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        grad = self.param.grad
        if self.kind == "sgd":
            self.param.add_(grad, alpha=-self.lr)
            return
        beta1, beta2 = self.betas
        self.t += 1
        self.exp_avg.lerp_(grad, 1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step_size = self.lr / (1 - beta1**self.t)
        denom = (self.exp_avg_sq.sqrt() / (1 - beta2**self.t) ** 0.5).add_(self.eps)
        self.param.addcdiv_(self.exp_avg, denom, value=-step_size)


class Trainer:
    def __init__(self, s: Setup, metrics_csv: CsvWriter, events: EventWriter, tokens_csv: CsvWriter | None = None):
        self.s = s
        self.csv = metrics_csv
        self.tokens_csv = tokens_csv
        self.events = events
        # Two streams: token sampling, and the engine's noise and faults; so turning outliers on does
        # not change which tokens are sampled. 2·seed and 2·seed+1 keep seeds 0, 1, 2, ... disjoint.
        self.gen = torch.Generator().manual_seed(2 * s.seed)
        self.noise_gen = torch.Generator().manual_seed(2 * s.seed + 1)
        self.theta = s.world.init_params(self.gen).requires_grad_(True)
        self.opt = Optimizer(self.theta, s.train.optimizer, s.train.lr)
        self.engine = Engine(s.world, s.mismatch)
        self.history = ParamHistory(s.mismatch.staleness)
        self.initial_objective = self.objective()
        self.best_objective, self.best_step = self.initial_objective, 0
        self.collapse_reason: str | None = None
        self.params_nonfinite = False
        self.steps_run = self.updates_run = self.updates_skipped = 0
        self.last_reward = self.final_objective = math.nan
        self._last_row_reward, self._last_objective = math.nan, self.initial_objective
        self.t0 = time.perf_counter()

    def objective_tensor(self) -> torch.Tensor:
        """The exact J(θ) of the live parameters, in float64 (no sampling noise in the curve)."""
        with torch.no_grad():
            return self.s.task.objective(self.s.world, self.theta, torch.float64)

    def objective(self) -> float:
        return float(self.objective_tensor())

    def train(self, progress: Progress) -> None:
        s = self.s
        n = s.batch_size * s.group_size
        # Contiguous slices, so a mini-batch holds whole groups whenever the sizes allow.
        slices = [slice(int(c[0]), int(c[-1]) + 1) for c in torch.arange(n).tensor_split(s.train.updates_per_step)]
        for step in range(s.train.steps):
            self.history.push(self.theta)
            prompts = s.world.sample_prompts(s.batch_size, self.gen).repeat_interleave(s.group_size, 0)
            ro = self.engine.sample(self.history.engine_params(), prompts, self.gen, self.noise_gen)
            rewards = s.task.reward(ro.tokens, ro.mask)
            adv = grpo_advantages(rewards, s.group_size, s.adv_std_norm).unsqueeze(-1).expand_as(ro.mask)
            with torch.no_grad():
                old = Bigram.token_log_probs(Bigram.log_prob_table(self.theta), ro.prev, ro.tokens)
            reward = rewards.mean()
            objective = self.objective_tensor()  # once a step: J(θ_t), the θ that `old` comes from
            if self.tokens_csv is not None and s.tokens_every and step % s.tokens_every == 0:
                self.tokens_csv.write_number_rows(_token_rows(step, ro, old), TOKEN_ROW)
            # A decoupled ratio (old − roll) does not move within a step: evaluate the correction
            # once for the step's batch, each update takes its rows. A bypass ratio (lp − roll)
            # moves with θ, so it is evaluated by each update.
            parts = (apply_correction_split(s.correction, old, ro.roll, ro.mask, slices, metrics=s.metrics)
                     if s.correction.ratio == "decoupled" else [None] * len(slices))
            for update, (sl, part) in enumerate(zip(slices, parts)):
                self.update(step, update, sl, ro, old, adv, reward, objective, part)
                if self.params_nonfinite:
                    break
            self.steps_run = step + 1
            self.last_reward = self._last_row_reward
            if self.params_nonfinite:
                return
            progress.advance(f"J {self._last_objective:.3f}")
        self.final_objective = self.objective()
        self._track_objective(s.train.steps, self.final_objective)

    def update(self, step: int, update: int, sl: slice, ro: Rollout, old: torch.Tensor, adv: torch.Tensor,
               reward: torch.Tensor, objective: torch.Tensor, correction: CorrectionResult | None = None) -> None:
        """One mini-batch update on the sequences `sl` of the step's batch (with their evaluated
        correction, when the step evaluated it), and its metrics row."""
        s = self.s
        theta = self.theta
        mask = ro.mask[sl]
        table = Bigram.log_prob_table(theta)
        lp = Bigram.token_log_probs(table, ro.prev[sl], ro.tokens[sl])
        res = policy_loss(s.loss, s.correction, lp, old[sl], ro.roll[sl], adv[sl], mask, metrics=s.metrics,
                          correction=correction)
        with torch.no_grad():
            ent = Bigram.entropy_table(table)[ro.prev[sl]]
            tokens = res.tokens if res.tokens is not None else mask.sum()
            entropy = (ent * mask).sum() / tokens.clamp(min=1)

        self.opt.zero_grad()
        res.loss.backward()
        grad = theta.grad
        grad_norm = torch.linalg.vector_norm(grad)
        # The one sync that decides control flow; every logged number is converted once, below.
        loss_finite, grad_finite = torch.stack([torch.isfinite(res.loss.detach()), torch.isfinite(grad).all()]).tolist()
        nonfinite = not (loss_finite and grad_finite)
        where = f"update {update}"
        if not loss_finite:
            bad = ~torch.isfinite(res.per_token.detach())
            seqs = bad.any(-1)
            self._event(step, "nonfinite_loss",
                        f"{where}: {int(bad.sum())} token(s) in {int(seqs.sum())} sequence(s) "
                        f"{_indices(seqs, offset=sl.start)}; injected outliers in batch: {int(ro.outliers[sl].sum())}")
        if not grad_finite:
            bad = ~torch.isfinite(grad)
            self._event(step, "nonfinite_grad",
                        f"{where}: {int(bad.sum())} of {grad.numel()} entries, parameter rows {_indices(bad.any(-1))}")
        if res.all_rejected:
            self.events.event(step, "all_rejected", f"{where}: all {int(mask.sum())} tokens of "
                              f"{mask.shape[0]} sequences rejected", "step (zero gradient)")
        # raise: this update is not applied either; its row is written, then the run stops.
        skipped = nonfinite and s.train.on_nonfinite in ("skip", "raise")

        before = theta.detach().clone()
        if not skipped:
            if s.train.grad_clip is not None:
                # clip_grad_norm_'s formula, reusing the norm already computed; NaN stays NaN (apply).
                with torch.no_grad():
                    grad.mul_((s.train.grad_clip / (grad_norm + 1e-6)).clamp(max=1.0))
            self.opt.step()
        else:
            self.updates_skipped += 1
        self.updates_run += 1
        with torch.no_grad():
            delta = theta.detach() - before
            update_norm = torch.linalg.vector_norm(delta)
            params_finite = torch.isfinite(theta).all()

        # one stack (it promotes to float64, the objective's dtype) and one .tolist() for the row;
        # the correction metrics already are Python floats
        counts = [res.clipped_tokens, res.tokens] if s.metrics else []
        reward_f, objective_f, loss_f, grad_norm_f, update_norm_f, entropy_f, params_ok, *clip_counts = torch.stack(
            [reward, objective, res.loss.detach(), grad_norm, update_norm, entropy, params_finite, *counts]).tolist()
        # metrics.csv's writer takes the constant cells (seed, correction, ...) from the run, the rest by name
        row = {"step": step, "update": update, "reward": reward_f, "objective": objective_f, "loss": loss_f,
               "grad_norm": grad_norm_f, "update_norm": update_norm_f, "entropy": entropy_f,
               "nonfinite_loss": int(not loss_finite), "nonfinite_grad": int(not grad_finite), "skipped": int(skipped),
               "all_rejected": int(res.all_rejected), **res.correction.metrics}
        if s.metrics:
            clipped, tokens = clip_counts
            row["ppo_clip_fraction"] = clipped / tokens if tokens else 0.0
        if s.timing:
            row["wall_ms"] = round((time.perf_counter() - self.t0) * 1000, 3)
        self.csv.write(row)
        self._last_row_reward, self._last_objective = reward_f, objective_f
        self._track_objective(step, objective_f)
        if nonfinite and s.train.on_nonfinite == "raise":
            raise NonfiniteError(f"step {step} {where}: non-finite {'loss' if not loss_finite else 'gradient'} "
                                 f"(train.on_nonfinite=raise)")
        if not params_ok:
            self.params_nonfinite = True
            n_bad = int((~torch.isfinite(theta.detach())).sum())
            self.events.event(step, "nonfinite_params", f"{where}: {n_bad} of {theta.numel()} parameters are NaN/inf",
                              "stop")
            self._collapse(step, f"non-finite parameters at step {step} {where}")

    def _event(self, step: int, kind: str, detail: str) -> None:
        self.events.event(step, kind, detail, {"skip": "skip update", "raise": "raise",
                                                "apply": "apply"}[self.s.train.on_nonfinite])

    def _track_objective(self, step: int, value: float) -> None:
        if not math.isfinite(value):
            return
        drop = self.s.train.collapse_drop
        if drop is not None and value < self.best_objective - drop:
            self._collapse(step, f"objective {value:.4f} fell more than {drop:g} below its best "
                                 f"{self.best_objective:.4f} (step {self.best_step})")
        if value > self.best_objective:
            self.best_objective, self.best_step = value, step

    def _collapse(self, step: int, reason: str) -> None:
        if self.collapse_reason is None:
            self.collapse_reason = reason
            self.events.event(step, "collapse", reason, "stop" if self.params_nonfinite else "continue")

    def summary(self, run_dir: Path, status: str) -> dict:
        s = self.s
        return {
            "study": "train",
            "status": status,
            "run_dir": str(run_dir),
            "seed": s.seed,
            "correction": s.correction.name,
            "loss": s.loss.name,
            "task": s.task.name,
            "staleness": s.mismatch.staleness,
            "precision": s.mismatch.precision,
            "steps": s.train.steps,
            "steps_run": self.steps_run,
            "updates_run": self.updates_run,
            "updates_skipped": self.updates_skipped,
            "initial_objective": self.initial_objective,
            "final_objective": self.final_objective,
            "best_objective": self.best_objective,
            "best_step": self.best_step,
            "final_reward": self.last_reward,
            "events": {kind: self.events.counts.get(kind, 0) for kind in EVENT_KINDS},
            "nonfinite_params": self.params_nonfinite,
            "collapsed": self.collapse_reason is not None,
            "collapse_reason": self.collapse_reason,
            "wall_s": round(time.perf_counter() - self.t0, 3),
        }


def _print_summary(summary: dict) -> None:
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    events = ", ".join(f"{k} {v}" for k, v in summary["events"].items() if v) or "none"
    collapsed = f"[red]yes[/red]: {summary['collapse_reason']}" if summary["collapsed"] else "no"
    console.print(f"[bold]train[/bold]  {summary['correction']} · {summary['loss']} · "
                  f"k={summary['staleness']} {summary['precision']} · seed {summary['seed']}")
    console.print(f"  objective {summary['initial_objective']:.4f} → {summary['final_objective']:.4f}, "
                  f"best {summary['best_objective']:.4f} at step {summary['best_step']}")
    console.print(f"  {summary['steps_run']} steps · {summary['updates_skipped']} updates skipped · "
                  f"{summary['wall_s']:.1f} s")
    console.print(f"  events: {events} · collapsed: {collapsed}")
