"""Validators for config sections: every bad value becomes one clear `UserError` line, raised before
any file is written. Every section (worlds, tasks, engine, training, probe) uses these, so they
live here rather than in any one of them. No torch."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from runner.errors import UserError


def check_keys(section: str, cfg: Mapping[str, Any], allowed: Iterable[str]) -> None:
    allowed = tuple(allowed)
    unknown = sorted(set(cfg) - set(allowed))
    if unknown:
        hint = ""
        if len(unknown) == 1:
            import difflib

            close = difflib.get_close_matches(unknown[0], allowed, n=1)
            hint = f" (did you mean {section}.{close[0]}?)" if close else ""
        raise UserError(f"{section}: unknown key(s) {', '.join(unknown)}{hint}; valid: {', '.join(sorted(allowed))}")


def as_int(
    section: str, cfg: Mapping[str, Any], key: str, low: int | None = None, default: Any = ..., high: int | None = None
) -> int:
    value = cfg.get(key, default)
    if value is ...:
        raise UserError(f"{section}.{key} is missing")
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserError(f"{section}.{key} must be an integer, got {value!r}")
    if low is not None and value < low:
        raise UserError(f"{section}.{key} must be >= {low}, got {value}")
    if high is not None and value > high:
        raise UserError(f"{section}.{key} must be <= {high}, got {value}")
    return value


def as_float(
    section: str,
    cfg: Mapping[str, Any],
    key: str,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    finite: bool = True,
    default: Any = ...,
) -> float:
    value = cfg.get(key, default)
    if value is ...:
        raise UserError(f"{section}.{key} is missing")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"{section}.{key} must be a number, got {value!r}")
    value = float(value)
    if math.isnan(value) or (finite and math.isinf(value)):
        raise UserError(f"{section}.{key} must be a finite number, got {value}")
    if low is not None and (value <= low if low_open else value < low):
        raise UserError(f"{section}.{key} must be {'>' if low_open else '>='} {low:g}, got {value:g}")
    if high is not None and value > high:
        raise UserError(f"{section}.{key} must be <= {high:g}, got {value:g}")
    return value


def as_optional_float(section: str, cfg: Mapping[str, Any], key: str, **kwargs: Any) -> float | None:
    """as_float, where null (None) is a valid value meaning "off"."""
    return None if cfg.get(key) is None else as_float(section, cfg, key, **kwargs)


def as_choice(section: str, cfg: Mapping[str, Any], key: str, choices: Iterable[str], default: Any = ...) -> str:
    value = cfg.get(key, default)
    choices = tuple(choices)
    if value not in choices:
        raise UserError(f"{section}.{key}={value!r} is not one of: {', '.join(choices)}")
    return value


def as_bool(section: str, cfg: Mapping[str, Any], key: str, default: Any = ...) -> bool:
    value = cfg.get(key, default)
    if not isinstance(value, bool):
        raise UserError(f"{section}.{key} must be true or false, got {value!r}")
    return value
