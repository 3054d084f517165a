"""What one sweep's jobs may share while Hydra composes each job's config.

Hydra's basic launcher composes every job from scratch (`load_sweep_config`): it re-reads and re-parses
each YAML file of the defaults list with PyYAML's pure-Python loader, deep-copies its whole config
repository first, and collects the garbage of all that against a heap that holds torch. On this conf tree
that is most of a small job's ~0.1 s overhead (`python scripts/bench_sweep.py`). Within one multirun
four things can be shared without changing a single composed value:

  parsed files   a config file's parse result, kept per (source, path) and checked against the file's
                 mtime and size, so an edit during the sweep is read again. Each load gets a deep copy:
                 Hydra pops a config's `defaults` out of what it loaded.
  the merge      the config merged from a defaults list (before the job's value overrides are applied) is
                 a function of that list and of the files' contents only, so jobs that pick the same
                 groups (`seed=range(0,50)`) share one merge, each getting a deep copy. Building the
                 defaults list re-checks every file in it, and any file read anew (first read, or
                 changed) starts a new generation of merges.
  the repository Hydra copies it only so that a config's `hydra.searchpath` cannot change the shared one;
                 here it is copied when that happens (initialize_sources), not before every job.
  the heap       gc.freeze(): the objects alive when the sweep starts (torch, Hydra, the study) are left
                 out of the collector's passes until the sweep ends.

In the launching process `shared_composition()` restores everything on exit, so only `is-study sweep`
sees it. A launcher's worker process (joblib/loky) composes its own jobs and exists only to run them;
runner/hydra_app/worker.py installs the sharing there for good after its first job (`install()`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
import os
from typing import Any, Callable, Iterator


def _file_stamp(source: Any, config_path: str) -> tuple[int, int] | None:
    """(mtime_ns, size) of a file source's config, None for sources that are not files (packages)."""
    if source.scheme() != "file":
        return None
    path = os.path.join(source.path, source._normalize_file_name(config_path))
    try:
        st = os.stat(os.path.realpath(path))
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def install() -> Callable[[], None]:
    """Share parsed files, merges and the repository from now on; returns the function that undoes it."""
    from hydra._internal import config_repository
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.core_plugins.file_config_source import FileConfigSource
    from hydra._internal.core_plugins.importlib_resources_config_source import ImportlibResourcesConfigSource

    restore: list[tuple[Any, str, Any]] = []
    generation = [0]  # files read anew so far: a merged config is reused only within one generation

    def patch(owner: Any, name: str, value: Any) -> None:
        restore.append((owner, name, owner.__dict__.get(name)))
        setattr(owner, name, value)

    for source_type in (FileConfigSource, ImportlibResourcesConfigSource):
        parsed: dict[tuple[str, str], tuple[Any, Any]] = {}

        def load_config(self, config_path: str, _load=source_type.load_config, _parsed=parsed) -> Any:
            key, stamp = (self.path, config_path), _file_stamp(self, config_path)
            hit = _parsed.get(key)
            if hit is None or hit[0] != stamp:
                hit = _parsed[key] = (stamp, _load(self, config_path))
                generation[0] += 1
            return copy.deepcopy(hit[1])

        patch(source_type, "load_config", load_config)

    merged: dict[tuple, Any] = {}

    def compose(self, defaults: list, repo: Any, _compose=ConfigLoaderImpl._compose_config_from_defaults_list) -> Any:
        key = (generation[0], tuple(dataclasses.astuple(d) for d in defaults))
        if key not in merged:
            merged[key] = _compose(self, defaults, repo)
        return copy.deepcopy(merged[key])

    patch(ConfigLoaderImpl, "_compose_config_from_defaults_list", compose)

    caching = config_repository.CachingConfigRepository

    def __init__(self, delegate: Any) -> None:
        self.delegate, self.cache, self._own_delegate = delegate, {}, False

    def initialize_sources(self, config_search_path: Any) -> None:
        if not self._own_delegate:  # Hydra's reason for its copy: never re-point the shared repository
            self.delegate, self._own_delegate = copy.deepcopy(self.delegate), True
        self.delegate.initialize_sources(config_search_path)

    patch(caching, "__init__", __init__)
    patch(caching, "initialize_sources", initialize_sources)

    def undo() -> None:
        for owner, name, original in reversed(restore):
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)

    return undo


@contextlib.contextmanager
def shared_composition() -> Iterator[None]:
    """The sharing above, and the heap frozen, for one multirun in the launching process."""
    undo = install()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        undo()
