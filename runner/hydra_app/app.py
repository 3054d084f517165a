"""Hydra as an application: compose the config of conf/, run one job, and turn Hydra's and
OmegaConf's exceptions into one-line `UserError`s.

Hydra is initialised inside `initialize_config_dir` used as a context manager, never at import
time and never through `@hydra.main`, so the CLI controls argv, exit codes and messages.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from runner.errors import UserError
from runner.paths import conf_dir

CONFIG_NAME = "config"
JOB_NAME = "is-study"


def job_dir_name(num: Any, width: Any) -> str:
    """A sweep job's dir name: its number zero-padded to the sweep's width (00, 01, … 11), so the
    dirs sort as the jobs do."""
    return f"{int(num):0{int(width)}d}"


def register_resolvers() -> None:
    """Our resolvers, in every process that composes or resolves our config: this one, and (through
    runner/hydra_app/worker.py, imported to unpickle the task function) a launcher's workers, where
    Hydra resolves each job's dir."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("isstudy_uid"):
        # A short random suffix: two runs started in the same second never share a directory.
        # Hydra resolves hydra.run.dir once per run, so one value per run.
        OmegaConf.register_new_resolver("isstudy_uid", lambda: secrets.token_hex(3), use_cache=True)
    if not OmegaConf.has_resolver("isstudy_job_dir"):
        OmegaConf.register_new_resolver("isstudy_job_dir", job_dir_name)


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
    from runner import registry

    # `experiment=mlp/tis-tames` is Hydra's 'experiment/mlp/tis-tames': the group is the one the user
    # named (the first prefix that is a group of ours), not everything before the last slash.
    named = [g for g in registry.GROUPS if missing.startswith(g + "/")]
    group, _, option = (named[0], "", missing[len(named[0]) + 1 :]) if named else missing.rpartition("/")
    if not group:
        return f"unknown config {missing!r}"
    valid = registry.group_options(group)
    if not valid:
        return f"unknown config group {group!r} (in {missing!r})"
    near = _nearest(option, valid)
    if near:
        return f"unknown {group} {option!r}; did you mean {' or '.join(near)}? (valid: {', '.join(valid)})"
    return f"unknown {group} {option!r}; valid: {', '.join(valid)}"


def _nearest(word: str, candidates: list[str]) -> list[str]:
    """At most two candidates close to a mistyped `word`, best first; compared whole and, for an option in
    a sub-folder (`mlp/tis-tames-mismatch`), by its last part too."""
    import difflib

    def score(candidate: str) -> float:
        forms = {candidate, candidate.rsplit("/", 1)[-1]}
        cut_short = len(word) >= 3 and any(f.startswith(word) for f in forms)  # `tis-tames` for tis-tames-mismatch
        return max([difflib.SequenceMatcher(None, word, f).ratio() for f in forms] + [0.8 * cut_short])

    scored = sorted(((score(c), c) for c in candidates), key=lambda sc: (-sc[0], sc[1].count("/"), sc[1]))
    return [c for s, c in scored if s >= max(0.75, scored[0][0] - 0.05)][:2] if scored else []


def _bare_word_message(exc: BaseException) -> str | None:
    """`is-study sweep threshold-tradeoff` (no `experiment=`): Hydra says "Error parsing override" and
    "missing EQUAL"; say that an override is KEY=VALUE, and which group the word is an option of."""
    text = str(exc)
    marker = "Error parsing override '"
    if marker not in text or "missing EQUAL" not in text:
        return None
    word = text.split(marker, 1)[1].splitlines()[0].rsplit("'", 1)[0]
    if "=" in word:
        return None
    from runner import registry

    options = [(g, o) for g in registry.GROUPS if g != "cases" for o in registry.group_options(g)]
    names = [o for g, o in options if o == word] or _nearest(word, sorted({o for g, o in options}))
    near = [f"{g}={o}" for name in names for g, o in options if o == name]
    hint = f"; did you mean {' or '.join(near[:2])}?" if near else " (e.g. correction=tis; see is-study list)"
    return f"{word!r} is not an override: write KEY=VALUE{hint}"


def _sweep_value_message(exc: BaseException) -> str | None:
    """`is-study run correction.high=2,5`: Hydra says "Ambiguous value ... add --multirun" (or, for
    range(...), "Sweep parameters ... requires --multirun"); say what to type instead."""
    text = str(exc)
    for marker in ("Ambiguous value for argument '", "Sweep parameters '"):
        if marker in text:
            override = text.split(marker, 1)[1].split("\n", 1)[0].rsplit("'", 1)[0]
            break
    else:
        return None
    from runner import registry

    key, _, value = override.partition("=")
    kind = "a comma-separated value sweeps" if marker.startswith("Ambiguous") else "a sweep over values"
    message = f"{override}: {kind}: use `is-study sweep` with the same overrides (`--dry-run` lists its jobs)"
    if marker.startswith("Ambiguous") and not registry.group_options(key.lstrip("+~")):
        message += f"; for a list write {key}=[{value}], for a string {key}='{value}'"
    return message


def _config_keys(node: Any, prefix: str = "") -> list[str]:
    """Every dotted key under a DictConfig node, leaves and sections alike, without resolving."""
    from omegaconf import DictConfig

    out = []
    for key in node.keys() if isinstance(node, DictConfig) else ():
        full = f"{prefix}.{key}" if prefix else str(key)
        out.append(full)
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
            out.extend(_config_keys(child, full))
    return out


def _unknown_key_message(exc: BaseException) -> str | None:
    """Hydra says "Could not override 'train.step'. To append to your config use +train.step=10";
    say which key is unknown and the nearest real one (a typo is the usual cause)."""
    import difflib

    text = str(exc)
    marker = "Could not override '"
    if marker not in text:
        return None
    key = text.split(marker, 1)[1].split("'", 1)[0]
    message = f"unknown key {key!r}"
    parent = getattr(exc.__cause__, "parent_node", None)
    if parent is None:
        return message
    keys = [k for k in _config_keys(parent._get_root()) if not k.startswith("hydra.") or key.startswith("hydra.")]
    keys = [k for k in keys if not key.startswith(k + ".")]  # not the section the key is in
    scored = sorted(((difflib.SequenceMatcher(None, key, k).ratio(), k) for k in keys), reverse=True)
    near = [k for score, k in scored if score >= max(0.75, scored[0][0] - 0.05)] if scored else []
    if near:
        return f"{message}; did you mean {' or '.join(near[:2])}?"
    section = key.split(".", 1)[0]
    if section in _STUDY_SECTIONS and not any(k == section or k.startswith(section + ".") for k in keys):
        return f"{message}: {section}.* keys belong to study={_STUDY_SECTIONS[section]}"
    return message


_STUDY_SECTIONS = {"probe": "probe"}  # config sections that only one study's config brings


@contextlib.contextmanager
def translated_errors() -> Iterator[None]:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        yield
    except UserError:
        raise
    except (HydraException, OmegaConfBaseException) as exc:
        msg = (
            _unknown_option_message(exc)
            or _unknown_key_message(exc)
            or _bare_word_message(exc)
            or _sweep_value_message(exc)
            or _first_line(exc)
        )
        raise UserError(f"config: {msg}") from None
    except ValueError as exc:
        # `correction=null`: Hydra's compose raises a plain ValueError for a group set to null
        if "Config group override must be a string" not in str(exc):
            raise
        raise UserError(
            "config: a config group takes an option's name, not null (see is-study list); "
            "to pick no experiment, leave experiment= out"
        ) from None


@contextlib.contextmanager
def initialized() -> Iterator[Any]:
    """Hydra initialised over conf/ for the duration of the block; yields Hydra's own `Hydra` object
    (what compose, run and multirun are called on). Errors inside come out translated."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_resolvers()
    GlobalHydra.instance().clear()
    with translated_errors(), initialize_config_dir(config_dir=str(conf_dir()), job_name=JOB_NAME, version_base=None):
        from runner.hydra_app.launchers import register_plugin_configs
        from runner.hydra_app.sweeper import register_config as register_sweeper_config

        register_plugin_configs()  # what our launcher presets extend (see launchers.py)
        register_sweeper_config()  # hydra/sweeper=is-study, the root config's sweeper
        yield GlobalHydra.instance().hydra


def compose(overrides: list[str] | tuple[str, ...] = (), with_hydra: bool = False):
    """The composed config for these override strings, as a DictConfig."""
    from hydra import compose as hydra_compose

    with initialized():
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

    with initialized() as hydra:
        if validate is not None:
            validate(_compose_for_run(hydra, overrides))
        try:
            job = hydra.run(
                config_name=CONFIG_NAME, task_function=guarded, overrides=list(overrides), with_log_configuration=False
            )
        except OSError as exc:  # the task's own errors are in `failure`: this is Hydra making the run dir
            raise UserError(
                f"the run dir cannot be created or written: {exc.filename or ''} "
                f"({exc.strerror or exc}); choose another hydra.run.dir"
            ) from None
    if failure:
        raise failure[0]
    return job.return_value


def _compose_for_run(hydra: Any, overrides: list[str]) -> Any:
    from hydra.types import RunMode

    return hydra.compose_config(
        config_name=CONFIG_NAME, overrides=list(overrides), run_mode=RunMode.RUN, with_log_configuration=False
    )


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


def instantiate(config: Any) -> Any:
    """Hydra's `_target_` instantiation of a plain mapping (nested values converted to plain containers).
    The target's own exception propagates: it is the user's class, and the caller words it."""
    from hydra.utils import instantiate as hydra_instantiate

    return hydra_instantiate(config, _convert_="all")


def job(cfg: Any) -> Any:
    """The task function of `is-study run`: a module-level function, like every task function, so a
    process launcher could pickle it."""
    from runner.studies import run_study

    return run_study(cfg, output_dir())


def default_configs(studies: Iterable[str] = ()) -> dict[str, Any]:
    """The default config as plain data, for a dataset report's config diff: "" → `compose([])`
    (what `is-study show` prints) and each of `studies` that is not the default one → its
    `compose(["study=NAME"])`. Composed here, in the gate, so that analysis only reads plain data."""
    configs = {"": to_container(compose([]))}
    default_study = configs[""].get("study", {}).get("name")
    for study in sorted(set(studies) - {default_study}):
        configs[study] = to_container(compose([f"study={study}"]))
    return configs
