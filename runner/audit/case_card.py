"""The case repro card, computed: a case file run through one composed preset and loss, the file's
expected results picked and compared, and two invariants checked per case. Returns plain data (a
`CaseCard`); analysis/reports/case_card.py only formats it, so analysis never runs the algebra or the audit.

The invariants are the two a bug report is about:
  1 the loss and d loss / d log_probs are finite (NaN or ±inf is the bug);
  2 a unit the correction rejects contributes exactly zero gradient, not 0·inf = NaN (runner.audit's
    check, in float32 as `is-study case` runs it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.audit.case_files import Case, load_case_file
from runner.audit.case_study import Mismatch, compare, evaluate
from runner.hydra_app import app as hydra_app
from runner.values import parse_override, same_value


@dataclass(frozen=True)
class RejectionCheck:
    """Invariant 2 for one case."""

    status: str  # "pass" | "fail" | "n/a"
    reason: str = ""  # why n/a, or what failed
    rejected: int = 0  # tokens the correction rejected


@dataclass(frozen=True)
class CaseCheck:
    name: str
    finite: bool  # invariant 1
    inputs_finite: bool  # the case's own unmasked inputs are all finite
    rejection: RejectionCheck  # invariant 2


@dataclass(frozen=True)
class CaseCard:
    overrides: list[str]  # the overrides this card was composed with (correction=... first)
    path: Path
    cases: list[Case]
    preset: str  # the correction's name
    correction: dict[str, Any]  # the composed correction config (description, low, high, veto, faithful, ...)
    loss: dict[str, Any]  # the composed loss config (name, reduction)
    results: list[dict[str, Any]]  # runner.audit.case_study.evaluate, one per case
    expected: list[dict[str, Any]] | None  # the file's expect entry for this preset, if any
    no_expected_reason: str  # why `expected` is None
    mismatches: list[Mismatch]
    checks: list[CaseCheck]


def build_card(path: Path, overrides: list[str]) -> CaseCard:
    """The card of the case file at `path` under the preset and loss these overrides compose."""
    from runner.audit.subjects import PresetSubject
    from runner.core.corrections import Correction
    from runner.core.losses import LossSpec

    case_file = load_case_file(path)
    cfg = hydra_app.compose(overrides)
    corr_cfg = hydra_app.to_container(cfg.correction)
    loss_cfg = hydra_app.to_container(cfg.loss)
    corr = Correction.from_config(corr_cfg)
    spec = LossSpec.from_config(loss_cfg)
    spec.check_correction(corr)
    results = [evaluate(c, spec, corr) for c in case_file.cases]
    expected, why = _expected_for(case_file, corr.name, overrides)
    mismatches = compare(results, expected) if expected is not None else []
    subject = PresetSubject(corr, spec)
    checks = [_check(case, res, subject) for case, res in zip(case_file.cases, results)]
    return CaseCard(
        list(overrides),
        case_file.path,
        case_file.cases,
        corr.name,
        corr_cfg,
        loss_cfg,
        results,
        expected,
        why,
        mismatches,
        checks,
    )


def build_cards(path: Path, overrides: list[str]) -> list[CaseCard]:
    """The cards a report on a case file covers: one for `correction=` when the command line names
    it, else one per entry of the file's `expect:` list (each under its own overrides, then the
    command line's). A file with no `expect:` list needs `correction=`: a one-line UserError."""
    if any(parse_override(o)[0] == "correction" for o in overrides if "=" in o):
        return [build_card(path, overrides)]
    case_file = load_case_file(path)
    entries = [e for e in case_file.expect if isinstance(e, dict) and isinstance(e.get("preset"), str)]
    if not entries:
        from runner.errors import UserError

        raise UserError(
            f"{case_file.path.name} has no `expect:` list to cover: name the preset to check, "
            f"e.g. correction=seq-mask-tis"
        )
    cards = []
    for entry in entries:
        extra = [str(o) for o in entry.get("overrides", []) or []]
        cards.append(build_card(path, [f"correction={entry['preset']}", *extra, *overrides]))
    return cards


def _expected_for(case_file, preset: str, overrides: list[str]) -> tuple[list | None, str]:
    """The expect entry of `preset` whose own overrides the command line sets too (the most specific
    one when several match)."""
    if not case_file.expect:
        return None, f"{case_file.path.name} has no `expect:` list"
    user = {parse_override(o)[0]: parse_override(o)[1] for o in overrides if "=" in o}
    user.pop("correction", None)
    candidates = []
    for entry in case_file.expect:
        if not isinstance(entry, dict) or entry.get("preset") != preset or "results" not in entry:
            continue
        extra = dict(parse_override(o) for o in entry.get("overrides", []) or [])
        if all(k in user and same_value(user[k], v) for k, v in extra.items()):
            candidates.append((len(extra), entry))
    if not candidates:
        return None, f"{case_file.path.name} has no expect entry for `{preset}` with these overrides"
    return max(candidates, key=lambda c: c[0])[1]["results"], ""


def _check(case: Case, result: dict[str, Any], subject) -> CaseCheck:
    masked_in = [(b, t) for b, row in enumerate(case.action_mask) for t, m in enumerate(row) if m > 0]
    inputs_finite = all(
        math.isfinite(getattr(case, k)[b][t])
        for b, t in masked_in
        for k in ("log_probs", "old_log_probs", "rollout_log_probs", "advantages")
    )
    return CaseCheck(result["name"], bool(result["finite"]), inputs_finite, _rejection(case, subject))


def _rejection(case: Case, subject) -> RejectionCheck:
    """Invariant 2, as runner.audit checks it, on this one case."""
    from runner.audit.invariants import applies_rejection, check_rejection
    from runner.audit.subjects import Batch

    reason = applies_rejection(subject)
    if reason:
        return RejectionCheck("n/a", reason)
    batch = Batch.from_case(case)
    outcome = subject(batch)
    rejected = int(((batch.mask > 0) & ~outcome.keep).sum())
    if rejected == 0:
        return RejectionCheck("n/a", "nothing rejected")
    failure = check_rejection(subject, batch)
    if failure:
        return RejectionCheck("fail", failure, rejected)
    return RejectionCheck("pass", "", rejected)
