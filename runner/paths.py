"""Where is-study finds its own files. No imports beyond the standard library, so any module (the
registry, the Hydra package, analysis) can ask without pulling anything else in."""

from __future__ import annotations

from pathlib import Path


def conf_dir() -> Path:
    """conf/ ships inside the wheel as runner/conf; an editable checkout reads the repo's conf/."""
    packaged = Path(__file__).resolve().parent / "conf"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "conf"
