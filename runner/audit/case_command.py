"""`is-study case`: a case file run through a loss and correction (the composed preset, or each of
the file's `expect:` entries with --check), or an audit's counterexample replayed on its preset or
target. The CLI parses the options and prints nothing of its own; `run_case` prints the tables or
the JSON and returns the exit code (1: a --check mismatch, or the recorded audit check still fails).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from runner.errors import UserError


def _echo(text: str, err: bool = False) -> None:
    print(text, file=sys.stderr if err else sys.stdout, flush=True)


def resolve_case_path(file: str) -> Path:
    """A case file's path, or a shipped case's by name."""
    from runner import registry

    path = Path(file)
    if path.exists():
        return path
    shipped = registry.shipped_case(file)
    if shipped is not None:
        return shipped
    raise UserError(f"case file not found: {file} (shipped cases: {', '.join(registry.group_options('cases'))})")


def _print_case_table(preset: str, results: list[dict], console) -> None:
    from rich.markup import escape
    from rich.table import Table

    def fmt(v):
        return f"{v:.6g}" if isinstance(v, float) else str(v)

    def fmt_matrix(rows):
        return escape("\n".join("[" + ", ".join(fmt(v) for v in row) + "]" for row in rows))

    table = Table(title=f"correction={preset}", title_justify="left", show_lines=True)
    for col in ("case", "loss", "d loss / d log_probs", "weights", "finite", "ess", "masked"):
        table.add_column(col)
    for r in results:
        m = r["metrics"]
        table.add_row(
            escape(r["name"]),
            fmt(r["loss"]),
            fmt_matrix(r["grad"]),
            fmt_matrix(r["weights"]),
            "[green]yes[/green]" if r["finite"] else "[red]NO[/red]",
            fmt(m.get("ess")),
            fmt(m.get("token_masked_fraction")),
        )
    console.print(table)


def _override_keys(overrides: list[str]) -> set[str]:
    return {o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o}


def run_case(
    file: str,
    overrides: list[str],
    *,
    as_json: bool,
    check: bool,
    target_options: dict[str, Any],
    max_elements: int | None,
    console,
    err_console,
) -> int:
    """The `case` command; returns its exit code. `target_options` are TargetSpec.of's keyword
    arguments (the --target options); `console` and `err_console` print to stdout and stderr."""
    from runner.audit.case_files import load_case_file

    # the file first: a bad or oversized one is refused before torch and Hydra are imported
    case_file = load_case_file(resolve_case_path(file), max_elements=max_elements)
    from runner.audit.case_study import compare, evaluate
    from runner.audit.external import TargetSpec
    from runner.core.corrections import Correction
    from runner.core.losses import LossSpec
    from runner.hydra_app import app as hydra_app

    spec = TargetSpec.of(**target_options)
    if case_file.audit and not check:
        from runner.audit.replay import validate

        validate(case_file)
    if spec.given or (case_file.target and not overrides and not check):
        return 1 if _replay_target(case_file, spec, overrides, as_json, check, console, err_console) else 0
    # An audit's counterexample of a preset names the preset: it is the default subject, and the
    # command line's overrides win key by key; a correction= of its own replaces it altogether.
    recorded = (case_file.audit or {}).get("overrides", []) if not case_file.target else []
    replay = bool(case_file.audit) and not check and bool(recorded or "correction" in _override_keys(overrides))
    if recorded and not check and "correction" not in _override_keys(overrides):
        overrides = [o for o in recorded if o.split("=", 1)[0] not in _override_keys(overrides)] + overrides
    runs = _case_runs(case_file, overrides, check)
    failures: list[str] = []
    printed: list[dict] = []
    verdicts: list[tuple[str, str, int]] = []
    failed = False  # the recorded audit check still fails

    for preset, extra, expected in runs:
        cfg = hydra_app.compose(extra + overrides)
        corr = Correction.from_config(hydra_app.to_container(cfg.correction))
        loss = LossSpec.from_config(hydra_app.to_container(cfg.loss))
        loss.check_correction(corr)
        results = [evaluate(c, loss, corr) for c in case_file.cases]
        if expected is not None:
            mismatches = compare(results, expected)
            failures.extend(f"{corr.name}: {m}" for m in mismatches)
            verdicts.append(
                (corr.name, " ".join(extra[1:] if extra[:1] == [f"correction={preset}"] else extra), len(mismatches))
            )
        if as_json:
            printed.extend({"preset": corr.name, **r} if len(runs) > 1 else r for r in results)
        elif not check or len(runs) == 1:
            _print_case_table(corr.name, results, console)
        if replay:
            from runner.audit.subjects import PresetSubject

            failed = _report_replay(case_file, PresetSubject(corr, loss)) or failed
    if as_json:
        _echo(json.dumps(printed, indent=1))
    if check and not as_json:
        from rich.table import Table

        table = Table(title=f"{case_file.path.name}: expected vs actual (tolerance 1e-5)", title_justify="left")
        for col in ("preset", "overrides", "cases", "verdict"):
            table.add_column(col)
        for name, extra_args, bad in verdicts:
            table.add_row(
                name,
                extra_args,
                str(len(case_file.cases)),
                "[green]match[/green]" if not bad else f"[red]{bad} mismatch(es)[/red]",
            )
        console.print(table)
    if check and failures:
        for line in failures:
            _echo(f"MISMATCH {line}", err=True)
        return 1
    return 1 if failed else 0


def _report_replay(case_file, subject) -> bool:
    """Run the check the file's `audit:` block names on `subject` and say how it went, on stderr
    (as --check's mismatches are); True when the violation is still there."""
    from runner.audit.replay import check_again

    replayed = check_again(case_file, subject)
    _echo(f"{'FAIL' if replayed.status == 'fail' else replayed.status} {replayed.text}", err=True)
    return replayed.status == "fail"


def _replay_target(case_file, spec, overrides: list[str], as_json: bool, check: bool, console, err_console) -> bool:
    """Replay on the file's target (or --target); True when the file's audit check still fails there."""
    from runner.audit.command import loss_specs
    from runner.audit.external import TargetSpec, resolve_all
    from runner.audit.replay import evaluate_target, print_table

    if check:
        raise UserError("--check compares presets with the file's expect: list; it does not apply to a target")
    if not spec.given:
        spec = TargetSpec.from_dict(case_file.target, str(case_file.path))
        err_console.print(
            f"[dim]replaying the target recorded in {case_file.path}: {spec.command_line()}[/dim]", soft_wrap=True
        )
        if spec.target is None and not overrides:  # a weights function: the loss it was found under
            overrides = list((case_file.audit or {}).get("overrides", []))
    elif spec.target is not None and overrides:
        raise UserError(f"--target replays an external callable; overrides ({' '.join(overrides)}) do not apply")
    subjects = resolve_all(spec, loss_specs(overrides) if spec.target is None else ())
    printed = []
    failed = False
    for subject in subjects:
        results = [evaluate_target(c, subject) for c in case_file.cases]
        title = subject.name + (f"  loss={subject.loss_name}" if subject.loss_name else "")
        if as_json:
            printed.extend({"target": title, **r} if len(subjects) > 1 else r for r in results)
        else:
            print_table(title, results, console)
        if case_file.audit:
            failed = _report_replay(case_file, subject) or failed
    if as_json:
        _echo(json.dumps(printed, indent=1))
    return failed


def _case_runs(case_file, overrides: list[str], check: bool) -> list[tuple[str, list[str], list | None]]:
    """Which (preset, extra overrides, expected results) to evaluate. Without --check: the composed
    preset. With --check: each matching `expect:` entry, its own overrides added unless the command
    line sets the same key."""
    if not check:
        return [("", [], None)]
    if not case_file.expect:
        raise UserError(f"{case_file.path}: --check needs an `expect:` list in the file")
    user_keys = _override_keys(overrides)
    chosen = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == "correction"]
    runs = []
    for entry in case_file.expect:
        if not isinstance(entry, dict) or "preset" not in entry or "results" not in entry:
            raise UserError(f"{case_file.path}: each expect entry needs `preset` and `results`")
        if chosen and entry["preset"] != chosen[-1]:
            continue
        extra = [o for o in entry.get("overrides", []) if o.split("=", 1)[0] not in user_keys]
        runs.append(
            (entry["preset"], [f"correction={entry['preset']}"] + extra if not chosen else extra, entry["results"])
        )
    if not runs:
        raise UserError(f"{case_file.path}: no expect entry for correction={chosen[-1]}")
    return runs
