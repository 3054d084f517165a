"""Resolve `--target module:attr [--target-kwargs JSON]` into an audit subject. Every way this can
go wrong is a `UserError` of one line (exit code 2); the convention is in runner/audit/__init__.py."""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import os
import sys
from typing import Any

from runner.bounded import load_json
from runner.errors import UserError


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def parse_kwargs(text: str | None) -> dict[str, Any]:
    if text is None or not text.strip():
        return {}
    try:
        value = load_json(text, "--target-kwargs")  # refused past runner.bounded's element cap
    except json.JSONDecodeError as exc:
        raise UserError(f"--target-kwargs is not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(value, dict):
        raise UserError(f"--target-kwargs must be a JSON object, got {type(value).__name__}")
    return value


def resolve(spec: str, kwargs_json: str | None = None):
    """`module:attr` → ExternalSubject. The current directory is put on sys.path first."""
    from runner.audit.subjects import Batch, ExternalSubject, TargetError

    kwargs = parse_kwargs(kwargs_json)
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name.strip() or not attr.strip():
        raise UserError(f"--target must be module:attr (e.g. openrlhf.models.loss:PolicyLoss), got {spec!r}")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        obj: Any = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # an import runs arbitrary code: any failure is the target's
        raise UserError(f"--target {spec}: cannot import {module_name} ({_first_line(exc)})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UserError(f"--target {spec}: {module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UserError(f"--target {spec}: {attr} is not callable ({type(obj).__name__}); "
                        "expected a class or a function")
    if inspect.isclass(obj):
        try:
            fn = obj(**kwargs)
        except Exception as exc:
            raise UserError(f"--target {spec}: {attr}(**kwargs) failed ({_first_line(exc)})") from None
        if not callable(fn):
            raise UserError(f"--target {spec}: an instance of {attr} is not callable")
    else:
        fn = functools.partial(obj, **kwargs) if kwargs else obj
    subject = ExternalSubject(spec, fn)
    # One benign call up front: a target that cannot take the convention is bad input, not a finding.
    probe = Batch.of([[-0.5, -1.0]], [[-0.6, -1.0]], [[-0.7, -0.9]], [[1.0, -1.0]], [[1, 1]])
    try:
        out = subject(probe)
    except TargetError as exc:
        raise UserError(f"--target {spec}: {exc} on a benign batch") from None
    except Exception as exc:
        raise UserError(f"--target {spec}: calling it as (log_probs, old_log_probs, advantages, action_mask=, "
                        f"rollout_log_probs=) failed ({_first_line(exc)})") from None
    del out
    return subject
