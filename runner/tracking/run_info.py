"""Who a tracker run is: its name, its group and its config, read from the files already in its run dir
(Hydra writes `.hydra/config.yaml` and `.hydra/overrides.yaml` there; a sweep writes `sweep.json` in the
sweep dir above each job), so no Hydra is needed here.

A sweep job's group is its sweep (the sweep dir's name) and its config is the sweep's swept keys: the
override keys whose values differ between the jobs of sweep.json, with this job's values, so a tracker's
grouping and parallel-coordinates views sort the jobs by what was swept.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SWEEP_MANIFEST = "sweep.json"  # runner/sweep/command.py's MANIFEST (importing it would pull the sweep in)


@dataclass(frozen=True)
class RunInfo:
    run_dir: Path
    name: str  # the run's name in the tracker: the run dir's name (a sweep job's: SWEEP/JOB)
    group: str | None  # the sweep's name for a sweep job, else None
    config: dict[str, Any] = field(default_factory=dict)  # flat "key.sub": value
    swept: tuple[str, ...] = ()  # which keys of config the sweep varies (empty outside a sweep)

    @property
    def root(self) -> Path:
        """Where files shared by many runs go (mlruns/): beside the run dirs, or beside the sweep."""
        return self.run_dir.parent.parent if self.group is not None else self.run_dir.parent


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} → {"a.b": 1}; lists become their JSON text (trackers take scalars)."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    key = prefix[:-1]
    if isinstance(node, (list, tuple)):
        return {key: json.dumps(node)}
    return {key: node}


def _override_pairs(overrides: list[str]) -> dict[str, str]:
    pairs = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if sep:
            pairs[key.lstrip("+~")] = value
    return pairs


def _sweep_job(run_dir: Path) -> tuple[str, dict[str, str]] | None:
    """(the sweep's name, this job's swept key → value) when run_dir is a job of an is-study sweep."""
    try:
        manifest = json.loads((run_dir.parent / SWEEP_MANIFEST).read_text(encoding="utf-8"))
        jobs = [_override_pairs(job) for job in manifest["jobs"]]
        mine = jobs[int(run_dir.name)]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
    keys = sorted({k for job in jobs for k in job})
    swept = {k: mine.get(k, "") for k in keys if len({job.get(k) for job in jobs}) > 1}
    return run_dir.parent.name, swept


def run_info(run_dir: Path, config: dict[str, Any]) -> RunInfo:
    """`config`: the run's resolved config (plain values), logged flat as the tracker run's config."""
    run_dir = Path(run_dir)
    flat = {k: v for k, v in flatten(config).items() if not k.startswith("hydra.")}
    job = _sweep_job(run_dir)
    if job is None:
        return RunInfo(run_dir, run_dir.name, None, flat)
    sweep, swept = job
    for key, value in swept.items():  # a swept group choice (correction=tis) is no key of the resolved config
        flat.setdefault(key, _scalar(value))
    return RunInfo(run_dir, f"{sweep}/{run_dir.name}", sweep, flat, tuple(swept))


def _scalar(text: str) -> Any:
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if isinstance(value, (str, int, float, bool)) else text
