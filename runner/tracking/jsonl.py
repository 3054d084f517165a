"""jsonl: `metrics.jsonl` in the run dir, one `{"step": …, "data": {…}}` line per update, the format of
verl's `file` logger (verl/utils/tracking.py's FileLogger at commit b178a3c): compact JSON (no spaces),
NaN and ±inf written as null, as orjson writes them there. Each line is flushed as written."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from runner.tracking.base import Tracker
from runner.tracking.run_info import RunInfo

FILE = "metrics.jsonl"


def _finite_or_none(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


class JsonlTracker(Tracker):
    name = "jsonl"

    def __init__(self, info: RunInfo):
        super().__init__(info)
        self.path = info.run_dir / FILE
        self._file = open(self.path, "w", encoding="utf-8")

    def log(self, step: int, data: Mapping[str, Any]) -> None:
        line = {"step": step, "data": {k: _finite_or_none(v) for k, v in data.items()}}
        self._file.write(json.dumps(line, separators=(",", ":"), allow_nan=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()
