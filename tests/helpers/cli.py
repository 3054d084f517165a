"""The command line as the tests drive it: in-process, and a sweep's subprocess killed mid-run."""

from __future__ import annotations

import contextlib
import io
import signal
import subprocess
import sys
import time
from pathlib import Path


def run_cli(*args: str) -> tuple[int, str, str]:
    """Run `is-study ARGS` in-process; return (exit code, stdout, stderr). Usable anywhere, even in
    module-scoped fixtures, which cannot take capsys."""
    from runner import cli as cli_module

    out, err = io.StringIO(), io.StringIO()
    old_argv = sys.argv
    sys.argv = ["is-study", *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli_module.main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = old_argv
    return code, out.getvalue(), err.getvalue()


def kill_at_first_done(proc: subprocess.Popen, sweep_dir: Path, timeout: float = 120) -> None:
    """SIGKILL a running sweep as soon as one of its jobs holds DONE (it must still be running)."""
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None and not any(Path(sweep_dir).glob("*/DONE")):
            time.sleep(0.02)
        assert proc.poll() is None, "the sweep ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
