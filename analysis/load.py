"""Read what the studies wrote into tidy pandas tables. Never imports torch; never parses dir names.

A *run dir* is one job: `.hydra/{config,overrides,hydra}.yaml` and the study's files (`metrics.csv`,
`events.csv`, `summary.json`, `tokens.csv` for `study=train`; `probe.csv` for `study=probe`; `DONE`
when complete). A *sweep dir* holds run dirs one level down (`multirun/NAME/<job num>/`, or any
folder of run dirs), and usually `sweep.csv` (every job's metrics, one column per swept key) and
`sweep_summary.csv` written by `is-study sweep` / `is-study aggregate`.

    >>> from analysis import load, load_dataset
    >>> df = load("multirun/ladder")        # one row per optimizer update (per probe cell for a probe)
    >>> df.attrs["swept"]                   # ['correction', 'mismatch.staleness', 'seed']
    >>> ds = load_dataset("multirun/ladder")  # everything: .metrics .events .summary .probe .tokens

Every table carries a `job` column (0..n-1, the jobs in numeric order) and one column per override
key of the jobs (`correction`, `mismatch.staleness`, `seed`, ...), read from each job's
`.hydra/overrides.yaml`. `attrs["keys"]` lists those keys and `attrs["swept"]` the ones that vary
across jobs. Where a key already is a column of the study's CSV (`seed`, `correction`), the CSV's
column is kept.

Built from a `Dataset`: the tidy tables of the figures and reports in analysis.tables (`per_job`,
`update_rows`, `probe_frame`), the command that made it in analysis.provenance (`command`, `describe`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from runner.core.schema import ALL_METRICS_COLUMNS
from runner.errors import UserError
from runner.values import parse_override, same_value

try:  # the C loader is ~10× faster on the 100 small files of a sweep
    _Loader = yaml.CSafeLoader
except AttributeError:  # pragma: no cover
    _Loader = yaml.SafeLoader

JOB_COLUMNS = ("job", "job_num", "run_dir")  # how sweep.csv may name the job of a row
# sweep.csv keeps one column where a swept key and a metrics column hold the same value (runner/sweep/aggregate.py
# SAME_AS): a bare sweep.csv gets the key back under its config name, so its figures facet as the job dirs'
CONFIG_NAME_OF = {"staleness": "mismatch.staleness", "precision": "mismatch.precision"}
DATA_FILES = ("metrics.csv", "probe.csv")
MAX_TOKEN_ROWS = 400_000  # per dataset: enough for every histogram, bounded memory


# ----------------------------------------------------------------------------------------- helpers
def read_yaml(path: Path) -> Any:
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return None


def flatten(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists stay values."""
    out: dict[str, Any] = {}
    if isinstance(cfg, Mapping):
        for k, v in cfg.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, Mapping) and v:
                out.update(flatten(v, key))
            else:
                out[key] = v
    return out


def fmt_value(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(fmt_value(x) for x in v) + "]"
    return str(v)


def _is_run_dir(path: Path) -> bool:
    return (path / ".hydra" / "config.yaml").is_file() or any((path / f).is_file() for f in DATA_FILES)


def _job_sort_key(path: Path) -> tuple:
    return (0, int(path.name), "") if path.name.isdigit() else (1, 0, path.name)


def find_runs(path: Path, depth: int = 2) -> list[Path]:
    """The run dirs at `path`: itself, or its children (then grandchildren, e.g. runs/DATE/TIME)."""
    if _is_run_dir(path):
        return [path]
    level = [path]
    for _ in range(depth):
        children = []
        for p in level:
            try:
                children.extend(
                    sorted((c for c in p.iterdir() if c.is_dir() and not c.name.startswith(".")), key=_job_sort_key)
                )
            except OSError:
                continue
        runs = [c for c in children if _is_run_dir(c)]
        if runs:
            return runs
        level = children
    return []


# ----------------------------------------------------------------------------------------- jobs
@dataclass
class Job:
    """One run dir."""

    index: int
    path: Path
    overrides: list[str]
    values: dict[str, Any]

    @classmethod
    def read(cls, index: int, path: Path) -> Job:
        raw = read_yaml(path / ".hydra" / "overrides.yaml")
        overrides = [str(o) for o in raw] if isinstance(raw, list) else []
        values = dict(parse_override(o) for o in overrides if "=" in o)
        return cls(index, path, overrides, values)

    @property
    def done(self) -> bool:
        return (self.path / "DONE").is_file()

    @property
    def study(self) -> str:
        if (self.path / "probe.csv").is_file():
            return "probe"
        if (self.path / "metrics.csv").is_file():
            return "train"
        study = self.config.get("study")
        return str(study.get("name")) if isinstance(study, Mapping) else "unknown"

    @cached_property
    def config(self) -> dict:
        cfg = read_yaml(self.path / ".hydra" / "config.yaml")
        return cfg if isinstance(cfg, dict) else {}

    @cached_property
    def flat_config(self) -> dict[str, Any]:
        return flatten(self.config)

    @cached_property
    def _hydra(self) -> dict:
        cfg = read_yaml(self.path / ".hydra" / "hydra.yaml")
        return cfg.get("hydra", {}) if isinstance(cfg, dict) and isinstance(cfg.get("hydra"), dict) else {}

    @property
    def hydra_overrides(self) -> list[str]:
        """The hydra.* overrides of the command line (hydra.run.dir=..., hydra/launcher=...)."""
        try:
            items = self._hydra["overrides"]["hydra"] or []
        except (TypeError, KeyError):
            return []
        return [str(o) for o in items if not str(o).startswith(("hydra.mode=", "hydra.job.num="))]

    @property
    def num(self) -> int | None:
        """Hydra's job number (the `job` column of the sweep's aggregate tables)."""
        try:
            return int(self._hydra["job"]["num"])
        except (TypeError, KeyError, ValueError):
            return None

    @cached_property
    def summary(self) -> dict | None:
        try:
            data = json.loads((self.path / "summary.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def value(self, key: str) -> Any:
        """The value of an override key, or of any dotted config key."""
        if key in self.values:
            return self.values[key]
        flat = self.flat_config
        if key in flat:
            return flat[key]
        node = self.config.get(key)
        if isinstance(node, Mapping) and "name" in node:  # a group: correction -> correction.name
            return node["name"]
        return None


# ----------------------------------------------------------------------------------------- dataset
@dataclass
class Dataset:
    """Everything under one PATH. Tables are read on first use and carry `job` + key columns."""

    path: Path
    kind: str  # "run" (one job) | "sweep" (several)
    jobs: list[Job]
    sweep_csv: Path | None = None
    _frames: dict[str, Any] = field(default_factory=dict, repr=False)
    _parent: Dataset | None = field(default=None, repr=False)

    # ---- keys
    @cached_property
    def keys(self) -> list[str]:
        """Every override key of any job, in first-seen order."""
        if not self.jobs and self.sweep_csv is not None:  # a bare sweep.csv: its non-metric columns
            df = _read_csv(self.sweep_csv, nrows=0)
            skip = set(ALL_METRICS_COLUMNS) | set(JOB_COLUMNS)
            if df is None:
                return []
            return [c for c in df.columns if c not in skip] + [
                key for col, key in CONFIG_NAME_OF.items() if col in df.columns and key not in df.columns
            ]
        seen: dict[str, None] = {}
        for job in self.jobs:
            for k in job.values:
                seen.setdefault(k, None)
        return list(seen)

    @cached_property
    def swept(self) -> list[str]:
        """The keys whose value differs between jobs (none for a single run)."""
        if not self.jobs:
            df = self.metrics
            return [] if df is None else [k for k in self.keys if df[k].nunique(dropna=False) > 1]
        out = []
        for k in self.keys:
            vals = {fmt_value(j.values.get(k)) for j in self.jobs}
            if len(vals) > 1:
                out.append(k)
        return out

    @property
    def studies(self) -> set[str]:
        return {j.study for j in self.jobs}

    @property
    def name(self) -> str:
        return self.path.name or str(self.path)

    @property
    def first(self) -> Job:
        return self.jobs[0]

    def key_frame(self):
        """One row per job: job, path, done and every key's value."""
        import pandas as pd

        rows = []
        for j in self.jobs:
            row = {"job": j.index, "run_dir": str(j.path), "done": j.done}
            for k in self.keys:
                row[k] = j.values.get(k)
            rows.append(row)
        return pd.DataFrame(rows, columns=["job", "run_dir", "done", *self.keys])

    def _attach(self, df, job: Job | None = None):
        """Add `job` and the key columns (keeping columns the CSV already has)."""
        if job is not None:
            if "job" in df.columns:
                df = df.drop(columns="job")
            df.insert(0, "job", job.index)
            for k in self.keys:
                if k not in df.columns:
                    df[k] = job.values.get(k)
        df.attrs.update({"keys": list(self.keys), "swept": list(self.swept), "path": str(self.path), "kind": self.kind})
        return df

    def _concat(self, name: str, reader) -> Any:
        if name in self._frames:
            return self._frames[name]
        if self._parent is not None:
            parent = getattr(self._parent, name)
            df = None if parent is None else parent[parent["job"].isin([j.index for j in self.jobs])].copy()
            if df is not None:
                df.attrs.update(parent.attrs, swept=list(self.swept))
            self._frames[name] = df
            return df
        import pandas as pd

        parts = []
        for job in self.jobs:
            part = reader(job)
            if part is not None and len(part.columns):
                parts.append(self._attach(part, job))
        df = self._attach(pd.concat(parts, ignore_index=True)) if parts else None
        self._frames[name] = df
        return df

    # ---- tables
    @property
    def metrics(self):
        """One row per optimizer update (train jobs), or None."""
        if "metrics" not in self._frames and self._parent is None and self.sweep_csv is not None:
            df = self._read_sweep_csv()
            if df is not None:
                self._frames["metrics"] = df
                if not self.jobs:
                    df.attrs["swept"] = list(self.swept)
        return self._concat("metrics", lambda j: _read_csv(j.path / "metrics.csv"))

    @property
    def probe(self):
        """One row per probe cell (preset × band), or None."""
        return self._concat("probe", lambda j: _read_csv(j.path / "probe.csv"))

    @property
    def events(self):
        def read(j):
            df = _read_csv(j.path / "events.csv", dtype={"kind": str, "detail": str, "action": str})
            return df

        return self._concat("events", read)

    @property
    def summary(self):
        """One row per job: summary.json flattened (events.* counts), plus `done`."""
        import pandas as pd

        def read(j):
            s = j.summary
            if s is None:
                return pd.DataFrame([{"done": j.done}])
            return pd.DataFrame([{**flatten(s), "done": j.done}])

        return self._concat("summary", read)

    @property
    def tokens(self):
        """Per-token trainer (old) and rollout-engine (roll) log-probs, or None when no job wrote them."""
        budget = max(MAX_TOKEN_ROWS // max(len(self.jobs), 1), 1000)

        def read(j):
            path = j.path / "tokens.csv"
            if not path.is_file():
                return None
            df = _read_spread(path, budget)
            if df is None or not {"old", "roll"} <= set(df.columns):
                return None
            return df

        return self._concat("tokens", read)

    @property
    def table(self):
        """The main table: metrics for train jobs, else probe cells."""
        if self.metrics is not None:
            return self.metrics
        return self.probe

    # ---- sweep.csv
    def _read_sweep_csv(self):
        """sweep.csv, with `job` and every key column; None when it cannot be matched to the jobs."""
        df = _read_csv(self.sweep_csv)
        if df is None:
            return None
        if not self.jobs:  # a bare sweep.csv: a job is a combination of its key columns
            for col, key in CONFIG_NAME_OF.items():
                if col in df.columns and key not in df.columns:
                    df[key] = df[col]
            job_col = next((c for c in JOB_COLUMNS if c in df.columns), None)
            by = [job_col] if job_col else self.keys
            ids = df.groupby(by, sort=False, dropna=False).ngroup() if by else 0
            if "job" in df.columns:
                df = df.drop(columns="job")
            df.insert(0, "job", ids)
            df.attrs.update({"keys": list(self.keys), "path": str(self.path), "kind": self.kind})
            return df
        job_col = next((c for c in JOB_COLUMNS if c in df.columns), None)
        kf = self.key_frame()
        if job_col == "run_dir":
            lookup = {os.path.normpath(str(j.path.resolve())): j.index for j in self.jobs}
            lookup.update({j.path.name: j.index for j in self.jobs})
            df["job"] = [
                lookup.get(os.path.normpath(str((self.path / str(p)).resolve())), lookup.get(Path(str(p)).name))
                for p in df["run_dir"]
            ]
        elif job_col in ("job", "job_num"):
            nums = [j.num for j in self.jobs]
            if None not in nums and len(set(nums)) == len(nums):
                by_num = {str(n): j.index for n, j in zip(nums, self.jobs)}
            else:
                by_num = {j.path.name: j.index for j in self.jobs}
            df["job"] = [by_num.get(str(v), None) for v in df[job_col]]
        else:
            swept = [k for k in self.swept if k in df.columns]
            if len(swept) != len(self.swept):
                return None  # cannot tell the jobs apart: read the job dirs instead
            if swept:
                key = lambda frame: frame[swept].map(fmt_value).astype(str).agg("\x1f".join, axis=1)  # noqa: E731
                index = dict(zip(key(kf), kf["job"]))
                df["job"] = key(df).map(index)
            else:
                df["job"] = self.jobs[0].index
        if df["job"].isna().any():
            return None
        df["job"] = df["job"].astype(int)
        # A job finished after the last aggregate (e.g. by --resume): read its own metrics.csv.
        import pandas as pd

        have = set(df["job"].unique().tolist())
        late = [j for j in self.jobs if j.index not in have and j.done]
        parts = [self._attach(part, j) for j in late if (part := _read_csv(j.path / "metrics.csv")) is not None]
        if parts:
            df = pd.concat([df, *parts], ignore_index=True)
        for k in self.keys:
            if k not in df.columns:
                df[k] = df["job"].map(dict(zip(kf["job"], kf[k])))
        cols = ["job"] + [c for c in df.columns if c != "job"]
        return self._attach(df[cols])

    # ---- selection
    def select(self, filters: Sequence[str]) -> Dataset:
        """Keep the jobs whose key (or any dotted config key) matches every `key=value[,value]`."""
        if not filters:
            return self
        if not self.jobs:
            raise UserError(f"{self.path}: filters need the job dirs beside sweep.csv")
        jobs = list(self.jobs)
        for f in filters:
            if "=" not in f:
                raise UserError(f"filter {f!r}: expected key=value")
            key, _, raw = f.partition("=")
            wanted = [parse_override(f"{key}={v}")[1] for v in raw.split(",")]
            jobs = [j for j in jobs if any(same_value(j.value(key), w) for w in wanted)]
        if not jobs:
            raise UserError(f"no job of {self.path} matches {' '.join(filters)}")
        return Dataset(self.path, self.kind if len(jobs) > 1 else "run", jobs, None, {}, self)


def _read_csv(path: Path, **kwargs):
    import pandas as pd

    if path is None or not Path(path).is_file():
        return None
    try:
        return pd.read_csv(path, **kwargs)
    except pd.errors.EmptyDataError:
        return None
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not a readable CSV ({str(exc).splitlines()[0]})") from None


def _read_spread(path: Path, budget: int):
    """At most `budget` rows of a CSV, evenly spaced over the whole file, read in chunks (bounded memory). Its
    head alone would be a long run's early steps only: a claim's late window would not be late."""
    import numpy as np
    import pandas as pd

    if path is None or not Path(path).is_file():
        return None
    with open(path, "rb") as f:
        rows = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b"")) - 1  # less the header
    if rows <= budget:
        return _read_csv(path)
    keep = np.unique(np.linspace(0, rows - 1, budget).round().astype(np.int64))
    parts, start = [], 0
    try:
        for chunk in pd.read_csv(path, chunksize=1 << 18):
            wanted = keep[(keep >= start) & (keep < start + len(chunk))] - start
            parts.append(chunk.iloc[wanted])
            start += len(chunk)
    except pd.errors.EmptyDataError:
        return None
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not a readable CSV ({str(exc).splitlines()[0]})") from None
    return pd.concat(parts, ignore_index=True)


# ----------------------------------------------------------------------------------------- entry points
def load_dataset(path: str | os.PathLike) -> Dataset:
    """A run dir, a sweep dir (or its sweep.csv), or a probe dir -> Dataset. One-line UserError otherwise."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"no such file or directory: {path}")
    sweep_csv = None
    if path.is_file():
        if path.suffix != ".csv":
            raise UserError(f"{path}: expected a run dir, a sweep dir or a sweep.csv")
        if path.name in DATA_FILES:  # a run's own metrics.csv / probe.csv: the run dir
            path = path.parent
        else:
            sweep_csv, path = path, path.parent
    elif (path / "sweep.csv").is_file():
        sweep_csv = path / "sweep.csv"
    runs = find_runs(path)
    jobs = [Job.read(i, p) for i, p in enumerate(runs)]
    if not jobs and sweep_csv is None:
        raise UserError(f"{path}: no run dirs here (nothing with .hydra/config.yaml, metrics.csv or probe.csv)")
    kind = "run" if len(jobs) == 1 and jobs[0].path == path else "sweep"
    ds = Dataset(path, kind, jobs, sweep_csv)
    if not jobs or ds.table is None:
        if ds.probe is None and ds.metrics is None:
            raise UserError(f"{path}: nothing to read (no metrics.csv, probe.csv or sweep.csv)")
    return ds


def load(path: str | os.PathLike):
    """The tidy table under `path`: one row per optimizer update (train) or per probe cell (probe),
    with `job` and one column per override key. `attrs`: keys, swept, path, kind."""
    return load_dataset(path).table
