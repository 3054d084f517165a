"""What Hydra's joblib launcher sends between the sweeping process and its workers, sent once per sweep.

The launcher (hydra_joblib_launcher/_core.py) hands every job the same three large objects: the
HydraContext (the config loader with its repository, ~23 kB pickled), the master config (~18 kB) and a
copy of every Hydra singleton (~31 kB). loky pickles them again for each job (~8 ms in the sweeping
process, which shares the CPUs with the workers) and each worker unpickles them again (~4 ms); each job
then sends back a JobReturn that carries its whole composed config and Hydra config (~19 kB, ~2 ms),
which nothing in `is-study sweep` reads. On a sweep of small jobs that is a large part of the cost
that a second worker does not halve (`python scripts/bench_sweep.py`).

Within `sent_once()`:
  the arguments  each of the three is pickled once, in the sweeping process, into a blob tagged with a
                 key; a job carries the blob (copying bytes costs ~nothing) and a worker unpickles a key
                 only the first time it sees it, then hands its later jobs the same objects. That is
                 what the basic launcher does in its one process: every job of a sweep gets the same
                 context, master config and singletons, so no composed config can change. A worker
                 keeps only the current sweep's objects.
  the returns    a worker drops the JobReturn's `cfg` and `hydra_cfg` before sending it back; the
                 job's status, return value, overrides and dir are kept. Each job's configs are on disk
                 in its `.hydra/` dir, written by the job itself.
Restored on exit. Nothing changes when the plugin is not installed or its launch code is not the
one this was written against (checked by the names of `execute_job`'s parameters).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import pickle
import uuid
from typing import Any, Iterator

# the parameters of the plugin's execute_job (hydra-joblib-launcher 1.2), and which are sent once
_EXECUTE_JOB_PARAMETERS = ("idx", "overrides", "hydra_context", "config", "task_function", "singleton_state")
_SENT_ONCE = (2, 3, 5)

# in a worker: key → what was unpickled, for one sweep only (a new sweep's first key clears the rest)
_received: dict[str, Any] = {}


def _receive(key: str, blob: bytes) -> Any:
    if key not in _received:
        sweep = key.partition(":")[0]
        for old in [k for k in _received if not k.startswith(sweep + ":")]:
            del _received[old]
        _received[key] = pickle.loads(blob)
    return _received[key]


class _Once:
    """Pickles as a call to _receive(key, blob): the blob is made once, and unpickled once per process.
    Not pickled at all (joblib runs `n_jobs=1` in the sweeping process), it stands for `value`."""

    def __init__(self, key: str, blob: bytes, value: Any) -> None:
        self.key, self.blob, self.value = key, blob, value

    def __reduce__(self) -> tuple:
        return _receive, (self.key, self.blob)


def execute_job_lean(*args: Any) -> Any:
    """The plugin's execute_job, with the JobReturn's configs dropped before it is sent back."""
    from hydra_plugins.hydra_joblib_launcher import _core

    ret = _core.execute_job(*(a.value if isinstance(a, _Once) else a for a in args))
    ret.cfg = ret.hydra_cfg = None
    return ret


def _plugin() -> Any:
    try:
        from hydra_plugins.hydra_joblib_launcher import _core
    except ImportError:  # the [parallel] extra is not installed: there is nothing to send
        return None
    names = tuple(inspect.signature(_core.execute_job).parameters)
    return _core if names == _EXECUTE_JOB_PARAMETERS and hasattr(_core, "delayed") else None


@contextlib.contextmanager
def sent_once() -> Iterator[None]:
    """The sharing above, for the multiruns started inside this block."""
    core = _plugin()
    if core is None:
        yield
        return
    from joblib.externals import cloudpickle

    real_delayed, sweep = core.delayed, f"{os.getpid()}-{uuid.uuid4().hex}"
    wrapped: dict[int, _Once] = {}  # by id; each _Once holds its object, so the id cannot be reused

    def once(value: Any) -> _Once:
        if id(value) not in wrapped:
            wrapped[id(value)] = _Once(f"{sweep}:{len(wrapped)}", cloudpickle.dumps(value), value)
        return wrapped[id(value)]

    def delayed(function: Any) -> Any:
        if function is not core.execute_job:
            return real_delayed(function)

        def call(*args: Any) -> Any:
            sent = [once(a) if i in _SENT_ONCE else a for i, a in enumerate(args)]
            return real_delayed(execute_job_lean)(*sent)

        return call

    core.delayed = delayed
    try:
        yield
    finally:
        core.delayed = real_delayed
