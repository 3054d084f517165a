"""How a dataset was made, in words: the is-study command that reproduces it (from sweep.json,
multirun.yaml or the jobs' .hydra/overrides.yaml) and the short line that names its config in figure
titles. Reads the `Dataset` of analysis.load; never imports torch.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable
from pathlib import Path

from analysis.load import Dataset, read_yaml
from runner.values import parse_override


# ----------------------------------------------------------------------------------------- words
def _quote(args: Iterable[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)


def _multirun_overrides(path: Path) -> tuple[list[str], list[str]] | None:
    cfg = read_yaml(path / "multirun.yaml")
    try:
        ov = cfg["hydra"]["overrides"]
    except (TypeError, KeyError):
        return None
    hydra_ov = [str(o) for o in (ov.get("hydra") or []) if not str(o).startswith("hydra.mode=")]
    return [str(o) for o in (ov.get("task") or [])], hydra_ov


def _recorded_command(data: dict) -> str | None:
    """The whole command line, when `is-study sweep` recorded it in sweep.json (`command`, a string
    or an argv list, at the top or in the latest run's entry): --jobs, --name, --launcher included."""
    runs = data.get("runs") if isinstance(data.get("runs"), list) else []
    for where in [data, *(r for r in reversed(runs) if isinstance(r, dict))]:
        for key in ("command", "argv"):
            value = where.get(key)
            if isinstance(value, str) and value.strip():
                return value.strip()
            if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
                argv = list(value)
                if argv[0] != "is-study":  # an argv without the program name
                    argv = ["is-study", *argv[1:]] if argv[0].endswith(("is-study", "runner")) else ["is-study", *argv]
                return _quote(argv)
    return None


def _sweep_manifest(path: Path) -> tuple[list[str] | str, str] | None:
    """(the command, its source) from sweep.json: the recorded command line when there is one,
    else the overrides with --launcher, --jobs and --name put back from what the manifest and the
    sweep dir say."""
    try:
        data = json.loads((path / "sweep.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    recorded = _recorded_command(data)
    if recorded is not None:
        return recorded, "sweep.json (the command as typed)"
    try:
        overrides = [str(o) for o in data["overrides"]]
    except (KeyError, TypeError):
        return None
    runs = data.get("runs") or [{}]
    first = runs[0] if isinstance(runs[0], dict) else {}
    extra: list[str] = []
    launcher = first.get("launcher")
    if launcher and launcher != "basic" and not any(o.startswith("hydra/launcher=") for o in overrides):
        extra += ["--launcher", str(launcher)]
    parallel = first.get("parallelism", first.get("n_jobs"))
    if isinstance(parallel, int) and not isinstance(parallel, bool):
        extra += ["--jobs", str(parallel)]
    if not any(o.startswith("hydra.sweep.dir=") for o in overrides) and path.parent.name == "multirun":
        extra += ["--name", path.name]
    return overrides + extra, "sweep.json"


def command(ds: Dataset) -> tuple[str, str]:
    """(the is-study command that produced the data, how it was found)."""
    if ds.kind == "run":
        job = ds.first
        return _quote(["is-study", "run", *job.overrides, *job.hydra_overrides]), ".hydra/overrides.yaml"
    manifest = _sweep_manifest(ds.path)
    if manifest is not None:
        cmd, source = manifest
        return (cmd if isinstance(cmd, str) else _quote(["is-study", "sweep", *cmd])), source
    multi = _multirun_overrides(ds.path)
    if multi is not None:
        task, hydra_ov = multi
        return _quote(["is-study", "sweep", *task, *hydra_ov]), "multirun.yaml"
    parts = []
    for k in ds.keys:
        vals: list[str] = []
        for j in ds.jobs:
            if k in j.values:
                v = next(o.partition("=")[2] for o in j.overrides if parse_override(o)[0] == k)
                if v not in vals:
                    vals.append(v)
        prefix = next((o.partition("=")[0] for j in ds.jobs for o in j.overrides if parse_override(o)[0] == k), k)
        parts.append(f"{prefix}={','.join(vals)}")
    return (
        _quote(["is-study", "sweep", *parts, f"hydra.sweep.dir={ds.path}"]),
        f"reconstructed from the {len(ds.jobs)} jobs' .hydra/overrides.yaml",
    )


QUIET_KEYS = ("log.quiet", "log.timing", "log.metrics")  # change no number: left out of titles


def describe(ds: Dataset) -> str:
    """A short line naming the config, for figure titles."""
    if ds.kind == "run":
        ov = [o for o in ds.first.overrides if parse_override(o)[0] not in QUIET_KEYS]
        return "is-study run " + (" ".join(ov) if ov else "(defaults)")
    if not ds.jobs:
        return f"{ds.sweep_csv}: " + (" × ".join(ds.swept) if ds.swept else "nothing swept")
    fixed = [
        o for o in ds.first.overrides if parse_override(o)[0] not in ds.swept and parse_override(o)[0] not in QUIET_KEYS
    ]
    swept = " × ".join(ds.swept) if ds.swept else "nothing swept"
    n = len(ds.jobs)
    return f"{ds.name}: {swept} ({n} job{'s' if n != 1 else ''})" + (f"; {' '.join(fixed)}" if fixed else "")
