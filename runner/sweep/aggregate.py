"""One tidy table per sweep: `is-study aggregate DIR` (and the end of every `is-study sweep`); or per set
of separate runs: `is-study aggregate runs/2026-12-01 runs/2026-12-02/10-11-12 --out DIR` (aggregate_runs:
every run dir at or below the paths is a job, numbered 0, 1, ... in path order; the tables go into DIR).

A job is a directory under the sweep dir holding `.hydra/overrides.yaml` (Hydra writes it before the
job starts). Everything about a job is read from its own files, never from directory names:
  - its number: `.hydra/hydra.yaml` → hydra.job.num
  - its swept keys: `.hydra/overrides.yaml`, parsed by Hydra's override grammar
  - its state: `DONE` (written last by the study: complete), `ERROR` (written by the sweep's job
    wrapper: failed; first line = the error), neither (running, or killed: `--resume` reruns it)
  - whether its files are whole (runner/sweep/integrity.py): a job with DONE whose DONE, summary.json or
    tables are damaged (cut short, garbage appended, two writers interleaved) is `damaged`: it is
    reported by path and reason, left out of every table but the summary, and `--resume` reruns it.

Files written in the sweep dir, each atomically (a temporary file of its own, then rename):
  sweep.csv          every finished job's metrics.csv rows (train study: one row per update, then the
                     run's final row: J after the last update, runner/core/schema.py),
                     prefixed by `job` and one column per override key of the jobs (swept or fixed on
                     the command line, e.g. `correction`, `correction.high`, `seed`). A key has one
                     name in every table here, the studies' own name for it where they have one
                     (SAME_AS: `staleness` for mismatch.staleness, `precision` for
                     mismatch.precision), so the tables merge on it without a rename. A per-job column
                     that already holds an override key's value is kept and the key's column left
                     out. When the correction's band is set by something else than
                     `correction.low` / `correction.high` (a band preset such as threshold-tradeoff's
                     `band=tight`, or the presets' own bands), numeric `low` and `high` columns follow
                     the keys, resolved from each job's config.
  sweep_summary.csv  one row per job, finished or not: job, the override keys (and low, high as
                     above), status (done / failed / incomplete / damaged), error (for a failed or
                     damaged job: what went wrong), run_dir (the job dir relative to the table's dir,
                     as ./00, so pandas reads it as text and it still resolves after the sweep dir is
                     moved: sweep_dir / run_dir), then summary.json flattened (`events.collapse`, ...;
                     its own `status` as `summary.status`; its absolute run_dir left out). A column
                     empty for every job (error when none failed, collapse_step when none collapsed)
                     is left out.
  sweep_probe.csv    the same as sweep.csv for studies that write probe.csv instead of metrics.csv
  sweep_events.csv   the same for events.csv (train study: NaN/inf, all_rejected, collapse events)
  sweep_tokens.csv   the same for tokens.csv (train study: per-token trainer and engine log-probs)
A table no job has is not written (and a stale copy from an earlier aggregate is removed).
"Finished" = DONE or ERROR: a failed job's rows are kept when its table is whole (they show what led
to the failure); an incomplete or damaged job's rows are not, nor a failed job's whose table is
damaged (its error then names the file and what is wrong with it, as a damaged job's does).

Values are copied as text, byte for byte; the CSVs are streamed, so a sweep of thousands of jobs
aggregates in constant memory.

About 520 lines on purpose: finding the jobs, judging each one's files and writing the tables share the
Job record and the atomic writer, and read in the order a table is made.

About 530 lines on purpose: finding jobs, judging their files and writing the tables are one pass over a
sweep dir, and `--resume` trusts exactly what this module calls whole.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import operator
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from runner import records
from runner.errors import UserError
from runner.hydra_app.overrides import parse_job_overrides
from runner.records import DONE, ERROR, fmt, unique_temp, write_failed
from runner.sweep.integrity import Damage, damage

SUMMARY_CSV = "sweep_summary.csv"
# per-job table -> its aggregate in the sweep dir
TABLES = {
    "metrics.csv": "sweep.csv",
    "probe.csv": "sweep_probe.csv",
    "events.csv": "sweep_events.csv",
    "tokens.csv": "sweep_tokens.csv",
}
STATUSES = ("done", "failed", "incomplete", "damaged")
# override key -> the name of its column in every table written here: the name the studies' own files
# (metrics.csv, tokens.csv, summary.json, probe.csv) give the same value, so the tables merge on it
SAME_AS = {"mismatch.staleness": "staleness", "mismatch.precision": "precision"}
BAND_KEYS = {"low": "correction.low", "high": "correction.high"}


@dataclass
class Job:
    num: int
    dir: Path
    overrides: list[tuple[str, str]]  # (key, value), in the order of .hydra/overrides.yaml
    status: str  # done | failed | incomplete | damaged
    error: str | None = None
    override_strings: list[str] = field(default_factory=list)
    damage: Damage | None = None  # damaged: what is wrong; failed: a damaged table (its rows are left out)

    @property
    def finished(self) -> bool:
        """Its rows go into the tables."""
        return self.status == "done" or (self.status == "failed" and self.damage is None)

    def label(self) -> str:
        return " ".join(self.override_strings)


@dataclass
class Report:
    sweep_dir: Path
    jobs: list[Job]
    keys: list[str]
    written: dict[str, int]  # file name -> data rows
    band: bool = False  # low and high columns were added

    def by_status(self, status: str) -> list[Job]:
        return [j for j in self.jobs if j.status == status]


def _yaml_load(path: Path) -> Any:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(path, encoding="utf-8") as f:
        return yaml.load(f, Loader=loader)


def job_status(job_dir: Path) -> tuple[str, str | None, Damage | None]:
    """(status, error first line, damage). ERROR wins over DONE: the job raised. A job with DONE
    whose files are not whole is damaged; a failed job's damaged table is noted (its rows are left
    out) but it stays failed."""
    err = job_dir / ERROR
    if err.is_file():
        with open(err, encoding="utf-8", errors="replace") as f:
            first = f.readline(1000).strip() or "failed"
        found = damage(job_dir, done=False)
        if found is not None:  # e.g. a full disk cut metrics.csv mid-line: say so, as for a damaged job
            first += f"; {os.path.relpath(found.path, job_dir)}: {found.reason}, so its rows are left out"
        return "failed", first, found
    if (job_dir / DONE).is_file():
        found = damage(job_dir, done=True)
        if found is not None:
            return "damaged", f"{os.path.relpath(found.path, job_dir)}: {found.reason}", found
        return "done", None, None
    return "incomplete", None, None


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
        num = _job_num(job_dir)
        if num is None:
            continue
        jobs.append(_read_job(num, job_dir))
    jobs.sort(key=lambda j: j.num)
    return jobs


def override_keys(jobs: Iterable[Job]) -> list[str]:
    keys: dict[str, None] = {}
    for job in jobs:
        for key, _ in job.overrides:
            keys.setdefault(key, None)
    return list(keys)


def band_values(jobs: list[Job], keys: list[str]) -> dict[int, list[str]] | None:
    """{job num: [low, high]} when the jobs' correction band is set by something else than the
    correction.low / correction.high keys (a band preset, the presets' own bands), i.e. when jobs
    with the same values of those keys have different bands; else None (the key columns say it all)."""
    from runner.hydra_app.job_config import resolved_values

    direct = [k for k in BAND_KEYS.values() if k in keys]
    bands: dict[int, list[str]] = {}
    seen: dict[tuple, set[tuple[str, str]]] = {}
    for job in jobs:
        values = resolved_values(job.dir / ".hydra" / "config.yaml", list(BAND_KEYS.values()))
        band = [fmt(values[k]) for k in BAND_KEYS.values()]
        bands[job.num] = band
        given = dict(job.overrides)
        seen.setdefault(tuple(given.get(k) for k in direct), set()).add(tuple(band))
    return bands if any(len(v) > 1 for v in seen.values()) else None


def column_name(key: str) -> str:
    """The column an override key is written under (SAME_AS: `staleness` for mismatch.staleness)."""
    return SAME_AS.get(key, key)


def run_dir_cell(job_dir: Path, table_dir: Path) -> str:
    """A job dir relative to the table's dir, so the table stays right when the sweep dir moves; "./00"
    rather than "00", so pandas reads the column as text, not as the number 0."""
    rel = os.path.relpath(job_dir, table_dir)
    return rel if rel.startswith(("..", os.sep)) else os.path.join(".", rel)


def _key_values(job: Job, keys: list[str]) -> list[str]:
    values = dict(job.overrides)
    return [values.get(k, "") for k in keys]


class _AtomicCsv:
    """A CSV written to a temporary file of its own beside its target and renamed into place on
    close; a failed write leaves the old file as it was and names the file (WriteFailed)."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self.tmp = unique_temp(path)
            self._file = records.open_for_writing(self.tmp, newline="")
        except OSError as exc:
            raise self._failed(exc) from None
        self.writer = csv.writer(self._file, lineterminator="\n")
        self.rows = 0

    def _failed(self, exc: OSError):
        return write_failed(
            self.path,
            exc,
            f"{self.path.name} was left as it was (free space, then is-study aggregate {self.path.parent})",
        )

    def writerow(self, row: list[str]) -> None:
        try:
            self.writer.writerow(row)
        except OSError as exc:
            self.abort()
            raise self._failed(exc) from None

    def write_text(self, text: str) -> None:
        """Lines already in this file's CSV dialect (see _plain_lines)."""
        try:
            self._file.write(text)
        except OSError as exc:
            self.abort()
            raise self._failed(exc) from None

    def commit(self) -> None:
        try:
            self._file.close()
            os.replace(self.tmp, self.path)
        except OSError as exc:
            self.abort()
            raise self._failed(exc) from None

    def abort(self) -> None:
        try:
            self._file.close()
        except OSError:
            pass
        self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> _AtomicCsv:
        return self

    def __exit__(self, exc_type, *exc: Any) -> None:
        # renamed into place only when every row was written; otherwise the old file stays
        if exc_type is None:
            self.commit()
        else:
            self.abort()


def _copy_plain_lines(
    lines: Iterator[str], out: _AtomicCsv, start: str, width: int, idx: list[int]
) -> Iterator[str] | None:
    """Write a table's data lines to `out` without the csv module, each after `start` (the prefix's
    cells) with the cells at `idx`, for as long as that is what parsing and rewriting each row would
    write: no quote or carriage return (so no field is quoted, none holds a comma or a newline) and
    `width` fields. Returns None when every line was written, else the lines from the first that is
    not plain, for the csv module (which starts there in the state it would have reached: no field was
    open). The studies' own tables are plain, and a sweep's largest (tokens.csv) is most of what
    aggregating costs, row by row."""
    commas = width - 1
    pick = None if idx == list(range(width)) else operator.itemgetter(*idx)
    chunk: list[str] = []

    def flush() -> None:
        out.write_text("".join(chunk))
        out.rows += len(chunk)
        chunk.clear()

    for line in lines:
        body = line[:-1] if line.endswith("\n") else line
        if body == "":  # a blank line, skipped as the csv module skips it
            continue
        if '"' in body or "\r" in body or body.count(",") != commas:
            flush()
            return itertools.chain([line], lines)
        if pick is not None:
            cells = pick(body.split(","))
            body = ",".join(cells) if len(idx) > 1 else cells
        chunk.append(f"{start}{body}\n")
        if len(chunk) == 4096:
            flush()
    flush()
    return None


def _read_header(path: Path) -> list[str] | None:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return next(csv.reader(f), None)
    except (OSError, UnicodeDecodeError, csv.Error):
        return None


def concat_table(
    jobs: list[Job], keys: list[str], table: str, out_path: Path, bands: dict[int, list[str]] | None = None
) -> int:
    """Concatenate `table` (e.g. metrics.csv) of the finished jobs into out_path, prefixed by job, the
    override keys and (with `bands`) low and high; returns the data rows written, 0 (and no file)
    when no job has the table."""
    sources = []
    columns: dict[str, None] = {}
    for job in jobs:
        if not job.finished:
            continue
        header = _read_header(job.dir / table)
        if header is None:
            continue
        sources.append((job, header))
        for c in header:
            columns.setdefault(c, None)
    if not sources:
        out_path.unlink(missing_ok=True)
        return 0
    # one column per value: a key's column wins over the table's column of the same name (`seed`),
    # the table's column over a key it records under another name (`staleness`), and the table's
    # own low / high over the band columns
    kept = [k for k in keys if SAME_AS.get(k) not in columns]
    band = bands is not None and not any(c in columns for c in BAND_KEYS)
    prefix_names = ["job", *map(column_name, kept), *(BAND_KEYS if band else ())]
    cols = [c for c in columns if c not in set(prefix_names)]
    with _AtomicCsv(out_path) as out:
        out.writerow([*prefix_names, *cols])
        for job, header in sources:
            prefix = [str(job.num), *_key_values(job, kept), *(bands[job.num] if band else ())]
            pos = {c: i for i, c in enumerate(header)}
            idx = [pos.get(c, -1) for c in cols]
            # a key this job was not given (separate runs: one set seed=1, another did not) takes the
            # table's own value of the same name, not an empty cell
            fill = [(1 + n, pos[k]) for n, k in enumerate(kept) if not prefix[1 + n] and k in pos]
            with open(job.dir / table, newline="", encoding="utf-8") as f:
                next(csv.reader(f), None)
                rest: Iterator[str] | None = f
                if idx and min(idx) >= 0 and not fill:
                    start = io.StringIO()
                    csv.writer(start, lineterminator="").writerow([*prefix, ""])  # the prefix and its comma
                    rest = _copy_plain_lines(f, out, start.getvalue(), len(header), idx)
                for row in csv.reader(rest or ()):
                    if not row:
                        continue
                    head = prefix
                    if fill:
                        head = list(prefix)
                        for at, i in fill:
                            head[at] = row[i] if i < len(row) else ""
                    out.writerow(head + [row[i] if 0 <= i < len(row) else "" for i in idx])
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


def _summary_columns(summary: dict[str, Any]) -> dict[str, Any]:
    """summary.json flattened for sweep_summary.csv. Its `mismatch` block (what the run measured between
    trainer and engine) becomes `measured_mismatch.*`: a table's `mismatch.` names are the config's, and
    the config's are renamed (staleness, not mismatch.staleness), so the block's must not look like them;
    its zero_grad_fraction is the summary's own, already a column."""
    flat = {}
    for name, value in _flatten(summary).items():
        if name == "mismatch.zero_grad_fraction":
            continue
        flat[f"measured_{name}" if name.startswith("mismatch.") else name] = value
    return flat


def _read_summary(job_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((job_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_summary(jobs: list[Job], keys: list[str], out_path: Path, bands: dict[int, list[str]] | None = None) -> int:
    own = ["status", "error", "run_dir"]
    fixed = ["job", *map(column_name, keys), *(BAND_KEYS if bands is not None else ()), *own]
    # summary.json's copies of a key's value are left out (`seed`, `staleness` for mismatch.staleness), and
    # so is its run_dir (absolute, stale once the sweep dir moves: run_dir above is relative to the table);
    # its other fields named like our own columns are kept as summary.NAME
    copies = set(fixed) - {"status", "error"}
    # a damaged job's summary.json is not trusted (it may be what is damaged)
    flats = [_summary_columns(_read_summary(job.dir)) if job.status != "damaged" else {} for job in jobs]
    columns: dict[str, None] = {}
    for flat in flats:
        for c in flat:
            if c not in copies:
                columns.setdefault(c, None)
    # a key this job was not given takes summary.json's value of the same name (`seed`, `staleness`)
    rows = [
        [
            str(job.num),
            *(v or fmt(flat.get(column_name(k))) for k, v in zip(keys, _key_values(job, keys))),
            *(bands[job.num] if bands is not None else []),
            job.status,
            job.error or "",
            run_dir_cell(job.dir, out_path.parent),
            *(fmt(flat.get(c)) for c in columns),
        ]
        for job, flat in zip(jobs, flats)
    ]
    names = fixed + [f"summary.{c}" if c in own else c for c in columns]
    # a column empty for every job says nothing (error when none failed, collapse_step when none
    # collapsed, world.eos_token without an EOS token): left out; `status` and `collapsed` still say it
    keep = [
        i
        for i, name in enumerate(names)
        if i < len(fixed) - len(own) or name in ("status", "run_dir") or any(row[i] != "" for row in rows)
    ]
    with _AtomicCsv(out_path) as out:
        out.writerow([names[i] for i in keep])
        for row in rows:
            out.writerow([row[i] for i in keep])
            out.rows += 1
    return out.rows


def _read_job(num: int, job_dir: Path) -> Job:
    overrides_file = job_dir / ".hydra" / "overrides.yaml"
    try:
        strings = [str(s) for s in (_yaml_load(overrides_file) or [])]
        overrides = parse_job_overrides(strings)
    except (OSError, ValueError, TypeError, UserError, yaml.YAMLError) as exc:
        bad = Damage(overrides_file, f"unreadable ({type(exc).__name__})")
        return Job(num, job_dir, [], "damaged", f".hydra/overrides.yaml: {bad.reason}", [], bad)
    status, error, found = job_status(job_dir)
    return Job(num, job_dir, overrides, status, error, strings, found)


def find_runs(paths: Iterable[Path | str]) -> list[Job]:
    """Every run dir (a dir holding .hydra/overrides.yaml) given or below the given paths, e.g. the
    runs/DATE/TIME dirs of separate `is-study run`s, numbered 0, 1, ... in the order given (below one
    path: sorted by path, so runs/DATE/TIME sort by time). A dir found twice is counted once."""
    dirs: dict[Path, None] = {}
    for path in map(Path, paths):
        if not path.is_dir():
            raise UserError(f"not a directory: {path}")
        if (path / ".hydra" / "overrides.yaml").is_file():
            found = [path]
        else:
            found = sorted(f.parent.parent for f in path.glob("**/.hydra/overrides.yaml"))
        if not found:
            raise UserError(f"no run dirs in {path} (nothing holds .hydra/overrides.yaml)")
        for d in found:
            dirs.setdefault(d.resolve(), None)
    return [_read_job(num, d) for num, d in enumerate(dirs)]


def _write_tables(jobs: list[Job], out_dir: Path) -> Report:
    keys = override_keys(jobs)
    bands = band_values(jobs, keys)
    written: dict[str, int] = {}
    for table, name in TABLES.items():
        rows = concat_table(jobs, keys, table, out_dir / name, bands if table == "metrics.csv" else None)
        if (out_dir / name).is_file():
            written[name] = rows
    written[SUMMARY_CSV] = write_summary(jobs, keys, out_dir / SUMMARY_CSV, bands)
    return Report(out_dir, jobs, keys, written, bands is not None)


def aggregate(sweep_dir: Path | str) -> Report:
    """Write sweep.csv, sweep_summary.csv (and sweep_probe.csv / sweep_events.csv / sweep_tokens.csv
    when jobs have those tables) in the sweep dir; return what was found and written."""
    sweep_dir = Path(sweep_dir)
    jobs = find_jobs(sweep_dir)
    if not jobs:
        raise UserError(f"no sweep jobs in {sweep_dir} (no */.hydra/overrides.yaml)")
    return _write_tables(jobs, sweep_dir)


def aggregate_runs(paths: Iterable[Path | str], out_dir: Path | str) -> Report:
    """The same tables for separate runs (`is-study aggregate runs/2026-12-01 runs/2026-12-02 --out
    DIR`): every run dir at or below `paths` is a job (find_runs), and the tables go into out_dir
    (created if need be), with each run's run_dir relative to it."""
    jobs = find_runs(paths)
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create {out_dir}: {exc.strerror or exc}") from None
    if not os.access(out_dir, os.W_OK):
        raise UserError(f"cannot write to {out_dir}: permission denied")
    return _write_tables(jobs, out_dir)


def aggregate_paths(directories: list[Path], out: Path | None) -> tuple[Report, bool]:
    """`is-study aggregate DIR... [--out OUT]`: one sweep dir's own tables (without --out), or the
    tables of separate runs into OUT (default: the one directory given, when it is not a run dir);
    returns the report and whether it was a sweep dir's."""
    sweep = len(directories) == 1 and directories[0].is_dir() and bool(find_jobs(directories[0]))
    if sweep and out is None:
        return aggregate(directories[0]), True
    if out is None:
        if len(directories) > 1 or (directories[0] / ".hydra" / "overrides.yaml").is_file():
            raise UserError("several runs: say where their tables go with --out DIR")
        out = directories[0]
    return aggregate_runs(directories, out), False
