"""Experiment trackers beside metrics.csv: `log.trackers=[jsonl,tensorboard,mlflow,wandb]`.

metrics.csv is always written, first; each chosen tracker then gets the same row under the names of
runner/tracking/names.py (namespaced as verl names them). One file per tracker; a tracker whose package
is missing is refused before the run starts (`check`), one that fails mid-run is dropped with one line
on stderr (runner/tracking/base.py). docs/tracking.md says where each one's files go.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.errors import UserError


@dataclass(frozen=True)
class TrackerSpec:
    module: str  # runner.tracking.MODULE, imported only when chosen
    cls: str
    needs: str | None  # the import its package provides (None: the standard library suffices)
    background: bool = False  # run on a thread of its own (runner/tracking/background.py): it mostly waits


TRACKERS = {
    "jsonl": TrackerSpec("jsonl", "JsonlTracker", None),
    "tensorboard": TrackerSpec("tensorboard", "TensorboardTracker", "tensorboardX"),
    "mlflow": TrackerSpec("mlflow", "MlflowTracker", "mlflow", background=True),
    "wandb": TrackerSpec("wandb", "WandbTracker", "wandb", background=True),
}
EXTRA = "tracking"  # pip install 'is-study[tracking]'


def installed(module: str) -> bool:
    """Whether `module` can be imported (tests replace this to simulate a missing package)."""
    return importlib.util.find_spec(module) is not None


def check(names: Sequence[str]) -> tuple[str, ...]:
    """The chosen trackers, validated: an unknown name or a missing package is one UserError."""
    if isinstance(names, str):
        names = [names]
    chosen = []
    for name in names:
        spec = TRACKERS.get(str(name))
        if spec is None:
            raise UserError(f"log.trackers: unknown tracker {name!r}; choose from {', '.join(TRACKERS)}")
        if spec.needs is not None and not installed(spec.needs):
            raise UserError(f"log.trackers: {name} needs the {spec.needs} package: pip install 'is-study[{EXTRA}]'")
        if name not in chosen:
            chosen.append(str(name))
    return tuple(chosen)


def open_trackers(names: Sequence[str], run_dir: Path, config: dict[str, Any], updates_per_step: int):
    """A Trackers fan-out over the chosen trackers of the run in run_dir (none: a no-op one). A tracker
    that cannot open is reported like one that fails later, and the run goes on without it."""
    from runner.tracking.background import BackgroundTracker
    from runner.tracking.base import Trackers, report_failure
    from runner.tracking.run_info import run_info

    opened = []
    if names:
        info = run_info(run_dir, config)
        for name in names:
            spec = TRACKERS[name]
            try:
                cls = getattr(importlib.import_module(f"runner.tracking.{spec.module}"), spec.cls)
                if spec.background:  # it opens on its thread; an error there is reported at the next row
                    opened.append(BackgroundTracker(name, lambda cls=cls: cls(info)))
                else:
                    opened.append(cls(info))
            except Exception as exc:  # noqa: BLE001 - a tracker never stops the run
                report_failure(name, exc)
    return Trackers(opened, updates_per_step)


FORMATS = {"csv": None, "parquet": "pyarrow"}  # log.format → the package it needs


def check_format(name: Any, option: str = "log.format") -> str:
    """log.format (or aggregate's --format): csv, the default, or parquet, which needs pyarrow."""
    needs = FORMATS.get(str(name), "")
    if needs == "":
        raise UserError(f"{option}: unknown format {name!r}; choose from {', '.join(FORMATS)}")
    if needs is not None and not installed(needs):
        raise UserError(f"{option} {name} needs the {needs} package: pip install 'is-study[{EXTRA}]'")
    return str(name)
