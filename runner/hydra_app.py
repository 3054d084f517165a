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


def run(overrides: list[str], task: Callable[[Any], Any]) -> Any:
    """One Hydra run: the run dir (hydra.run.dir) and .hydra/ are Hydra's; `task(cfg)` does the work.
    Returns the task's return value; the task's own UserError propagates unchanged."""
    with _initialized() as hydra:
        job = hydra.run(config_name=CONFIG_NAME, task_function=task, overrides=list(overrides),
                        with_log_configuration=False)
    return job.return_value


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
