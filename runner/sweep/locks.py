"""One writer per directory: a lock file that names its holder (host, pid, start time, command).

A sweep holds `<sweep dir>/.sweep.lock` for its whole life and each sweep job holds
`<job dir>/.job.lock` while it runs, so two sweeps (or a sweep and its own `--resume`, or a job and
its SLURM requeue) never write the same files.

How it locks:
  - `flock` on the lock file. The kernel (or the NFS server) drops the lock when its holder dies,
    however it dies, so a lock left by a killed sweep is free again; the file still names the dead
    holder and the next one takes it over with a note. On release the holder deletes the file while
    still holding it; a process that opened the old file meanwhile sees that the path now names
    another file (or none) and tries again, so two holders never coexist.
  - Where `flock` is unsupported (Lustre mounted without `flock`, some FUSE filesystems): the file is
    created with O_EXCL, and a file naming a holder on this host whose process is gone is taken over
    with a note. A holder on another host cannot be checked from here: the message names it and
    the file to delete once that sweep is known to be gone. (Two processes taking over the same
    stale file in the same instant could both succeed on such a filesystem; flock has no such gap.)
  - A holder writes its name just after it takes the lock; one refused in between reads the file again
    for up to NAME_WAIT_S, so its message names the holder.

Only the standard library: fcntl, not the `filelock` package, because the holder's identity is
written into the lock file and read back by the one that is refused.
"""

from __future__ import annotations

import datetime as _dt
import errno
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: the exclusive-create fallback
    fcntl = None  # type: ignore[assignment]

# flock unsupported here: fall back to exclusive creation
_NO_FLOCK = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}
_HOLDER_BYTES = 4096
NAME_WAIT_S = 1.0  # how long a refused sweep waits for a busy, still-empty lock file to name its holder


def _process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), which tells a live process from
    a later one that was given the same pid."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    started: str  # ISO time, local, seconds
    command: str = ""
    pid_start: str | None = None

    @classmethod
    def me(cls, command: str = "") -> Holder:
        pid = os.getpid()
        return cls(
            socket.gethostname(), pid, _dt.datetime.now().isoformat(timespec="seconds"), command, _process_start(pid)
        )

    @classmethod
    def parse(cls, raw: bytes) -> Holder | None:
        try:
            data = json.loads(raw.decode("utf-8"))
            return cls(
                str(data["host"]),
                int(data["pid"]),
                str(data["started"]),
                str(data.get("command", "")),
                data.get("pid_start"),
            )
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            return None

    def encode(self) -> bytes:
        return (
            json.dumps(
                {
                    "host": self.host,
                    "pid": self.pid,
                    "started": self.started,
                    "command": self.command,
                    "pid_start": self.pid_start,
                }
            )
            + "\n"
        ).encode("utf-8")

    def describe(self) -> str:
        return f"host {self.host}, pid {self.pid}, started {self.started}"

    def gone(self) -> bool:
        """True when this holder is known to be dead: on this host, and its pid is free or now
        belongs to a process started later. A holder on another host is never known to be gone."""
        if self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
        now = _process_start(self.pid)
        return self.pid_start is not None and now is not None and now != self.pid_start


class LockBusy(Exception):
    """The directory is locked by a live holder (or one that cannot be checked)."""

    def __init__(self, path: Path, holder: Holder | None, checkable: bool = True):
        self.path, self.holder, self.checkable = path, holder, checkable
        super().__init__(f"{path}: held by {holder.describe() if holder else 'an unknown holder'}")


def _read(path: Path) -> Holder | None:
    try:
        with open(path, "rb") as f:
            return Holder.parse(f.read(_HOLDER_BYTES))
    except OSError:
        return None


def _named(read: Callable[[], Holder | None]) -> Holder | None:
    """The holder a busy lock names. A holder writes its name just after it takes the lock, so a lock found
    busy and still empty is read again for up to NAME_WAIT_S before it is reported as naming nobody."""
    deadline = time.monotonic() + NAME_WAIT_S
    while True:
        holder = read()
        if holder is not None or time.monotonic() >= deadline:
            return holder
        time.sleep(0.01)


def holder_of(path: Path | str) -> Holder | None:
    """Who the lock file names, without locking: a live holder, a dead one that left it, or None."""
    return _read(Path(path))


class DirLock:
    """`with DirLock(dir / ".sweep.lock", command) as lock:` holds the lock for the block; `lock.note`
    says whose stale lock was taken over, if any. Raises LockBusy when someone else holds it."""

    def __init__(self, path: Path | str, command: str = ""):
        self.path = Path(path)
        self.command = command
        self.note: str | None = None
        self._fd: int | None = None
        self._exclusive = False

    # -- flock
    def _acquire_flock(self) -> Holder | None:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _named(lambda: Holder.parse(os.pread(fd, _HOLDER_BYTES, 0)))
                os.close(fd)
                raise LockBusy(self.path, holder) from None
            except OSError as exc:
                os.close(fd)
                if exc.errno in _NO_FLOCK:
                    raise _Unsupported() from None
                raise
            try:
                current = os.stat(self.path)
            except FileNotFoundError:
                current = None
            if current is None or not os.path.samestat(os.fstat(fd), current):
                os.close(fd)  # the holder released (deleted) it between our open and flock: again
                continue
            previous = Holder.parse(os.pread(fd, _HOLDER_BYTES, 0))
            self._fd = fd
            return previous

    # -- exclusive creation (no flock)
    def _acquire_exclusive(self) -> Holder | None:
        taken_over: Holder | None = None
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                holder = _named(lambda: _read(self.path))
                if holder is not None and holder.gone():
                    self.path.unlink(missing_ok=True)
                    taken_over = holder
                    continue
                raise LockBusy(self.path, holder, checkable=False) from None
            self._fd, self._exclusive = fd, True
            return taken_over
        raise LockBusy(self.path, _read(self.path), checkable=False)

    def acquire(self) -> DirLock:
        me = Holder.me(self.command)
        previous = None
        if fcntl is not None:
            try:
                previous = self._acquire_flock()
            except _Unsupported:
                previous = self._acquire_exclusive()
        else:  # pragma: no cover
            previous = self._acquire_exclusive()
        try:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, me.encode(), 0)
        except OSError:
            self.release()  # a lock that cannot name its holder is not taken (a full disk)
            raise
        if previous is not None and (previous.host, previous.pid) != (me.host, me.pid):
            self.note = f"took over the lock of a process that stopped without releasing it ({previous.describe()})"
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            # deleted while still held: see the module docstring
            self.path.unlink(missing_ok=True)
        except OSError:
            pass
        finally:
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> DirLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


class _Unsupported(Exception):
    pass
