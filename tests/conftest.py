"""Shared fixtures. The shared helpers that are not fixtures live in tests/helpers/."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# tests.helpers is imported from the checkout's root, however pytest was started (`pytest` alone
# does not put the working directory on sys.path; `python -m pytest` does)
_REPO = str(Path(__file__).resolve().parent.parent)
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from tests.helpers.arithmetic import pin_environment  # noqa: E402 - importable only once the root is on sys.path

# before anything imports torch: the same arithmetic on every CI machine (tests/helpers/arithmetic.py says why)
if "torch" in sys.modules:
    raise pytest.UsageError("torch was imported before tests/conftest.py could pin its arithmetic (a plugin?)")
pin_environment()

from tests.helpers.cli import run_cli  # noqa: E402

os.environ.setdefault("MPLBACKEND", "Agg")


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
