"""One tidy table per sweep: `is-study aggregate DIR` (and the end of every `is-study sweep`).

A job is a directory under the sweep dir holding `.hydra/overrides.yaml` (Hydra writes it before the
job starts). Everything about a job is read from its own files, never from directory names:
  - its number: `.hydra/hydra.yaml` → hydra.job.num
  - its swept keys: `.hydra/overrides.yaml`, parsed by Hydra's override grammar
  - its state: `DONE` (written last by the study: complete), `ERROR` (written by the sweep's job
    wrapper: failed; first line = the error), neither (running, or killed: `--resume` reruns it)

Files written in the sweep dir, each atomically (a temp file, then rename):
  sweep.csv          every finished job's metrics.csv rows (train study: one row per update),
                     prefixed by `job` and one column per override key of the jobs (swept or fixed on
                     the command line, e.g. `correction`, `correction.high`, `mismatch.staleness`,
                     `seed`). A per-job column with the same name as an override key (`seed`,
                     `correction`) is left out: the override column already holds it.
  sweep_summary.csv  one row per job, finished or not: job, the override keys, job_status
                     (done / failed / incomplete), error, job_dir (relative to the sweep dir), then
                     summary.json flattened (`events.collapse`, ...).
  sweep_probe.csv    the same as sweep.csv for studies that write probe.csv instead of metrics.csv
  sweep_events.csv   the same for events.csv (train study: NaN/inf, all_rejected, collapse events)
A table no job has is not written (and a stale copy from an earlier aggregate is removed).
"Finished" = DONE or ERROR: a failed job's rows are kept (they show what led to the failure); an
incomplete job's partial rows are not.

Values are copied as text, byte for byte; the CSVs are streamed, so a sweep of thousands of jobs
aggregates in constant memory.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from runner.errors import UserError
from runner.hydra_app.overrides import parse_job_overrides
from runner.records import DONE, ERROR, fmt

SUMMARY_CSV = "sweep_summary.csv"
# per-job table -> its aggregate in the sweep dir
TABLES = {"metrics.csv": "sweep.csv", "probe.csv": "sweep_probe.csv", "events.csv": "sweep_events.csv"}


@dataclass
class Job:
    num: int
    dir: Path
    overrides: list[tuple[str, str]]  # (key, value), in the order of .hydra/overrides.yaml
    status: str  # done | failed | incomplete
    error: str | None = None
    override_strings: list[str] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.status in ("done", "failed")

    def label(self) -> str:
        return " ".join(self.override_strings)


@dataclass
class Report:
    sweep_dir: Path
    jobs: list[Job]
    keys: list[str]
    written: dict[str, int]  # file name -> data rows

    def by_status(self, status: str) -> list[Job]:
        return [j for j in self.jobs if j.status == status]


def _yaml_load(path: Path) -> Any:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(path, encoding="utf-8") as f:
        return yaml.load(f, Loader=loader)


def job_status(job_dir: Path) -> tuple[str, str | None]:
    """(status, error first line). ERROR wins over DONE: the job raised."""
    err = job_dir / ERROR
    if err.is_file():
        text = err.read_text(encoding="utf-8", errors="replace").strip()
        return "failed", (text.splitlines()[0] if text else "failed")
    if (job_dir / DONE).is_file():
        return "done", None
    return "incomplete", None


def _job_num(job_dir: Path) -> int | None:
    try:
        data = _yaml_load(job_dir / ".hydra" / "hydra.yaml")
        num = data["hydra"]["job"]["num"]
        return int(num)
    except (OSError, KeyError, TypeError, ValueError):
        return None


def find_jobs(sweep_dir: Path | str) -> list[Job]:
    """Every job dir directly under the sweep dir, sorted by hydra.job.num."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise UserError(f"not a directory: {sweep_dir}")
    jobs = []
    for overrides_file in sweep_dir.glob("*/.hydra/overrides.yaml"):
        job_dir = overrides_file.parent.parent
        strings = _yaml_load(overrides_file) or []
        strings = [str(s) for s in strings]
        num = _job_num(job_dir)
        if num is None:
            continue
        status, error = job_status(job_dir)
        jobs.append(Job(num, job_dir, parse_job_overrides(strings), status, error, strings))
    jobs.sort(key=lambda j: j.num)
    return jobs


def override_keys(jobs: Iterable[Job]) -> list[str]:
    keys: dict[str, None] = {}
    for job in jobs:
        for key, _ in job.overrides:
            keys.setdefault(key, None)
    return list(keys)


def _key_values(job: Job, keys: list[str]) -> list[str]:
    values = dict(job.overrides)
    return [values.get(k, "") for k in keys]


class _AtomicCsv:
    """A CSV written to `.NAME.tmp` beside its target and renamed into place on close."""

    def __init__(self, path: Path):
        self.path = path
        self.tmp = path.with_name(f".{path.name}.tmp")
        self._file = open(self.tmp, "w", newline="", encoding="utf-8")
        self.writer = csv.writer(self._file, lineterminator="\n")
        self.rows = 0

    def writerow(self, row: list[str]) -> None:
        self.writer.writerow(row)

    def commit(self) -> None:
        self._file.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self._file.close()
        self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> "_AtomicCsv":
        return self

    def __exit__(self, exc_type, *exc: Any) -> None:
        # renamed into place only when every row was written; otherwise the old file stays
        if exc_type is None:
            self.commit()
        else:
            self.abort()


def _read_header(path: Path) -> list[str] | None:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return next(csv.reader(f), None)
    except OSError:
        return None


def concat_table(jobs: list[Job], keys: list[str], table: str, out_path: Path) -> int:
    """Concatenate `table` (e.g. metrics.csv) of the finished jobs into out_path, prefixed by job and
    the override keys; returns the data rows written, 0 (and no file) when no job has the table."""
    sources = []
    columns: dict[str, None] = {}
    key_set = set(keys)
    for job in jobs:
        if not job.finished:
            continue
        header = _read_header(job.dir / table)
        if header is None:
            continue
        sources.append((job, header))
        for c in header:
            if c not in key_set and c != "job":
                columns.setdefault(c, None)
    if not sources:
        out_path.unlink(missing_ok=True)
        return 0
    cols = list(columns)
    with _AtomicCsv(out_path) as out:
        out.writerow(["job", *keys, *cols])
        for job, header in sources:
            prefix = [str(job.num), *_key_values(job, keys)]
            pos = {c: i for i, c in enumerate(header)}
            idx = [pos.get(c, -1) for c in cols]
            with open(job.dir / table, newline="", encoding="utf-8") as f:
                reader = csv.reader(f)
                next(reader, None)
                for row in reader:
                    if not row:
                        continue
                    out.writerow(prefix + [row[i] if 0 <= i < len(row) else "" for i in idx])
                    out.rows += 1
    return out.rows


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    if isinstance(data, dict):
        for k, v in data.items():
            name = f"{prefix}{k}"
            if isinstance(v, dict):
                flat.update(_flatten(v, f"{name}."))
            else:
                flat[name] = json.dumps(v) if isinstance(v, list) else v
    return flat


def _read_summary(job_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((job_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def write_summary(jobs: list[Job], keys: list[str], out_path: Path) -> int:
    fixed = ["job", *keys, "job_status", "error", "job_dir"]
    taken = set(fixed)
    flats = [(_flatten(_read_summary(job.dir))) for job in jobs]
    columns: dict[str, None] = {}
    for flat in flats:
        for c in flat:
            if c not in taken:
                columns.setdefault(c, None)
    cols = list(columns)
    with _AtomicCsv(out_path) as out:
        out.writerow(fixed + cols)
        for job, flat in zip(jobs, flats):
            rel = os.path.relpath(job.dir, out_path.parent)
            out.writerow([str(job.num), *_key_values(job, keys), job.status, job.error or "", rel,
                          *(fmt(flat.get(c)) for c in cols)])
            out.rows += 1
    return out.rows


def aggregate(sweep_dir: Path | str) -> Report:
    """Write sweep.csv, sweep_summary.csv (and sweep_probe.csv / sweep_events.csv when jobs have
    those tables) in the sweep dir; return what was found and written."""
    sweep_dir = Path(sweep_dir)
    jobs = find_jobs(sweep_dir)
    if not jobs:
        raise UserError(f"no sweep jobs in {sweep_dir} (no */.hydra/overrides.yaml)")
    keys = override_keys(jobs)
    written: dict[str, int] = {}
    for table, name in TABLES.items():
        rows = concat_table(jobs, keys, table, sweep_dir / name)
        if (sweep_dir / name).is_file():
            written[name] = rows
    written[SUMMARY_CSV] = write_summary(jobs, keys, sweep_dir / SUMMARY_CSV)
    return Report(sweep_dir, jobs, keys, written)
