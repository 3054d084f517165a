"""The `is-study` command line. It parses, delegates and prints; torch, Hydra, pandas and
matplotlib are imported only inside the commands that need them, so `--help` and `list` are instant.

Every command takes Hydra override strings (`correction=seq-mask-tis correction.high=2`). Bad input
gives one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from runner.errors import UserError

app = typer.Typer(
    name="is-study",
    help="Experiment runner for off-policy importance-sampling corrections (TIS, IcePop, seq-mask-tis, ...).",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

OverridesArg = typer.Argument(None, help="Hydra overrides, e.g. correction=seq-mask-tis correction.high=2", show_default=False)


def _overrides(values: Optional[List[str]]) -> list[str]:
    return list(values or [])


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


# ----------------------------------------------------------------------------------------- list
@app.command("list", help="List presets, losses and config groups.  [dim]e.g. is-study list[/dim]")
def list_command() -> None:
    from rich.markup import escape
    from rich.table import Table

    from runner import registry

    console = _console()
    table = Table(title="correction presets  (correction=NAME)", title_justify="left", show_lines=False)
    table.add_column("preset", style="bold", no_wrap=True)
    table.add_column("kind")
    table.add_column("band", no_wrap=True)
    table.add_column("what it computes")
    for entry in registry.presets():
        table.add_row(entry.name, "faithful" if entry.faithful else "ours", escape(entry.band), escape(entry.description))
    console.print(table)
    for group in registry.GROUPS[1:]:
        group_entries = registry.entries(group)
        if not group_entries:
            continue
        t = Table(title=f"{group}  ({group}=NAME)" if group != "cases" else "shipped cases  (is-study case NAME)",
                  title_justify="left")
        t.add_column("name", style="bold", no_wrap=True)
        t.add_column("description")
        for entry in group_entries:
            t.add_row(entry.name, escape(entry.description))
        console.print(t)


# ----------------------------------------------------------------------------------------- show
@app.command(help="Print the composed config.  [dim]e.g. is-study show correction=tis correction.high=2[/dim]")
def show(overrides: Optional[List[str]] = OverridesArg) -> None:
    from runner import hydra_app

    cfg = hydra_app.compose(_overrides(overrides))
    typer.echo(hydra_app.to_yaml(cfg), nl=False)


# ----------------------------------------------------------------------------------------- run
@app.command(help="Run one study and write CSV to a run dir.  [dim]e.g. is-study run correction=seq-mask-tis[/dim]")
def run(
    overrides: Optional[List[str]] = OverridesArg,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar and no summary."),
) -> None:
    from runner import hydra_app

    args = _overrides(overrides) + (["log.quiet=true"] if quiet else [])
    summary = hydra_app.run(args, hydra_app.job)
    if isinstance(summary, dict) and summary.get("run_dir"):
        typer.echo(summary["run_dir"])


# ----------------------------------------------------------------------------------------- case
def _resolve_case_path(file: str) -> Path:
    from runner import registry

    path = Path(file)
    if path.exists():
        return path
    shipped = registry.shipped_case(file)
    if shipped is not None:
        return shipped
    raise UserError(f"case file not found: {file} (shipped cases: {', '.join(registry.group_options('cases'))})")


def _print_case_table(preset: str, results: list[dict]) -> None:
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
        table.add_row(escape(r["name"]), fmt(r["loss"]), fmt_matrix(r["grad"]), fmt_matrix(r["weights"]),
                      "[green]yes[/green]" if r["finite"] else "[red]NO[/red]",
                      fmt(m.get("ess")), fmt(m.get("token_masked_fraction")))
    _console().print(table)


def _override_keys(overrides: list[str]) -> set[str]:
    return {o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o}


@app.command(help="Run a case file through a loss and correction.  [dim]e.g. is-study case openrlhf-seq-mask-tis correction=seq-mask-tis[/dim]")
def case(
    file: str = typer.Argument(..., help="A case file (YAML/JSON) or a shipped case name (see `is-study list`)."),
    overrides: Optional[List[str]] = OverridesArg,
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list, one object per case."),
    check: bool = typer.Option(False, "--check", help="Compare with the file's expect: list to 1e-5; exit 1 on a mismatch."),
) -> None:
    from runner import hydra_app
    from runner.cases import load_case_file

    overrides = _overrides(overrides)
    case_file = load_case_file(_resolve_case_path(file))
    runs = _case_runs(case_file, overrides, check)
    failures: list[str] = []
    printed: list[dict] = []
    verdicts: list[tuple[str, str, int]] = []
    from runner.corrections import Correction
    from runner.losses import LossSpec
    from runner.studies.case import compare, evaluate

    for preset, extra, expected in runs:
        cfg = hydra_app.compose(extra + overrides)
        corr = Correction.from_config(hydra_app.to_container(cfg.correction))
        spec = LossSpec.from_config(hydra_app.to_container(cfg.loss))
        results = [evaluate(c, spec, corr) for c in case_file.cases]
        if expected is not None:
            mismatches = compare(results, expected)
            failures.extend(f"{corr.name}: {m}" for m in mismatches)
            verdicts.append((corr.name, " ".join(extra[1:] if extra[:1] == [f"correction={preset}"] else extra),
                             len(mismatches)))
        if as_json:
            printed.extend({"preset": corr.name, **r} if len(runs) > 1 else r for r in results)
        elif not check or len(runs) == 1:
            _print_case_table(corr.name, results)
    if as_json:
        typer.echo(json.dumps(printed, indent=1))
    if check and not as_json:
        from rich.table import Table

        table = Table(title=f"{case_file.path.name}: expected vs actual (tolerance 1e-5)", title_justify="left")
        for col in ("preset", "overrides", "cases", "verdict"):
            table.add_column(col)
        for name, extra_args, bad in verdicts:
            table.add_row(name, extra_args, str(len(case_file.cases)),
                          "[green]match[/green]" if not bad else f"[red]{bad} mismatch(es)[/red]")
        _console().print(table)
    if check:
        if failures:
            for line in failures:
                typer.echo(f"MISMATCH {line}", err=True)
            raise typer.Exit(1)


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
        runs.append((entry["preset"], [f"correction={entry['preset']}"] + extra if not chosen else extra, entry["results"]))
    if not runs:
        raise UserError(f"{case_file.path}: no expect entry for correction={chosen[-1]}")
    return runs


# ----------------------------------------------------------------------------------------- main
def main() -> None:
    import click

    try:
        code = app(standalone_mode=False)
    except UserError as exc:
        typer.echo(f"is-study: error: {exc}", err=True)
        sys.exit(2)
    except click.exceptions.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt):
        typer.echo("is-study: interrupted", err=True)
        sys.exit(130)
    except OSError as exc:
        where = f": {exc.filename}" if getattr(exc, "filename", None) else ""
        typer.echo(f"is-study: error: {exc.strerror or exc}{where}", err=True)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
