"""`is-study case FILE --target ...`: run a case file's tensors through an external target, as the
audit called it (float32, the target's convention), and report loss, gradient and, with a weights
function, the coefficients. A case on which the target raises reports the exception and its line,
so a crash's counterexample replays as the crash.

`check_again` runs the check a counterexample file's `audit:` block names (runner/audit/case_files.py) on a
subject, a preset's or a target's, exactly as the audit ran it, so `is-study case FILE` can say
whether the finding still holds and exit 1 while it does."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from runner.audit.case_files import Case, CaseFile, encode_nested, encode_number
from runner.errors import UserError

NAMED_CHECKS = ("all-masked", "reference", "raises")


def evaluate_target(case: Case, subject) -> dict[str, Any]:
    import torch

    from runner.audit.crashes import message_of, raising_frame, short_path
    from runner.audit.subjects import Batch, SubjectRaised

    try:
        out = subject(Batch.from_case(case), torch.float32)
    except SubjectRaised as raised:
        file, line = raising_frame(raised.error)
        msg = message_of(raised.error)
        return {
            "name": case.name,
            "loss": None,
            "grad": None,
            "finite": False,
            "weights": None,
            "raised": f"{type(raised.error).__name__}{': ' + msg if msg else ''} at {short_path(file)}:{line}",
        }
    loss = float(out.loss)
    return {
        "name": case.name,
        "loss": encode_number(loss),
        "grad": encode_nested(out.grad.tolist()),
        "finite": math.isfinite(loss) and bool(torch.isfinite(out.grad).all()),
        "weights": encode_nested(out.coef.tolist()) if out.coef is not None else None,
        "raised": None,
    }


def print_table(title: str, results: list[dict[str, Any]], console) -> None:
    from rich.markup import escape
    from rich.table import Table

    def fmt(v):
        return f"{v:.6g}" if isinstance(v, float) else str(v)

    def matrix(rows):
        return "—" if rows is None else escape("\n".join("[" + ", ".join(fmt(v) for v in row) + "]" for row in rows))

    table = Table(title=title, title_justify="left", show_lines=True)
    for col in ("case", "loss", "d loss / d log_probs", "weights", "finite"):
        table.add_column(col)
    for r in results:
        if r["raised"]:
            table.add_row(escape(r["name"]), f"[red]raises[/red] {escape(r['raised'])}", "—", "—", "[red]NO[/red]")
            continue
        table.add_row(
            escape(r["name"]),
            fmt(r["loss"]),
            matrix(r["grad"]),
            matrix(r["weights"]),
            "[green]yes[/green]" if r["finite"] else "[red]NO[/red]",
        )
    console.print(table)


@dataclass
class Replayed:
    status: str  # fail (the violation is there) | pass | n/a (the check does not apply to this subject)
    text: str


def _label(audit: dict[str, Any]) -> str:
    from runner.audit import all_masked
    from runner.audit.invariants import INVARIANTS

    check = audit["check"]
    if isinstance(check, int):
        return f"invariant {check} ({INVARIANTS[check].text})"
    return {
        "all-masked": f"the all-masked check ({all_masked.TEXT})",
        "reference": f"the reference check (the results of correction={audit.get('reference')} on ordinary inputs)",
        "raises": "raises (an exception the audit found)",
    }[check]


def _audited_case(case_file: CaseFile) -> Case:
    name = case_file.audit.get("case")
    return next((c for c in case_file.cases if c.name == name), case_file.cases[0])


def validate(case_file: CaseFile) -> None:
    """A one-line error for an `audit:` block this version cannot replay."""
    audit = case_file.audit or {}
    check = audit.get("check")
    where = str(case_file.path)
    if not (check in NAMED_CHECKS or (isinstance(check, int) and not isinstance(check, bool) and 1 <= check <= 7)):
        raise UserError(
            f"{where}: `audit.check` must be an invariant 1-7 or one of {', '.join(NAMED_CHECKS)}, got {check!r}"
        )
    if check == "reference" and not isinstance(audit.get("reference"), str):
        raise UserError(f"{where}: `audit.check: reference` needs `reference:` (the preset compared with)")
    if audit.get("dtype", "float32") not in ("float32", "float64"):
        raise UserError(f"{where}: `audit.dtype` must be float32 or float64, got {audit.get('dtype')!r}")


def _raised_text(raised) -> str:
    from runner.audit.crashes import message_of, raising_frame, short_path

    file, line = raising_frame(raised.error)
    msg = message_of(raised.error)
    return f"{type(raised.error).__name__}{': ' + msg if msg else ''} at {short_path(file)}:{line}"


def _allowed(subject) -> tuple[str, ...]:
    spec = getattr(subject, "target_spec", None)
    return tuple(spec.allow_raise) if spec is not None else ()


def check_again(case_file: CaseFile, subject) -> Replayed:
    """Run the file's recorded check on `subject`, on the case it names (the first by default)."""
    import torch

    from runner.audit.subjects import Batch, SubjectRaised

    validate(case_file)
    audit = case_file.audit
    check = audit["check"]
    batch = Batch.from_case(_audited_case(case_file))
    who = subject.name + (f" loss={subject.loss_name}" if subject.loss_name else "")
    head = f"{_label(audit)} on {who}"
    found_then = f" (the audit found: {audit['violation']})" if audit.get("violation") else ""
    try:
        if isinstance(check, int):
            from runner.audit.invariants import INVARIANTS, violation

            reason = INVARIANTS[check].applies(subject)
            if reason:
                return Replayed("n/a", f"{head}: does not apply ({reason})")
            found = violation(INVARIANTS[check], subject, batch)
        elif check == "all-masked":
            from runner.audit import all_masked
            from runner.audit.crashes import CrashLog

            log = CrashLog(_allowed(subject))
            verdict = all_masked.judge(subject, batch, log)
            if verdict.status == "raise":
                crash = next(iter(log.crashes.values()))
                return Replayed("fail", f"{head}: raises {crash.type}: {crash.message}")
            found = verdict.violation
        elif check == "reference":
            from runner.audit import reference

            found = reference.check(subject, reference.reference_subject(subject, audit["reference"]), batch)
        else:
            from runner.audit.crashes import CrashLog

            dtype = getattr(torch, audit.get("dtype", "float32"))
            try:
                subject(batch, dtype)
            except SubjectRaised as raised:
                if CrashLog(_allowed(subject)).is_allowed(raised.error):
                    return Replayed(
                        "pass",
                        f"{head}: refused with {type(raised.error).__name__}, which --allow-raise allows{found_then}",
                    )
                text = _raised_text(raised)
                return Replayed("fail", f"{head}: {text}" + ("" if text == audit.get("violation") else found_then))
            return Replayed("pass", f"{head}: no longer raises{found_then}")
    except SubjectRaised as raised:
        return Replayed("fail", f"{head}: raises {_raised_text(raised)}, so the check cannot run{found_then}")
    if found is None:
        return Replayed("pass", f"{head}: holds on this file{found_then}")
    same = "" if str(found) == audit.get("violation") else found_then
    return Replayed("fail", f"{head}: {found}{same}")
