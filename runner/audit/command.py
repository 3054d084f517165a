"""`is-study audit`: check presets (or an external target) against the seven invariants of
runner/audit/invariants.py, the all-masked check, and optionally a reference preset; report every
exception once; save a shrunk counterexample for every finding.

For each row (a preset under ppo and reinforce, or one target) and each invariant:
  1. the hand-written cases (runner/audit/generators.py) that the input profile admits, in order;
  2. otherwise a derandomized hypothesis search (`hypothesis.find`), which shrinks what it finds;
  3. a failure is shrunk once more (greedy rows/columns), always keeping its kind (a −inf loss
     stays a −inf loss), and saved by runner/audit/counterexamples.py to
     OUT/<row>[.<hash>].<check>.yaml, the command that reproduces it in the header.

A batch on which the subject raises is skipped by the check and logged; each distinct exception
(type and raising line) is one finding, shrunk and saved too. Faithful presets are expected to fail
what released code fails; only a finding on one of our own presets or on an external target makes
the exit code 1. The table is drawn by runner/audit/table.py.

About 520 lines on purpose: the audit's one loop (rows × invariants × budgets) and the report it
prints, read top to bottom; the checks themselves are in the modules named above.

About 530 lines on purpose: the search, the shrink and the four kinds of cell share one budget and one
output dir, and read in the order a finding is made.
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.audit.counterexamples import case_path, save_counterexample, slug
from runner.audit.groups import ALL_MASKED, RAISES, REFERENCE, Cell, Group
from runner.errors import UserError

DEFAULT_LOSSES = ("ppo", "reinforce")
SHRINK_CALLS = 150  # calls hypothesis may spend shrinking one finding, counted from its replay of it


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


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def loss_specs(overrides: Sequence[str]) -> list:
    """One LossSpec per loss to audit: loss=NAME, or ppo and reinforce."""
    from runner.core.losses import LossSpec
    from runner.hydra_app import app as hydra_app

    _, loss, rest = _split_overrides(overrides)
    losses = [loss] if loss else list(DEFAULT_LOSSES)
    return [
        LossSpec.from_config(hydra_app.to_container(hydra_app.compose([f"loss={name}", *rest]).loss)) for name in losses
    ]


def preset_groups(overrides: Sequence[str]) -> list[Group]:
    from runner import registry
    from runner.audit.subjects import PresetSubject
    from runner.core.corrections import Correction
    from runner.hydra_app import app as hydra_app

    preset, _, rest = _split_overrides(overrides)
    names = [preset] if preset else [e.name for e in registry.presets()]
    specs = loss_specs(overrides)  # the loss groups do not depend on the preset: one compose per loss
    groups = []
    for name in names:
        cfg = hydra_app.compose([f"correction={name}", *rest])
        corr = Correction.from_config(hydra_app.to_container(cfg.correction))
        subjects = [PresetSubject(corr, spec, rest) for spec in specs]
        key = slug(corr.name) + (f".{_short_hash(' '.join(sorted(rest)))}" if rest else "")
        groups.append(Group(corr.name, corr.faithful, subjects, key))
    return groups


def target_group(spec, overrides: Sequence[str] = ()) -> Group:
    from runner.audit.external import resolve_all

    if spec.target is not None and overrides:
        raise UserError(f"--target audits an external callable; overrides ({' '.join(overrides)}) do not apply")
    if spec.target is None and _split_overrides(overrides)[0]:
        raise UserError("--weights-fn without --target is audited under our losses; correction= does not apply")
    subjects = resolve_all(spec, loss_specs(overrides) if spec.target is None else ())
    name = subjects[0].name
    return Group(
        name, False, subjects, f"{slug(name)}.{spec.digest()}", spec.cli_args() + list(overrides), spec.allow_raise
    )


# --------------------------------------------------------------------------------- search
@functools.lru_cache(maxsize=1)
def _hand_cases() -> tuple:
    from runner.audit.generators import hand_cases

    return tuple(hand_cases())


@functools.lru_cache(maxsize=2)
def _padding_cases(realistic: bool) -> tuple:
    from runner.audit.generators import padding_variants

    return tuple(padding_variants(list(_hand_cases()), realistic))


def hand_batches(n: int, subject, profile) -> list:
    if n in (1, 2, 3):
        batches = list(_hand_cases())
    elif n == 4:
        batches = list(_padding_cases(profile.realistic))
    elif n == 5:
        first = [subject.calibration_batch()] if subject.kind == "external" else []
        batches = first + [b.on_policy() for b in _hand_cases()]
    elif n == 6:
        batches = [b for b in _hand_cases() if b.shape[0] >= 2]
    else:
        batches = []
    return [b for b in batches if profile.admits(b)]


@dataclass
class Search:
    """How the checks of one row are searched: budget, input profile, hand cases, and the log of
    what the row's subjects raised."""

    budget: Any
    profile: Any
    log: Any
    hand: bool = True

    @property
    def profile_args(self) -> list[str]:
        return [] if self.profile.name == "adversarial" else ["--profile", self.profile.name]

    def find(self, label: str, check: Callable, hand: list, kind: str, profile=None):
        """(shrunk batch, violation, how it was found) or None. `check(batch)` → Violation | None."""
        from runner.audit.generators import hypothesis_settings, pool, shrink, strategy
        from runner.audit.subjects import SubjectRaised

        profile = profile or self.profile

        def outcome(batch):
            try:
                return check(batch)
            except SubjectRaised as raised:
                self.log.record(raised, label)
                return None

        found = first = how = None

        def same_kind(batch) -> bool:
            v = outcome(batch)
            return v is not None and v.kind == first.kind

        for batch in hand if self.hand else []:
            first = outcome(batch)
            if first is not None:
                found, how = batch, f"the hand-written case {batch.name!r}"
                break
        if found is None:
            from hypothesis import find
            from hypothesis.errors import NoSuchExample

            for batch in pool(kind, self.budget, profile):
                first = outcome(batch)
                if first is not None:
                    found = batch
                    break
            if found is None:
                return None
            how = f"a hypothesis search ({self.budget.name} budget)"
            try:
                found = find(
                    strategy(kind, self.budget, profile),
                    BudgetedShrink(same_kind, SHRINK_CALLS),
                    settings=hypothesis_settings(self.budget.examples[kind]),
                )
                how += ", shrunk by hypothesis"
            except NoSuchExample:  # the replay missed it; the greedy shrink below still applies
                pass
            except Exception as exc:  # noqa: BLE001 - e.g. Flaky: a target that answers differently twice
                how += f" (hypothesis could not shrink it: {type(exc).__name__})"
        found = shrink(found, same_kind)
        final = outcome(found)
        if final is None or final.kind != first.kind:
            final = first
            how += "; the same input did not fail again: the target answers differently twice"
        return found, final, how


class BudgetedShrink:
    """A `hypothesis.find` predicate that stops the shrink after `calls` calls. Hypothesis shrinks
    until no pass makes progress, which on a slow target (10 ms a call) takes seconds; past the
    budget every candidate but the best so far is refused (that one is replayed at the end), so it
    stops at what it has. A count, not a clock, so two runs give the same counterexample."""

    def __init__(self, predicate: Callable[[Any], bool], calls: int):
        self.predicate, self.calls = predicate, calls
        self.used = 0  # counted from the replayed failure on
        self.best: bytes | None = None

    def __call__(self, batch) -> bool:
        if self.used >= self.calls:
            return self.best is not None and batch.key() == self.best
        ok = self.predicate(batch)
        if ok or self.used:
            self.used += 1
        if ok:
            self.best = batch.key()
        return ok


# --------------------------------------------------------------------------------- the checks of a row
def _check_invariant(n: int, group: Group, search: Search, out_dir: Path) -> Cell:
    from runner.audit.invariants import INVARIANTS, violation

    inv = INVARIANTS[n]
    start = time.perf_counter()
    reasons, applied, failure = [], False, None
    for subject in group.subjects:
        reason = inv.applies(subject)
        if reason:
            reasons.append(reason)
            continue
        applied = True
        found = search.find(
            f"{n} {inv.short}",
            functools.partial(violation, inv, subject),
            hand_batches(n, subject, search.profile),
            inv.generator,
        )
        if found is not None:
            failure = (subject, *found)
            break
    path = case_path(out_dir, group.key, n)
    cell = Cell(group.name, n, "n/a", group.faithful, profile=search.profile.name)
    if failure is not None:
        subject, batch, detail, how = failure
        save_counterexample(
            path,
            n,
            f"fails invariant {n} ({inv.text})",
            subject,
            group,
            batch,
            detail,
            how,
            search.profile.name,
            search.profile_args,
        )
        cell.status, cell.counterexample, cell.loss, cell.detail, cell.found_by = (
            "fail",
            str(path),
            subject.loss_name,
            str(detail),
            how,
        )
    elif applied:
        cell.status = "pass"
    else:
        cell.detail = reasons[0] if reasons else None
    cell.seconds = time.perf_counter() - start
    return cell


def _check_all_masked(group: Group, search: Search, out_dir: Path) -> Cell:
    from runner.audit import all_masked

    start = time.perf_counter()
    verdicts = [all_masked.check(s, search.profile, search.log) for s in group.subjects]
    verdict = (
        next((v for v in verdicts if v.status == "fail"), None)
        or next((v for v in verdicts if v.status == "raise"), None)
        or verdicts[0]
    )
    cell = Cell(
        group.name,
        ALL_MASKED,
        verdict.status,
        group.faithful,
        profile=search.profile.name,
        note=verdict.note,
        found_by="the all-masked batches" if verdict.status != "pass" else None,
    )
    path = case_path(out_dir, group.key, ALL_MASKED)
    if verdict.status == "fail":
        subject = group.subjects[verdicts.index(verdict)]
        save_counterexample(
            path,
            ALL_MASKED,
            f"fails the all-masked check ({all_masked.TEXT})",
            subject,
            group,
            verdict.batch,
            str(verdict.violation),
            cell.found_by,
            search.profile.name,
            search.profile_args,
        )
        cell.counterexample, cell.detail, cell.loss = str(path), str(verdict.violation), subject.loss_name
    elif verdict.status == "raise":
        cell.detail = "raises (reported once, under raises)"
    cell.seconds = time.perf_counter() - start
    return cell


def _check_reference(preset: str, group: Group, search: Search, out_dir: Path) -> Cell:
    from runner.audit import reference
    from runner.audit.generators import PROFILES, ordinary_cases

    start = time.perf_counter()
    failure = None
    for subject in group.subjects:
        ref = reference.reference_subject(subject, preset)
        found = search.find(
            f"reference correction={preset}",
            functools.partial(reference.check, subject, ref),
            ordinary_cases(),
            "ordinary",
            PROFILES["realistic"],
        )
        if found is not None:
            failure = (subject, *found)
            break
    cell = Cell(group.name, REFERENCE, "pass", group.faithful, profile="ordinary")
    path = case_path(out_dir, group.key, f"ref-{slug(preset)}")
    if failure is not None:
        subject, batch, detail, how = failure
        save_counterexample(
            path,
            REFERENCE,
            f"differs from correction={preset} on ordinary inputs",
            subject,
            group,
            batch,
            detail,
            how,
            "ordinary",
            ["--reference", f"correction={preset}"],
            reference=preset,
        )
        cell.status, cell.counterexample, cell.loss, cell.detail, cell.found_by = (
            "fail",
            str(path),
            subject.loss_name,
            f"vs correction={preset}: {detail}",
            how,
        )
    cell.seconds = time.perf_counter() - start
    return cell


def _crash_cells(group: Group, search: Search, out_dir: Path) -> list[Cell]:
    """One cell per distinct exception, its batch shrunk while it raises the same way."""
    from runner.audit.crashes import short_path
    from runner.audit.generators import shrink
    from runner.audit.subjects import SubjectRaised

    cells = []
    for crash in list(search.log.crashes.values()):
        start = time.perf_counter()
        subject = crash.subject or group.subjects[0]

        def same(batch, crash=crash) -> bool:
            try:
                subject(batch, crash.dtype)
            except SubjectRaised as raised:
                return search.log.same(crash, raised)
            return False

        batch = shrink(crash.batch, same) if same(crash.batch) else crash.batch
        text = crash.text(short_path(crash.file))
        checks = ", ".join(crash.checks)
        how = f"the {crash.checks[0]} check" + (
            f" (also hit by: {', '.join(crash.checks[1:])})" if len(crash.checks) > 1 else ""
        )
        path = case_path(out_dir, group.key, f"raises-{crash.type}-{crash.line}")
        save_counterexample(
            path,
            RAISES,
            f"raises {crash.type}",
            subject,
            group,
            batch,
            text,
            how,
            search.profile.name,
            search.profile_args,
            dtype=crash.dtype,
        )
        cells.append(
            Cell(
                group.name,
                RAISES,
                "fail",
                group.faithful,
                str(path),
                subject.loss_name,
                text,
                how,
                search.profile.name,
                time.perf_counter() - start,
                note=f"checks: {checks}",
            )
        )
    return cells


def audit_groups(
    groups: list[Group],
    budget,
    out_dir: Path,
    invariants: Sequence[int] = tuple(range(1, 8)),
    hand: bool = True,
    profile=None,
    reference: str | None = None,
    all_masked: bool = True,
    on_step: Callable[[str], None] | None = None,
) -> list[Cell]:
    from runner.audit.crashes import CrashLog
    from runner.audit.generators import PROFILES
    from runner.audit.invariants import INVARIANTS

    profile = profile or PROFILES["adversarial"]
    out_dir = Path(out_dir)
    cells: list[Cell] = []
    for group in groups:
        search = Search(budget, profile, CrashLog(group.allow_raise), hand)
        written: list[Cell] = []
        for n in invariants:
            if on_step:
                on_step(f"{group.name} · {n} {INVARIANTS[n].short}")
            written.append(_check_invariant(n, group, search, out_dir))
        if all_masked:
            if on_step:
                on_step(f"{group.name} · all-masked")
            written.append(_check_all_masked(group, search, out_dir))
        if reference:
            if on_step:
                on_step(f"{group.name} · reference correction={reference}")
            written.append(_check_reference(reference, group, search, out_dir))
        written += _crash_cells(group, search, out_dir)
        for name, count in search.log.refusals.items():
            written.append(
                Cell(
                    group.name,
                    RAISES,
                    "pass",
                    group.faithful,
                    profile=profile.name,
                    note=f"{count} batch(es) refused with {name}, allowed by --allow-raise",
                )
            )
        _remove_stale(out_dir, group.key, {c.counterexample for c in written if c.counterexample})
        cells += written
    return cells


def _remove_stale(out_dir: Path, key: str, keep: set[str]) -> None:
    """Counterexamples of this row from an earlier run that no longer fail."""
    if not out_dir.is_dir():
        return
    stem = slug(key) + "."
    for path in out_dir.glob(f"{slug(key)}.*.yaml"):
        rest = path.name[len(stem) : -len(".yaml")]
        if "." not in rest and str(path) not in keep:  # not a longer key's file (tis.<hash>.inv1)
            path.unlink()


def run_audit(
    overrides: Sequence[str] = (),
    out_dir: str | Path = "audit-cases",
    budget: str = "default",
    profile: str = "adversarial",
    target=None,
    target_kwargs: str | None = None,
    invariants: Sequence[int] | None = None,
    hand: bool = True,
    reference: str | None = None,
    all_masked: bool = True,
    on_step: Callable[[str], None] | None = None,
    on_start: Callable[[int], None] | None = None,
) -> list[Cell]:
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        raise UserError("is-study audit needs hypothesis: pip install hypothesis") from None
    from runner.audit import reference as references
    from runner.audit.external import TargetSpec
    from runner.audit.generators import BUDGETS, PROFILES

    if budget not in BUDGETS:
        raise UserError(f"audit budget {budget!r} is not one of: {', '.join(BUDGETS)}")
    if profile not in PROFILES:
        raise UserError(f"--profile {profile!r} is not one of: {', '.join(PROFILES)}")
    invariants = tuple(invariants or range(1, 8))
    if isinstance(target, str) or target is None:
        target = TargetSpec(target=target, target_kwargs=target_kwargs)
    target.validate()
    preset = references.parse(reference) if reference else None
    if preset:
        from runner import registry

        if preset not in registry.group_options("correction"):
            raise UserError(f"--reference: unknown correction preset {preset!r} (see is-study list)")
    groups = [target_group(target, overrides)] if target.given else preset_groups(overrides)
    if on_start:
        on_start(len(groups) * (len(invariants) + all_masked + bool(preset)))
    return audit_groups(
        groups, BUDGETS[budget], Path(out_dir), invariants, hand, PROFILES[profile], preset, all_masked, on_step
    )


def exit_code(cells: list[Cell]) -> int:
    return 1 if any(c.finding and not c.faithful for c in cells) else 0
