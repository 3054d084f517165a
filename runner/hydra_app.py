"""The only module that touches Hydra: compose, run and multirun over conf/, and the translation of
Hydra's and OmegaConf's exceptions into one-line `UserError`s.

Hydra is initialised inside `initialize_config_dir` used as a context manager, never at import
time and never through `@hydra.main`, so the CLI controls argv, exit codes and messages.
"""

from __future__ import annotations

import contextlib
import secrets
from pathlib import Path
from typing import Any, Callable, Iterator

from runner.errors import UserError

CONFIG_NAME = "config"
JOB_NAME = "is-study"


def conf_dir() -> Path:
    """conf/ ships inside the wheel as runner/conf; an editable checkout reads the repo's conf/."""
    packaged = Path(__file__).resolve().parent / "conf"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "conf"


def _register_resolvers() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("isstudy_uid"):
        # A short random suffix: two runs started in the same second never share a directory.
        # Hydra resolves hydra.run.dir once per run, so one value per run.
        OmegaConf.register_new_resolver("isstudy_uid", lambda: secrets.token_hex(3), use_cache=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _unknown_option_message(exc: BaseException) -> str | None:
    """Hydra says "Could not find 'correction/foo'" and lists options over many lines; say it in one,
    with the valid names."""
    text = str(exc)
    marker = "Could not find '"
    if marker not in text:
        return None
    missing = text.split(marker, 1)[1].split("'", 1)[0]
    group, _, option = missing.rpartition("/")
    if not group:
        return f"unknown config {missing!r}"
    from runner import registry

    valid = registry.group_options(group)
    if not valid:
        return f"unknown config group {group!r} (in {missing!r})"
    return f"unknown {group} {option!r}; valid: {', '.join(valid)}"


@contextlib.contextmanager
def translated_errors() -> Iterator[None]:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        yield
    except UserError:
        raise
    except (HydraException, OmegaConfBaseException) as exc:
        msg = _unknown_option_message(exc) or _first_line(exc)
        raise UserError(f"config: {msg}") from None


@contextlib.contextmanager
def _initialized() -> Iterator[Any]:
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    _register_resolvers()
    GlobalHydra.instance().clear()
    with translated_errors(), initialize_config_dir(config_dir=str(conf_dir()), job_name=JOB_NAME, version_base=None):
        yield GlobalHydra.instance().hydra


def compose(overrides: list[str] | tuple[str, ...] = (), with_hydra: bool = False):
    """The composed config for these override strings, as a DictConfig."""
    from hydra import compose as hydra_compose

    with _initialized():
        return hydra_compose(config_name=CONFIG_NAME, overrides=list(overrides), return_hydra_config=with_hydra)


def run(overrides: list[str], task: Callable[[Any], Any], validate: Callable[[Any], None] | None = None) -> Any:
    """One Hydra run: the run dir (hydra.run.dir) and .hydra/ are Hydra's; `task(cfg)` does the work.
    `validate(cfg)` runs first on the composed config, before Hydra creates anything on disk, so bad
    input leaves no half-made run dir. Returns the task's return value; the task's own exception
    propagates unchanged (without Hydra's extra "Error executing job" line)."""
    failure: list[Exception] = []

    def guarded(cfg: Any) -> Any:
        # Hydra reports a failed job on stderr before re-raising; keep the exception to ourselves.
        try:
            return task(cfg)
        except Exception as exc:  # noqa: BLE001 - re-raised below, unchanged
            failure.append(exc)
            return None

    with _initialized() as hydra:
        if validate is not None:
            validate(hydra_compose_for_run(hydra, overrides))
        job = hydra.run(config_name=CONFIG_NAME, task_function=guarded, overrides=list(overrides),
                        with_log_configuration=False)
    if failure:
        raise failure[0]
    return job.return_value


def hydra_compose_for_run(hydra: Any, overrides: list[str]) -> Any:
    from hydra.types import RunMode

    return hydra.compose_config(config_name=CONFIG_NAME, overrides=list(overrides), run_mode=RunMode.RUN,
                                with_log_configuration=False)


def multirun(overrides: list[str], task: Callable[[Any], Any]) -> Any:
    """A Hydra multirun with its configured sweeper and launcher."""
    with _initialized() as hydra:
        return hydra.multirun(config_name=CONFIG_NAME, task_function=task, overrides=list(overrides),
                              with_log_configuration=False)


def output_dir() -> Path:
    """The current job's output directory (inside a task function)."""
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir)


def to_container(cfg: Any) -> Any:
    from omegaconf import OmegaConf

    with translated_errors():
        return OmegaConf.to_container(cfg, resolve=True)


def to_yaml(cfg: Any) -> str:
    from omegaconf import OmegaConf

    with translated_errors():
        return OmegaConf.to_yaml(cfg, resolve=True)


def job(cfg: Any) -> Any:
    """The task function of `run` and of every sweep job: a module-level function, so process
    launchers (joblib, submitit, ray) can pickle it."""
    from runner.studies import run_study

    return run_study(cfg, output_dir())


# ----------------------------------------------------------------------------------------- sweeps
# What `is-study sweep` / `aggregate` need from Hydra; the rest of the sweep logic (resume, progress,
# failures, aggregation) is Hydra-free, in runner/sweep.py and runner/aggregate.py.

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def sweep_plan(overrides: list[str]) -> dict:
    """Compose the sweep's master config (multirun mode) and expand its jobs exactly as Hydra's
    BasicSweeper will: `hydra.sweeper.params` (an experiment's sweep) first, then the command line's
    task overrides, through Hydra's own override parser and `BasicSweeper.split_arguments`.

    Returns {"jobs": [[override, ...], ...] (job num = index), "sweep_dir": the resolved
    hydra.sweep.dir, "launcher": hydra.launcher._target_}."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    with _initialized() as hydra:
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
        return {
            "jobs": [list(job) for job in batches[0]],
            "sweep_dir": str(cfg.hydra.sweep.dir),
            "launcher": str(cfg.hydra.launcher.get("_target_")),
        }


def quote_override_value(value: str) -> str:
    """A string as a Hydra override value: single-quoted, with ' and \\ escaped."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def parse_job_overrides(overrides: list[str]) -> list[tuple[str, str]]:
    """(key, value) for each override string of a job's `.hydra/overrides.yaml`, parsed by Hydra's
    override grammar: `+`/`++` prefixes dropped, quotes removed; deletions (`~key`) left out."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    with translated_errors():
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    out = []
    for o in parsed:
        if o.is_delete():
            continue
        value = o.value()
        key = o.key_or_group + (f"@{o.package}" if o.package else "")
        out.append((key, value if isinstance(value, str) else o.get_value_element_as_str()))
    return out


# The pid of the process that called sweep_multirun; a sweep_job running in any other process runs in
# a launcher's worker (joblib/loky, submitit, ray), where _worker_ready() tunes the process once.
_LAUNCHING_PID: int | None = None
_WORKER_STATE = {"plugins_kept": False, "frozen": False}


def _keep_plugins_across_jobs() -> None:
    """Hydra's process launchers (joblib's execute_job, ...) call `Singleton.set_state` at the start of
    every job, and set_state drops the `Plugins` singleton and rediscovers every plugin (~10 ms a
    job, pure overhead: the installed plugins cannot change inside a worker). In a worker only, let
    set_state keep this process's Plugins instance; everything else set_state does is unchanged."""
    from hydra.core.plugins import Plugins
    from hydra.core.singleton import Singleton

    original = Singleton.set_state
    if getattr(original, "_isstudy_keeps_plugins", False):
        return
    plugins = Plugins.instance()

    def set_state(state: Any) -> None:
        instances = state.get("instances") if isinstance(state, dict) else None
        if isinstance(instances, dict) and Plugins not in instances:
            state = {**state, "instances": {**instances, Plugins: plugins}}
        original(state)

    set_state._isstudy_keeps_plugins = True  # type: ignore[attr-defined]
    Singleton.set_state = staticmethod(set_state)


def _freeze_worker_heap() -> None:
    """Called once, after a worker's first job (torch and the study imported by then): move
    everything alive to the GC's permanent generation. loky calls gc.collect() about every second
    in each worker (when psutil is absent) and every full collection walks torch's ~180k objects
    (~90 ms of CPU each); frozen, they are skipped and a collection costs ~0. Nothing a job computes
    changes; the objects frozen were alive anyway (one full collection runs first)."""
    import gc

    gc.collect()
    gc.freeze()


def _in_worker() -> bool:
    import os

    return _LAUNCHING_PID != os.getpid()


def sweep_job(cfg: Any) -> Any:
    """The task function of every `is-study sweep` job (module-level, so joblib, submitit and ray
    can pickle it): skips a job whose dir holds DONE (--resume), reruns a partial one from scratch,
    and turns an exception into <job dir>/ERROR plus a failure marker, so one failing job never
    stops the sweep. See runner.sweep.run_job."""
    from hydra.core.hydra_config import HydraConfig

    from runner import sweep
    from runner.studies import run_study

    worker = _in_worker()
    if worker and not _WORKER_STATE["plugins_kept"]:
        _WORKER_STATE["plugins_kept"] = True
        _keep_plugins_across_jobs()
    hydra_cfg = HydraConfig.get()
    try:
        return sweep.run_job(cfg, Path(hydra_cfg.runtime.output_dir), Path(str(hydra_cfg.sweep.dir)), run_study)
    finally:
        if worker and not _WORKER_STATE["frozen"]:
            _WORKER_STATE["frozen"] = True
            _freeze_worker_heap()


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


@contextlib.contextmanager
def _representative_validation() -> Iterator[None]:
    """Hydra's BasicSweeper composes every job's config to validate a batch before launching it, and
    the launcher then composes each again to run it: two full compositions per job (~0.1 s each on
    this conf tree), the bulk of a small job's overhead. For `is-study sweep` only, the validation
    composes the representative jobs instead (see representative_jobs): the same errors are caught
    before anything runs, at a fraction of the cost. Restored on exit."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    had_own = "validate_batch_is_legal" in BasicSweeper.__dict__
    original = BasicSweeper.validate_batch_is_legal
    groups: dict[str, bool] = {}

    def validate(self, batch):
        loader = self.hydra_context.config_loader

        def is_group(key: str) -> bool:
            if key not in groups:
                groups[key] = bool(loader.get_group_options(key))
            return groups[key]

        return original(self, representative_jobs([list(b) for b in batch], is_group))

    BasicSweeper.validate_batch_is_legal = validate
    try:
        yield
    finally:
        if had_own:
            BasicSweeper.validate_batch_is_legal = original
        else:
            del BasicSweeper.validate_batch_is_legal


def sweep_multirun(overrides: list[str]) -> Any:
    """`is-study sweep`'s multirun: Hydra's configured sweeper and launcher, the task function
    `sweep_job`, and the representative validation above."""
    import os

    global _LAUNCHING_PID
    _LAUNCHING_PID = os.getpid()
    with _initialized() as hydra, _representative_validation():
        return hydra.multirun(config_name=CONFIG_NAME, task_function=sweep_job, overrides=list(overrides),
                              with_log_configuration=False)
