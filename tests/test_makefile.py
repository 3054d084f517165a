"""The Makefile runs pip once per environment (issue 31): a target that only runs does not reinstall,
and a fresh environment, a changed pyproject.toml or an install from another checkout still does.

Each case runs `make -n` (print the commands, run none) on a copy of the Makefile, with the
interpreter-derived variables set on the command line so the state is the test's, not this machine's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A copy of the Makefile and pyproject.toml, a stand-in site-packages and a stamp made after both."""
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(REPO / name, tmp_path / name)
    (tmp_path / "site-packages").mkdir()
    (tmp_path / ".make").mkdir()
    (tmp_path / ".make" / "installed-k").touch()
    _age(tmp_path / "pyproject.toml", 100)
    _age(tmp_path / "site-packages", 100)
    return tmp_path


def _age(path: Path, seconds: float) -> None:
    past = path.stat().st_mtime - seconds
    os.utime(path, (past, past))


def _commands(checkout: Path, target: str, installed_here: str = "yes") -> list[str]:
    # --no-print-directory: under a parent make (CI's `make test`) make -n also prints "make[1]: Entering …"
    got = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "-n",
            target,
            "PYTHON=python3",
            "ENV_KEY=k",
            f"INSTALLED_HERE={installed_here}",
            f"SITE_PACKAGES={checkout / 'site-packages'}",
        ],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=60,
        # the Makefile's defaults, whatever the caller exported: CI's .ci/run sets EXTRAS=test,tracking
        env={k: v for k, v in os.environ.items() if k != "EXTRAS"},
    )
    assert got.returncode == 0, got.stderr
    return got.stdout.splitlines()


def _installs(commands: list[str]) -> bool:
    return any("pip install" in c for c in commands)


def test_installed_environment_runs_without_pip(checkout):
    assert _commands(checkout, "test") == ["python3 -m pytest"]
    assert _commands(checkout, "run") == ["is-study run correction=seq-mask-tis"]
    assert _commands(checkout, "test-fast") == ['python3 -m pytest -m "not slow"']
    assert _commands(checkout, "lint") == ["python3 -m ruff check .", "python3 -m ruff format --check ."]


def test_fresh_environment_installs_before_linting(checkout):
    """ruff comes with the test extra: a new environment gets it before `make lint` calls it."""
    (checkout / ".make" / "installed-k").unlink()
    commands = _commands(checkout, "lint")
    assert any("pip install -q -e '.[test]'" in c for c in commands)
    assert commands[-2:] == ["python3 -m ruff check .", "python3 -m ruff format --check ."]


def test_fresh_environment_installs_test_extras_then_runs(checkout):
    (checkout / ".make" / "installed-k").unlink()  # a new environment: no stamp of its own yet
    commands = _commands(checkout, "test")
    assert any("pip install -q -e '.[test]'" in c for c in commands)
    assert commands[-1] == "python3 -m pytest"


def test_changed_pyproject_reinstalls(checkout):
    _age(checkout / ".make" / "installed-k", 200)
    assert _installs(_commands(checkout, "run"))


def test_environment_changed_after_the_install_reinstalls(checkout):
    """A venv deleted and made again at the same path has a newer site-packages than the stamp."""
    _age(checkout / ".make" / "installed-k", 50)  # still newer than pyproject.toml
    os.utime(checkout / "site-packages")  # now
    assert _installs(_commands(checkout, "test"))


def test_install_from_another_checkout_reinstalls(checkout):
    assert _installs(_commands(checkout, "test", installed_here=""))


def test_ci_installs_from_scratch_then_lints_then_runs_make_test():
    script = (REPO / ".ci" / "run").read_text()
    steps = ["rm -rf .make", "\nmake install\n", "\nmake lint\n", "\nmake test\n"]
    assert all(step in script for step in steps), script
    assert [script.index(step) for step in steps] == sorted(script.index(step) for step in steps)


def test_ruff_is_pinned_in_the_test_extra_and_the_pre_commit_hooks_run_it():
    """`make lint` and pre-commit run the same ruff, the version the tree is formatted with."""
    import tomllib

    test_extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    pins = [r for r in test_extra if r.startswith("ruff")]
    assert len(pins) == 1 and pins[0].startswith("ruff=="), test_extra
    hooks = (REPO / ".pre-commit-config.yaml").read_text()
    assert "entry: ruff check" in hooks and "entry: ruff format" in hooks and "language: system" in hooks
