"""mlflow: one MLflow run per is-study run, through MlflowClient. The tracking URI is `log.mlflow_uri`,
else MLflow's own MLFLOW_TRACKING_URI, else a local file store `mlruns/` beside the run dirs (beside the
sweep dir for a sweep's jobs). MLflow 3 keeps its file store in maintenance mode and refuses it unless
MLFLOW_ALLOW_FILE_STORE is set, which this tracker sets for that default only. A sweep's jobs share one
experiment named after the sweep (a single run goes to the experiment `is-study`), the config as params.
The tracker runs on a thread of its own (runner/tracking/background.py) and writes the rows waiting there
with one synchronous `log_batch` per MLflow batch limit (1000 metrics), in order."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from runner.tracking.base import Tracker
from runner.tracking.run_info import RunInfo

EXPERIMENT = "is-study"  # the experiment of runs outside a sweep
PARAMS_PER_BATCH = 100  # MLflow's limit on params in one log_batch
PARAM_LENGTH = 6000  # and on a param value's length
METRICS_PER_BATCH = 1000  # and on metrics in one log_batch


def tracking_uri(info: RunInfo, configured: str | None) -> str:
    if configured:
        return configured
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return (info.root / "mlruns").resolve().as_uri()


class MlflowTracker(Tracker):
    name = "mlflow"

    def __init__(self, info: RunInfo):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        super().__init__(info)
        self.uri = tracking_uri(info, info.config.get("log.mlflow_uri"))
        self.client = MlflowClient(tracking_uri=self.uri)
        experiment_id = self._experiment(info.group or EXPERIMENT)
        tags = {"is_study.run_dir": str(info.run_dir)}
        if info.group:
            tags["is_study.sweep"] = info.group
        self.run_id = self.client.create_run(experiment_id, run_name=info.name, tags=tags).info.run_id
        params = [Param(k, str(v)[:PARAM_LENGTH]) for k, v in info.config.items()]
        for i in range(0, len(params), PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[i : i + PARAMS_PER_BATCH])
        from mlflow.entities import Metric

        self._metric = Metric

    def _experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name)
        except Exception:
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def log(self, step: int, data: Mapping[str, Any]) -> None:
        self.log_rows([(step, data)])

    def log_rows(self, rows) -> None:
        # synchronous and from one thread: MLflow's asynchronous logging writes its batches from a pool of
        # threads, whose file-store writers race to create a metric's directory ("[Errno 17] File exists",
        # seen in this benchmark) and may append one metric's values out of order
        now = int(time.time() * 1000)
        metrics = [self._metric(name, float(value), now, step) for step, data in rows for name, value in data.items()]
        for i in range(0, len(metrics), METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + METRICS_PER_BATCH])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
