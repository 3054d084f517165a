"""The synthetic world: a tabular bigram policy (`policy.py`), tasks with an exact objective
(`task.py`) and a stale, numerically mismatched rollout engine (`engine.py`).

Everything a study needs to build the world from a config is re-exported here.
"""

from runner.synthetic.engine import Engine, Mismatch, Rollout, ParamHistory
from runner.synthetic.policy import Bigram
from runner.synthetic.task import Task, exact_gradient, grpo_advantages, make_task

__all__ = [
    "Bigram",
    "Engine",
    "Mismatch",
    "ParamHistory",
    "Rollout",
    "Task",
    "exact_gradient",
    "grpo_advantages",
    "make_task",
]
