"""Tasks: rewards on sampled responses (runner/tasks/base.py says what a task gives). One file per
family of tasks; `task.name` picks one through the lazy registry below."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runner.lookup import LazyRegistry
from runner.tasks.base import CountTask, Task

TASKS = LazyRegistry(
    "task.name",
    {
        "target-count": "runner.tasks.targets:TargetCount",
        "target-threshold": "runner.tasks.targets:TargetThreshold",
        "count-exact": "runner.tasks.count_exact:CountExact",
        "count-asked": "runner.tasks.count_asked:CountAsked",
        "count-in-text": "runner.tasks.count_in_text:CountInText",
        "sort": "runner.tasks.sorting:Sort",
    },
)


def make_task(cfg: Mapping[str, Any], rollout: Mapping[str, Any]) -> Task:
    """Build (and validate) the task of a `task:` config section."""
    cfg = dict(cfg)
    return TASKS.resolve(cfg.get("name")).from_config(cfg, rollout)


__all__ = ["TASKS", "CountTask", "Task", "make_task"]
