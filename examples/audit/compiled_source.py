"""Compile chosen definitions out of a framework's source file, for the adapters in this folder: a
framework's loss module often imports its whole trainer at module level, while the functions the audit
calls need torch alone. Only the named top-level classes and functions are compiled, with the file's own
name and line numbers (so a finding points at the framework's line), into a namespace the adapter fills
with what they use."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any


def definitions(path: Path, names: set[str]) -> ast.Module:
    """The top-level classes and functions of `path` called `names`, in the file's order."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found")
    tree = ast.parse(path.read_text(), filename=str(path))
    body = [n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name in names]
    missing = names - {n.name for n in body}
    if missing:
        raise LookupError(f"{', '.join(sorted(missing))} not found in {path}")
    return ast.Module(body=body, type_ignores=[])


def compile_into(namespace: dict[str, Any], path: Path, names: set[str]) -> None:
    # dont_inherit: this file's `from __future__ import annotations` must not reach their code (pydantic and
    # dataclasses read the annotations)
    exec(compile(definitions(path, names), str(path), "exec", dont_inherit=True), namespace)
