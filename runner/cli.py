"""The `is-study` command line. It parses, delegates and prints; torch, Hydra, pandas and
matplotlib are imported only inside the commands that need them, so `--help` and `list` are instant.

Every command takes Hydra override strings (`correction=seq-mask-tis correction.high=2`). Bad input
gives one line on stderr and exit code 2, never a traceback.

About 650 lines on purpose: one function per command, each a short parse, delegate, print; most of the
length is typer's declarations of each command's options and their help text, which belong beside it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

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


def _print_version(value: bool) -> None:
    if value:
        from runner import __version__

        typer.echo(f"is-study {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print is-study's version and exit."
    ),
) -> None:
    pass


OverridesArg = typer.Argument(
    None, help="Hydra overrides, e.g. correction=seq-mask-tis correction.high=2", show_default=False
)


def _overrides(values: list[str] | None) -> list[str]:
    return list(values or [])


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


# The options that name an external target, shared by `audit` and `case`.
TargetOpt = typer.Option(
    None,
    "--target",
    help="An external policy loss: module:attr or path/to/file.py:attr (a file is loaded without its package's __init__).",
)
TargetKwargsOpt = typer.Option(
    None,
    "--target-kwargs",
    help='JSON object: constructor kwargs of --target (extra kwargs of a function); {"_target_": ...} values are instantiated.',
)
StubOpt = typer.Option(
    None, "--stub", help="Modules to replace by stubs while loading (comma-separated or repeated), e.g. deepspeed,ray."
)
ConventionOpt = typer.Option(
    "openrlhf",
    "--convention",
    help="openrlhf | verl | trl | plain: the parameter names and return value of the target.",
)
ArgMapOpt = typer.Option(
    None,
    "--arg-map",
    help="ROLE=PARAM,... to rename single roles (lp, old, roll, adv, mask, weights); PARAM a name, a position, or - to leave it out.",
)
LossKeyOpt = typer.Option(
    None, "--loss-key", help="Where the loss is in what the target returns: a tuple index or a dict key."
)
CallKwargsOpt = typer.Option(
    None,
    "--call-kwargs",
    help='JSON object: forward-time kwargs (e.g. loss_agg_mode, config); {"_target_": ...} values are instantiated.',
)
WeightsFnOpt = typer.Option(
    None,
    "--weights-fn",
    help="module:fn or file.py:fn: the correction's coefficients from (old, roll, mask); fed to --target, or audited under our losses without one.",
)
WeightsKwargsOpt = typer.Option(None, "--weights-kwargs", help="JSON object: extra kwargs of --weights-fn.")


def _target_spec(**values):
    from runner.audit.external import TargetSpec

    return TargetSpec.of(**values)


# ----------------------------------------------------------------------------------------- list
@app.command(
    "list",
    help=(
        "List presets, losses and config groups.  [dim]e.g. is-study list[/dim]\n\n"
        "On a terminal: one table per group. Piped or redirected: one tab-separated line per item, what to type "
        "first (correction=tis, loss=ppo, case NAME), then for a preset its kind and band, then the description."
    ),
)
def list_command() -> None:
    from rich.markup import escape
    from rich.table import Table

    from runner import registry

    if not sys.stdout.isatty():  # for grep and cut: no tables, no wrapping

        def line(*fields: str) -> None:
            typer.echo("\t".join(" ".join(f.split()) for f in fields))

        for entry in registry.presets():
            line(
                f"correction={entry.name}",
                "faithful" if entry.faithful else "ours",
                entry.band or "-",
                entry.description,
            )
        for group in registry.GROUPS[1:]:
            for entry in registry.entries(group):
                line(f"case {entry.name}" if group == "cases" else f"{group}={entry.name}", entry.description)
        return
    console = _console()
    by_framework = registry.presets_by_framework()
    counts = ", ".join(f"{name} {len(group)}" for name, group in by_framework)
    table = Table(
        title=f"correction presets  (correction=NAME), by framework: {counts}", title_justify="left", show_lines=False
    )
    table.add_column("preset", style="bold", no_wrap=True)
    table.add_column("framework")
    table.add_column("band", no_wrap=True)
    table.add_column("what it computes")
    for name, group in by_framework:
        for i, entry in enumerate(group):
            label = f"{name} ({len(group)})" if i == 0 else ""
            table.add_row(
                entry.name, label, escape(entry.band), escape(entry.description), end_section=i == len(group) - 1
            )
    console.print(table)
    for group in registry.GROUPS[1:]:
        group_entries = registry.entries(group)
        if not group_entries:
            continue
        titles = {
            "cases": "shipped cases  (is-study case NAME)",
            "hydra/launcher": "sweep launchers  (is-study sweep --launcher NAME, or hydra/launcher=NAME)",
        }
        t = Table(title=titles.get(group, f"{group}  ({group}=NAME)"), title_justify="left")
        t.add_column("name", style="bold", no_wrap=True)
        t.add_column("description")
        for entry in group_entries:
            t.add_row(entry.name, escape(entry.description))
        console.print(t)


# ----------------------------------------------------------------------------------------- show
@app.command(help="Print the composed config.  [dim]e.g. is-study show correction=tis correction.high=2[/dim]")
def show(overrides: list[str] | None = OverridesArg) -> None:
    from runner.hydra_app import app as hydra_app

    cfg = hydra_app.compose(_overrides(overrides))
    typer.echo(hydra_app.to_yaml(cfg), nl=False)


# ----------------------------------------------------------------------------------------- run
@app.command(help="Run one study and write CSV to a run dir.  [dim]e.g. is-study run correction=seq-mask-tis[/dim]")
def run(
    overrides: list[str] | None = OverridesArg,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar and no summary."),
) -> None:
    from runner.hydra_app import app as hydra_app

    args = _overrides(overrides) + (["log.quiet=true"] if quiet else [])
    from runner.studies import validate_study

    summary = hydra_app.run(args, hydra_app.job, validate=validate_study)
    if isinstance(summary, dict) and summary.get("run_dir"):
        typer.echo(summary["run_dir"])


# ----------------------------------------------------------------------------------------- case
@app.command(
    help="Run a case file through a loss and correction, or replay an audit's counterexample on its target.  [dim]e.g. is-study case openrlhf-seq-mask-tis correction=seq-mask-tis[/dim]"
)
def case(
    file: str = typer.Argument(..., help="A case file (YAML/JSON) or a shipped case name (see `is-study list`)."),
    overrides: list[str] | None = OverridesArg,
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list, one object per case."),
    check: bool = typer.Option(
        False, "--check", help="Compare with the file's expect: list to 1e-5; exit 1 on a mismatch."
    ),
    target: str | None = typer.Option(
        None,
        "--target",
        help="Replay the cases on an external target (the audit's options below); a file an audit saved replays its preset or target, and its check (exit 1 while it fails), without this.",
    ),
    target_kwargs: str | None = TargetKwargsOpt,
    stub: list[str] | None = StubOpt,
    convention: str = ConventionOpt,
    arg_map: str | None = ArgMapOpt,
    loss_key: str | None = LossKeyOpt,
    call_kwargs: str | None = CallKwargsOpt,
    weights_fn: str | None = WeightsFnOpt,
    weights_kwargs: str | None = WeightsKwargsOpt,
    max_elements: int | None = typer.Option(
        None,
        "--max-elements",
        help="Refuse a file that expands to more elements, YAML aliases included (default 10,000,000).",
        show_default=False,
    ),
) -> None:
    from runner.audit.case_command import run_case

    code = run_case(
        file,
        _overrides(overrides),
        as_json=as_json,
        check=check,
        max_elements=max_elements,
        target_options=dict(
            target=target,
            target_kwargs=target_kwargs,
            stub=stub,
            convention=convention,
            arg_map=arg_map,
            loss_key=loss_key,
            call_kwargs=call_kwargs,
            weights_fn=weights_fn,
            weights_kwargs=weights_kwargs,
        ),
        console=_console(),
        err_console=_console(stderr=True),
    )
    if code:
        raise typer.Exit(code)


# ----------------------------------------------------------------------------------------- audit
@app.command(
    help=(
        "Check presets (or an external loss) against seven invariants; save shrunk counterexamples.  "
        "[dim]e.g. is-study audit correction=openrlhf-bc71bb1/seq-mask-tis[/dim]\n\n"
        "Invariants, under loss=ppo and loss=reinforce: 1 finite inputs give a finite loss and gradient; 2 a rejected "
        "unit gets exactly zero gradient; 3 clamped coefficients stay in their bounds; 4 values at mask=0 (even NaN/inf) "
        "change nothing; 5 on-policy inputs give coefficient 1 and the loss of `none`; 6 permuting the batch permutes "
        "the results; 7 the gradient matches finite differences. An all-masked batch is checked on its own (finite, or "
        "an --allow-raise refusal); each distinct exception is one finding with its file:line. Each finding is saved, "
        "shrunk, as OUT/NAME[.HASH].CHECK.yaml for `is-study case`. Exit code 1 when a preset that is not a faithful "
        "reproduction (or an external target) has a finding; faithful presets that fail reproduce upstream behaviour.\n\n"
        "External target ([bold]--target module:attr[/bold] or [bold]path/to/file.py:attr[/bold]): a class built as "
        "attr(**kwargs), or a function given the kwargs, called on [B, T] tensors under a convention: openrlhf (default) "
        "loss_fn(log_probs, old_log_probs, advantages, action_mask=..., rollout_log_probs=...) returning the loss or a "
        "tuple whose first item is the loss; verl (old_log_prob=, log_prob=, advantages=, response_mask=, "
        "rollout_is_weights=) returning (loss, metrics); trl (per_token_logps=, old_per_token_logps=, "
        "sampling_per_token_logps=, advantages=, completion_mask=); plain (log_probs=, old_log_probs=, "
        "rollout_log_probs=, advantages=, action_mask=). The current directory is importable. --weights-fn gives the "
        "coefficients separately (invariants 2 and 3 then read them; --band declares their bounds); "
        "--reference correction=PRESET compares with one of our presets on ordinary inputs.  "
        "[dim]e.g. is-study audit --target tests.helpers.external_loss_planted_bug:PlantedLoss "
        "--target-kwargs '{\"high\": 5.0}'[/dim]"
    )
)
def audit(
    overrides: list[str] | None = OverridesArg,
    as_json: bool = typer.Option(
        False, "--json", help="Print a JSON list, one object per row × check (and per exception)."
    ),
    out: Path = typer.Option(Path("audit-cases"), "--out", help="Directory for the counterexample case files."),
    thorough: bool = typer.Option(
        False, "--thorough", help="Longer property-based searches (more examples, bigger batches)."
    ),
    profile: str = typer.Option(
        "adversarial",
        "--profile",
        help="adversarial (any finite value, NaN/inf padding) | realistic (log-probs in [-100, 0], |lp - old| <= 20, left-aligned masks).",
    ),
    reference: str | None = typer.Option(
        None, "--reference", help="correction=PRESET: compare with one of our presets on ordinary inputs."
    ),
    target: str | None = TargetOpt,
    target_kwargs: str | None = TargetKwargsOpt,
    stub: list[str] | None = StubOpt,
    convention: str = ConventionOpt,
    arg_map: str | None = ArgMapOpt,
    loss_key: str | None = LossKeyOpt,
    call_kwargs: str | None = CallKwargsOpt,
    weights_fn: str | None = WeightsFnOpt,
    weights_kwargs: str | None = WeightsKwargsOpt,
    band: str | None = typer.Option(
        None,
        "--band",
        help="LOW,HIGH: the bounds of --weights-fn's kept coefficients (for invariant 3); either side may be empty.",
    ),
    allow_raise: list[str] | None = typer.Option(
        None,
        "--allow-raise",
        help="Exception types the target raises on purpose (documented refusals), e.g. ValueError.",
    ),
) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from runner.audit.command import exit_code, run_audit
    from runner.audit.table import render

    spec = _target_spec(
        target=target,
        target_kwargs=target_kwargs,
        stub=stub,
        convention=convention,
        arg_map=arg_map,
        loss_key=loss_key,
        call_kwargs=call_kwargs,
        weights_fn=weights_fn,
        weights_kwargs=weights_kwargs,
        band=band,
        allow_raise=allow_raise,
    )
    err = _console(stderr=True)
    progress = Progress(
        TextColumn("audit"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    )
    task = progress.add_task("", total=None)
    state = {"first": True}

    def on_step(description: str) -> None:
        if state["first"]:
            state["first"] = False
        else:
            progress.advance(task)
        progress.update(task, description=description)

    with progress:
        cells = run_audit(
            _overrides(overrides),
            out_dir=out,
            budget="thorough" if thorough else "default",
            profile=profile,
            target=spec,
            reference=reference,
            on_step=on_step,
            on_start=lambda total: progress.update(task, total=total),
        )
    if as_json:
        typer.echo(json.dumps([c.to_json() for c in cells], indent=1))
    else:
        render(cells, _console())
    if exit_code(cells):
        raise typer.Exit(1)


# ----------------------------------------------------------------------------------------- sweep
@app.command(
    help=(
        "Run a sweep: a Hydra multirun (BasicSweeper syntax), resumable, aggregated into sweep.csv.  "
        "[dim]e.g. is-study sweep correction=tis,icepop,seq-mask-tis correction.high=2,5,10 'seed=range(0,3)'[/dim]\n\n"
        "An experiment can define the sweep: [dim]is-study sweep experiment=bigram/threshold-tradeoff[/dim]. Jobs go to "
        "multirun/NAME/<job num>/ (--name) or a timestamped dir; at the end sweep.csv (every job's metrics.csv rows "
        "with one column per override key), sweep_summary.csv (one row per job) are written there. A failing job is "
        "listed and the exit code is 1; the other jobs still run. One sweep at a time per directory (a second one, or a "
        "--resume while it runs, is refused). Launchers: basic (default, one job at a time), joblib, submitit-local, "
        "submitit-slurm, ray (each needs its extra)."
    )
)
def sweep(
    overrides: list[str] | None = OverridesArg,
    name: str | None = typer.Option(None, "--name", help="Put the sweep in multirun/NAME (hydra.sweep.dir=... wins)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List the jobs' overrides and their count; run nothing."),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Rerun into the existing --name / hydra.sweep.dir, skipping jobs that hold DONE and whole files.",
    ),
    launcher: str | None = typer.Option(
        None, "--launcher", help="basic | joblib | submitit-local | submitit-slurm | ray (hydra/launcher=...)."
    ),
    jobs: int | None = typer.Option(
        None, "--jobs", help="Jobs in parallel (joblib n_jobs, SLURM array parallelism, ...)."
    ),
) -> None:
    from runner.sweep import command as sweeps
    from runner.sweep import report as sweep_report

    req = sweeps.Request(
        overrides=_overrides(overrides),
        name=name,
        resume=resume,
        dry_run=dry_run,
        launcher=launcher,
        jobs=jobs,
        argv=sys.argv[1:],
    )
    if dry_run:
        plan, done = sweeps.dry_run(req)
        for num, job in enumerate(plan.jobs):
            typer.echo(f"#{num} {' '.join(job)}" + ("  [done: skipped on --resume]" if num in done else ""))
        resumed = f", {len(done)} already done" if resume else ""
        typer.echo(f"{len(plan.jobs)} jobs{resumed} (dry run: nothing ran; {sweeps.dry_run_dir(req, plan)})")
        return
    try:
        result = sweeps.run(req, watch=sweep_report.ProgressBar, say=sweep_report.note)
    except KeyboardInterrupt as exc:
        if getattr(exc, "resume_hint", None):
            typer.echo(f"is-study: sweep interrupted; finish it with: {exc.resume_hint}", err=True)
        raise
    sweep_report.print_result(result, req, _console(stderr=True))
    typer.echo(str(result.sweep_dir))
    if not result.ok:
        raise typer.Exit(1)


# ----------------------------------------------------------------------------------------- aggregate
@app.command(
    help=(
        "Write sweep.csv and sweep_summary.csv for a sweep dir (also done at the end of every sweep), or for "
        "separate runs.  [dim]e.g. is-study aggregate multirun/tradeoff;  is-study aggregate runs/2026-12-01 "
        "runs/2026-12-02 --out tables/both[/dim]\n\n"
        "sweep.csv: every finished job's metrics.csv rows, prefixed by job and one column per override key, read "
        "from each job's .hydra/overrides.yaml. sweep_summary.csv: one row per job (status done / failed / "
        "incomplete / damaged, error, run_dir relative to the table, summary.json). sweep_probe.csv / "
        "sweep_events.csv / sweep_tokens.csv likewise for probe.csv / events.csv / tokens.csv. A job whose files "
        "are damaged (cut short, garbage appended) is named with the file and the reason, left out of the "
        "tables, and rerun by the sweep's command with --resume.\n\n"
        "Separate runs (runs/DATE/TIME of is-study run): give their dirs, or dirs above them; every run dir "
        "found is a job (numbered in path order) and the tables go into --out (default: the one directory given)."
    )
)
def aggregate(
    directories: list[Path] = typer.Argument(
        ..., help="A sweep dir (multirun/NAME), or run dirs or dirs holding them (runs/DATE).", show_default=False
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Where the tables of separate runs go (default: the one directory given).",
        show_default=False,
    ),
    table_format: str = typer.Option(
        "csv", "--format", help="csv | parquet: each table also as Parquet beside its CSV (sweep.parquet, ...)."
    ),
) -> None:
    from runner.sweep.aggregate import STATUSES, aggregate_paths
    from runner.sweep.report import aggregate_hints, problem_lines
    from runner.tracking import check_format

    parquet = check_format(table_format, "--format") == "parquet"  # pyarrow missing: refused before any work
    report, sweep = aggregate_paths(directories, out)
    err = _console(stderr=True)
    counts = {s: len(report.by_status(s)) for s in STATUSES}
    where = directories[0] if sweep else " ".join(map(str, directories))
    err.print(
        f"[bold]aggregate[/bold] {where}: {len(report.jobs)} jobs ("
        + ", ".join(f"{n} {s}" for s, n in counts.items())
        + ")",
        soft_wrap=True,
    )
    for line in problem_lines(report) + (aggregate_hints(report) if sweep else []):
        err.print(line, soft_wrap=True)
    for file, rows in report.written.items():
        typer.echo(f"{report.sweep_dir / file}\t{rows} rows")
        if parquet:
            from runner.tracking.parquet import csv_to_parquet

            typer.echo(f"{csv_to_parquet(report.sweep_dir / file)}\t{rows} rows")
    if report.by_status("damaged"):
        raise typer.Exit(1)  # the tables are written, without the damaged jobs: a problem was found


# ----------------------------------------------------------------------------------------- plot
@app.command(
    help=(
        "Draw figures for a run, sweep or probe dir: PNG (150 dpi) and PDF.  "
        "[dim]e.g. is-study plot multirun/ladder --kind stability --style paper[/dim]\n\n"
        "Kinds: training (objective and reward vs step), grad-norm (log scale, spikes marked), stability (NaN/inf and "
        "collapse rate vs staleness; a sweep), presets (probe bias / variance / relative MSE per preset, one band each: "
        "the default probe), threshold (the same vs the upper threshold, several bands), mismatch (tokens.csv: "
        "log-ratios, p_rollout vs p_train, |Δp| by p), masking (masked / clamped fraction and ESS vs step), "
        "mismatch-over-training (kl_k3, χ², max|Δp| and entropy vs step, a line per precision), survival (seeds not yet "
        "collapsed vs step, with ESS and grad norm aligned on each collapse), bias-split (a probe sweep over "
        "rollout.seq_len: direction and size of the bias vs T), length-heatmap (a train sweep over rollout.seq_len × "
        "correction: final J and collapse rate), threshold-training (a train sweep over the band: final J, peak-to-final "
        "drop, masked fraction, ESS and NaN/inf events vs [low, high], a line per correction). By default every kind the "
        "data allows, and not one that would only show flat lines (plot says which it skipped and why); files are "
        "KIND.png and KIND.pdf in --out."
    )
)
def plot(
    path: Path = typer.Argument(
        ..., help="A run dir, a sweep dir (or its sweep.csv), or a probe dir.", show_default=False
    ),
    kind: list[str] | None = typer.Option(
        None, "--kind", "-k", help="Figure kind(s), repeated or comma-separated; default: all that apply."
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Output directory (default: PATH/figures; --style paper: PATH/figures/paper)."
    ),
    style: str = typer.Option(
        "default", "--style", help="default | paper (3.3 or 7 in wide, at most 3 rows, fonts for LaTeX)."
    ),
) -> None:
    from analysis import figures, load_dataset
    from analysis import style as styles

    styles.rc(style)  # an unknown style fails before any reading
    kinds = [k.strip() for item in (kind or []) for k in item.split(",") if k.strip()]
    from analysis.replay import is_replay_dir

    if is_replay_dir(path):  # `is-study replay`'s dir: its own figure kinds (analysis/figures/replay.py)
        from analysis.figures import replay as replay_figures

        written, skipped = replay_figures.render(path, out, kinds or None, style)
        for name, reason in skipped.items():
            _console(stderr=True).print(f"[dim]skipped {name}: {reason}[/dim]")
        for files in written.values():
            for file in files:
                typer.echo(str(file))
        return
    ds = load_dataset(path)
    written, skipped = figures.render(
        ds, out if out is not None else figures.default_dir(ds, style), kinds or None, style
    )
    err = _console(stderr=True)
    for name, reason in skipped.items():
        err.print(f"[dim]skipped {name}: {reason}[/dim]")
    for files in written.values():
        for file in files:
            typer.echo(str(file))
    # a run logged with log.trackers=[tensorboard] gets its figures there too, as images
    from runner.tracking.tensorboard import add_figures_to_run

    pngs = [Path(f) for files in written.values() for f in files if Path(f).suffix == ".png"]
    if path.is_dir() and add_figures_to_run(path, pngs):
        err.print(f"[dim]{len(pngs)} figures added to {path / 'tensorboard'}[/dim]")


# ----------------------------------------------------------------------------------------- report
@app.command(
    help=(
        "Write a Markdown report for an issue or a lab notebook.  [dim]e.g. is-study report multirun/ladder[/dim]\n\n"
        "For a run, sweep or probe dir: the verdict per correction, the command that produced it, the config's "
        "differences from the defaults, a results table and the figures (drawn into PATH/figures if missing); "
        "OVERRIDES filter a sweep's jobs (correction=tis mismatch.staleness=0,8). For a case file: the repro card, "
        "inputs, expected vs actual and the invariant that broke, for correction=PRESET or else for every preset of the "
        "file's expect: list.  "
        "[dim]e.g. is-study report openrlhf-seq-mask-tis correction=openrlhf-bc71bb1/seq-mask-tis[/dim]"
    )
)
def report(
    path: str = typer.Argument(
        ..., help="A run / sweep / probe dir, a sweep.csv, a case file or a shipped case name.", show_default=False
    ),
    overrides: list[str] | None = typer.Argument(
        None, help="Case file: Hydra overrides (correction=...). Dir: filters key=value[,value].", show_default=False
    ),
    out: str | None = typer.Option(
        None,
        "--out",
        "-o",
        help="Report file; '-' = stdout. Default: PATH/report.md (a case file: runs/reports/NAME-report.md).",
    ),
) -> None:
    from analysis import reports

    overrides = _overrides(overrides)
    from analysis.replay import is_replay_dir

    if is_replay_dir(Path(path)):  # `is-study replay`'s dir (analysis/reports/replay.py)
        from analysis.reports import replay as replay_report

        dest = reports.destination(out, Path(path) / "report.md")
        reports.write(replay_report.build(Path(path)), dest)
        if dest is not None:
            typer.echo(str(dest))
        return
    case_path = reports.case_file(path)
    # What the reports need from the config and the algebra is computed here, in runner, and handed
    # to analysis as plain data; analysis only formats it.
    if case_path is None:
        from analysis.reports import dataset
        from runner.hydra_app import app as hydra_app

        ds = dataset.load(path, overrides)
        try:
            defaults = hydra_app.default_configs(dataset.studies(ds))
        except UserError as exc:  # the report says so in its config section instead
            defaults = str(exc)
        text, dest = dataset.build(ds, overrides, out, defaults)
    else:
        from analysis.reports import case_card
        from runner.audit.case_card import build_cards

        dest = reports.destination(out, case_card.case_report_path(case_path))
        text = case_card.case_report(build_cards(case_path, overrides), overrides, shown=path)
    reports.write(text, dest)
    if dest is not None:
        typer.echo(str(dest))


# ----------------------------------------------------------------------------------------- replay
@app.command(
    help=(
        "Run a framework's dumped training batches through every correction preset: what each would have "
        "masked, clamped and weighted, step by step.  [dim]e.g. is-study replay dump_dir/train_data --format slime[/dim]\n\n"
        "Formats: slime, nemo-rl, skyrl, prime-rl, npz, parquet, jsonl, tokens-csv (default: by file name). Writes replay.csv "
        "(a row per step × preset), replay_summary.csv and tokens.csv to --out (default runs/DATE/TIME-replay-XXXXXX). "
        "Pickle and .pt files are loaded without running code (types other than tensors, arrays and containers are "
        "refused) unless --trust. docs/replay.md lists the fields each reader reads."
    )
)
def replay(
    path: Path = typer.Argument(..., help="A dump file or a directory of steps.", show_default=False),
    overrides: list[str] | None = typer.Argument(
        None,
        help="correction=PRESET[,PRESET...] (default: every preset) and loss=NAME (default ppo).",
        show_default=False,
    ),
    fmt: str | None = typer.Option(
        None, "--format", "-f", help="slime | nemo-rl | skyrl | prime-rl | npz | parquet | jsonl | tokens-csv."
    ),
    every: bool = typer.Option(False, "--all", help="Every preset (the default when none is named)."),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="The replay dir (default: a new runs/DATE/TIME-replay-XXXXXX)."
    ),
    trust: bool = typer.Option(
        False,
        "--trust",
        help="Load pickle / .pt files with plain pickle: runs whatever code they hold. Only for your own files.",
    ),
    max_bytes: int | None = typer.Option(
        None,
        "--max-bytes",
        help="Refuse a file larger than this (or expanding to more), default 4 GiB.",
        show_default=False,
    ),
    tokens: bool = typer.Option(True, "--tokens/--no-tokens", help="Write tokens.csv (one row per logged token)."),
    minibatches: int | None = typer.Option(
        None,
        "--minibatches",
        help="Split each step into N contiguous mini-batches of sequences, a replay.csv row each (default: an "
        "is-study run's train.updates_per_step, else 1).",
        show_default=False,
    ),
) -> None:
    from runner.replay import command as replays
    from runner.replay.limits import DEFAULT_MAX_BYTES, Limits

    if trust:
        typer.echo("is-study: --trust: pickle and .pt files are loaded unrestricted; they can run any code", err=True)
    if max_bytes is not None and max_bytes <= 0:
        raise UserError(f"--max-bytes must be positive, got {max_bytes}")
    req = replays.Request(
        path=path,
        fmt=fmt,
        overrides=_overrides(overrides),
        every=every,
        out=out,
        limits=Limits(max_bytes=max_bytes or DEFAULT_MAX_BYTES, trust=trust),
        tokens=tokens,
        minibatches=minibatches,
    )
    typer.echo(str(replays.run(req)))


# ----------------------------------------------------------------------------------------- claims
@app.command(
    help=(
        "Check the literature's claims on their experiments' output: a verdict line and a figure per claim.  "
        "[dim]e.g. is-study claims --all multirun/figures --out figures --worlds 'bigram mlp'[/dim]\n\n"
        "DIR is one experiment's sweep dir (with --claim NAME, the experiment's name; any world), or with --all a "
        "folder holding DIR/WORLD/NAME for each world in --worlds (scripts/figures.sh runs them). Prints one line "
        "per claim: [WORLD/]NAME: holds | does not hold | inconclusive | untestable here — the numbers. With "
        "--out, NAME.png and NAME.pdf go there; with --all into OUT/WORLD/ (OUT/SIZE/WORLD/ with --size full, regime or regime-full) with that world's "
        "verdicts.json, and OUT/VERDICTS.md, the claim × world table of every verdicts.json under OUT. The rules "
        "are in analysis/claims/."
    )
)
def claims(
    directory: Path = typer.Argument(
        ..., metavar="DIR", help="An experiment's output dir, or with --all the folder of them.", show_default=False
    ),
    claim: str | None = typer.Option(None, "--claim", help="The claim (= the experiment's name) DIR holds."),
    every: bool = typer.Option(False, "--all", help="Every claim, from DIR/WORLD/NAME; writes OUT/VERDICTS.md."),
    only: str = typer.Option("", "--only", help="With --all: space-separated claim names (default: all)."),
    worlds: str = typer.Option(
        "", "--worlds", help="With --all: space-separated worlds (default: bigram mlp transformer)."
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Write NAME.png and NAME.pdf here (with --all: OUT/WORLD/, and VERDICTS.md)."
    ),
    style: str = typer.Option("default", "--style", help="default | paper"),
    size: str = typer.Option(
        "default",
        "--size",
        help="The size the runs were (default | full | regime | regime-full: the field regime): names the column "
        "and the folder.",
    ),
) -> None:
    from analysis import style as styles
    from analysis.claims import verdicts

    styles.rc(style)  # an unknown style fails before any reading
    names = verdicts.chosen(claim, every, only)
    size = verdicts.size_checked(size)
    if not every:
        for name, verdict in verdicts.check(directory, names, False, out, style):
            typer.echo(verdicts.line(name, verdict))
        return
    for text in verdicts.check_all(directory, names, verdicts.chosen_worlds(worlds), out, style, size):
        typer.echo(text)


# ----------------------------------------------------------------------------------------- main
def main() -> None:
    try:
        code = app(standalone_mode=False)
    except UserError as exc:
        typer.echo(f"is-study: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        typer.echo("is-study: interrupted", err=True)
        sys.exit(130)
    except OSError as exc:
        where = f": {exc.filename}" if getattr(exc, "filename", None) else ""
        typer.echo(f"is-study: error: {exc.strerror or exc}{where}", err=True)
        sys.exit(2)
    except Exception as exc:
        # Click's usage errors (a missing argument, an unknown option or command), whether from
        # click itself or the copy newer Typer versions vendor: duck-typed, so either works.
        if hasattr(exc, "exit_code") and hasattr(exc, "format_message"):
            typer.echo(f"is-study: error: {exc.format_message()} (see is-study --help)", err=True)
            sys.exit(exc.exit_code)
        if type(exc).__name__ == "Abort":
            typer.echo("is-study: interrupted", err=True)
            sys.exit(130)
        raise
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
