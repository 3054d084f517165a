"""Case files: a bug report's tensors in, a verdict out.

A case file is YAML or JSON: a list of case objects, or a mapping whose `cases:` key holds one. A
case has `log_probs`, `old_log_probs`, `rollout_log_probs` and `advantages` ([B][T] each), an
optional `action_mask` (all ones when missing) and an optional `name`. Non-finite numbers may be
YAML's `.nan`/`.inf`/`-.inf` or the strings "nan", "inf", "-inf". An optional `expect:` list holds,
per preset, one result per case (format: shared/spec/cases/seed-issue.yaml). An optional
`target:` mapping names the external target an audit found the cases on (runner/audit/external.py:
TargetSpec), so that `is-study case FILE` replays that target rather than a preset. An optional
`audit:` mapping says which finding the cases are the counterexample of, so that `is-study case
FILE` runs that check again (runner/audit/replay.py) and exits 1 while it still fails:

    audit:
      check: 1             # an invariant 1-7, all-masked, reference or raises
      violation: loss -inf on finite inputs        # what the audit saw
      overrides: [correction=tis, loss=ppo]        # the preset it was found on (for a --weights-fn
                                                   # target without --target: its loss=)
      case: garbage-padding   # the case the check runs on (default: the first)
      reference: tis          # check: reference only, the preset compared with
      dtype: float64          # check: raises only, when the call that raised was not float32
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from runner.bounded import clip, load_json, load_yaml
from runner.errors import UserError

TENSOR_KEYS = ("log_probs", "old_log_probs", "rollout_log_probs", "advantages")
NONFINITE = {"nan": math.nan, "inf": math.inf, "+inf": math.inf, "-inf": -math.inf}
SHIPPED_CASES_GROUP = "cases"
AUDIT_KEYS = ("check", "violation", "overrides", "case", "reference", "dtype")


@dataclass
class Case:
    name: str
    log_probs: list[list[float]]
    old_log_probs: list[list[float]]
    rollout_log_probs: list[list[float]]
    advantages: list[list[float]]
    action_mask: list[list[float]]

    def tensors(self, dtype=None) -> dict[str, Any]:
        import torch

        dtype = dtype or torch.float32
        return {k: torch.tensor(getattr(self, k), dtype=dtype) for k in (*TENSOR_KEYS, "action_mask")}

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            **{k: encode_nested(getattr(self, k)) for k in (*TENSOR_KEYS, "action_mask")},
        }


@dataclass
class CaseFile:
    path: Path
    cases: list[Case]
    expect: list[dict[str, Any]] = field(default_factory=list)
    target: dict[str, Any] | None = None  # the audit target the cases were found on
    audit: dict[str, Any] | None = None  # the finding the cases are the counterexample of


def decode_number(value: Any, where: str) -> float:
    if isinstance(value, bool):
        raise UserError(f"{where}: expected a number, got {clip(value)}")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value.strip().lower() in NONFINITE:
        return NONFINITE[value.strip().lower()]
    raise UserError(f"{where}: expected a number or 'nan'/'inf'/'-inf', got {clip(value)}")


def encode_number(x: float) -> float | str:
    """JSON has no NaN/inf: they travel as strings, as the case-file format allows."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def encode_nested(values: Any) -> Any:
    if isinstance(values, (list, tuple)):
        return [encode_nested(v) for v in values]
    return encode_number(float(values))


def _matrix(raw: Any, where: str) -> list[list[float]]:
    if not isinstance(raw, list) or not raw or not all(isinstance(row, list) for row in raw):
        raise UserError(f"{where}: expected a non-empty [B][T] list of lists")
    width = len(raw[0])
    if width == 0:
        raise UserError(f"{where}: rows must not be empty")
    for i, row in enumerate(raw):
        if len(row) != width:
            raise UserError(f"{where}: row {i} has {len(row)} values, row 0 has {width}")
    return [[decode_number(v, f"{where}[{i}][{j}]") for j, v in enumerate(row)] for i, row in enumerate(raw)]


def parse_case(raw: Any, index: int) -> Case:
    where = f"case {index}"
    if not isinstance(raw, dict):
        raise UserError(f"{where}: expected a mapping with log_probs, old_log_probs, rollout_log_probs, advantages")
    name = str(raw.get("name", f"case-{index}"))
    where = f"case {clip(name)}"
    missing = [k for k in TENSOR_KEYS if k not in raw]
    if missing:
        raise UserError(f"{where}: missing {', '.join(missing)}")
    tensors = {k: _matrix(raw[k], f"{where}.{k}") for k in TENSOR_KEYS}
    shape = (len(tensors["log_probs"]), len(tensors["log_probs"][0]))
    if raw.get("action_mask") is None:
        tensors["action_mask"] = [[1.0] * shape[1] for _ in range(shape[0])]
    else:
        tensors["action_mask"] = _matrix(raw["action_mask"], f"{where}.action_mask")
        bad = {v for row in tensors["action_mask"] for v in row if v not in (0.0, 1.0)}
        if bad:
            raise UserError(f"{where}.action_mask: values must be 0 or 1, got {clip(sorted(bad)[0])}")
    for key, value in tensors.items():
        got = (len(value), len(value[0]))
        if got != shape:
            raise UserError(f"{where}: {key} has shape {list(got)} but log_probs has {list(shape)}")
    return Case(name=name, **tensors)


CAP_HINT = "is-study case --max-elements N raises it"


def load_case_file(path: str | Path, max_elements: int | None = None) -> CaseFile:
    """Read and check a case file. A file that expands to more than `max_elements` elements (YAML
    aliases included) is refused while it is parsed, before any of it is built (runner.bounded)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"case file not found: {path}")
    try:
        text = path.read_text()
        data = (
            load_json(text, str(path), max_elements, CAP_HINT)
            if path.suffix == ".json"
            else load_yaml(text, str(path), max_elements, CAP_HINT)
        )
    except (yaml.YAMLError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'} ({first})") from None
    expect: list[dict[str, Any]] = []
    target = None
    if isinstance(data, dict):
        if "cases" not in data:
            raise UserError(f"{path}: a mapping must hold the cases under a `cases:` key")
        raw_cases = data["cases"]
        expect = data.get("expect") or []
        if not isinstance(expect, list):
            raise UserError(f"{path}: `expect:` must be a list of {{preset, results}} entries")
        target = data.get("target")
        if target is not None and not isinstance(target, dict):
            raise UserError(f"{path}: `target:` must be a mapping (--target and its options)")
        audit = _audit_block(data.get("audit"), path)
    else:
        raw_cases, audit = data, None
    if not isinstance(raw_cases, list) or not raw_cases:
        raise UserError(f"{path}: expected a non-empty list of cases")
    cases = [parse_case(c, i) for i, c in enumerate(raw_cases)]
    if audit and "case" in audit and audit["case"] not in {c.name for c in cases}:
        raise UserError(f"{path}: `audit.case` names {clip(audit['case'])}, which is not a case of the file")
    return CaseFile(path=path, cases=cases, expect=expect, target=target, audit=audit)


def _audit_block(raw: Any, path: Path) -> dict[str, Any] | None:
    """The `audit:` mapping, its shape checked (which checks exist is runner/audit/replay.py's business)."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or "check" not in raw:
        raise UserError(
            f"{path}: `audit:` must be a mapping with a `check:` (an invariant 1-7, all-masked, reference or raises)"
        )
    unknown = sorted(str(k) for k in raw if k not in AUDIT_KEYS)
    if unknown:
        raise UserError(
            f"{path}: unknown key(s) in `audit:`: {clip(', '.join(unknown))} (known: {', '.join(AUDIT_KEYS)})"
        )
    overrides = raw.get("overrides", [])
    if not isinstance(overrides, list) or not all(isinstance(o, str) and "=" in o for o in overrides):
        raise UserError(f"{path}: `audit.overrides` must be a list of KEY=VALUE overrides")
    return dict(raw)


def write_case_file(
    path: str | Path,
    cases: list[Case],
    header: str = "",
    expect: list | None = None,
    target: dict[str, Any] | None = None,
    audit: dict[str, Any] | None = None,
) -> Path:
    """Write cases as YAML that `is-study case` reads back unchanged (non-finite as strings)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body: dict[str, Any] = {"cases": [c.to_dict() for c in cases]}
    if expect:
        body["expect"] = expect
    if target:
        body["target"] = target
    if audit:
        body["audit"] = audit
    text = "".join(f"# {line}\n" for line in header.splitlines()) + yaml.safe_dump(body, sort_keys=False, width=120)
    path.write_text(text)
    return path
