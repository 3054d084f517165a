"""Lazy registries: a name → "module:attr" map, imported only when that name is chosen.

Worlds, tasks, losses and studies are each one such map, so listing what exists imports nothing
(no torch for `is-study list`), adding an entry is one line, and an unknown name gives one error
line listing the valid ones. No if-chains over names anywhere else.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any

from runner.errors import UserError


class LazyRegistry(Mapping[str, str]):
    def __init__(self, kind: str, targets: Mapping[str, str]):
        self.kind = kind  # the config key that picks an entry, e.g. "policy.name"
        self._targets = dict(targets)

    def __getitem__(self, name: str) -> str:
        return self._targets[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._targets)

    def __len__(self) -> int:
        return len(self._targets)

    def names(self) -> list[str]:
        return sorted(self._targets)

    def resolve(self, name: Any) -> Any:
        """The registered object for `name`, imported now; a one-line UserError for any other name."""
        target = self._targets.get(name) if isinstance(name, str) else None
        if target is None:
            raise UserError(f"{self.kind}={name!r} is not one of: {', '.join(self.names())}")
        module_name, _, attr = target.partition(":")
        return getattr(importlib.import_module(module_name), attr)
