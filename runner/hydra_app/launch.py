"""What `is-study sweep` asks of Hydra: the jobs a sweep expands to (exactly as Hydra's BasicSweeper
will), the dry run's validation of them, and the multirun itself, through Hydra's own sweeper and
launchers unchanged. The rest of the sweep (resume, progress, failures, aggregation) is Hydra-free, in
runner/sweep/command.py and runner/sweep/aggregate.py."""

from __future__ import annotations

import gc
from typing import Any, Callable

from runner.errors import UserError
from runner.hydra_app import worker
from runner.hydra_app.app import CONFIG_NAME, initialized

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def sweep_plan(overrides: list[str], validate: bool = False) -> dict:
    """Compose the sweep's master config (multirun mode) and expand its jobs exactly as Hydra's
    BasicSweeper will: `hydra.sweeper.params` (an experiment's sweep) first, then the command line's
    task overrides, through Hydra's own override parser and `BasicSweeper.split_arguments`.
    With `validate`, the jobs are then composed as the sweep composes them before launching any
    (`validate_jobs`), so `--dry-run` fails where the sweep would, with the same message.

    Returns {"jobs": [[override, ...], ...] (job num = index), "sweep_dir": the resolved
    hydra.sweep.dir, "sweep_dir_varies": whether another launch would resolve it differently (the
    default's time and random suffix), "launcher": hydra.launcher._target_}."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    with initialized() as hydra:
        cfg = hydra.compose_config(config_name=CONFIG_NAME, overrides=list(overrides), run_mode=RunMode.MULTIRUN,
                                   with_log_configuration=False)
        sweeper = cfg.hydra.sweeper
        target = sweeper.get("_target_")
        if target != BASIC_SWEEPER:
            raise UserError(f"sweep: only Hydra's basic sweeper is supported (hydra.sweeper is {target})")
        params = sweeper.get("params")
        params = OmegaConf.to_container(params, resolve=True) if params is not None else {}
        arguments = [f"{k}={v}" for k, v in params.items()]
        arguments += OmegaConf.to_container(cfg.hydra.overrides.task, resolve=False)
        parsed = OverridesParser.create(config_loader=hydra.config_loader).parse_overrides(arguments)
        batches = BasicSweeper.split_arguments(parsed, None)
        jobs = [list(job) for job in batches[0]]
        if validate:
            validate_jobs(hydra.config_loader, cfg, jobs)
        return {
            "jobs": jobs,
            "sweep_dir": str(cfg.hydra.sweep.dir),
            "sweep_dir_varies": _varies_per_launch(cfg, "hydra.sweep.dir"),
            "launcher": str(cfg.hydra.launcher.get("_target_")),
        }


def _varies_per_launch(cfg: Any, key: str) -> bool:
    """Whether the value at dotted `key` resolves differently at another launch: it uses the time
    (`${now:...}`), or it changes once the resolvers' cache is cleared (`${isstudy_uid:}`, a random
    suffix). The cache is the root config's, so the whole config is copied."""
    import copy

    from omegaconf import OmegaConf

    parent, _, leaf = key.rpartition(".")
    if "${now:" in str(OmegaConf.to_container(OmegaConf.select(cfg, parent), resolve=False).get(leaf)):
        return True
    again = copy.deepcopy(cfg)
    OmegaConf.clear_cache(again)
    return str(OmegaConf.select(again, key)) != str(OmegaConf.select(cfg, key))


def _group_test(loader: Any) -> Callable[[str], bool]:
    """is_group(key) for representative_jobs, asked of Hydra's config loader once per key."""
    groups: dict[str, bool] = {}

    def is_group(key: str) -> bool:
        if key not in groups:
            groups[key] = bool(loader.get_group_options(key))
        return groups[key]

    return is_group


def validate_jobs(loader: Any, master_config: Any, jobs: list[list[str]]) -> None:
    """The dry run's check of what the sweep checks before it launches anything: each representative
    job composed from the master config, as Hydra's `Sweeper.validate_batch_is_legal` composes every
    job. A composition error raises, and `initialized()` words it."""
    for job in representative_jobs(jobs, _group_test(loader)):
        loader.load_sweep_config(master_config=master_config, sweep_overrides=list(job))


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


def sweep_multirun(overrides: list[str]) -> Any:
    """`is-study sweep`'s multirun: Hydra's configured sweeper and launcher, and the task function
    runner.hydra_app.worker.sweep_job. The objects alive when it starts (torch, Hydra, the study) are
    frozen out of the garbage collector's passes until it ends: a full collection walks torch's ~180k
    objects, and composing each job's config makes enough garbage to trigger some."""
    worker.mark_launching_process()
    with initialized() as hydra:
        gc.freeze()
        try:
            return hydra.multirun(config_name=CONFIG_NAME, task_function=worker.sweep_job,
                                  overrides=list(overrides), with_log_configuration=False)
        finally:
            gc.unfreeze()
