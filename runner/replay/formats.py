"""The readers by format name, and which files of a path each one reads."""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from pathlib import Path

from runner.errors import UserError
from runner.replay.limits import Limits
from runner.replay.schema import StepBatch, concat

# format name → module; auto-detection tries them in this order (the framework layouts before the generic ones)
READERS = {
    "slime": "runner.replay.slime",
    "nemo-rl": "runner.replay.nemo_rl",
    "skyrl": "runner.replay.skyrl",
    "prime-rl": "runner.replay.prime_rl",
    "npz": "runner.replay.own_npz",
    "parquet": "runner.replay.own_parquet",
    "jsonl": "runner.replay.own_jsonl",
    "tokens-csv": "runner.replay.tokens_csv",
}
_DIGITS = re.compile(r"(\d+)")


def reader(name: str):
    if name not in READERS:
        raise UserError(f"--format {name!r} is not one of: {', '.join(READERS)}")
    return importlib.import_module(READERS[name])


def _natural(path: Path) -> list:
    """step_2 before step_10: numbers in the path compare as numbers."""
    return [int(p) if p.isdigit() else p for p in _DIGITS.split(str(path))]


def files(path: Path, fmt: str | None) -> list[tuple[Path, object]]:
    """(file, reader) for every file the path holds that a reader accepts, in step order."""
    if not path.exists():
        raise UserError(f"{path}: no such file or directory")
    modules = [reader(fmt)] if fmt else [reader(name) for name in READERS]
    candidates = [path] if path.is_file() else sorted((p for p in path.rglob("*") if p.is_file()), key=_natural)
    found = []
    for file in candidates:
        module = next((m for m in modules if m.accepts(file)), None)
        if module is not None:
            found.append((file, module))
    if not found:
        what = f"--format {fmt}" if fmt else "any format (see docs/replay.md)"
        if path.is_file():
            raise UserError(f"{path}: not a file {what} reads; name the format with --format")
        raise UserError(f"{path}: holds no file {what} reads")
    return found


def steps(found: list[tuple[Path, object]], limits: Limits) -> Iterator[StepBatch]:
    """Every step of `files`' list, one batch a step: consecutive pieces of one step (a framework's ranks)
    joined. The list is taken before the replay dir is made, so a replay dir inside PATH is never read back."""
    pending: list[StepBatch] = []
    for file, module in found:
        for piece in module.read(file, limits):
            if pending and piece.step != pending[0].step:
                yield concat(pending)
                pending = []
            pending.append(piece)
    if pending:
        yield concat(pending)
