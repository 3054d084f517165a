"""What a reader may read: the size cap, and whether pickle's restriction is lifted (--trust)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from runner.errors import UserError

DEFAULT_MAX_BYTES = 4 << 30  # 4 GiB a file: a dump's step is megabytes to a few hundred; more is a wrong path


@dataclass(frozen=True)
class Limits:
    max_bytes: int = DEFAULT_MAX_BYTES
    trust: bool = False


def check_size(path: Path, limits: Limits, size: int | None = None) -> None:
    """Refuse a file (or, given `size`, what it expands to) above the cap, before reading it."""
    size = path.stat().st_size if size is None else size
    if size > limits.max_bytes:
        raise UserError(f"{path}: {size:,} bytes is over the {limits.max_bytes:,}-byte cap (raise it with --max-bytes)")
