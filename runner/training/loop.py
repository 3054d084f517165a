"""One training step, in any world, with no I/O: Trainer.step(t) returns a StepRecord of tensors.

A step:
  1. push θ into the ring buffer; the engine samples `batch_size` prompts × `group_size` responses
     from θ_{t−k} and reports `roll` (runner/worlds/engine.py);
  2. rewards, then GRPO advantages (reward − group mean, optionally / group std);
  3. `old` = the trainer's fp32 log-probs under θ_t, once, before any update; J(θ_t) every
     `train.objective_every` steps (exact, or Monte Carlo: runner/training/objective.py);
  4. `train.updates_per_step` mini-batch updates (contiguous slices of whole groups when the sizes
     allow): `lp` under the live θ, `runner.core.losses.policy_loss(...)`, backward, clip, optimizer step.
     A decoupled correction (old − roll) does not move within a step, so it is evaluated once for
     the step's batch and each update takes its rows; a bypass ratio (lp − roll) moves with θ and is
     evaluated by each update.

Each update's record keeps its numbers as 0-d tensors, so the writer converts a whole row in one
`.tolist()`; events are returned as `faults.Event`s, already worded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from runner.core.corrections import CorrectionResult, apply_correction_split
from runner.core.losses import policy_loss
from runner.training import faults
from runner.training.advantages import grpo_advantages
from runner.training.config import Setup
from runner.training.dynamic_sampling import refill
from runner.training.faults import CollapseWatch, Event
from runner.training.objective import make_objective
from runner.training.optim import Optimizer, clip_, global_norm
from runner.worlds.engine import Engine, ParamHistory, Rollout

# mismatch.sampling_stream n > 0 samples from n·S + 2·seed. torch's CPU generator keeps only the low 32 bits
# of a seed (2³² + s draws what s draws), so S is a 32-bit odd number: stream 1 sits near 2.65·10⁹, far from
# every other stream of a realistic seed (2·seed, 2·seed + 1, seed + a multiple of 2³²).
SAMPLING_STREAM = 0x9E3779B1
# The shuffle stream's seed is this + seed, which the run's other two streams (2·seed, 2·seed + 1) never take
# for any seed below it.
SHUFFLE_SEED_OFFSET = 1_000_003


@dataclass
class UpdateRecord:
    update: int
    loss: torch.Tensor  # 0-d, detached
    grad_norm: torch.Tensor  # 0-d, before clipping
    clipped: torch.Tensor  # 0-d 1.0 / 0.0: the grad clip bound (grad_norm > train.grad_clip)
    update_norm: torch.Tensor  # 0-d ‖Δθ‖ of this update (0 when skipped)
    entropy: torch.Tensor  # 0-d mean entropy of π_θ over the mini-batch's tokens
    params_finite: torch.Tensor  # 0-d bool
    loss_finite: bool
    grad_finite: bool
    skipped: bool
    all_rejected: bool
    correction_metrics: dict[str, float]
    loss_counts: list[torch.Tensor]  # LossResult.counts, for runner.core.losses.loss_metrics; [] without metrics


@dataclass
class StepRecord:
    step: int
    rollout: Rollout
    old: torch.Tensor  # [N, T] the trainer's fp32 log-probs under θ_t
    reward: torch.Tensor  # 0-d mean sampled reward of the step
    objective: torch.Tensor | None  # 0-d J(θ_t) (float64); None on steps between evaluations
    objective_se: torch.Tensor | None  # its Monte Carlo standard error; None when exact or not evaluated
    updates: list[UpdateRecord] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    stop: str | None = None  # "nonfinite" (on_nonfinite=raise) | "nonfinite_params"; None: carry on


class Trainer:
    def __init__(self, s: Setup):
        self.s = s
        # Two streams: token sampling, and the engine's noise and faults; so turning outliers on does
        # not change which tokens are sampled. 2·seed and 2·seed+1 keep seeds 0, 1, 2, ... disjoint.
        self.gen = torch.Generator(device=s.device).manual_seed(2 * s.seed)
        self.noise_gen = torch.Generator(device=s.device).manual_seed(2 * s.seed + 1)
        # A third stream, only for a shuffled filter (a control arm), so that every other run's streams are untouched.
        self.shuffle_gen = (
            torch.Generator(device=s.device).manual_seed(SHUFFLE_SEED_OFFSET + s.seed)
            if s.correction.filter_shuffle
            else None
        )
        self.params = {name: p.requires_grad_(True) for name, p in s.world.init_params(self.gen).items()}
        if s.mismatch.sampling_stream:
            # The same θ₀, other prompts and tokens: a fresh generator, far from every other stream.
            self.gen = torch.Generator(device=s.device).manual_seed(
                SAMPLING_STREAM * s.mismatch.sampling_stream + 2 * s.seed
            )
        self.opt = Optimizer(self.params, s.train.optimizer, s.train.lr)
        self.engine = Engine(s.world, s.mismatch)
        self.history = ParamHistory(s.mismatch.staleness)
        self.objective_fn = make_objective(s.world, s.task, s.train.objective_samples, s.seed, s.device)
        n = s.batch_size * s.group_size
        # Contiguous slices, so a mini-batch holds whole groups whenever the sizes allow.
        self.slices = [slice(int(c[0]), int(c[-1]) + 1) for c in torch.arange(n).tensor_split(s.train.updates_per_step)]
        self.initial_objective = self.objective()
        self.collapse = CollapseWatch(s.train.collapse, self.initial_objective)
        self.params_nonfinite = False
        self.updates_run = self.updates_skipped = 0
        self.extra_batches = 0  # drawn by rollout.dynamic_sampling

    def _draw(self) -> tuple[Rollout, torch.Tensor]:
        """One more batch from the engine's current (stale) parameters, and its rewards."""
        s = self.s
        prompts = s.world.sample_prompts(s.batch_size, self.gen).repeat_interleave(s.group_size, 0)
        ro = self.engine.sample(self.history.engine_params(), prompts, self.gen, self.noise_gen)
        return ro, s.task.reward(ro.prompts, ro.tokens, ro.mask)

    def objective_tensor(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """J(θ) of the live parameters in float64, and its standard error (None when exact)."""
        return self.objective_fn(self.params)

    def objective(self) -> float:
        return float(self.objective_tensor()[0])

    def step(self, step: int) -> StepRecord:
        s = self.s
        self.history.push(self.params)
        prompts = s.world.sample_prompts(s.batch_size, self.gen).repeat_interleave(s.group_size, 0)
        ro = self.engine.sample(self.history.engine_params(), prompts, self.gen, self.noise_gen)
        rewards = s.task.reward(ro.prompts, ro.tokens, ro.mask)
        if s.dynamic_sampling:
            ro, rewards, drawn = refill(ro, rewards, s.group_size, s.dynamic_sampling, self._draw)
            self.extra_batches += drawn
        adv = grpo_advantages(rewards, s.group_size, s.adv_std_norm).unsqueeze(-1).expand_as(ro.mask)
        with torch.no_grad():
            old = s.world.token_stats(self.params, ro.prompts, ro.tokens, entropy=False).logp
        record = StepRecord(step=step, rollout=ro, old=old, reward=rewards.mean(), objective=None, objective_se=None)
        if step % s.train.objective_every == 0:
            record.objective, record.objective_se = self.objective_tensor()
            self._note(record, self.collapse.observe_objective(step, float(record.objective)))
        else:
            self._note(record, self.collapse.observe_objective(step, float(record.reward), estimate=True))
        parts = (
            apply_correction_split(
                s.correction, old, ro.roll, ro.mask, self.slices, metrics=s.metrics, generator=self.shuffle_gen
            )
            # bypass and off-policy sequence masking read each update's lp: evaluated per update instead
            if s.correction.ratio == "decoupled" and s.correction.opsm_delta is None
            else [None] * len(self.slices)
        )
        for update, (sl, part) in enumerate(zip(self.slices, parts)):
            record.updates.append(self._update(record, update, sl, adv, part))
            if record.stop is not None:
                break
        return record

    def finish(self) -> tuple[torch.Tensor, torch.Tensor | None, list[Event]]:
        """J(θ_T) after the last update (0-d float64) and its Monte Carlo SE (None when exact), tracked
        like every other objective value at step T = train.steps, and its events."""
        value, se = self.objective_tensor()
        event = self.collapse.observe_objective(self.s.train.steps, float(value))
        return value, se, [] if event is None else [event]

    @staticmethod
    def _note(record: StepRecord, event: Event | None) -> None:
        if event is not None:
            record.events.append(event)

    def _update(
        self, record: StepRecord, update: int, sl: slice, adv: torch.Tensor, correction: CorrectionResult | None
    ) -> UpdateRecord:
        """One mini-batch update on the sequences `sl` of the step's batch."""
        s, ro, step = self.s, record.rollout, record.step
        mask = ro.mask[sl]
        stats = s.world.token_stats(self.params, ro.prompts[sl], ro.tokens[sl])
        res = policy_loss(
            s.loss,
            s.correction,
            stats.logp,
            record.old[sl],
            ro.roll[sl],
            adv[sl],
            mask,
            metrics=s.metrics,
            correction=correction,
            generator=self.shuffle_gen,
        )
        with torch.no_grad():
            tokens = res.tokens if res.tokens is not None else mask.sum()
            entropy = (stats.entropy * mask).sum() / tokens.clamp(min=1)

        self.opt.zero_grad()
        res.loss.backward()
        grads = {name: p.grad for name, p in self.params.items()}
        grad_norm = global_norm(list(grads.values()))
        # The one sync that decides control flow; every logged number is converted once, by the writer.
        loss_finite, grad_finite = torch.stack(
            [torch.isfinite(res.loss.detach()), torch.stack([torch.isfinite(g).all() for g in grads.values()]).all()]
        ).tolist()
        nonfinite = not (loss_finite and grad_finite)
        where = f"update {update}"
        action = faults.ACTIONS[s.train.on_nonfinite]
        if not loss_finite:
            record.events.append(
                Event(
                    step,
                    "nonfinite_loss",
                    faults.nonfinite_loss_detail(where, res.per_token, sl.start, ro.outliers[sl]),
                    action,
                )
            )
        if not grad_finite:
            record.events.append(Event(step, "nonfinite_grad", faults.nonfinite_grad_detail(where, grads), action))
        if res.all_rejected:
            record.events.append(
                Event(
                    step,
                    "all_rejected",
                    f"{where}: all {int(mask.sum())} tokens of {mask.shape[0]} sequences rejected",
                    "step (zero gradient)",
                )
            )
        skipped = faults.skips(s.train.on_nonfinite, nonfinite)

        clip = s.train.grad_clip
        clipped = (grad_norm > clip).to(grad_norm.dtype) if clip is not None else grad_norm.new_zeros(())
        before = [p.detach().clone() for p in self.params.values()]
        if not skipped:
            if clip is not None:
                clip_(list(grads.values()), clip, grad_norm)
            self.opt.step()
        else:
            self.updates_skipped += 1
        self.updates_run += 1
        with torch.no_grad():
            update_norm = global_norm([p.detach() - b for p, b in zip(self.params.values(), before)])
            params_finite = torch.stack([torch.isfinite(p).all() for p in self.params.values()]).all()

        out = UpdateRecord(
            update=update,
            loss=res.loss.detach(),
            grad_norm=grad_norm,
            clipped=clipped,
            update_norm=update_norm,
            entropy=entropy,
            params_finite=params_finite,
            loss_finite=loss_finite,
            grad_finite=grad_finite,
            skipped=skipped,
            all_rejected=res.all_rejected,
            correction_metrics=res.correction.metrics,
            loss_counts=res.counts if s.metrics else [],
        )
        if grad_finite:
            self._note(record, self.collapse.observe_grad_norm(step, update, float(grad_norm)))
        if nonfinite and s.train.on_nonfinite == "raise":
            record.stop = "nonfinite"
        elif not bool(params_finite):
            self.params_nonfinite = True
            record.stop = "nonfinite_params"
            record.events.append(
                Event(step, "nonfinite_params", faults.nonfinite_params_detail(where, self.params), "stop")
            )
            self._note(record, self.collapse.nonfinite_params(step, where))
        return out
