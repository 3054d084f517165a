"""The counterexample of an audit finding as a case file: OUT/<row>[.<hash>].<check>.yaml, with a
header that says what failed, how it was found, under which profile, and how to reproduce it. The
file records, as data, what the finding was found on (the preset's overrides under `audit:`, or an
external target under `target:`) and which check failed (`audit:`, runner/audit/case_files.py), so
`is-study case FILE` replays it on that preset or target, runs the check again and exits 1 while it
still fails. For invariants 4-6 of a preset it also holds an `expect:` list that `--check` compares
with."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from runner.audit.groups import Group, slug


def case_path(out_dir: Path, key: str, check: int | str) -> Path:
    suffix = f"inv{check}" if isinstance(check, int) else check
    return Path(out_dir) / f"{slug(key)}.{suffix}.yaml"


def _results(case, subject, corr=None) -> dict[str, Any]:
    from runner.audit.case_study import evaluate

    r = evaluate(case, subject.spec, corr or subject.corr)
    return {"loss": r["loss"], "grad": r["grad"]}


def _preset_header(path: Path, n: int | str, subject, batch, cases) -> tuple[list[str], list | None]:
    """Reproduce lines for a preset (and, for invariants 4-6, the `expect:` numbers to --check)."""
    from runner.core.corrections import Correction

    args = preset_overrides(subject)
    lines, expect = [], None
    if n in (6, 7):
        lines.append(
            "checked in float64; `is-study case` prints float32 results, and checks in float64 as the audit did"
        )
    if n in (4, 5, 6):
        if n == 4:
            clean = _results(cases[0], subject)
            expect = [clean, dict(clean)]
        elif n == 5:
            expect = [_results(cases[0], subject, Correction(name="none"))]
        else:
            from runner.audit.invariants import permutations

            perm = permutations(batch.shape[0])[0]
            first = _results(cases[0], subject)
            expect = [first, {"loss": first["loss"], "grad": [first["grad"][i] for i in perm]}]
        what = {4: "what clean (zero) padding gives", 5: "what `none` gives", 6: "the original's results, permuted"}[n]
        lines.append(f"expect: holds {what}, so --check shows the mismatch")
        expect = [{"preset": subject.name, "overrides": args[1:], "results": expect}]
        lines.append(f"reproduce: is-study case {path} --check")
    lines.append(
        f"reproduce: is-study case {path}   (the file names its preset ({' '.join(args)}) and the check; "
        "exit 1 while it fails)"
    )
    return lines, expect


def preset_overrides(subject) -> list[str]:
    return [f"correction={subject.name}", f"loss={subject.loss_name}", *subject.overrides]


def audit_block(
    check: int | str, subject, detail: str, case: str | None = None, reference: str | None = None, dtype=None
) -> dict[str, Any]:
    """The case file's `audit:` mapping: what `is-study case FILE` needs to run the check again."""
    block: dict[str, Any] = {"check": check, "violation": str(detail)}
    if subject.kind == "preset":
        block["overrides"] = preset_overrides(subject)
    elif subject.loss_name:  # a weights function under one of our losses
        block["overrides"] = [f"loss={subject.loss_name}"]
    if case:
        block["case"] = case
    if reference:
        block["reference"] = reference
    if dtype is not None and str(dtype) != "torch.float32":
        block["dtype"] = str(dtype).removeprefix("torch.")
    return block


def save_counterexample(
    path: Path,
    check: int | str,
    title: str,
    subject,
    group: Group,
    batch,
    detail: str,
    how: str,
    inputs: str,
    audit_args: Sequence[str] = (),
    reference: str | None = None,
    dtype=None,
) -> Path:
    """Write the counterexample of one finding, with a header saying what, how it was found (from
    which `inputs`: a profile's, or ordinary ones) and how to rerun it; `audit_args` are the audit's
    options beyond the target's that found it (--profile, --reference). `reference` is the preset
    a reference finding was compared with, `dtype` the dtype of the call that raised a crash."""
    from runner.audit.case_files import write_case_file
    from runner.audit.invariants import permutations

    B, T = batch.shape
    cases = [
        batch.to_case(f"{check}-counterexample" if isinstance(check, str) else f"invariant-{check}-counterexample")
    ]
    if check == 4:
        cases = [batch.clean_padding().to_case("clean-padding"), batch.to_case("garbage-padding")]
    elif check == 5:
        cases = [batch.on_policy().to_case("on-policy")]
    elif check == 6:
        perm = permutations(B)[0]
        cases = [batch.to_case("original"), batch.rows(perm).to_case(f"rows-permuted-{'-'.join(map(str, perm))}")]
    loss = f"loss={subject.loss_name}: " if subject.loss_name else ""
    header = [
        f"is-study audit: {group.name} {title}",
        f"{loss}{detail}",
        f"found by {how}; {inputs} inputs; B={B}, T={T}",
    ]
    target = None
    expect = None
    if subject.kind == "preset":
        lines, expect = _preset_header(path, check, subject, batch, cases)
        header += lines
    elif subject.target_spec is not None:
        target = subject.target_spec.to_dict()
        header.append(
            f"reproduce: is-study case {path}   (the file names its target and the check; exit 1 while "
            "it fails; add --json for numbers)"
        )
        header.append(f"found with: {shlex.join(['is-study', 'audit', *group.repro, *audit_args])}")
    audit = audit_block(check, subject, detail, cases[-1].name if check == 4 else None, reference, dtype)
    return write_case_file(path, cases, header="\n".join(header), expect=expect, target=target, audit=audit)
