"""`is-study audit`: check presets (or an external loss) against the seven invariants of
runner/audit/invariants.py and save a shrunk counterexample for every failure.

For each preset × invariant × loss (ppo, then reinforce; the first failing loss wins):
  1. the hand-written adversarial cases (runner/audit/generators.py), in order;
  2. otherwise a derandomized hypothesis search (`hypothesis.find`), which shrinks what it finds;
  3. a failure is shrunk once more (greedy rows/columns) and written with
     `runner.cases.write_case_file` to OUT/<preset>.inv<N>.yaml, with the command that reproduces it
     in the header (`--check` where the file carries the expected numbers: invariants 4, 5, 6).

A preset × invariant is "fail" when any loss fails, "n/a" when it applies under no loss, and "pass"
otherwise. Faithful presets are expected to fail what released code fails; only a failure of one of
our own presets (or of an external target) makes the exit code 1.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from runner.errors import UserError

DEFAULT_LOSSES = ("ppo", "reinforce")
UPSTREAM = "reproduces upstream behaviour"


@dataclass
class Cell:
    """One preset × invariant."""

    preset: str
    invariant: int
    status: str  # pass | fail | n/a
    faithful: bool
    counterexample: str | None = None
    loss: str | None = None  # the loss under which it failed (None for an external target)
    detail: str | None = None  # the violation, or why the invariant is n/a
    found_by: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"preset": self.preset, "invariant": self.invariant, "status": self.status,
                "faithful": self.faithful, "counterexample": self.counterexample}


@dataclass
class Group:
    """The subjects (one per loss) that make up one row of the table."""

    name: str
    faithful: bool
    subjects: list


# --------------------------------------------------------------------------------- subjects
def _split_overrides(overrides: Sequence[str]) -> tuple[str | None, str | None, list[str]]:
    preset = loss = None
    rest = []
    for o in overrides:
        key, _, value = o.partition("=")
        if key == "correction":
            preset = value
        elif key == "loss":
            loss = value
        else:
            rest.append(o)
    return preset, loss, rest


def preset_groups(overrides: Sequence[str]) -> list[Group]:
    from runner import registry
    from runner.hydra_app import app as hydra_app
    from runner.audit.subjects import PresetSubject
    from runner.corrections import Correction
    from runner.losses import LossSpec

    preset, loss, rest = _split_overrides(overrides)
    names = [preset] if preset else [e.name for e in registry.presets()]
    losses = [loss] if loss else list(DEFAULT_LOSSES)
    # The loss groups do not depend on the preset: one compose per loss, one per preset.
    specs = [LossSpec.from_config(hydra_app.to_container(hydra_app.compose([f"loss={loss_name}", *rest]).loss))
             for loss_name in losses]
    groups = []
    for name in names:
        cfg = hydra_app.compose([f"correction={name}", *rest])
        corr = Correction.from_config(hydra_app.to_container(cfg.correction))
        subjects = [PresetSubject(corr, spec, rest) for spec in specs]
        groups.append(Group(corr.name, corr.faithful, subjects))
    return groups


# --------------------------------------------------------------------------------- search
@functools.lru_cache(maxsize=1)
def _hand_cases() -> tuple:
    from runner.audit.generators import hand_cases

    return tuple(hand_cases())


@functools.lru_cache(maxsize=1)
def _padding_cases() -> tuple:
    from runner.audit.generators import padding_variants

    return tuple(padding_variants(list(_hand_cases())))


def hand_batches(n: int, subject) -> list:
    if n in (1, 2, 3):
        return list(_hand_cases())
    if n == 4:
        return list(_padding_cases())
    if n == 5:
        first = [subject.calibration_batch()] if subject.kind == "external" else []
        return first + [b.on_policy() for b in _hand_cases()]
    if n == 6:
        return [b for b in _hand_cases() if b.shape[0] >= 2]
    return []


def search(n: int, subject, profile, hand: bool = True):
    """(shrunk batch, violation, how it was found) or None."""
    from runner.audit.generators import hypothesis_settings, pool, shrink, strategy
    from runner.audit.invariants import INVARIANTS, violation

    inv = INVARIANTS[n]

    def fails(batch) -> bool:
        return violation(inv, subject, batch) is not None

    found = how = None
    if hand:
        for batch in hand_batches(n, subject):
            if fails(batch):
                found, how = batch, f"hand-written case {batch.name!r}"
                break
    if found is None:
        from hypothesis import find
        from hypothesis.errors import NoSuchExample

        found = next((b for b in pool(inv.generator, profile) if fails(b)), None)
        if found is None:
            return None
        how = f"hypothesis search ({profile.name} profile)"
        try:
            found = find(strategy(inv.generator, profile), fails,
                         settings=hypothesis_settings(profile.examples[inv.generator]))
            how += ", shrunk by hypothesis"
        except NoSuchExample:  # the replay missed it; the greedy shrink below still applies
            pass
    found = shrink(found, fails)
    return found, violation(inv, subject, found), how


# --------------------------------------------------------------------------------- case files
def _slug(name: str) -> str:
    return name.replace("/", "--").replace(":", "--")


def case_path(out_dir: Path, preset: str, n: int) -> Path:
    return Path(out_dir) / f"{_slug(preset)}.inv{n}.yaml"


def _results(case, subject, corr=None) -> dict[str, Any]:
    from runner.studies.case import evaluate

    r = evaluate(case, subject.spec, corr or subject.corr)
    return {"loss": r["loss"], "grad": r["grad"]}


def save_counterexample(path: Path, n: int, subject, batch, detail: str, how: str, kwargs_json: str | None) -> Path:
    from runner.audit.invariants import INVARIANTS, permutations
    from runner.cases import write_case_file
    from runner.corrections import Correction

    inv = INVARIANTS[n]
    B, T = batch.shape
    header = [f"is-study audit: {subject.name} fails invariant {n} ({inv.text})"]
    expect = None
    if n == 4:
        cases = [batch.clean_padding().to_case("clean-padding"), batch.to_case("garbage-padding")]
    elif n == 5:
        cases = [batch.on_policy().to_case("on-policy")]
    elif n == 6:
        perm = permutations(B)[0]
        cases = [batch.to_case("original"), batch.rows(perm).to_case(f"rows-permuted-{'-'.join(map(str, perm))}")]
    else:
        cases = [batch.to_case(f"invariant-{n}-counterexample")]
    if subject.kind == "preset":
        args = [f"correction={subject.name}", f"loss={subject.loss_name}", *subject.overrides]
        header.append(f"loss={subject.loss_name}: {detail}")
        if n == 4:
            clean = _results(cases[0], subject)
            expect = [clean, dict(clean)]
        elif n == 5:
            expect = [_results(cases[0], subject, Correction(name="none"))]
        elif n == 6:
            first = _results(cases[0], subject)
            expect = [first, {"loss": first["loss"], "grad": [first["grad"][i] for i in perm]}]
        header.append(f"found by {how}; B={B}, T={T}")
        if n in (6, 7):
            header.append("checked in float64; `is-study case` evaluates in float32")
        if expect is not None:
            overrides = args[1:]
            what = {4: "what clean (zero) padding gives", 5: "what `none` gives",
                    6: "the original's results, permuted"}[n]
            header.append(f"expect: holds {what}, so --check shows the mismatch")
            expect = [{"preset": subject.name, "overrides": overrides, "results": expect}]
            header.append(f"reproduce: is-study case {path} --check")
        header.append(f"reproduce: is-study case {path} {' '.join(args)}")
    else:
        header.append(detail)
        header.append(f"found by {how}; B={B}, T={T}")
        kw = f", {kwargs_json!r}" if kwargs_json else ""
        header.append("reproduce (Python): from runner.audit.external import resolve; from runner.audit.subjects "
                      f"import Batch; from runner.cases import load_case_file; s = resolve({subject.name!r}{kw}); "
                      f"print([s(Batch.from_case(c)).loss for c in load_case_file({str(path)!r}).cases])")
    return write_case_file(path, cases, header="\n".join(header), expect=expect)


# --------------------------------------------------------------------------------- the audit
def audit_groups(groups: list[Group], profile, out_dir: Path, invariants: Sequence[int] = tuple(range(1, 8)),
                 hand: bool = True, kwargs_json: str | None = None,
                 on_step: Callable[[str], None] | None = None) -> list[Cell]:
    from runner.audit.invariants import INVARIANTS

    cells: list[Cell] = []
    for group in groups:
        for n in invariants:
            inv = INVARIANTS[n]
            if on_step:
                on_step(f"{group.name} · {n} {inv.short}")
            reasons, applied, failure = [], False, None
            for subject in group.subjects:
                reason = inv.applies(subject)
                if reason:
                    reasons.append(reason)
                    continue
                applied = True
                found = search(n, subject, profile, hand)
                if found is not None:
                    failure = (subject, *found)
                    break
            path = case_path(out_dir, group.name, n)
            if failure is not None:
                subject, batch, detail, how = failure
                save_counterexample(path, n, subject, batch, detail, how, kwargs_json)
                cells.append(Cell(group.name, n, "fail", group.faithful, str(path), subject.loss_name, detail, how))
                continue
            if path.is_file():
                path.unlink()  # a counterexample from an earlier run that no longer fails
            if applied:
                cells.append(Cell(group.name, n, "pass", group.faithful))
            else:
                cells.append(Cell(group.name, n, "n/a", group.faithful, detail=reasons[0] if reasons else None))
    return cells


def run_audit(overrides: Sequence[str] = (), out_dir: str | Path = "audit-cases", profile: str = "default",
              target: str | None = None, target_kwargs: str | None = None, invariants: Sequence[int] | None = None,
              hand: bool = True, on_step: Callable[[str], None] | None = None,
              on_start: Callable[[int], None] | None = None) -> list[Cell]:
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        raise UserError("is-study audit needs hypothesis: pip install hypothesis") from None
    from runner.audit.generators import PROFILES

    if profile not in PROFILES:
        raise UserError(f"audit profile {profile!r} is not one of: {', '.join(PROFILES)}")
    invariants = tuple(invariants or range(1, 8))
    if target_kwargs is not None and target is None:
        raise UserError("--target-kwargs needs --target")
    if target is not None:
        if overrides:
            raise UserError(f"--target audits an external callable; overrides ({' '.join(overrides)}) do not apply")
        from runner.audit.external import resolve

        groups = [Group(target, False, [resolve(target, target_kwargs)])]
    else:
        groups = preset_groups(overrides)
    if on_start:
        on_start(len(groups) * len(invariants))
    return audit_groups(groups, PROFILES[profile], Path(out_dir), invariants, hand, target_kwargs, on_step)


def exit_code(cells: list[Cell]) -> int:
    return 1 if any(c.status == "fail" and not c.faithful for c in cells) else 0


# --------------------------------------------------------------------------------- output
def render(cells: list[Cell], console) -> None:
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    from runner.audit.invariants import INVARIANTS

    numbers = sorted({c.invariant for c in cells})
    rows: dict[str, list[Cell]] = {}
    for c in cells:
        rows.setdefault(c.preset, []).append(c)
    # A narrow terminal drops the kind column and says "known" for "reproduces upstream behaviour".
    upstream_fails = any(c.faithful and c.status == "fail" for c in cells)
    need = max((len(p) for p in rows), default=6) + 8 + 4 * len(numbers) + (len(UPSTREAM) if upstream_fails else 7) \
        + 2 * (len(numbers) + 3)
    wide = console.width >= need
    legend = "  ".join(f"{n} {INVARIANTS[n].short}" for n in numbers)
    if not wide and upstream_fails:
        legend += f"\nknown: a faithful preset that {UPSTREAM}"
    table = Table(title="is-study audit  (preset × invariant)", title_justify="left", caption=legend,
                  caption_justify="left", box=box.SIMPLE_HEAD, collapse_padding=not wide, pad_edge=wide)
    table.add_column("preset", style="bold", no_wrap=True)
    if wide:
        table.add_column("kind")
    for n in numbers:
        table.add_column(str(n), justify="center", no_wrap=True, min_width=4)
    table.add_column("verdict", no_wrap=not wide)
    for preset, row in rows.items():
        faithful = row[0].faithful
        by_n = {c.invariant: c for c in row}
        texts = []
        for n in numbers:
            c = by_n.get(n)
            if c is None:
                texts.append("")
            elif c.status == "pass":
                texts.append("[green]pass[/green]")
            elif c.status == "n/a":
                texts.append("[dim]n/a[/dim]")
            else:
                texts.append("[yellow]FAIL[/yellow]" if faithful else "[bold red]FAIL[/bold red]")
        failed = any(c.status == "fail" for c in row)
        upstream = UPSTREAM if wide else "known"
        verdict = (f"[yellow]{upstream}[/yellow]" if faithful else "[bold red]BUG[/bold red]") if failed \
            else "[green]ok[/green]"
        kind = "faithful" if faithful else "external" if ":" in preset else "ours"
        table.add_row(escape(preset), *([kind] if wide else []), *texts, verdict)
    console.print(table)
    failures = [c for c in cells if c.status == "fail"]
    if failures:
        console.print("counterexamples (shrunk; each file's header says how to reproduce it):")
        for c in failures:
            loss = f" loss={c.loss}" if c.loss else ""
            tag = f" [yellow]({UPSTREAM})[/yellow]" if c.faithful else " [bold red](bug)[/bold red]"
            console.print(f"  {escape(c.preset)} · {c.invariant} {INVARIANTS[c.invariant].short}{loss}: "
                          f"{escape(c.detail or '')}{tag}\n    → {escape(c.counterexample or '')}")
    ours = sorted({c.preset for c in failures if not c.faithful})
    if ours:
        console.print(f"[bold red]{len(ours)} preset(s) or target(s) that are not faithful reproductions fail: "
                      f"{escape(', '.join(ours))}[/bold red]")
    elif any(not c.faithful for c in cells):
        console.print("[green]no bug: every preset of ours (or target) passes every invariant that applies[/green]")
