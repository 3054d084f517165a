"""`is-study sweep`: a Hydra multirun (BasicSweeper syntax, Hydra's launchers) plus what Hydra lacks:
a dry run, resume, a progress bar, failure isolation and one table at the end (runner/sweep/aggregate.py).

Nothing here imports Hydra; what must touch it is in runner/hydra_app/ (`launch.sweep_plan` expands
the jobs exactly as BasicSweeper does, `launch.sweep_multirun` runs them, `worker.sweep_job` is the
picklable task function).

- One sweep per directory: the sweep holds `<sweep dir>/.sweep.lock` (runner/sweep/locks.py) from
  before it looks at the dir until it has aggregated. A second sweep, or a `--resume`, into a locked
  dir is refused in one line naming the holder; a lock left by a sweep that died is taken over with
  a note.
- Job dirs are `<sweep dir>/<hydra.job.num zero-padded>` (00, 01, …; the width from the job count,
  kept in sweep.json for `--resume`), so the same overrides map every job to the same dir on a rerun,
  the dirs sort as the jobs do, and `--resume` is a plain rerun into the same sweep dir.
- Resume and failure isolation happen inside each job (runner/sweep/job.py): a job whose dir holds a
  whole result (DONE and valid tables) is skipped, a partial or damaged one reruns from scratch, and
  a failing one writes `<job dir>/ERROR` instead of raising, so it never stops the sweep. The
  failures are listed at the end.
- Progress counts DONE / ERROR markers on disk (`scan_markers`), so it works the same whether jobs
  run in this process (basic) or in other processes or machines (joblib, submitit, ray).
- Nothing here prints: `run` returns a `Result`, and takes the progress bar (`watch`) and the note
  printer (`say`) from its caller; the console side is runner/sweep/report.py.
- `<sweep dir>/sweep.json` records the job list, so `--resume` with different overrides is refused
  (job num → dir would no longer match), and the whole command line of each run (`command`, for
  reports).

About 540 lines on purpose: the plan, the lock, resume and the run are one sequence, read top to bottom;
the console is runner/sweep/report.py's and the jobs' own logic runner/sweep/job.py's.

About 540 lines on purpose: planning, locking, resuming and the dry run share the sweep dir's manifest
and lock, and read best as one lifecycle.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import importlib.util
import json
import os
import shlex
import shutil
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.bounded import clip
from runner.errors import UserError
from runner.hydra_app.overrides import quote_override_value
from runner.records import DONE, ERROR, write_json_atomic
from runner.sweep.job import JOB_LOCK, error_line
from runner.sweep.locks import DirLock, LockBusy, holder_of

MANIFEST = "sweep.json"
DEFAULT_ROOT = "multirun"
LOCK = ".sweep.lock"
MIN_JOB_DIR_WIDTH = 2


@dataclass(frozen=True)
class Launcher:
    name: str  # --launcher NAME
    preset: str  # hydra/launcher=PRESET (conf/hydra/launcher/PRESET.yaml)
    plugin: str | None  # the module its extra installs
    extra: str | None  # pip install 'is-study[EXTRA]'
    jobs_key: str | None  # the override --jobs N sets


LAUNCHERS = {
    "basic": Launcher("basic", "basic", None, None, None),
    "joblib": Launcher("joblib", "joblib", "hydra_plugins.hydra_joblib_launcher", "parallel", "hydra.launcher.n_jobs"),
    # submitit's local executor starts a whole batch at once: cap the batch instead.
    "submitit-local": Launcher(
        "submitit-local",
        "submitit-local",
        "hydra_plugins.hydra_submitit_launcher",
        "slurm",
        "hydra.sweeper.max_batch_size",
    ),
    "submitit-slurm": Launcher(
        "submitit-slurm",
        "submitit-slurm",
        "hydra_plugins.hydra_submitit_launcher",
        "slurm",
        "hydra.launcher.array_parallelism",
    ),
    "ray": Launcher("ray", "ray", "hydra_plugins.hydra_ray_launcher", "ray", "++hydra.launcher.ray.init.num_cpus"),
}
# hydra/launcher=NAME given directly: our presets (named as --launcher names them), or a plugin's own
# config that no preset of ours shadows.
_BY_OPTION = {
    **LAUNCHERS,
    "submitit_local": LAUNCHERS["submitit-local"],
    "submitit_slurm": LAUNCHERS["submitit-slurm"],
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
    argv: list[str] | None = None  # the command line after `is-study`, as typed (the CLI sets it)

    def command(self) -> list[str]:
        """The whole command line after `is-study`: as typed, else rebuilt from the request."""
        if self.argv is not None:
            return list(self.argv)
        args = ["sweep", *self.overrides]
        for flag, value in (("--launcher", self.launcher), ("--jobs", self.jobs), ("--name", self.name)):
            if value is not None:
                args += [flag, str(value)]
        return args + (["--resume"] if self.resume else []) + (["--dry-run"] if self.dry_run else [])


@dataclass
class Plan:
    jobs: list[list[str]]
    sweep_dir: Path
    overrides: list[str]  # what goes to Hydra's multirun
    launcher: Launcher | None
    job_dir_width: int = MIN_JOB_DIR_WIDTH
    sweep_dir_varies: bool = False  # another launch picks another dir (the default: its time, a random suffix)


def _check_name(name: str) -> None:
    p = Path(name)
    if not name.strip() or p.is_absolute() or ".." in p.parts:
        raise UserError(
            f"--name {clip(name)}: give a plain name (it becomes {DEFAULT_ROOT}/NAME); "
            f"for another place use hydra.sweep.dir=DIR"
        )


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
            raise UserError(f"--launcher {clip(req.launcher)}: valid: {', '.join(LAUNCHERS)}")
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
                raise UserError(
                    "--jobs: the basic launcher runs one job at a time; add --launcher joblib "
                    "(or submitit-local, submitit-slurm, ray)"
                )
        elif _find(user, _key(spec.jobs_key)) is None:
            ours.append(f"{spec.jobs_key}={req.jobs}")
    if (
        spec is not None
        and spec.name == "submitit-local"
        and req.jobs is None
        and _find(user, "hydra.sweeper.max_batch_size") is None
    ):
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


def _read_manifest(sweep_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((sweep_dir / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def job_dir_width(sweep_dir: Path, n_jobs: int, resume: bool) -> int:
    """Digits of a job dir's name: enough for the last job, at least 2. A resumed sweep keeps the
    width it was made with (sweep.json), and one made before dirs were padded keeps plain numbers."""
    if resume:
        recorded = _read_manifest(sweep_dir).get("job_dir_width")
        if isinstance(recorded, int) and recorded > 0:
            return recorded
        if (sweep_dir / "0" / ".hydra").is_dir():
            return 1
    return max(MIN_JOB_DIR_WIDTH, len(str(max(n_jobs - 1, 0))))


def plan(req: Request, validate: bool = False) -> Plan:
    """Expand the jobs and fix the sweep dir (resolved once, then passed to Hydra as a literal). With
    `validate`, compose the jobs as the sweep does before launching (for --dry-run)."""
    from runner.hydra_app import launch

    if req.resume and req.name is None and _find(req.overrides, "hydra.sweep.dir") is None:
        raise UserError("--resume needs the sweep to resume: --name NAME or hydra.sweep.dir=DIR")
    overrides, spec = build_overrides(req)
    info = launch.sweep_plan(overrides, validate=validate)
    sweep_dir = Path(info["sweep_dir"]).expanduser().resolve()
    final = [o for o in overrides if _key(o) != "hydra.sweep.dir"]
    final.append(f"hydra.sweep.dir={quote_override_value(str(sweep_dir))}")
    width = job_dir_width(sweep_dir, len(info["jobs"]), req.resume)
    if _find(final, "hydra.sweep.subdir") is None:
        final.append(
            f"hydra.sweep.subdir={quote_override_value('${isstudy_job_dir:${hydra.job.num},' + str(width) + '}')}"
        )
    return Plan(info["jobs"], sweep_dir, final, spec, width, bool(info.get("sweep_dir_varies")))


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


# ----------------------------------------------------------------------------------------- the sweep
@dataclass
class Result:
    sweep_dir: Path
    total: int
    report: Any  # runner.aggregate.Report, or None when no job started
    skipped: int  # jobs already DONE before this run (--resume)
    wall_s: float
    aborted: str | None = None
    notes: list[str] = field(default_factory=list)

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
        return (
            self.report is not None
            and not self.jobs("failed")
            and not self.jobs("incomplete")
            and not self.jobs("damaged")
            and self.missing == 0
        )


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
        old = _read_manifest(d).get("jobs")
        if old is not None and old != p.jobs:
            if len(old) != len(p.jobs):
                why = f"{len(old)} jobs then, {len(p.jobs)} now"
            else:
                i = next(i for i, (a, b) in enumerate(zip(old, p.jobs)) if a != b)
                why = f"job {i} was {clip(' '.join(map(str, old[i])))}, now {clip(' '.join(p.jobs[i]))}"
            raise UserError(
                f"--resume: the overrides differ from the sweep in {d} ({why}); resume with the same overrides"
            )


def command_line(args: list[str]) -> str:
    """`is-study ARGS`, shell-quoted: what a user pastes to run it again."""
    return " ".join(shlex.quote(a) for a in ["is-study", *args])


def _write_manifest(req: Request, p: Plan, started: str) -> None:
    """sweep.json: the job list (what --resume checks), the job dirs' width, and the command line of
    the sweep (`command`, `argv`: the run that made it) and of each run (`runs`, resumes included)."""
    path = p.sweep_dir / MANIFEST
    data: dict[str, Any] = _read_manifest(p.sweep_dir) if req.resume else {}
    args = req.command()
    data.setdefault("created", started)
    data.setdefault("command", command_line(args))
    data.setdefault("argv", ["is-study", *args])
    data["overrides"] = list(req.overrides)
    data["jobs"] = p.jobs
    data["job_dir_width"] = p.job_dir_width
    data.setdefault("runs", []).append(
        {
            "started": started,
            "launcher": p.launcher.name if p.launcher else "basic",
            "resume": req.resume,
            "command": command_line(args),
        }
    )
    write_json_atomic(path, data, incomplete=f"the sweep in {p.sweep_dir} did not start")


def _done_markers(sweep_dir: Path) -> dict[str, tuple[int, int]]:
    """{job dir name: (inode, mtime) of its DONE}: a job rerun writes a new DONE (a new file)."""
    found = {}
    for marker in sweep_dir.glob(f"*/{DONE}"):
        try:
            st = marker.stat()
        except OSError:
            continue
        found[marker.parent.name] = (st.st_ino, st.st_mtime_ns)
    return found


def busy_message(d: Path, busy: LockBusy, resume: bool) -> str:
    holder = busy.holder
    who = holder.describe() if holder else f"a holder that has not written {busy.path.name} yet"
    gone = holder is not None and holder.gone()
    if gone:  # flock still held: a process the dead sweep started (a launcher's worker) lives on
        who += f"; pid {holder.pid} has exited but a process it started still holds the lock"
    elif not busy.checkable and holder is not None:
        who += f"; if that sweep is gone, delete {busy.path}"
    then = ", then --resume it" if resume else ", or choose another --name"
    return f"{d} is in use by another sweep ({who}): wait for it to finish{then}"


Watch = Callable[[Path, int], AbstractContextManager[Any]]  # (sweep dir, job count) → held while the jobs run


def run(req: Request, watch: Watch | None = None, say: Callable[[str], None] | None = None) -> Result:
    """Run the sweep; then aggregate whatever is on disk. Raises UserError for bad input (nothing
    ran) and for a sweep dir another sweep holds; job failures and an aborted launcher are in the
    Result. Nothing is printed here: `watch(sweep_dir, n_jobs)` is entered while the jobs run (the
    CLI's progress bar, runner/sweep/report.py), and `say(note)` is called for each note as it
    happens; the notes are also in Result.notes."""
    from runner.hydra_app import launch
    from runner.sweep import aggregate as agg

    say = say or (lambda text: None)
    p = plan(req)
    created = not p.sweep_dir.exists()
    made = [d for d in (p.sweep_dir, *p.sweep_dir.parents) if not d.exists()]  # what mkdir creates, deepest first
    try:
        p.sweep_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(
            f"the sweep dir cannot be created or written: {p.sweep_dir} ({exc.strerror or exc}); "
            f"choose another --name or hydra.sweep.dir"
        ) from None
    lock = DirLock(p.sweep_dir / LOCK, command=command_line(req.command()))
    try:
        lock.acquire()
    except LockBusy as busy:
        raise UserError(busy_message(p.sweep_dir, busy, req.resume)) from None
    except OSError as exc:
        raise UserError(f"cannot lock the sweep dir {p.sweep_dir}: {exc.strerror or exc}") from None
    notes = [lock.note] if lock.note else []
    for note in notes:
        say(note)
    try:
        return _run_locked(req, p, watch, notes, agg, launch)
    except BaseException:
        if created and not _has_jobs(p.sweep_dir):  # nothing ran: leave no half-made sweep dir behind
            shutil.rmtree(p.sweep_dir, ignore_errors=True)
            for parent in made[1:]:  # nor the parents made for it (`multirun/`), unless something else is there now
                try:
                    parent.rmdir()
                except OSError:
                    break
        raise
    finally:
        lock.release()


def _run_locked(req: Request, p: Plan, watch: Watch | None, notes: list[str], agg, launch) -> Result:
    _check_target(req, p)
    started = _dt.datetime.now().isoformat(timespec="seconds")
    _write_manifest(req, p, started)
    done_before = _done_markers(p.sweep_dir)
    t0 = time.perf_counter()
    aborted = None
    try:
        with (watch or _unwatched)(p.sweep_dir, len(p.jobs)):
            launch.sweep_multirun(p.overrides)
    except KeyboardInterrupt as exc:
        exc.resume_hint = resume_hint(req, p.sweep_dir)  # the CLI prints it
        raise
    except Exception as exc:
        if not _has_jobs(p.sweep_dir):
            if isinstance(exc, UserError):
                raise
            raise UserError(f"sweep: {error_line(exc)}") from None
        aborted = error_line(exc)
    wall = time.perf_counter() - t0
    report = agg.aggregate(p.sweep_dir) if _has_jobs(p.sweep_dir) else None
    after = _done_markers(p.sweep_dir)
    kept = {name for name, ident in done_before.items() if after.get(name) == ident}
    skipped = sum(1 for j in report.by_status("done") if j.dir.name in kept) if report is not None else 0
    return Result(p.sweep_dir, len(p.jobs), report, skipped, wall, aborted, notes)


def _unwatched(sweep_dir: Path, total: int) -> AbstractContextManager[None]:
    return contextlib.nullcontext()


def running_sweep(sweep_dir: Path) -> str | None:
    """Who holds the sweep dir's lock, if a live sweep does (without taking it): for aggregate's note."""
    holder = holder_of(Path(sweep_dir) / LOCK)
    if holder is None or holder.gone():
        return None
    return holder.describe()


def dry_run(req: Request) -> tuple[Plan, set[int]]:
    """The plan, and with --resume the numbers of the jobs already DONE (those a resume skips).
    Refuses what the sweep would refuse before running a job, with the same message: a job that
    does not compose, a dir that holds another sweep, a --resume whose overrides differ. Reads only."""
    p = plan(req, validate=True)
    _check_target(req, p)
    done: set[int] = set()
    if req.resume and _has_jobs(p.sweep_dir):
        from runner.sweep.aggregate import find_jobs

        done = {j.num for j in find_jobs(p.sweep_dir) if j.status == "done"}
    return p, done


def dry_run_dir(req: Request, p: Plan) -> str:
    """Where the dry run says the sweep will go. The default dir is named when the sweep starts (the
    time then and a random suffix, so two sweeps never share one): no dry run can know that name, so
    it says so and how to fix one, rather than print a name the sweep will not use."""
    if not p.sweep_dir_varies:
        return f"sweep dir {p.sweep_dir}"
    if _find(req.overrides, "hydra.sweep.dir") is not None:
        return "sweep dir named when the sweep starts (hydra.sweep.dir uses the time or a random suffix)"
    return (
        f"sweep dir named when the sweep starts: {DEFAULT_ROOT}/DATE_TIME-RANDOM; "
        f"give --name NAME to fix it: {DEFAULT_ROOT}/NAME"
    )


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


def live_job_lock(job_dir: Path) -> tuple[str, Path] | None:
    """(who holds it, the lock file) for a job dir whose lock names a process not known to be gone;
    None otherwise (a lock left by a killed job is taken over by the next run of it)."""
    lock = Path(job_dir) / JOB_LOCK
    holder = holder_of(lock)
    if holder is None or holder.gone():
        return None
    return holder.describe(), lock


def rerun_command(sweep_dir: Path) -> str | None:
    """The command that reruns what did not finish in a sweep dir: the sweep's own command from
    sweep.json, with --resume and without --dry-run; None when sweep.json has no sweep command."""
    command = _read_manifest(Path(sweep_dir)).get("command")
    if not isinstance(command, str) or not command.startswith("is-study sweep"):
        return None
    args = shlex.split(command)
    again = command if "--resume" in args else f"{command} --resume"
    if "--dry-run" in args:
        again = again.replace(" --dry-run", "")
    return again
