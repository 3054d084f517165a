"""What `is-study sweep` and `is-study aggregate` print on the console: the progress bar while a
sweep's jobs run, the notes as they happen, and the summary at the end (counts, the tables written,
one line per job that failed, is damaged or did not finish, and how to rerun them).

runner/sweep/command.py plans, runs, resumes and aggregates and returns what happened (a `Result`); this
module only words it, so the sweep itself runs the same with no console at all (benchmarks, tests).
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

from rich.markup import escape

from runner.records import ERROR
from runner.sweep import command as sweeps


def note(text: str) -> None:
    """A note from the sweep (a lock taken over from a dead sweep), printed on stderr as it happens."""
    print(f"is-study: note: {text}", file=sys.stderr, flush=True)


class ProgressBar:
    """A rich progress bar over the sweep's jobs, fed by counting markers on disk every `interval`
    seconds from a background thread, so it counts jobs run by any launcher (in this process or in
    others). Disabled (a no-op) when stderr is not a terminal. Passed to sweeps.run as `watch`."""

    def __init__(self, sweep_dir: Path, total: int, enabled: bool | None = None, interval: float = 0.25):
        self.sweep_dir = Path(sweep_dir)
        self.total = total
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.interval = interval
        self.since = time.time() - 1.0
        self._done: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar = None

    def __enter__(self) -> ProgressBar:
        if not self.enabled:
            return self
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._bar = Progress(
            TextColumn("[bold]sweep[/bold]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self._task = self._bar.add_task("sweep", total=self.total, info="")
        self._bar.start()
        self._update()
        self._thread = threading.Thread(target=self._loop, name="is-study-sweep-progress", daemon=True)
        self._thread.start()
        return self

    def _update(self) -> None:
        done, failed = sweeps.scan_markers(self.sweep_dir, self.since, self._done)
        info = f"[red]{failed} failed[/red]" if failed else ""
        self._bar.update(self._task, completed=min(done + failed, self.total), info=info)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._update()

    def __exit__(self, *exc: Any) -> None:
        if self._bar is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._update()
        self._bar.stop()


def print_result(result: sweeps.Result, req: sweeps.Request, console: Any, limit: int = 20) -> None:
    """The end-of-sweep report, on the given (stderr) rich console. At most `limit` jobs of each
    kind (failed, damaged, incomplete) are listed one per line; sweep_summary.csv has them all."""

    def say(text: str) -> None:
        console.print(text, soft_wrap=True)

    done, failed, incomplete = result.jobs("done"), result.jobs("failed"), result.jobs("incomplete")
    damaged = result.jobs("damaged")
    parts = [f"{len(done)} done" + (f" ({result.skipped} already done before this run)" if result.skipped else "")]
    parts.append(f"[red]{len(failed)} failed[/red]" if failed else "0 failed")
    if damaged:
        parts.append(f"[red]{len(damaged)} damaged[/red]")
    if incomplete or result.missing:
        parts.append(f"[yellow]{len(incomplete) + result.missing} incomplete[/yellow]")
    say(
        f"[bold]sweep[/bold] {escape(str(result.sweep_dir))}: {result.total} jobs, {', '.join(parts)}; "
        f"{result.wall_s:.1f} s"
    )
    if result.report is not None:
        say("  wrote " + ", ".join(f"{name} ({rows} rows)" for name, rows in result.report.written.items()))
    for line in problem_lines(result.report, limit) if result.report is not None else []:
        say(line)
    if result.aborted and result.ok:
        say(f"  [yellow]note:[/yellow] the launcher raised after every job had finished: {escape(result.aborted)}")
    elif result.aborted:
        say(f"  [red]the launcher stopped the sweep:[/red] {escape(result.aborted)}")
    if not result.ok:
        say(f"  rerun what did not finish: {escape(sweeps.resume_hint(req, result.sweep_dir))}")


def _lock_note(job_dir: Path) -> str:
    """For an incomplete job: who holds (or held) its lock, unless that process is known to be gone."""
    held = sweeps.live_job_lock(job_dir)
    if held is None:
        return ""
    holder, lock = held
    return escape(
        f": its lock names {holder} (still running there? if that process is gone and the "
        f"filesystem has no flock, delete {lock})"
    )


def problem_lines(report: Any, limit: int = 20) -> list[str]:
    """Rich-markup lines, one per failed, damaged or incomplete job (at most `limit` of each kind):
    its number, overrides, what is wrong and where. Shared by `sweep` and `aggregate`."""
    lines = []
    for kind, style in (("failed", "red"), ("damaged", "red"), ("incomplete", "yellow")):
        jobs = report.by_status(kind)
        for job in jobs[:limit]:
            if kind == "failed":
                where, why = job.dir / ERROR, f": {escape(job.error or '')}"
            elif kind == "damaged":
                where, why = job.damage.path, f": {escape(job.damage.reason)}"
            else:
                where, why = job.dir, _lock_note(job.dir)
            lines.append(
                f"  [{style}]{kind.upper()}[/{style}] job {job.num} {escape(f'[{job.label()}]')}{why}  "
                f"[dim]({escape(str(where))})[/dim]"
            )
        if len(jobs) > limit:
            lines.append(f"  … and {len(jobs) - limit} more {kind} jobs (see sweep_summary.csv)")
    return lines


def aggregate_hints(report: Any) -> list[str]:
    """What `is-study aggregate` adds below the problem lines: that a sweep still runs there, and how
    to rerun the jobs that did not finish (the sweep's own command from sweep.json, with --resume)."""
    lines = []
    holder = sweeps.running_sweep(report.sweep_dir)
    if holder is not None:
        lines.append(
            f"  [yellow]note:[/yellow] a sweep is still running here ({escape(holder)}): "
            f"the jobs it has not finished count as incomplete"
        )
    unfinished = [j for j in report.jobs if j.status in ("damaged", "incomplete", "failed")]
    if unfinished and holder is None:
        again = sweeps.rerun_command(report.sweep_dir)
        lines.append(f"  rerun them: {escape(again)}" if again else "  rerun them: the sweep's command with --resume")
    return lines
