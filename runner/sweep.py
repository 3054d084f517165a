"""`is-study sweep`: a Hydra multirun (BasicSweeper syntax, Hydra's launchers) plus what Hydra lacks:
a dry run, resume, a progress bar, failure isolation and one table at the end (runner/aggregate.py).

Nothing here imports Hydra; what must touch it is in runner/hydra_app/ (`launch.sweep_plan` expands
the jobs exactly as BasicSweeper does, `launch.sweep_multirun` runs them, `worker.sweep_job` is the
picklable task function).

- Job dirs are `<sweep dir>/${hydra.job.num}` (conf/config.yaml), so the same overrides map every job
  to the same dir on a rerun, and `--resume` is a plain rerun into the same sweep dir.
- Resume and failure isolation happen inside each job (runner/sweep_job.py): a job whose dir holds
  DONE is skipped, a partial one reruns from scratch, and a failing one writes `<job dir>/ERROR`
  instead of raising, so it never stops the sweep. The failures are listed at the end.
- Progress counts DONE / ERROR markers on disk from a background thread, so it works the same
  whether jobs run in this process (basic) or in other processes or machines (joblib, submitit, ray).
- `<sweep dir>/sweep.json` records the job list, so `--resume` with different overrides is refused
  (job num → dir would no longer match).
"""

from __future__ import annotations

import datetime as _dt
import importlib.util
import json
import os
import shlex
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.errors import UserError
from runner.hydra_app.overrides import quote_override_value
from runner.records import DONE, ERROR, write_json_atomic
from runner.sweep_job import error_line

MANIFEST = "sweep.json"
DEFAULT_ROOT = "multirun"


@dataclass(frozen=True)
class Launcher:
    name: str  # --launcher NAME
    preset: str  # hydra/launcher=PRESET (conf/hydra/launcher/PRESET.yaml)
    plugin: str | None  # the module its extra installs
    extra: str | None  # pip install 'is-study[EXTRA]'
    jobs_key: str | None  # the override --jobs N sets


LAUNCHERS = {
    "basic": Launcher("basic", "serial", None, None, None),
    "joblib": Launcher("joblib", "parallel", "hydra_plugins.hydra_joblib_launcher", "parallel", "hydra.launcher.n_jobs"),
    # submitit's local executor starts a whole batch at once: cap the batch instead.
    "submitit-local": Launcher("submitit-local", "submitit-local", "hydra_plugins.hydra_submitit_launcher", "slurm",
                               "hydra.sweeper.max_batch_size"),
    "submitit-slurm": Launcher("submitit-slurm", "submitit-slurm", "hydra_plugins.hydra_submitit_launcher", "slurm",
                               "hydra.launcher.array_parallelism"),
    "ray": Launcher("ray", "ray-cluster", "hydra_plugins.hydra_ray_launcher", "ray", "++hydra.launcher.ray.init.num_cpus"),
}
# hydra/launcher=NAME given directly, as our preset or as the plugin's own config name.
_BY_OPTION = {
    **{spec.preset: spec for spec in LAUNCHERS.values()},
    "basic": LAUNCHERS["basic"],
    "joblib": LAUNCHERS["joblib"],
    "submitit_local": LAUNCHERS["submitit-local"],
    "submitit_slurm": LAUNCHERS["submitit-slurm"],
    "ray": LAUNCHERS["ray"],
    "ray_aws": LAUNCHERS["ray"],
}


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _value(override: str) -> str:
    return override.split("=", 1)[1] if "=" in override else ""


def _find(overrides: list[str], key: str) -> str | None:
    """The value of the last override of `key`, or None."""
    found = None
    for o in overrides:
        if "=" in o and _key(o) == key:
            found = _value(o)
    return found


def plugin_installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_launcher_installed(spec: Launcher) -> None:
    if spec.plugin and not plugin_installed(spec.plugin):
        raise UserError(f"launcher {spec.name} needs the [{spec.extra}] extra: pip install 'is-study[{spec.extra}]'")


# ----------------------------------------------------------------------------------------- request
@dataclass
class Request:
    overrides: list[str] = field(default_factory=list)
    name: str | None = None
    resume: bool = False
    dry_run: bool = False
    launcher: str | None = None
    jobs: int | None = None


@dataclass
class Plan:
    jobs: list[list[str]]
    sweep_dir: Path
    overrides: list[str]  # what goes to Hydra's multirun
    launcher: Launcher | None


def _check_name(name: str) -> None:
    p = Path(name)
    if not name.strip() or p.is_absolute() or ".." in p.parts:
        raise UserError(f"--name {name!r}: give a plain name (it becomes {DEFAULT_ROOT}/NAME); "
                        f"for another place use hydra.sweep.dir=DIR")


def build_overrides(req: Request) -> tuple[list[str], Launcher | None]:
    """The user's overrides plus what --launcher, --jobs, --name and the sweep's logging add.
    Ours come first; an override the user wrote for the same key wins (we then add nothing)."""
    user = list(req.overrides)
    ours: list[str] = []
    chosen = _find(user, "hydra/launcher")
    spec: Launcher | None = None
    if req.launcher is not None:
        spec = LAUNCHERS.get(req.launcher)
        if spec is None:
            raise UserError(f"--launcher {req.launcher!r}: valid: {', '.join(LAUNCHERS)}")
        if chosen is not None:
            raise UserError(f"give either --launcher or hydra/launcher={chosen}, not both")
        ours.append(f"hydra/launcher={spec.preset}")
    elif chosen is not None:
        spec = _BY_OPTION.get(chosen)
    if spec is not None:
        check_launcher_installed(spec)
    if req.jobs is not None:
        if req.jobs < 1:
            raise UserError(f"--jobs {req.jobs}: must be ≥ 1")
        if spec is None or spec.jobs_key is None:
            if req.jobs > 1:
                raise UserError("--jobs: the basic launcher runs one job at a time; add --launcher joblib "
                                "(or submitit-local, submitit-slurm, ray)")
        elif _find(user, _key(spec.jobs_key)) is None:
            ours.append(f"{spec.jobs_key}={req.jobs}")
    if spec is not None and spec.name == "submitit-local" and req.jobs is None \
            and _find(user, "hydra.sweeper.max_batch_size") is None:
        ours.append(f"hydra.sweeper.max_batch_size={os.cpu_count() or 1}")
    # Jobs print nothing (their results are in their dirs) and Hydra logs nothing over the progress bar.
    for group in ("hydra/job_logging", "hydra/hydra_logging"):
        if _find(user, group) is None:
            ours.append(f"{group}=none")
    if req.name is not None:
        _check_name(req.name)
        if _find(user, "hydra.sweep.dir") is None:
            ours.append(f"hydra.sweep.dir={quote_override_value(f'{DEFAULT_ROOT}/{req.name}')}")
    return ours + user, spec


def plan(req: Request) -> Plan:
    """Expand the jobs and fix the sweep dir (resolved once, then passed to Hydra as a literal)."""
    from runner.hydra_app import launch

    if req.resume and req.name is None and _find(req.overrides, "hydra.sweep.dir") is None:
        raise UserError("--resume needs the sweep to resume: --name NAME or hydra.sweep.dir=DIR")
    overrides, spec = build_overrides(req)
    info = launch.sweep_plan(overrides)
    sweep_dir = Path(info["sweep_dir"]).expanduser().resolve()
    final = [o for o in overrides if _key(o) != "hydra.sweep.dir"]
    final.append(f"hydra.sweep.dir={quote_override_value(str(sweep_dir))}")
    return Plan(info["jobs"], sweep_dir, final, spec)


# ----------------------------------------------------------------------------------------- progress
def scan_markers(sweep_dir: Path, since: float, done: set[str]) -> tuple[int, int]:
    """(jobs with DONE, jobs with an ERROR written since `since`) among the sweep dir's job dirs.
    `done` caches the dirs already seen complete (DONE is final within a run)."""
    failed = 0
    try:
        entries = list(os.scandir(sweep_dir))
    except OSError:
        return len(done), 0
    for entry in entries:
        if entry.name in done or entry.name.startswith(".") or not entry.is_dir():
            continue
        try:
            if os.stat(os.path.join(entry.path, ERROR)).st_mtime >= since:
                failed += 1
                continue
        except OSError:
            pass
        if os.path.isfile(os.path.join(entry.path, DONE)):
            done.add(entry.name)
    return len(done), failed


class Watcher:
    """A rich progress bar over the sweep's jobs, fed by counting markers on disk every `interval`
    seconds from a background thread. Disabled (a no-op) when stderr is not a terminal."""

    def __init__(self, sweep_dir: Path, total: int, enabled: bool, interval: float = 0.25):
        self.sweep_dir = Path(sweep_dir)
        self.total = total
        self.enabled = enabled
        self.interval = interval
        self.since = time.time() - 1.0
        self._done: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar = None

    def __enter__(self) -> "Watcher":
        if not self.enabled:
            return self
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self._bar = Progress(TextColumn("[bold]sweep[/bold]"), BarColumn(), MofNCompleteColumn(),
                             TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("eta"),
                             TimeRemainingColumn(), console=Console(stderr=True), transient=True)
        self._task = self._bar.add_task("sweep", total=self.total, info="")
        self._bar.start()
        self._update()
        self._thread = threading.Thread(target=self._loop, name="is-study-sweep-progress", daemon=True)
        self._thread.start()
        return self

    def _update(self) -> None:
        done, failed = scan_markers(self.sweep_dir, self.since, self._done)
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


# ----------------------------------------------------------------------------------------- the sweep
@dataclass
class Result:
    sweep_dir: Path
    total: int
    report: Any  # runner.aggregate.Report, or None when no job started
    skipped: int  # jobs already DONE before this run (--resume)
    wall_s: float
    aborted: str | None = None

    def jobs(self, status: str) -> list:
        return self.report.by_status(status) if self.report is not None else []

    @property
    def missing(self) -> int:
        """Jobs of the plan that have no dir at all (never started)."""
        found = len(self.report.jobs) if self.report is not None else 0
        return max(self.total - found, 0)

    @property
    def ok(self) -> bool:
        """Every job of the plan holds DONE. The markers on disk are the truth: a launcher that
        raised while collecting results after every job finished does not make the sweep fail."""
        return (self.report is not None and not self.jobs("failed") and not self.jobs("incomplete")
                and self.missing == 0)


def _has_jobs(sweep_dir: Path) -> bool:
    return sweep_dir.is_dir() and any(sweep_dir.glob("*/.hydra/overrides.yaml"))


def _check_target(req: Request, p: Plan) -> None:
    """Refuse to mix two sweeps in one dir, and refuse a resume whose job list differs."""
    d = p.sweep_dir
    if not req.resume:
        if _has_jobs(d):
            raise UserError(f"{d} already holds a sweep: add --resume to finish it, or choose another --name")
        return
    manifest = d / MANIFEST
    if not manifest.is_file() and not _has_jobs(d):
        raise UserError(f"--resume: no sweep in {d}")
    if manifest.is_file():
        try:
            old = json.loads(manifest.read_text(encoding="utf-8")).get("jobs")
        except ValueError:
            old = None
        if old is not None and old != p.jobs:
            if len(old) != len(p.jobs):
                why = f"{len(old)} jobs then, {len(p.jobs)} now"
            else:
                i = next(i for i, (a, b) in enumerate(zip(old, p.jobs)) if a != b)
                why = f"job {i} was `{' '.join(old[i])}`, now `{' '.join(p.jobs[i])}`"
            raise UserError(f"--resume: the overrides differ from the sweep in {d} ({why}); "
                            f"resume with the same overrides")


def _write_manifest(req: Request, p: Plan) -> None:
    path = p.sweep_dir / MANIFEST
    data: dict[str, Any] = {}
    if req.resume and path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            data = {}
    now = _dt.datetime.now().isoformat(timespec="seconds")
    data.setdefault("created", now)
    data["overrides"] = list(req.overrides)
    data["jobs"] = p.jobs
    data.setdefault("runs", []).append({"started": now, "launcher": p.launcher.name if p.launcher else "basic",
                                        "resume": req.resume})
    p.sweep_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, data)


def _count_done(sweep_dir: Path) -> int:
    return sum(1 for m in sweep_dir.glob(f"*/{DONE}") if not (m.parent / ERROR).exists()) if sweep_dir.is_dir() else 0


def run(req: Request, progress: bool | None = None) -> Result:
    """Run the sweep; then aggregate whatever is on disk. Raises UserError for bad input (nothing
    ran); job failures and an aborted launcher are in the Result."""
    from runner import aggregate as agg
    from runner.hydra_app import launch

    p = plan(req)
    _check_target(req, p)
    created = not p.sweep_dir.exists()
    _write_manifest(req, p)
    skipped = _count_done(p.sweep_dir)
    if progress is None:
        progress = sys.stderr.isatty()
    t0 = time.perf_counter()
    aborted = None
    try:
        with Watcher(p.sweep_dir, len(p.jobs), enabled=progress):
            launch.sweep_multirun(p.overrides)
    except KeyboardInterrupt as exc:
        exc.resume_hint = resume_hint(req, p.sweep_dir)  # the CLI prints it
        raise
    except Exception as exc:  # noqa: BLE001
        if not _has_jobs(p.sweep_dir):
            if created:  # nothing ran: leave no half-made sweep dir behind
                shutil.rmtree(p.sweep_dir, ignore_errors=True)
            if isinstance(exc, UserError):
                raise
            raise UserError(f"sweep: {error_line(exc)}") from None
        aborted = error_line(exc)
    wall = time.perf_counter() - t0
    report = agg.aggregate(p.sweep_dir) if _has_jobs(p.sweep_dir) else None
    return Result(p.sweep_dir, len(p.jobs), report, skipped, wall, aborted)


def dry_run(req: Request) -> tuple[Plan, set[int]]:
    """The plan, and with --resume the numbers of the jobs already DONE (those a resume skips)."""
    p = plan(req)
    done: set[int] = set()
    if req.resume and _has_jobs(p.sweep_dir):
        from runner.aggregate import find_jobs

        done = {j.num for j in find_jobs(p.sweep_dir) if j.status == "done"}
    return p, done


def resume_hint(req: Request, sweep_dir: Path) -> str:
    args = ["is-study", "sweep", *req.overrides]
    if req.launcher:
        args += ["--launcher", req.launcher]
    if req.jobs:
        args += ["--jobs", str(req.jobs)]
    if req.name:
        args += ["--name", req.name]
    elif _find(req.overrides, "hydra.sweep.dir") is None:
        args.append(f"hydra.sweep.dir={sweep_dir}")
    args.append("--resume")
    return " ".join(shlex.quote(a) for a in args)


def print_result(result: Result, req: Request, console: Any, limit: int = 20) -> None:
    """The end-of-sweep report, on the given (stderr) rich console. At most `limit` failed and
    `limit` incomplete jobs are listed one per line; sweep_summary.csv has them all."""
    from rich.markup import escape

    def say(text: str) -> None:
        console.print(text, soft_wrap=True)

    done, failed, incomplete = result.jobs("done"), result.jobs("failed"), result.jobs("incomplete")
    parts = [f"{len(done)} done" + (f" ({result.skipped} already done before this run)" if result.skipped else "")]
    parts.append(f"[red]{len(failed)} failed[/red]" if failed else "0 failed")
    if incomplete or result.missing:
        parts.append(f"[yellow]{len(incomplete) + result.missing} incomplete[/yellow]")
    say(f"[bold]sweep[/bold] {escape(str(result.sweep_dir))}: {result.total} jobs, {', '.join(parts)}; "
        f"{result.wall_s:.1f} s")
    if result.report is not None:
        say("  wrote " + ", ".join(f"{name} ({rows} rows)" for name, rows in result.report.written.items()))
    for kind, jobs, style in (("FAILED", failed, "red"), ("INCOMPLETE", incomplete, "yellow")):
        for job in jobs[:limit]:
            where = job.dir / ERROR if kind == "FAILED" else job.dir
            error = f": {escape(job.error or '')}" if kind == "FAILED" else ""
            say(f"  [{style}]{kind}[/{style}] job {job.num} [{escape(job.label())}]{error}  [dim]({escape(str(where))})[/dim]")
        if len(jobs) > limit:
            say(f"  … and {len(jobs) - limit} more {kind.lower()} jobs (see sweep_summary.csv)")
    if result.aborted and result.ok:
        say(f"  [yellow]note:[/yellow] the launcher raised after every job had finished: {escape(result.aborted)}")
    elif result.aborted:
        say(f"  [red]the launcher stopped the sweep:[/red] {escape(result.aborted)}")
    if not result.ok:
        say(f"  rerun what did not finish: {escape(resume_hint(req, result.sweep_dir))}")
