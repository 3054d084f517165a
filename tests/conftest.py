"""Shared test helpers: the spec's case files and an in-process CLI runner."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SPEC_CASES = REPO.parent / "shared" / "spec" / "cases"

os.environ.setdefault("MPLBACKEND", "Agg")


def spec_case_file(name: str) -> Path:
    """The spec's case file, or the copy shipped in conf/cases when ../shared is absent."""
    path = SPEC_CASES / f"{name}.yaml"
    if path.is_file():
        return path
    shipped = {"seed-issue": "openrlhf-seq-mask-tis", "frameworks": "frameworks"}[name]
    return REPO / "conf" / "cases" / f"{shipped}.yaml"


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


@pytest.fixture
def cli():
    """`run_cli` as a fixture."""
    return run_cli


@pytest.fixture
def one_thread():
    """One intra-op thread, as the studies run their small tensors: with 2 threads on a busy 2-core
    machine the tests that call the maths directly ran 10× slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
