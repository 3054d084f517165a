"""The validated run: every config section read, checked and built before any file is written.
Every bad value raises a one-line UserError naming its key."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from runner import tracking
from runner.config_checks import as_bool, as_choice, as_float, as_int, check_keys
from runner.core.corrections import Correction
from runner.core.losses import LossSpec
from runner.errors import UserError
from runner.tasks import Task, make_task
from runner.training.device import resolve as resolve_device
from runner.training.faults import ON_NONFINITE, CollapseRules
from runner.training.optim import OPTIMIZERS
from runner.worlds.engine import Mismatch
from runner.worlds.protocol import World
from runner.worlds.registry import make_world

ROLLOUT_KEYS = (
    "vocab_size",
    "seq_len",
    "batch_size",
    "group_size",
    "prompt_len",
    "eos_token",
    "adv_std_norm",
    "dynamic_sampling",
)


@dataclass(frozen=True)
class TrainSettings:
    steps: int
    lr: float
    optimizer: str
    updates_per_step: int
    grad_clip: float | None
    on_nonfinite: str
    collapse: CollapseRules
    objective_every: int  # J(θ_t) every N steps (the objective cell is empty in between)
    objective_samples: int  # rollouts per Monte Carlo J, where the world has no exact objective

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> TrainSettings:
        s = "train"
        check_keys(s, cfg, cls.__dataclass_fields__)
        clip = cfg.get("grad_clip")
        return cls(
            steps=as_int(s, cfg, "steps", low=1),
            lr=as_float(s, cfg, "lr", low=0.0, low_open=True),
            optimizer=as_choice(s, cfg, "optimizer", OPTIMIZERS),
            updates_per_step=as_int(s, cfg, "updates_per_step", low=1),
            grad_clip=None if clip is None else as_float(s, cfg, "grad_clip", low=0.0, low_open=True),
            on_nonfinite=as_choice(s, cfg, "on_nonfinite", ON_NONFINITE),
            collapse=CollapseRules.from_config(cfg.get("collapse")),
            objective_every=as_int(s, cfg, "objective_every", low=1, default=1),
            objective_samples=as_int(s, cfg, "objective_samples", low=2, default=512),
        )


@dataclass(frozen=True)
class Setup:
    """Everything a study needs, validated."""

    seed: int
    world: World
    task: Task
    mismatch: Mismatch
    correction: Correction
    loss: LossSpec
    train: TrainSettings
    batch_size: int  # prompts per step
    group_size: int  # responses per prompt
    adv_std_norm: bool
    timing: bool
    metrics: bool
    quiet: bool
    tokens_every: int
    device: torch.device = torch.device("cpu")
    trackers: tuple[str, ...] = ()  # log.trackers (runner/tracking/), beside metrics.csv
    log_format: str = "csv"  # log.format: csv | parquet (metrics.parquet and tokens.parquet beside the CSV)
    dynamic_sampling: int = 0  # DAPO: up to N extra batches a step to replace all-same groups (0: off)


def _section(cfg: Mapping[str, Any], key: str) -> dict:
    node = cfg.get(key)
    if node is None:
        raise UserError(f"config: the {key!r} section is missing")
    return dict(node)


def load(cfg: Mapping[str, Any]) -> Setup:
    """The run described by a resolved config (plain dicts, e.g. OmegaConf.to_container(cfg))."""
    rollout = _section(cfg, "rollout")
    check_keys("rollout", rollout, ROLLOUT_KEYS)
    task = make_task(_section(cfg, "task"), rollout)
    world = make_world(_section(cfg, "policy"), rollout, task)
    seed = as_int("config", {"seed": cfg.get("seed")}, "seed", low=0)
    train = TrainSettings.from_config(_section(cfg, "train"))
    batch_size = as_int("rollout", rollout, "batch_size", low=1)
    group_size = as_int("rollout", rollout, "group_size", low=1)
    if train.updates_per_step > batch_size * group_size:
        raise UserError(
            f"train.updates_per_step ({train.updates_per_step}) > rollout.batch_size × "
            f"rollout.group_size ({batch_size * group_size}): a mini-batch would be empty"
        )
    log = _section(cfg, "log")
    correction = Correction.from_config(_section(cfg, "correction"))
    loss = LossSpec.from_config(_section(cfg, "loss"))
    loss.check_correction(correction)
    return Setup(
        seed=seed,
        world=world,
        task=task,
        mismatch=Mismatch.from_config(_section(cfg, "mismatch")),
        correction=correction,
        loss=loss,
        train=train,
        batch_size=batch_size,
        group_size=group_size,
        adv_std_norm=as_bool("rollout", rollout, "adv_std_norm", default=False),
        timing=as_bool("log", log, "timing", default=True),
        metrics=as_bool("log", log, "metrics", default=True),
        quiet=as_bool("log", log, "quiet", default=False),
        tokens_every=as_int("log", log, "tokens_every", low=0, default=50),
        device=resolve_device(cfg.get("device", "cpu")),
        trackers=tracking.check(log.get("trackers") or ()),
        log_format=tracking.check_format(log.get("format", "csv")),
        dynamic_sampling=as_int("rollout", rollout, "dynamic_sampling", low=0, default=0),
    )
