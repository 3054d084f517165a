"""The task function of every `is-study sweep` job, and the tuning of the process it runs in.

`sweep_job` is module-level, so joblib, submitit and ray can pickle it. The job's own logic (resume,
failure isolation) is Hydra-free, in runner/sweep/job.py; what needs Hydra (the job's dirs, making its
config quiet) is here. In a launcher's worker process, the first job also tunes the process once.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from runner.hydra_app.app import register_resolvers
from runner.sweep import job as job_logic

# A launcher's worker imports this module to unpickle the task function, before Hydra resolves the
# job's dir there: hydra.sweep.subdir uses our resolver (isstudy_job_dir).
register_resolvers()

# The pid of the process that launched the sweep (runner.hydra_app.launch); a sweep_job running in any
# other process runs in a launcher's worker (joblib/loky, submitit, ray).
_LAUNCHING_PID: int | None = None
_WORKER_STATE = {"frozen": False}


def mark_launching_process() -> None:
    """Called by the process that launches the sweep: its jobs are not in a worker."""
    global _LAUNCHING_PID
    _LAUNCHING_PID = os.getpid()


def _in_worker() -> bool:
    return _LAUNCHING_PID != os.getpid()


def _freeze_worker_heap() -> None:
    """Called once, after a worker's first job (torch and the study imported by then): move
    everything alive to the GC's permanent generation. loky calls gc.collect() about every second
    in each worker (when psutil is absent) and every full collection walks torch's ~180k objects
    (~90 ms of CPU each); frozen, they are skipped and a collection costs ~0. Nothing a job computes
    changes; the objects frozen were alive anyway (one full collection runs first)."""
    import gc

    gc.collect()
    gc.freeze()


def _force_quiet(cfg: Any) -> None:
    """A sweep's jobs draw no progress bars and print no summaries (several at once, or under the
    sweep's own bar). Only printing changes; the results do not."""
    from omegaconf import open_dict, read_write

    if cfg.get("log") is not None and "quiet" in cfg.log:
        with read_write(cfg), open_dict(cfg):
            cfg.log.quiet = True


def _quiet_study(cfg: Any, job_dir: Path) -> Any:
    # looked up at call time: a benchmark may wrap runner.studies.run_study to count its CPU time
    from runner.studies import run_study

    _force_quiet(cfg)
    return run_study(cfg, job_dir)


def sweep_job(cfg: Any) -> Any:
    """Run one sweep job in its dir (see runner.sweep_job.run_job): skipped when it holds DONE
    (--resume), rerun from scratch when partial, and a failure recorded in <job dir>/ERROR instead of
    raised, so one failing job never stops the sweep."""
    from hydra.core.hydra_config import HydraConfig

    worker = _in_worker()
    hydra_cfg = HydraConfig.get()
    try:
        return job_logic.run_job(cfg, Path(hydra_cfg.runtime.output_dir), Path(str(hydra_cfg.sweep.dir)), _quiet_study)
    finally:
        if worker and not _WORKER_STATE["frozen"]:
            _WORKER_STATE["frozen"] = True
            _freeze_worker_heap()
