"""The audit's table (rows × checks) and, below it, one line per finding and one per note."""

from __future__ import annotations

from runner.audit.groups import ALL_MASKED, RAISES, REFERENCE, UPSTREAM, Cell


def _label(c: Cell) -> str:
    from runner.audit.invariants import INVARIANTS

    return f"{c.invariant} {INVARIANTS[c.invariant].short}" if isinstance(c.invariant, int) else str(c.invariant)


def render(cells: list[Cell], console) -> None:
    """The table (rows × checks), then one line per finding and one per note."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    from runner.audit.invariants import INVARIANTS

    numbers = sorted({c.invariant for c in cells if isinstance(c.invariant, int)})
    extra = [k for k in (ALL_MASKED, REFERENCE) if any(c.invariant == k for c in cells)]
    heads = {ALL_MASKED: "empty", REFERENCE: "ref", RAISES: "raises"}
    rows: dict[str, list[Cell]] = {}
    for c in cells:
        rows.setdefault(c.preset, []).append(c)
    upstream_fails = any(c.faithful and c.finding for c in cells)
    need = (
        max((len(p) for p in rows), default=6)
        + 8
        + 4 * len(numbers)
        + 7 * len(extra)
        + 8
        + (len(UPSTREAM) if upstream_fails else 7)
        + 2 * (len(numbers) + len(extra) + 4)
    )
    wide = console.width >= need
    if not wide:  # one letter each, spelled out in the legend
        heads = {ALL_MASKED: "E", REFERENCE: "R", RAISES: "X"}
    meaning = {ALL_MASKED: "all-masked batch", REFERENCE: "matches the reference preset", RAISES: "distinct exceptions"}
    legend = "  ".join(
        [f"{n} {INVARIANTS[n].short}" for n in numbers] + [f"{heads[k]}: {meaning[k]}" for k in (*extra, RAISES)]
    )
    if not wide and upstream_fails:
        legend += f"\nknown: a faithful preset that {UPSTREAM}"
    table = Table(
        title="is-study audit  (preset × invariant)",
        title_justify="left",
        caption=legend,
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        collapse_padding=not wide,
        pad_edge=wide,
        padding=(0, 1) if wide else 0,
    )  # SIMPLE_HEAD already puts a space between columns
    table.add_column("preset", style="bold", no_wrap=True, max_width=None if wide else 24)
    if wide:
        table.add_column("kind")
    for n in [*numbers, *extra]:
        table.add_column(str(n) if isinstance(n, int) else heads[n], justify="center", no_wrap=True, min_width=4)
    table.add_column(heads[RAISES], justify="center", no_wrap=True)
    table.add_column("verdict", no_wrap=not wide)
    for preset, row in rows.items():
        faithful = row[0].faithful
        by_check = {c.invariant: c for c in row if c.invariant != RAISES}
        texts = []
        for n in [*numbers, *extra]:
            c = by_check.get(n)
            if c is None:
                texts.append("")
            elif c.status == "pass":
                texts.append("[green]pass[/green]")
            elif c.status == "n/a":
                texts.append("[dim]n/a[/dim]")
            elif c.status == "raise":
                texts.append("[yellow]raise[/yellow]" if faithful else "[bold red]raise[/bold red]")
            else:
                texts.append("[yellow]FAIL[/yellow]" if faithful else "[bold red]FAIL[/bold red]")
        raised = sum(c.invariant == RAISES and c.finding for c in row)
        texts.append(("[yellow]" if faithful else "[bold red]") + f"{raised}[/]" if raised else "[green]0[/green]")
        failed = any(c.finding for c in row)
        upstream = UPSTREAM if wide else "known"
        verdict = (
            (f"[yellow]{upstream}[/yellow]" if faithful else "[bold red]BUG[/bold red]")
            if failed
            else "[green]ok[/green]"
        )
        kind = "faithful" if faithful else "external" if ":" in preset else "ours"
        table.add_row(escape(preset), *([kind] if wide else []), *texts, verdict)
    console.print(table)
    failures = [c for c in cells if c.finding]
    if failures:
        console.print("findings (each shrunk and saved; the file's header says how to reproduce it):")
        for c in failures:
            loss = f" loss={c.loss}" if c.loss else ""
            tag = f"[yellow]({UPSTREAM})[/yellow]" if c.faithful else "[bold red](bug)[/bold red]"
            console.print(
                f"  {escape(c.preset)} · {escape(_label(c))}{loss}: {escape(c.detail or '')} "
                f"{escape(f'[{c.profile} inputs]')} {tag} → {escape(c.counterexample or '')}",
                soft_wrap=True,
            )
    notes = [c for c in cells if c.note and not c.finding]
    if notes:
        console.print("notes (not findings):")
        for c in notes:
            console.print(f"  {escape(c.preset)} · {escape(_label(c))}: {escape(c.note or '')}", soft_wrap=True)
    ours = sorted({c.preset for c in failures if not c.faithful})
    if ours:
        console.print(
            f"[bold red]{len(ours)} preset(s) or target(s) that are not faithful reproductions fail: "
            f"{escape(', '.join(ours))}[/bold red]",
            soft_wrap=True,
        )
    elif any(not c.faithful for c in cells):
        console.print("[green]no bug: every preset of ours (or target) passes every check that applies[/green]")
