"""wandb: one W&B run per is-study run, in offline mode unless the user chose another (WANDB_MODE), so
it never needs a network; `wandb sync RUN/wandb/offline-run-*` uploads it later. Its files go in
`RUN/wandb/`. A sweep's jobs share a group named after the sweep, with the swept keys in the config.
W&B's console capture and system metrics are off: is-study prints its own lines, and a sampler
thread would cost the run time it does not measure. So are its requirements file (a listing of every
installed package) and machine info, which took 0.2 of W&B's 0.45 s start in this project's benchmark; the
run dir's .hydra/ and summary.json already say what ran. The tracker runs on a thread of its own
(runner/tracking/background.py), so the service process starts while the run does."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from runner.tracking.base import Tracker
from runner.tracking.run_info import RunInfo

PROJECT = "is-study"  # unless WANDB_PROJECT says otherwise


class WandbTracker(Tracker):
    name = "wandb"

    def __init__(self, info: RunInfo):
        import wandb

        super().__init__(info)
        self._wandb = wandb
        settings = wandb.Settings(
            console="off",
            silent=True,
            x_disable_stats=True,
            x_disable_meta=True,
            disable_git=True,
            disable_code=True,
            x_save_requirements=False,
            x_disable_machine_info=True,
        )
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", PROJECT),
            dir=str(info.run_dir),
            name=info.name,
            group=info.group,
            config=dict(info.config),
            mode=os.environ.get("WANDB_MODE", "offline"),
            settings=settings,
        )

    def log(self, step: int, data: Mapping[str, Any]) -> None:
        self.run.log(dict(data), step=step)

    def close(self) -> None:
        self.run.finish()
        # finish() returns before W&B's service process has written the run's file; teardown waits for
        # it, so a finished run's files are whole (a sweep job's, or a test's, read right after)
        self._wandb.teardown()
