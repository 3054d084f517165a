"""One value as a command line, a YAML file and a CSV cell write it: `correction.high=2`, `2.0` and
"2" are the same value. Used wherever an override is matched against what a run recorded (the case
card's expect entries, analysis's filters). No torch, no Hydra: yaml only."""

from __future__ import annotations

import math
from typing import Any

import yaml

try:  # the C loader is ~10× faster on the 100 small files of a sweep
    _Loader = yaml.CSafeLoader
except AttributeError:  # pragma: no cover
    _Loader = yaml.SafeLoader


def parse_override(text: str) -> tuple[str, Any]:
    """'correction.high=2' -> ('correction.high', 2); group choices stay strings."""
    key, _, raw = str(text).partition("=")
    key = key.lstrip("+~")
    try:
        value = yaml.load(raw, Loader=_Loader) if raw != "" else None
    except yaml.YAMLError:
        value = raw
    if isinstance(value, (dict, list)) or value is None and raw.strip().lower() not in ("null", "~", ""):
        value = raw
    return key, value


def same_value(a: Any, b: Any) -> bool:
    """Equality across the types a CSV, a YAML file and a command line give the same value."""

    def norm(v):
        if isinstance(v, bool):
            return str(v).lower()
        if isinstance(v, (int, float)):
            return "nan" if isinstance(v, float) and math.isnan(v) else float(v)
        if v is None:
            return "null"
        s = str(v).strip()
        try:
            return float(s)
        except ValueError:
            return s.lower() if s.lower() in ("true", "false", "null") else s

    return norm(a) == norm(b)
