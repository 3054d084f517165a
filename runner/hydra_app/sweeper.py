"""The project's Hydra sweeper (`hydra/sweeper=is-study`, the root config's default): BasicSweeper's
config (`params`, `max_batch_size`), syntax and job order, built on Hydra's public Sweeper interface.

Why not Hydra's BasicSweeper: before each batch it composes every job's config
(`Sweeper.validate_batch_is_legal`), and the launcher then composes each again, so a sweep of cheap jobs
paid for its configs twice. This sweeper composes one representative job per combination of
config-group choices (`representative_jobs`): a job's composition can fail only through which configs
it picks or which keys it sets, never through a plain key's value, so those find every error the full
check would, with the same message. Everything else is as BasicSweeper does it: the jobs are expanded
by `expand_jobs` (Hydra's override grammar; the order and strings of `BasicSweeper.split_arguments`),
multirun.yaml is saved in the sweep dir, and the batches go to the configured launcher in order.

Hydra instantiates plugins only from the `hydra_plugins` namespace package, so the class Hydra is
given (PLUGIN_CLASS) is hydra_plugins/is_study_sweeper.py's subclass of `ExpandingSweeper`; its config is
registered by `register_config`. `is-study sweep --dry-run` (runner/hydra_app/launch.py) expands and
validates with the same functions.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.plugins.sweeper import Sweeper
from omegaconf import OmegaConf

CONFIG_NAME = "is-study"  # hydra/sweeper=is-study
PLUGIN_CLASS = "hydra_plugins.is_study_sweeper.IsStudySweeper"  # hydra.sweeper._target_


def expand_jobs(params: dict[str, Any] | None, arguments: Sequence[str], config_loader: Any = None) -> list[list[str]]:
    """The jobs of a sweep, as Hydra's BasicSweeper expands them: the config's `params` (an experiment's
    sweep) first, then the command line's task overrides; each override's key keeps the place where it
    first appeared (a later one replaces its values); the cartesian product, the last key fastest."""
    strings = [f"{key}={value}" for key, value in (params or {}).items()] + list(arguments)
    parsed = OverridesParser.create(config_loader=config_loader).parse_overrides(strings)
    choices: dict[str, list[str]] = {}
    for override in parsed:
        key = override.get_key_element()
        if not override.is_sweep_override():
            choices[key] = [f"{key}={override.get_value_element_as_str()}"]
        elif override.is_discrete_sweep():
            choices[key] = [f"{key}={value}" for value in override.sweep_string_iterator()]
        else:  # interval(0,1): a continuous range, for an optimising sweeper; BasicSweeper's message
            raise HydraException(f"BasicSweeper does not support sweep type : {override.value_type.name}")
    return [list(job) for job in itertools.product(*choices.values())]


def batches(jobs: list[list[str]], max_batch_size: int | None) -> Iterable[list[list[str]]]:
    """The jobs in launch order, at most max_batch_size at a time (null: all at once)."""
    if max_batch_size is None:
        yield jobs
        return
    if not isinstance(max_batch_size, int) or max_batch_size < 1:
        raise HydraException(f"hydra.sweeper.max_batch_size={max_batch_size}: a positive number of jobs, or null")
    for start in range(0, len(jobs), max_batch_size):
        yield jobs[start : start + max_batch_size]


def group_test(loader: Any) -> Callable[[str], bool]:
    """is_group(key) for representative_jobs, asked of Hydra's config loader once per key."""
    groups: dict[str, bool] = {}

    def is_group(key: str) -> bool:
        if key not in groups:
            groups[key] = bool(loader.get_group_options(key))
        return groups[key]

    return is_group


def representative_jobs(jobs: list[list[str]], is_group: Callable[[str], bool]) -> list[list[str]]:
    """One job per distinct combination of config-group choices (and set of keys). Composing a job can
    fail only through which configs are picked (`correction=nope`) or which keys are set
    (`correction.hgh=2`), not through the value of a plain key (`seed=7`), so composing these
    representatives finds the errors that composing every job would."""
    seen: set[tuple] = set()
    chosen = []
    for job in jobs:
        signature = []
        for o in job:
            key, _, value = o.partition("=")
            bare = key.lstrip("+~")
            signature.append((key, value if is_group(bare.split("@", 1)[0]) else None))
        sig = tuple(signature)
        if sig not in seen:
            seen.add(sig)
            chosen.append(job)
    return chosen


def validate_jobs(loader: Any, master_config: Any, jobs: list[list[str]]) -> None:
    """Compose each representative job from the sweep's master config, as a launcher will compose it:
    the first that cannot be composed raises Hydra's own error, before any job runs."""
    for job in representative_jobs(jobs, group_test(loader)):
        loader.load_sweep_config(master_config=master_config, sweep_overrides=list(job))


class ExpandingSweeper(Sweeper):
    """BasicSweeper's behaviour with one composition per job (the launcher's) instead of two."""

    def __init__(self, max_batch_size: int | None = None, params: dict[str, str] | None = None) -> None:
        super().__init__()
        self.max_batch_size = max_batch_size
        self.params = params or {}
        self.hydra_context: Any = None
        self.config: Any = None
        self.launcher: Any = None

    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        from hydra.core.plugins import Plugins

        self.hydra_context = hydra_context
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> Any:
        loader = self.hydra_context.config_loader
        jobs = expand_jobs(self.params, arguments, loader)
        chunks = list(batches(jobs, self.max_batch_size))
        validate_jobs(loader, self.config, jobs)
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        returns = []
        initial_job_idx = 0
        for batch in chunks:
            results = self.launcher.launch(batch, initial_job_idx=initial_job_idx)
            for r in results:
                _ = r.return_value  # raises a job's exception, as BasicSweeper does
            initial_job_idx += len(batch)
            returns.append(results)
        return returns


@dataclass
class ExpandingSweeperConf:
    """BasicSweeperConf's fields and types (a value of `params` is read as a string), so every
    experiment's `hydra.sweeper.params` composes as it did under BasicSweeper."""

    _target_: str = ""
    max_batch_size: int | None = None
    params: dict[str, str] | None = None


def register_config() -> None:
    """`hydra/sweeper=is-study` in Hydra's ConfigStore, as a Hydra plugin registers its config. Called
    whenever Hydra is initialised (runner.hydra_app.app.initialized), not from the plugin module, so a
    config composes (the root config names this sweeper) even where hydra_plugins is not importable;
    a launcher's workers get it with the ConfigStore Hydra hands them."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(
        group="hydra/sweeper", name=CONFIG_NAME, node=ExpandingSweeperConf(_target_=PLUGIN_CLASS), provider="is-study"
    )
