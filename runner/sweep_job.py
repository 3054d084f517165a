"""One sweep job in its dir, whatever process or machine runs it; no Hydra here (the task function
that calls this is runner/hydra_app/worker.py).

- A job whose dir holds DONE returns its summary.json without computing anything: `--resume` is a
  plain rerun into the same sweep dir.
- Any other job clears the partial files of an earlier attempt (everything but `.hydra/`) and runs
  from scratch.
- A failing job writes `<job dir>/ERROR` (the error on the first line, then the traceback) and
  returns a failure marker instead of raising: Hydra's BasicSweeper would otherwise raise on the
  first failed job and the sweep would end there.
"""

from __future__ import annotations

import json
import os
import shutil
import traceback
from pathlib import Path
from typing import Any, Callable

from runner.errors import UserError
from runner.records import DONE, ERROR, is_done


def error_line(exc: BaseException) -> str:
    """The one line a failure is listed by: a UserError's own message, else the exception's type and
    first line."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else ""
    if isinstance(exc, UserError):
        return line or type(exc).__name__
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


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
        if entry.name == ".hydra" or entry.suffix == ".log":
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def run_job(cfg: Any, job_dir: Path, sweep_dir: Path, work: Callable[[Any, Path], Any]) -> Any:
    """One sweep job (see the module docstring). `work(cfg, job_dir)` is the study."""
    job_dir = Path(job_dir)
    if is_done(job_dir) and not (job_dir / ERROR).exists():
        return {**_read_summary(job_dir), "sweep": "skipped"}
    clear_partial(job_dir, sweep_dir)
    try:
        return work(cfg, job_dir)
    except Exception as exc:  # noqa: BLE001 - every failure is recorded, none stops the sweep
        line = error_line(exc)
        (job_dir / DONE).unlink(missing_ok=True)
        tmp = job_dir / f".{ERROR}.tmp"
        tmp.write_text(f"{line}\n\n{traceback.format_exc()}", encoding="utf-8")
        os.replace(tmp, job_dir / ERROR)
        return {"status": "failed", "error": line, "run_dir": str(job_dir), "sweep": "failed"}
