"""One sweep job in its dir, whatever process or machine runs it; no Hydra here (the task function
that calls this is runner/hydra_app/worker.py).

- A job locks its dir (`<job dir>/.job.lock`, runner/sweep/locks.py) while it runs: a second attempt
  at the same job (a SLURM requeue while the first still runs, two sweeps) finds it locked, leaves
  the dir alone and returns a marker; only one process ever writes a job's files.
- A job whose dir holds a whole result (DONE and valid tables, runner/sweep/integrity.py) returns its
  summary.json without computing anything: `--resume` is a plain rerun into the same sweep dir.
- Any other job clears the partial files of an earlier attempt (everything but `.hydra/`) and runs
  from scratch: a damaged job is rerun.
- A failing job writes `<job dir>/ERROR` (the error on the first line, then the traceback) and
  returns a failure marker instead of raising: Hydra's BasicSweeper would otherwise raise on the
  first failed job and the sweep would end there. When even ERROR cannot be written (a full disk)
  the job is left without DONE, and `--resume` reruns it.
"""

from __future__ import annotations

import json
import shutil
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner.errors import UserError
from runner.records import DONE, ERROR, WriteFailed, is_done, write_text_atomic
from runner.sweep.integrity import damage
from runner.sweep.locks import DirLock, LockBusy

JOB_LOCK = ".job.lock"


ERROR_LINE_LIMIT = 500


def error_line(exc: BaseException) -> str:
    """The one line a failure is listed by: a UserError's own message, else the exception's type and
    first line; at most ERROR_LINE_LIMIT characters (the rest is in ERROR's traceback)."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else ""
    if not isinstance(exc, UserError):
        line = f"{type(exc).__name__}: {line}" if line else type(exc).__name__
    line = line or type(exc).__name__
    return line if len(line) <= ERROR_LINE_LIMIT else f"{line[:ERROR_LINE_LIMIT]}… ({len(line):,} characters)"


def _read_summary(job_dir: Path) -> dict:
    try:
        return json.loads((job_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"status": "ok", "run_dir": str(job_dir)}


def clear_partial(job_dir: Path, sweep_dir: Path) -> None:
    """Remove what an earlier, unfinished attempt left in a job dir: everything but `.hydra/` (just
    rewritten by Hydra for this attempt) and Hydra's job log. Only ever inside the sweep dir, and
    never the sweep dir itself."""
    job_dir, sweep_dir = Path(job_dir).resolve(), Path(sweep_dir).resolve()
    if job_dir == sweep_dir or sweep_dir not in job_dir.parents:
        return
    for entry in job_dir.iterdir():
        if entry.name in (".hydra", JOB_LOCK) or entry.suffix == ".log":
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def is_complete(job_dir: Path) -> bool:
    """DONE, no ERROR, and every file whole: what `--resume` skips."""
    return is_done(job_dir) and not (job_dir / ERROR).exists() and damage(job_dir) is None


def run_job(cfg: Any, job_dir: Path, sweep_dir: Path, work: Callable[[Any, Path], Any]) -> Any:
    """One sweep job (see the module docstring). `work(cfg, job_dir)` is the study."""
    job_dir = Path(job_dir)
    lock = DirLock(job_dir / JOB_LOCK, command=f"sweep job in {job_dir}")
    try:
        lock.acquire()
    except LockBusy as busy:
        who = busy.holder.describe() if busy.holder else "an unknown holder"
        return {
            "status": "busy",
            "error": f"another process is running this job ({who})",
            "run_dir": str(job_dir),
            "sweep": "busy",
        }
    except OSError as exc:  # e.g. a full disk: nothing was written, so the job stays incomplete
        return {
            "status": "failed",
            "error": f"cannot lock {job_dir}: {exc.strerror or exc}",
            "run_dir": str(job_dir),
            "sweep": "failed",
        }
    try:
        if is_complete(job_dir):
            return {**_read_summary(job_dir), "sweep": "skipped"}
        clear_partial(job_dir, sweep_dir)
        try:
            return work(cfg, job_dir)
        except Exception as exc:  # noqa: BLE001 - every failure is recorded, none stops the sweep
            line = error_line(exc)
            _record_failure(job_dir, line)
            return {"status": "failed", "error": line, "run_dir": str(job_dir), "sweep": "failed"}
    finally:
        lock.release()


def _record_failure(job_dir: Path, line: str) -> None:
    (job_dir / DONE).unlink(missing_ok=True)
    try:
        write_text_atomic(job_dir / ERROR, f"{line}\n\n{traceback.format_exc()}")
    except WriteFailed:
        pass  # no DONE and no ERROR: the job counts as incomplete, and --resume reruns it
