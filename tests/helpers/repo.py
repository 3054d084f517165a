"""The checkout the tests run in, and the spec's case files."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SPEC_CASES = REPO.parent / "shared" / "spec" / "cases"


def spec_case_file(name: str) -> Path:
    """The spec's case file, or the copy shipped in conf/cases when ../shared is absent."""
    path = SPEC_CASES / f"{name}.yaml"
    if path.is_file():
        return path
    shipped = {"seed-issue": "openrlhf-seq-mask-tis", "frameworks": "frameworks"}[name]
    return REPO / "conf" / "cases" / f"{shipped}.yaml"
