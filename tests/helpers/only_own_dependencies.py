"""Run `is-study ARGS` as in a fresh environment that holds is-study and its own dependencies only.

    python tests/helpers/only_own_dependencies.py audit --target ...

Every installed distribution outside the closure of is-study's `dependencies` (pyproject.toml,
no extras) is hidden: importing one of its modules raises ModuleNotFoundError, as it would where it
is not installed. tests/test_audit_released.py runs the audit of released code this way, so a
target's import that only this machine happens to satisfy (verl's `orjson`, which CI had and a
fresh venv has not) fails here too instead of passing by luck. Modules no installed distribution
provides (the repository's own, the unpacked wheels, a file target) are not touched, nor are
`--stub` names: the audit's stubs are looked up before this finder.
"""

from __future__ import annotations

import importlib.abc
import importlib.metadata as metadata
import re
import runpy
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;(]", requirement.strip(), maxsplit=1)[0]


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def own_requirements() -> list[str]:
    """is-study's `dependencies`, read from the checkout's pyproject.toml (the installed metadata
    may be another checkout's)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the installed metadata, without extras
        from packaging.requirements import Requirement

        return [
            r
            for r in metadata.requires("is-study") or []
            if not (Requirement(r).marker and not Requirement(r).marker.evaluate({"extra": ""}))
        ]
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]


def dependency_closure(requirements: list[str]) -> set[str]:
    """The canonical names of the distributions `requirements` need, transitively, extras left out."""
    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = [_name(r) for r in requirements]
    while todo:
        name = _canonical(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def hidden_modules() -> set[str]:
    """Top-level modules that only distributions outside the closure provide."""
    allowed = dependency_closure(own_requirements()) | {"is-study"}
    hidden = set()
    for module, dists in metadata.packages_distributions().items():
        if module in sys.stdlib_module_names:
            continue
        if not any(_canonical(d) in allowed for d in dists):
            hidden.add(module)
    return hidden


class HideFinder(importlib.abc.MetaPathFinder):
    def __init__(self, names: set[str]):
        self.names = names

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


def main() -> None:
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        sys.path.pop(0)  # this script's folder is not on a user's path
    names = hidden_modules()
    for loaded in [m for m in sys.modules if m.partition(".")[0] in names]:
        del sys.modules[loaded]
    sys.meta_path.insert(0, HideFinder(names))
    sys.argv = ["is-study", *sys.argv[1:]]
    runpy.run_module("runner", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
