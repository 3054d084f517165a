"""Bring an external policy loss into this process: `module:attr` or `path/to/file.py:attr`, with
heavy imports the loss never uses replaced by stubs (`--stub deepspeed,ray`).

A file inside a package is loaded under its dotted name, and the packages above it are registered
*hollow*: their `__path__` is set, their `__init__.py` is not run. Framework `__init__`s import the
whole trainer (OpenRLHF's imports the actor, hence peft, deepspeed and transformers); the loss
needs none of it. Relative and absolute imports of sibling modules still resolve, and other
subpackages are imported normally. A file outside any package is loaded with its folder on
sys.path, so its own sibling imports resolve too.

While the target loads, `torch.compile` is the identity: the audit calls the eager code (what
compilation must reproduce), and merely importing the compiler costs seconds (OpenRLHF's
models/utils.py compiles a helper at import time that no loss uses).

A stubbed module answers any attribute with a stub class, and any submodule with another stub
module. A stub class can be subclassed, called, used as a decorator (it hands back what it
decorates) and chained (`stub.a.b(c)`); whatever the loss actually calls on it is an error of the
target's, reported as a crash.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from runner.errors import UserError


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


# --------------------------------------------------------------------------------- stubs
def _passes_through(args: tuple, kwargs: dict) -> bool:
    """`@stub` and `@stub(...)` used as decorators hand back what they decorate."""
    return len(args) == 1 and not kwargs and (isinstance(args[0], type) or callable(args[0]))


class _StubMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return stub_class(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args, **kwargs):
        if _passes_through(args, kwargs) and cls.__dict__.get("_stub_root", False):
            return args[0]
        return super().__call__(*args, **kwargs)

    def __bool__(cls) -> bool:
        return False  # `if deepspeed.comm.is_initialized():` and the like take the quiet branch


class _Stub(metaclass=_StubMeta):
    _stub_root = True

    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return stub_class(f"{type(self).__qualname__}.{name}")

    def __call__(self, *args, **kwargs):
        return args[0] if _passes_through(args, kwargs) else stub_class(f"{type(self).__qualname__}()")

    def __bool__(self) -> bool:
        return False


def stub_class(name: str) -> type:
    return _StubMeta(name, (_Stub,), {"__module__": "is-study stub", "_stub_root": True})


class StubModule(types.ModuleType):
    __version__ = "0.0.0"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = stub_class(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec):
        module = StubModule(spec.name)
        module.__path__ = []  # a package: its submodules are stubs too
        return module

    def exec_module(self, module) -> None:
        pass


class StubFinder(importlib.abc.MetaPathFinder):
    """Answers imports of the stubbed names (and their submodules) before any real finder."""

    def __init__(self, names: Sequence[str]):
        self.names = set(names)

    def covers(self, fullname: str) -> bool:
        return any(fullname == n or fullname.startswith(n + ".") for n in self.names)

    def find_spec(self, fullname, path=None, target=None):
        if not self.covers(fullname):
            return None
        return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)


NEEDED = {"torch", "numpy", "hypothesis", "runner", "hydra", "omegaconf", "yaml", "rich", "typer", "click"}


def install_stubs(names: Sequence[str]) -> None:
    """Stub `names` for the rest of the process; a stubbed name already imported for real is
    replaced too, so the target sees the stub whichever came first."""
    names = [n.strip() for n in names if n.strip()]
    if not names:
        return
    for n in names:
        if not all(part.isidentifier() for part in n.split(".")):
            raise UserError(f"--stub: {n!r} is not a module name")
        if n.split(".")[0] in NEEDED:
            raise UserError(
                f"--stub {n}: the audit itself needs {n.split('.')[0]}; stub only what the loss does not use"
            )
    finder = next((f for f in sys.meta_path if isinstance(f, StubFinder)), None)
    if finder is None:
        finder = StubFinder(())
        sys.meta_path.insert(0, finder)
    finder.names.update(names)
    for loaded in [m for m in sys.modules if finder.covers(m)]:
        if not isinstance(sys.modules[loaded], StubModule):
            del sys.modules[loaded]


def parse_stubs(text: str | Sequence[str] | None) -> list[str]:
    if text is None:
        return []
    items = [text] if isinstance(text, str) else list(text)
    return [n.strip() for item in items for n in item.split(",") if n.strip()]


# --------------------------------------------------------------------------------- loading
def split_spec(spec: str, flag: str = "--target") -> tuple[str, str]:
    where, sep, attr = spec.rpartition(":")
    if not sep or not where.strip() or not attr.strip() or not all(p.isidentifier() for p in attr.split(".")):
        raise UserError(
            f"{flag} must be module:attr or path/to/file.py:attr "
            f"(e.g. openrlhf/models/loss.py:PolicyLoss), got {spec!r}"
        )
    return where, attr


def _eager_compile(model=None, **_options):
    return model if model is not None else (lambda fn: fn)


@contextlib.contextmanager
def eager_torch_compile():
    import torch

    compile_ = torch.compile
    torch.compile = _eager_compile
    try:
        yield
    finally:
        torch.compile = compile_


def _is_file_spec(where: str) -> bool:
    return where.endswith(".py") or os.sep in where or "/" in where


def _hollow_package(name: str, folder: Path) -> types.ModuleType:
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = [str(folder)]
    module = importlib.util.module_from_spec(spec)
    module.__path__ = [str(folder)]
    module.__file__ = str(folder / "__init__.py")
    return module


def load_file(path: Path) -> types.ModuleType:
    """Load `path` as a module without running the `__init__.py` of the packages above it."""
    path = path.resolve()
    packages: list[Path] = []
    folder = path.parent
    while (folder / "__init__.py").is_file():
        packages.insert(0, folder)
        folder = folder.parent
    if not packages:
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))
        name = path.stem
    else:
        parts = [p.name for p in packages]
        for depth, pkg_dir in enumerate(packages):
            pkg = ".".join(parts[: depth + 1])
            existing = sys.modules.get(pkg)
            if existing is None or str(pkg_dir) not in list(getattr(existing, "__path__", [])):
                sys.modules[pkg] = _hollow_package(pkg, pkg_dir)
                if depth:
                    setattr(sys.modules[".".join(parts[:depth])], parts[depth], sys.modules[pkg])
        name = ".".join(parts + [path.stem]) if path.stem != "__init__" else ".".join(parts)
    existing = sys.modules.get(name)
    if existing is not None and getattr(existing, "__file__", None) == str(path):
        return existing
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    if "." in name:
        parent, _, leaf = name.rpartition(".")
        setattr(sys.modules[parent], leaf, module)
    return module


def load_attr(spec: str, flag: str = "--target") -> Any:
    """`module:attr` or `path/to/file.py:attr` → the object; a bad spec or a failed import is a
    UserError naming the flag. The current directory is importable (tests.x:Loss from the repo)."""
    where, attr = split_spec(spec, flag)
    try:
        if _is_file_spec(where):
            path = Path(where)
            if not path.is_file():
                raise UserError(f"{flag} {spec}: no such file {where}")
            with eager_torch_compile():
                obj: Any = load_file(path)
        else:
            cwd = os.getcwd()
            if cwd not in sys.path and "" not in sys.path:
                sys.path.insert(0, cwd)
            with eager_torch_compile():
                obj = importlib.import_module(where)
    except UserError:
        raise
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - an import runs arbitrary code: any failure is the target's
        hint = ""
        if isinstance(exc, ImportError) and getattr(exc, "name", None):
            hint = f"; stub what the loss does not need with --stub {exc.name.split('.')[0]}"
            if not _is_file_spec(where) and "." in where:
                hint += f", or give its file (.../{where.replace('.', '/')}.py:{attr}) to skip its packages' __init__"
        raise UserError(f"{flag} {spec}: cannot import {where} ({first_line(exc)}){hint}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UserError(f"{flag} {spec}: {where} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj
