"""Nothing lost, nothing silently corrupted (issue 19), each fault made for real:

- two sweeps started at once on one directory: one refuses in one line naming the other, the other
  finishes with exactly the data of an undisturbed sweep; a --resume into the running sweep refuses too;
- a sweep killed with SIGKILL leaves a stale lock, which its --resume takes over with a note;
- a job dir locked by another live process (a requeued job's first attempt) is left alone;
- aggregate over a job cut short in the middle of a line and one with garbage appended reports both by
  path and reason, leaves them out and exits 1; --resume reruns them and sweep.csv equals the
  undisturbed sweep's, byte for byte;
- a YAML alias bomb is refused in under a second, in a message under 300 characters; the same cap
  holds for --target-kwargs; no message quotes more than ~200 characters of a value;
- a full disk, simulated by a writer that raises OSError(ENOSPC), names the file and says the run dir
  is incomplete; in a sweep the job is failed and --resume reruns it.
"""

from __future__ import annotations

import csv
import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from runner import records
from runner.errors import UserError
from runner.sweep.integrity import Damage, check_table
from runner.sweep.locks import DirLock, Holder, LockBusy
from tests.helpers.cli import kill_at_first_done, run_cli
from tests.helpers.repo import REPO

# 4 jobs of 300 steps × 2 updates on a tiny world: long enough (seconds) that a second sweep started
# with it meets it running, short enough for CI
SWEEP = [
    "correction=tis,icepop",
    "seed=0,1",
    "train.steps=300",
    "rollout.batch_size=2",
    "rollout.group_size=2",
    "log.quiet=true",
    "log.timing=false",
    "log.tokens_every=0",
]
JOBS, ROWS_PER_JOB = 4, 600 + 1  # 300 steps × 2 updates, then the final row (J after the last update)
TINY = ["train.steps=3", "rollout.batch_size=2", "rollout.group_size=2", "log.quiet=true", "log.timing=false"]


def _read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _sweep_process(sweep_dir: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "runner", "sweep", *SWEEP, f"hydra.sweep.dir={sweep_dir}", *extra],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory) -> Path:
    """The sweep, run alone: what every disturbed sweep must end up equal to."""
    d = tmp_path_factory.mktemp("reliability") / "undisturbed"
    code, _, err = run_cli("sweep", *SWEEP, f"hydra.sweep.dir={d}")
    assert code == 0, err
    rows = _read_csv(d / "sweep.csv")
    assert len(rows) == JOBS * ROWS_PER_JOB
    return d


# ----------------------------------------------------------------------------------------- one sweep per dir
@pytest.mark.slow
def test_two_sweeps_at_once_one_refuses_the_other_finishes_exactly(undisturbed, tmp_path):
    d = tmp_path / "contested"
    first, second = _sweep_process(d), _sweep_process(d)
    try:
        deadline = time.monotonic() + 120
        while first.poll() is None and second.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        loser, winner = (first, second) if first.poll() is not None else (second, first)
        _, loser_err = loser.communicate(timeout=30)
        assert loser.returncode == 2, loser_err
        line = loser_err.strip()
        assert len(line.splitlines()) == 1, line
        assert f"{d} is in use by another sweep (host {socket.gethostname()}, pid {winner.pid}, started " in line
        assert winner.poll() is None, "the winner should still be running"

        # --resume into the dir while the sweep runs is refused the same way, and changes nothing
        code, _, err = run_cli("sweep", *SWEEP, f"hydra.sweep.dir={d}", "--resume")
        assert code == 2 and f"pid {winner.pid}" in err and "then --resume it" in err, err
        _, winner_err = winner.communicate(timeout=300)
    finally:
        for p in (first, second):
            if p.poll() is None:
                p.kill()
    assert winner.returncode == 0, winner_err
    assert (d / "sweep.csv").read_bytes() == (undisturbed / "sweep.csv").read_bytes()
    for job in sorted(d.glob("*/metrics.csv")):
        assert check_table(job) == ROWS_PER_JOB
    assert not (d / ".sweep.lock").exists() and not list(d.rglob("*.tmp"))


@pytest.mark.slow
def test_a_stale_lock_is_taken_over_with_a_note(undisturbed, tmp_path):
    d = tmp_path / "killed"
    proc = _sweep_process(d)
    kill_at_first_done(proc, d)
    stale = json.loads((d / ".sweep.lock").read_text())
    assert stale["pid"] == proc.pid and stale["host"] == socket.gethostname()

    code, _, err = run_cli("sweep", *SWEEP, f"hydra.sweep.dir={d}", "--resume")
    assert code == 0, err
    assert (
        f"note: took over the lock of a process that stopped without releasing it (host {stale['host']}, "
        f"pid {proc.pid}, started {stale['started']})"
    ) in err
    assert (d / "sweep.csv").read_bytes() == (undisturbed / "sweep.csv").read_bytes()
    manifest = json.loads((d / "sweep.json").read_text())
    assert [r["resume"] for r in manifest["runs"]] == [False, True]


def test_a_refused_sweep_names_a_holder_that_names_itself_just_after_locking(tmp_path):
    """The window the two-sweeps test once hit on CI: the holder has the flock and has not yet written its name.
    Another process holds the lock and writes its name 0.3 s later; the refusal waits for it and names it. A
    holder that never names itself is refused as nobody, after NAME_WAIT_S."""
    import runner.sweep.locks as dirlock

    path = tmp_path / ".sweep.lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            f"fd = os.open({str(path)!r}, os.O_RDWR | os.O_CREAT, 0o644)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('locked', flush=True)\n"
            "time.sleep(0.3)\n"
            "os.pwrite(fd, sys.argv[1].encode(), 0)\n"
            "time.sleep(30)\n",
            Holder(socket.gethostname(), 4242, "2026-12-07T00:00:00").encode().decode(),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(LockBusy) as busy:
            DirLock(path).acquire()
        assert (busy.value.holder.pid, busy.value.holder.started) == (4242, "2026-12-07T00:00:00")
    finally:
        holder.kill()
        holder.wait()

    silent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, time\n"
            f"fd = os.open({str(path)!r}, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('locked', flush=True)\n"
            "time.sleep(30)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert silent.stdout.readline().strip() == "locked"
        began = time.monotonic()
        with pytest.raises(LockBusy) as busy:
            DirLock(path).acquire()
        assert busy.value.holder is None and time.monotonic() - began >= dirlock.NAME_WAIT_S
    finally:
        silent.kill()
        silent.wait()


def test_without_flock_a_dead_holder_on_this_host_is_taken_over(tmp_path, monkeypatch):
    """Filesystems without flock (Lustre without -o flock): the lock file is created exclusively, and
    its holder is checked by pid on this host."""
    import runner.sweep.locks as dirlock

    def no_flock(fd, op):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(dirlock.fcntl, "flock", no_flock)
    path = tmp_path / ".sweep.lock"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    path.write_bytes(Holder(socket.gethostname(), dead_pid, "2026-01-01T00:00:00").encode())
    with DirLock(path, command="test") as lock:
        assert lock.note == (
            "took over the lock of a process that stopped without releasing it "
            f"(host {socket.gethostname()}, pid {dead_pid}, started 2026-01-01T00:00:00)"
        )
        assert json.loads(path.read_text())["pid"] == os.getpid()
        with pytest.raises(LockBusy) as busy:  # held: a second taker is refused
            DirLock(path).acquire()
        assert busy.value.holder.pid == os.getpid() and not busy.value.checkable
    assert not path.exists()

    path.write_bytes(Holder("some-other-host", dead_pid, "2026-01-01T00:00:00").encode())
    with pytest.raises(LockBusy):  # another host's holder cannot be checked from here
        DirLock(path).acquire()


@pytest.mark.slow
def test_a_job_locked_by_another_process_is_left_alone(tmp_path):
    """A requeued job whose first attempt still runs: the second attempt must not touch its dir."""
    d = tmp_path / "requeue"
    args = ["seed=0,1", *TINY, f"hydra.sweep.dir={d}"]
    code, _, err = run_cli("sweep", *args)
    assert code == 0, err
    (d / "01" / "DONE").unlink()  # job 1 is "running" elsewhere: no DONE, its lock held by another process
    (d / "01" / "partial-output").write_text("the other writer's file\n")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from runner.sweep.locks import DirLock\n"
            f"lock = DirLock({str(d / '01' / '.job.lock')!r}, 'first attempt').acquire()\n"
            "print('held', flush=True); time.sleep(120)",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        code, _, err = run_cli("sweep", *args, "--resume")
        assert code == 1 and "INCOMPLETE job 1 " in err, err
        assert f"its lock names host {socket.gethostname()}, pid {holder.pid}, started " in err
        assert (d / "01" / "partial-output").read_text() == "the other writer's file\n"  # not cleared
        statuses = {r["job"]: r["status"] for r in _read_csv(d / "sweep_summary.csv")}
        assert statuses == {"0": "done", "1": "incomplete"}
    finally:
        holder.kill()
        holder.wait()
    code, _, err = run_cli("sweep", *args, "--resume")  # the first attempt is gone: the job runs
    assert code == 0, err
    assert not (d / "01" / "partial-output").exists() and (d / "01" / "DONE").is_file()


@pytest.mark.slow
def test_unique_temp_names_let_writers_race(undisturbed, tmp_path):
    """Two aggregations of one dir at once (the old shared `.sweep.csv.tmp` made one fail)."""
    from runner.sweep.aggregate import aggregate

    d = tmp_path / "copy"
    shutil.copytree(undisturbed, d)
    errors: list[BaseException] = []

    def again():
        try:
            for _ in range(3):
                aggregate(d)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=again) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert (d / "sweep.csv").read_bytes() == (undisturbed / "sweep.csv").read_bytes()
    assert not list(d.glob(".*.tmp"))


# ----------------------------------------------------------------------------------------- damaged jobs
@pytest.mark.slow
def test_aggregate_reports_damaged_jobs_and_resume_restores_the_exact_table(undisturbed, tmp_path):
    d = tmp_path / "damaged"
    shutil.copytree(undisturbed, d)
    cut = d / "01" / "metrics.csv"
    data = cut.read_bytes()
    cut.write_bytes(data[: len(data) - len(data.splitlines(keepends=True)[-1]) // 2])  # in the middle of a line
    with open(d / "02" / "metrics.csv", "a", encoding="utf-8") as f:
        f.write("garbage\n")
    before = {p.parent.name: p.stat().st_mtime_ns for p in d.glob("*/DONE")}
    width = len((d / "02" / "metrics.csv").read_text().splitlines()[0].split(","))  # the header's cells

    code, out, err = run_cli("aggregate", str(d))
    assert code == 1, err
    assert "DAMAGED job 1 [correction=tis seed=1 " in err and f"({cut})" in err
    assert "ends in the middle of a line" in err
    assert "DAMAGED job 2 [correction=icepop seed=0 " in err and f"({d / '02' / 'metrics.csv'})" in err
    assert f"line {ROWS_PER_JOB + 2} has 1 cell, the header {width}" in err
    assert "rerun them: is-study sweep" in err and "--resume" in err
    assert "(2 done, 0 failed, 0 incomplete, 2 damaged)" in err
    rows = _read_csv(d / "sweep.csv")
    assert sorted({r["job"] for r in rows}) == ["0", "3"] and len(rows) == 2 * ROWS_PER_JOB
    summary = {r["job"]: r for r in _read_csv(d / "sweep_summary.csv")}
    assert [summary[j]["status"] for j in "0123"] == ["done", "damaged", "damaged", "done"]
    assert summary["1"]["error"] == "metrics.csv: ends in the middle of a line (cut short?)"
    assert summary["2"]["error"] == f"metrics.csv: line {ROWS_PER_JOB + 2} has 1 cell, the header {width}"

    code, out, _ = run_cli("sweep", *SWEEP, f"hydra.sweep.dir={d}", "--resume", "--dry-run")
    assert code == 0 and "4 jobs, 2 already done (dry run" in out, out
    code, _, err = run_cli("sweep", *SWEEP, f"hydra.sweep.dir={d}", "--resume")
    assert code == 0, err
    assert "(2 already done before this run)" in err
    after = {p.parent.name: p.stat().st_mtime_ns for p in d.glob("*/DONE")}
    assert after["00"] == before["00"] and after["03"] == before["03"]  # the whole jobs were not rerun
    assert after["01"] != before["01"] and after["02"] != before["02"]
    assert (d / "sweep.csv").read_bytes() == (undisturbed / "sweep.csv").read_bytes()
    assert {r["status"] for r in _read_csv(d / "sweep_summary.csv")} == {"done"}


def test_the_table_checks(tmp_path):
    header = "step,update,seed,correction,staleness,precision,reward\n"
    rows = ["0,0,0,tis,0,bf16,0.5\n", "0,1,0,tis,0,bf16,0.25\n", "1,0,0,tis,0,bf16,0.125\n"]
    path = tmp_path / "metrics.csv"
    cases = {
        "whole": (header + "".join(rows), None),
        "two writers": (header + rows[0] + rows[1] + rows[1] + rows[2], "line 4: (step, update) = (0, 1) after (0, 1)"),
        "back in time": (header + rows[2] + rows[0], "line 3: (step, update) = (0, 0) after (1, 0)"),
        "not a number": (header + rows[0].replace("0.5", "0.5x"), "line 2: reward = '0.5x' is not a number"),
        "bad step": (header + rows[0].replace("0,0,0", "a,0,0", 1), "line 2: step = 'a' is not an integer"),
        "cut short": (header + rows[0] + rows[1][:7], "ends in the middle of a line"),
        "no header": ("", "no header"),
        "wrong first column": ("update,step\n", "header starts with 'update', not step"),
        "duplicate column": ("step,update,step\n", "header 'step,update,step' is not a list of unique column names"),
    }
    for name, (text, reason) in cases.items():
        path.write_text(text)
        if reason is None:
            assert check_table(path) == 3, name
            continue
        with pytest.raises(Damage) as damage:
            check_table(path)
        assert damage.value.reason.startswith(reason), (name, damage.value.reason)
    path.write_bytes(b"step,update\n0,\xff\n")
    with pytest.raises(Damage, match="not UTF-8"):
        check_table(path)


# ----------------------------------------------------------------------------------------- bounded inputs
def _alias_bomb(path: Path, levels: int = 9) -> Path:
    """~1 KB of YAML that expands to 9**10 (3.5e9) numbers per tensor."""
    lines = ["a0: &a0 [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]")
    lines.append("cases:\n  - name: bomb")
    lines += [f"    {k}: [*a{levels}]" for k in ("log_probs", "old_log_probs", "rollout_log_probs", "advantages")]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_an_alias_bomb_is_refused_fast_in_one_short_line(tmp_path):
    bomb = _alias_bomb(tmp_path / "bomb.yaml")
    assert bomb.stat().st_size < 1500
    t0 = time.perf_counter()
    code, out, err = run_cli("case", str(bomb))
    elapsed = time.perf_counter() - t0
    assert code == 2 and not out
    line = err.strip()
    assert len(line.splitlines()) == 1 and len(line) < 300, line
    assert line == (
        f"is-study: error: {bomb}: expands to more than 10,000,000 elements, the cap "
        f"(is-study case --max-elements N raises it)"
    )
    assert elapsed < 1.0, elapsed

    recursive = tmp_path / "recursive.yaml"
    recursive.write_text("cases: &c\n  - *c\n")
    code, _, err = run_cli("case", str(recursive))
    assert code == 2 and "a YAML alias refers to the node that contains it" in err


def test_the_cap_is_a_flag_and_applies_to_target_kwargs(tmp_path, monkeypatch):
    shipped = REPO / "conf" / "cases" / "openrlhf-seq-mask-tis.yaml"
    code, _, err = run_cli("case", str(shipped), "--max-elements", "20")
    assert code == 2 and "more than 20 elements" in err
    code, out, err = run_cli("case", str(shipped), "--max-elements", "100000", "--json")
    assert code == 0, err
    assert json.loads(out)

    import runner.bounded as bounded
    from runner.audit.external import parse_json_object

    def parse_kwargs(text):
        return parse_json_object(text, "--target-kwargs")

    monkeypatch.setattr(bounded, "DEFAULT_MAX_ELEMENTS", 100)
    # elements: the object, its key, the list and its 97 numbers (YAML counts the same document alike)
    fits = json.dumps({"values": list(range(97))})
    assert parse_kwargs(fits) == {"values": list(range(97))}
    assert bounded.load_yaml(fits, "yaml") == {"values": list(range(97))}
    with pytest.raises(UserError, match=r"^--target-kwargs: holds more than 100 elements, the cap$"):
        parse_kwargs(json.dumps({"values": list(range(98))}))
    with pytest.raises(UserError, match=r"^yaml: expands to more than 100 elements, the cap$"):
        bounded.load_yaml(json.dumps({"values": list(range(98))}), "yaml")


def test_messages_quote_at_most_about_200_characters(tmp_path):
    huge = tmp_path / "huge-value.yaml"
    huge.write_text(
        "cases:\n  - name: " + "n" * 100_000 + "\n    log_probs: [['" + "x" * 100_000 + "']]\n"
        "    old_log_probs: [[0.0]]\n    rollout_log_probs: [[0.0]]\n    advantages: [[1.0]]\n"
    )
    code, _, err = run_cli("case", str(huge))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert len(err) < 300 + len(str(huge)) + 250, len(err)
    assert "expected a number or 'nan'/'inf'/'-inf', got 'xxx" in err
    nested = tmp_path / "nested.yaml"
    nested.write_text(
        "cases:\n  - log_probs: [[" + "[" * 50 + "1" + "]" * 50 + "]]\n    old_log_probs: [[0.0]]\n"
        "    rollout_log_probs: [[0.0]]\n    advantages: [[1.0]]\n"
    )
    code, _, err = run_cli("case", str(nested))
    assert code == 2 and len(err) < 300 + len(str(nested)), err
    # a value echoed by a message built elsewhere (here a config check) is cut in the middle
    code, _, err = run_cli("run", "correction.high=" + "a" * 100_000)
    assert code == 2 and len(err.strip().splitlines()) == 1 and len(err) < 300, err
    assert err.startswith("is-study: error: correction.high must be a number or null, got 'aaa")
    assert "…[99,822 characters]…" in err
    assert len(str(UserError("v" * 10**6))) < 300 and len(str(UserError("v " * 10**6))) < 1100


# ----------------------------------------------------------------------------------------- a full disk
class FullDisk:
    """A file on a disk that fills after `budget` characters: the write that crosses it writes what
    fits, then raises OSError(ENOSPC), as write(2) does."""

    def __init__(self, file, budget: int):
        self._file, self._left = file, budget

    def write(self, text: str) -> int:
        if len(text) > self._left:
            self._file.write(text[: self._left])
            self._file.flush()
            self._left = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._left -= len(text)
        return self._file.write(text)

    def __getattr__(self, name):
        return getattr(self._file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._file.close()


def _disk_fills_on(monkeypatch, name: str, budget: int, where: str = "") -> None:
    real = records.open_for_writing

    def opener(path, newline=None):
        f = real(path, newline=newline)
        hit = Path(path).name == name or (name.startswith(".") and Path(path).name.startswith(name))
        return FullDisk(f, budget) if hit and where in str(path) else f

    monkeypatch.setattr(records, "open_for_writing", opener)


def test_a_full_disk_names_the_file_and_says_the_run_is_incomplete(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    _disk_fills_on(monkeypatch, "metrics.csv", 3000)
    code, out, err = run_cli("run", *TINY, "train.steps=50", f"hydra.run.dir={run_dir}")
    assert code == 2 and not out
    assert err.strip() == (
        f"is-study: error: No space left on device while writing {run_dir / 'metrics.csv'}; "
        f"the run dir {run_dir} is incomplete (no DONE)"
    )
    assert not (run_dir / "DONE").exists()
    assert (run_dir / "metrics.csv").stat().st_size == 3000  # what fitted, nothing lost before it

    run_dir = tmp_path / "run2"
    _disk_fills_on(monkeypatch, ".summary.json.", 10)  # the atomic write's temporary file
    code, _, err = run_cli("run", *TINY, f"hydra.run.dir={run_dir}")
    assert code == 2
    assert err.strip() == (
        f"is-study: error: No space left on device while writing {run_dir / 'summary.json'}; "
        f"the run dir {run_dir} is incomplete (no DONE)"
    )
    assert not (run_dir / "DONE").exists() and not list(run_dir.glob(".*.tmp"))


def test_a_full_disk_in_a_sweep_fails_the_job_and_resume_reruns_it(tmp_path, monkeypatch):
    d = tmp_path / "full"
    args = ["seed=0,1", *TINY, f"hydra.sweep.dir={d}"]
    _disk_fills_on(monkeypatch, "metrics.csv", 500, where=str(d / "01"))
    code, _, err = run_cli("sweep", *args)
    assert code == 1
    cut = (d / "01" / "metrics.csv").read_text()
    assert len(cut) == 500 and not cut.endswith("\n")  # the disk filled in the middle of a line
    # the job is failed, and its table damaged: reported as both, and none of its rows reach sweep.csv
    summary = {r["job"]: r for r in _read_csv(d / "sweep_summary.csv")}
    assert [summary[j]["status"] for j in "01"] == ["done", "failed"]
    failure = (
        f"No space left on device while writing {d / '01' / 'metrics.csv'}; the run dir {d / '01'} is "
        "incomplete (no DONE); metrics.csv: ends in the middle of a line (cut short?), so its rows are "
        "left out"
    )
    assert summary["1"]["error"] == failure
    assert "FAILED job 1 [seed=1 " in err and f"]: {failure}  ({d / '01' / 'ERROR'})\n" in err
    rows = _read_csv(d / "sweep.csv")
    assert {r["job"] for r in rows} == {"0"} and len(rows) == 3 * 2 + 1  # job 0's 3 steps × 2 updates, its final J
    assert not (d / "01" / "DONE").exists()

    # aggregate cannot write sweep.csv: it says so, and the old sweep.csv stays as it was
    old = (d / "sweep.csv").read_bytes()
    _disk_fills_on(monkeypatch, ".sweep.csv.", 100)
    code, _, err = run_cli("aggregate", str(d))
    assert code == 2
    assert err.strip() == (
        f"is-study: error: No space left on device while writing {d / 'sweep.csv'}; sweep.csv "
        f"was left as it was (free space, then is-study aggregate {d})"
    )
    assert (d / "sweep.csv").read_bytes() == old and not list(d.glob(".*.tmp"))

    monkeypatch.undo()  # space freed
    code, _, err = run_cli("sweep", *args, "--resume")
    assert code == 0, err
    assert {r["status"] for r in _read_csv(d / "sweep_summary.csv")} == {"done"}
    assert len(_read_csv(d / "sweep.csv")) == 2 * (3 * 2 + 1)
