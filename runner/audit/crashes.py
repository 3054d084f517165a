"""Exceptions as findings: each distinct exception a subject raises (same type, same raising line)
is one finding, whichever checks ran into it, with its type, message and file:line.

The raising frame is the innermost frame of the traceback outside torch and the standard library:
for verl's `1.0 / masked_mean(...).item()` that is verl's line, not a frame of torch's. Types named
with `--allow-raise` (or any of their subclasses) are documented refusals: the batch is skipped and
counted, and nothing is reported as a finding.
"""

from __future__ import annotations

import os
import sysconfig
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from runner.audit.subjects import Batch, SubjectRaised

_LIBRARY_DIRS = tuple(
    str(Path(p).resolve()) + os.sep for p in {sysconfig.get_paths()["stdlib"], os.path.dirname(torch.__file__)}
)


def raising_frame(error: BaseException) -> tuple[str, int]:
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return "?", 0
    own = [f for f in frames if not str(Path(f.filename).resolve()).startswith(_LIBRARY_DIRS)]
    frame = (own or frames)[-1]
    return frame.filename, frame.lineno or 0


def short_path(file: str) -> str:
    """A file as its package spells it (verl/trainer/ppo/rollout_corr_helper.py), else as given."""
    path = Path(file)
    root = path.parent
    while (root / "__init__.py").is_file():
        root = root.parent
    if root == path.parent:
        try:
            return str(path.resolve().relative_to(Path.cwd()))
        except ValueError:
            return file
    return str(path.relative_to(root))


def message_of(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


@dataclass
class Crash:
    type: str
    message: str
    file: str
    line: int
    batch: Batch  # the first batch that raised it, as the subject was called
    dtype: torch.dtype
    subject: Any  # the subject that raised it (a preset row has one per loss)
    checks: list[str] = field(default_factory=list)  # the checks that ran into it, first one first

    @property
    def signature(self) -> tuple[str, str, int]:
        return self.type, self.file, self.line

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def text(self, short_file: str | None = None) -> str:
        msg = f": {self.message}" if self.message else ""
        return f"{self.type}{msg} at {short_file or self.file}:{self.line}"


def _names(error: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(error).__mro__} | {
        f"{cls.__module__}.{cls.__qualname__}" for cls in type(error).__mro__
    }


class CrashLog:
    """What one subject raised across all checks, deduplicated by signature."""

    def __init__(self, allowed: Sequence[str] = ()):
        self.allowed = tuple(allowed)
        self.crashes: dict[tuple[str, str, int], Crash] = {}
        self.refusals: dict[str, int] = {}  # allowed exception type → how many batches it refused

    def is_allowed(self, error: BaseException) -> bool:
        return bool(self.allowed) and bool(_names(error) & set(self.allowed))

    def record(self, raised: SubjectRaised, check: str) -> Crash | None:
        """Note an exception; None when it is an allowed refusal."""
        error = raised.error
        if self.is_allowed(error):
            name = type(error).__name__
            self.refusals[name] = self.refusals.get(name, 0) + 1
            return None
        file, line = raising_frame(error)
        crash = Crash(type(error).__name__, message_of(error), file, line, raised.batch, raised.dtype, raised.subject)
        crash = self.crashes.setdefault(crash.signature, crash)
        if check not in crash.checks:
            crash.checks.append(check)
        return crash

    def same(self, crash: Crash, raised: SubjectRaised) -> bool:
        error = raised.error
        return (type(error).__name__, *raising_frame(error)) == crash.signature
