"""One row of the audit's table: the subjects (one per loss) that are audited together, and what
names their case files and selects them again on the command line."""

from __future__ import annotations

from dataclasses import dataclass, field


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
