"""What `is-study sweep` asks of Hydra: the jobs a sweep expands to (exactly as the sweep will), the
dry run's validation of them, and the multirun itself, through the project's sweeper
(runner/hydra_app/sweeper.py, on Hydra's public Sweeper interface) and Hydra's launchers unchanged. The
rest of the sweep (resume, progress, failures, aggregation) is Hydra-free, in runner/sweep/command.py
and runner/sweep/aggregate.py."""

from __future__ import annotations

import gc
from typing import Any

from runner.errors import UserError
from runner.hydra_app import worker
from runner.hydra_app.app import CONFIG_NAME, initialized


def sweep_plan(overrides: list[str], validate: bool = False) -> dict:
    """Compose the sweep's master config (multirun mode) and expand its jobs exactly as the project's
    sweeper will: `hydra.sweeper.params` (an experiment's sweep) first, then the command line's task
    overrides (`sweeper.expand_jobs`, BasicSweeper's order and strings). With `validate`, the jobs are
    then checked as the sweeper checks them before launching any (`sweeper.validate_jobs`), so
    `--dry-run` fails where the sweep would, with the same message.

    Returns {"jobs": [[override, ...], ...] (job num = index), "sweep_dir": the resolved
    hydra.sweep.dir, "sweep_dir_varies": whether another launch would resolve it differently (the
    default's time and random suffix), "launcher": hydra.launcher._target_}."""
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from runner.hydra_app.sweeper import PLUGIN_CLASS, expand_jobs, validate_jobs

    with initialized() as hydra:
        cfg = hydra.compose_config(
            config_name=CONFIG_NAME, overrides=list(overrides), run_mode=RunMode.MULTIRUN, with_log_configuration=False
        )
        sweeper = cfg.hydra.sweeper
        target = sweeper.get("_target_")
        if target != PLUGIN_CLASS:
            raise UserError(
                f"sweep: only is-study's sweeper is supported (hydra/sweeper=is-study; hydra.sweeper is {target})"
            )
        params = sweeper.get("params")
        params = OmegaConf.to_container(params, resolve=True) if params is not None else {}
        task_overrides = OmegaConf.to_container(cfg.hydra.overrides.task, resolve=False)
        jobs = expand_jobs(params, task_overrides, hydra.config_loader)
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


def sweep_multirun(overrides: list[str]) -> Any:
    """`is-study sweep`'s multirun: the configured sweeper (ours) and launcher, and the task function
    runner.hydra_app.worker.sweep_job. The objects alive when it starts (torch, Hydra, the study) are
    frozen out of the garbage collector's passes until it ends: a full collection walks torch's ~180k
    objects, and composing each job's config makes enough garbage to trigger some."""
    worker.mark_launching_process()
    with initialized() as hydra:
        gc.freeze()
        try:
            return hydra.multirun(
                config_name=CONFIG_NAME,
                task_function=worker.sweep_job,
                overrides=list(overrides),
                with_log_configuration=False,
            )
        finally:
            gc.unfreeze()
