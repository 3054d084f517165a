"""One row of the audit's table: the subjects (one per loss) that are audited together, and what
names their case files and selects them again on the command line; and its cells (one per check),
which the audit (runner/audit/command.py) fills and the table (runner/audit/table.py) draws."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

UPSTREAM = "reproduces upstream behaviour"
ALL_MASKED, REFERENCE, RAISES = "all-masked", "reference", "raises"  # the checks besides invariants 1-7


def slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-+" else "-" for c in name.replace("/", "--").replace(":", "--"))


@dataclass
class Group:
    """The subjects (one per loss) that make up one row of the table."""

    name: str
    faithful: bool
    subjects: list
    key: str = ""  # the case files' name stem: the name, plus a hash of what else defines the row
    repro: list[str] = field(default_factory=list)  # CLI arguments that select this row again
    allow_raise: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.key:
            self.key = slug(self.name)


@dataclass
class Cell:
    """One row × check: an invariant (1-7), the all-masked check, the reference, or one exception."""

    preset: str
    invariant: int | str
    status: str  # pass | fail | n/a | raise (the all-masked batch raised: see that exception's cell)
    faithful: bool
    counterexample: str | None = None
    loss: str | None = None  # the loss under which it failed (None for a target with its own loss)
    detail: str | None = None  # the violation, or why the check is n/a
    found_by: str | None = None
    profile: str = "adversarial"
    seconds: float = 0.0
    note: str | None = None  # something worth knowing that is not a finding

    @property
    def finding(self) -> bool:
        return self.status == "fail"

    def to_json(self) -> dict[str, Any]:
        return {
            "preset": self.preset,
            "invariant": self.invariant,
            "status": self.status,
            "faithful": self.faithful,
            "counterexample": self.counterexample,
            "violation": self.detail if self.finding else None,
            "reason": self.detail if self.status == "n/a" else None,
            "note": self.note,
            "loss": self.loss,
            "found_by": self.found_by,
            "profile": self.profile,
            "seconds": round(self.seconds, 3),
        }
