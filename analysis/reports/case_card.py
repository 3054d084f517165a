"""`is-study report CASE-FILE [correction=PRESET]`: a case file's repro card in Markdown.

The inputs, the expected against the actual results and which invariant broke: 1 a finite loss and
gradient, 2 exactly zero gradient at every rejected unit. runner/audit/case_card.py computes all of it
(the CLI calls it and hands the card here); this module only formats it, and never imports torch,
the algebra or the audit.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from analysis.reports import fmt, table

# ----------------------------------------------------------------------------------------- case card
INVARIANTS = {1: "finite loss and gradient", 2: "zero gradient at rejected units"}


CASE_REPORTS = Path("runs") / "reports"  # under runs/, where `is-study run` writes and .gitignore ignores


def case_report_path(case_path: Path) -> Path:
    """Where a case file's report goes by default: runs/reports/NAME-report.md under the current
    directory, not next to the case file (which may be a shipped one, inside the package) nor loose
    in the current directory (a checkout's root, outside .gitignore)."""
    return Path.cwd() / CASE_REPORTS / f"{Path(case_path).stem}-report.md"


def _verdict(card) -> tuple[str, str]:
    """(word, sentence): BROKEN when an invariant fails, MISMATCH when the results differ from the
    file's expected ones, OK otherwise; the sentence says what was checked, and nothing more is
    claimed than was checked."""
    n = len(card.checks)
    broken_cases = {
        1: [c.name for c in card.checks if not c.finite],
        2: [c.name for c in card.checks if c.rejection.status == "fail"],
    }
    broken = [
        f"invariant {k} ({INVARIANTS[k]}) fails in {', '.join(cases)}" for k, cases in broken_cases.items() if cases
    ]
    checked_2 = sum(1 for c in card.checks if c.rejection.status != "n/a")
    why_na = sorted({c.rejection.reason for c in card.checks if c.rejection.status == "n/a"})
    if checked_2 == n:
        two = f"invariant 2 in all {n} cases"
    elif checked_2:
        two = f"invariant 2 in {checked_2} of {n} cases (n/a in the others: {'; '.join(why_na)})"
    else:
        two = f"invariant 2 n/a ({'; '.join(why_na)})"
    if card.expected is None:
        expected = f"not compared with expected results ({card.no_expected_reason})"
    elif card.mismatches:
        expected = f"{len(card.mismatches)} mismatch(es) with the file's expected results"
    else:
        expected = f"the file's expected results match in all {n} cases (tolerance 1e-5)"
    if broken:
        text = "; ".join(broken)
        return "BROKEN", text[0].upper() + text[1:] + f". Checked: invariant 1 in all {n} cases, {two}; {expected}."
    if card.expected is not None and card.mismatches:
        return "MISMATCH", f"Checked: invariant 1 in all {n} cases, {two}; {expected}."
    return "OK", f"Checked: invariant 1 in all {n} cases, {two}; {expected}."


def case_report(cards, overrides: list[str], shown: str | None = None) -> str:
    """The repro card's Markdown from runner.case_card.CaseCard(s): one card, or a summary of every
    preset of the file's expect: list followed by each preset's card. `shown` is the path or name the
    user gave (default: the file's path)."""
    if not isinstance(cards, (list, tuple)):
        cards = [cards]
    if len(cards) == 1:
        return _one_card(cards[0], overrides, shown, level=1)
    name = Path(shown or cards[0].path).name
    parts = [
        f"# Repro cards: `{name}`, every preset of its `expect:` list\n",
        f"{len(cards)} presets, each under the overrides of its expect entry; a card per preset follows. "
        f"`is-study report {shown or cards[0].path} correction=PRESET` gives one.\n",
    ]
    rows = []
    for card in cards:
        word, _ = _verdict(card)
        broken = [
            k for k in (1, 2) if any((not c.finite) if k == 1 else c.rejection.status == "fail" for c in card.checks)
        ]
        rows.append(
            {
                "preset": f"`{card.preset}`",
                "verdict": f"**{word}**",
                "faithful": "yes" if card.correction.get("faithful") else "no",
                "invariants broken": ", ".join(str(k) for k in broken) or "none",
                "expected results": (
                    "—"
                    if card.expected is None
                    else ("match" if not card.mismatches else f"{len(card.mismatches)} mismatch(es)")
                ),
            }
        )
    parts.append(table(rows) + "\n")
    counts = Counter(_verdict(c)[0] for c in cards)
    parts.append(
        "Summary: " + ", ".join(f"{n} {w}" for w, n in counts.items()) + ". BROKEN on a faithful preset "
        "whose expected results match is the released code's behaviour, reproduced.\n"
    )
    for card in cards:
        parts.append(_one_card(card, overrides, shown, level=2))
    return "\n".join(parts).rstrip() + "\n"


def _one_card(card, overrides: list[str], shown: str | None, level: int) -> str:
    h = "#" * level
    sub = "#" * (level + 1)
    corr_cfg, loss_cfg = card.correction, card.loss
    title = f"Repro card: `{Path(shown or card.path).name}` under correction={card.preset}"
    parts = [f"{h} {title if level == 1 else f'correction={card.preset}'}\n"]
    word, sentence = _verdict(card)
    parts.append(f"**Verdict: {word}.** {sentence}\n")
    if card.expected is not None and card.mismatches:
        parts.append(
            f"**{len(card.mismatches)} mismatch(es) with the file's expected results** (tolerance 1e-5): "
            + "; ".join(str(m) for m in card.mismatches[:5])
            + ".\n"
        )
    elif card.expected is not None and word == "BROKEN":
        parts.append(
            "The actual results match the file's expected results (tolerance 1e-5): the reported behaviour "
            "is reproduced.\n"
        )

    shown_path = shown or str(card.path)
    card_overrides = list(getattr(card, "overrides", None) or overrides)
    parts.append(f"{sub} Command\n")
    parts.append("```bash\n" + " ".join(["is-study", "case", shown_path, *card_overrides]) + "\n```\n")

    parts.append(f"{sub} Setup\n")
    band = f"[{fmt(corr_cfg.get('low'))}, {fmt(corr_cfg.get('high'))}]"
    setup = [
        {
            "": "correction",
            "value": f"`{card.preset}`" + (" (faithful reproduction)" if corr_cfg.get("faithful") else ""),
        },
        {"": "what it computes", "value": corr_cfg.get("description", "")},
        {
            "": "band [low, high]",
            "value": band + (f", veto {fmt(corr_cfg.get('veto'))}" if corr_cfg.get("veto") is not None else ""),
        },
        {"": "loss", "value": f"`{loss_cfg.get('name')}`, reduction {loss_cfg.get('reduction')}"},
    ]
    parts.append(table(setup) + "\n")

    parts.append(f"{sub} Inputs\n")
    parts.append(
        "Per token: the trainer's log-probs under θ (`log_probs`), at rollout time (`old_log_probs`), "
        "the engine's (`rollout_log_probs`), the advantage and the action mask; log-ratio = old − roll.\n"
    )
    for case in card.cases:
        parts.append(f"**{case.name}**\n")
        parts.append(_inputs_table(case) + "\n")

    parts.append(f"{sub} Expected vs actual\n")
    parts.append(_expect_table(card.results, card.expected, card.mismatches) + "\n")

    parts.append(f"{sub} Invariants\n")
    parts.append(table([_invariant_row(c, r) for c, r in zip(card.checks, card.results)]) + "\n")
    parts.append(
        "1: the loss and d loss / d log_probs are finite (NaN or ±inf is the bug). "
        "2: a unit the correction rejects contributes exactly zero gradient (not 0·inf = NaN).\n"
    )
    return "\n".join(parts).rstrip() + "\n"


def _invariant_row(check, result: dict) -> dict:
    if check.finite:
        one = "✓"
    else:
        one = f"✗ loss {fmt(result['loss'])}" + ("" if check.inputs_finite else " (the inputs hold NaN/inf)")
    rejection = check.rejection
    if rejection.status == "n/a":
        two = f"n/a ({rejection.reason})"
    elif rejection.status == "fail":
        two = f"✗ {rejection.reason}"
    else:
        n = rejection.rejected
        two = f"✓ ({n} rejected token{'s' if n != 1 else ''}, gradient 0)"
    return {"case": check.name, f"1 {INVARIANTS[1]}": one, f"2 {INVARIANTS[2]}": two}


def _inputs_table(case) -> str:
    rows = []
    B = len(case.log_probs)
    for b in range(B):
        for t in range(len(case.log_probs[b])):
            row = {"seq": b} if B > 1 else {}
            old, roll = case.old_log_probs[b][t], case.rollout_log_probs[b][t]
            row.update(
                {
                    "t": t,
                    "log_probs": case.log_probs[b][t],
                    "old_log_probs": old,
                    "rollout_log_probs": roll,
                    "advantages": case.advantages[b][t],
                    "action_mask": case.action_mask[b][t],
                    "log-ratio": old - roll if math.isfinite(old) and math.isfinite(roll) else float("nan"),
                }
            )
            # Full precision (the shortest repr that round-trips): the card must reproduce the case.
            rows.append({k: _exact(v) if isinstance(v, float) else v for k, v in row.items()})
    return table(rows)


def _exact(v: float) -> str:
    if not math.isfinite(v):
        return fmt(v)
    return str(int(v)) if v == int(v) and abs(v) < 1e15 else repr(v)


def _expect_table(results: list[dict], expected: list | None, mismatches) -> str:
    bad = {(m.case, m.field.split("[")[0]) for m in mismatches}
    rows = []
    for i, res in enumerate(results):
        exp = expected[i] if expected is not None and i < len(expected) else {}
        for field in ("loss", "grad"):
            row = {
                "case": res["name"],
                "field": field if field == "loss" else "d loss / d log_probs",
                "expected": fmt(_num(exp[field]), 7) if field in exp else "—",
                "actual": fmt(_num(res[field]), 7),
            }
            if field in exp:
                row["match"] = "✗" if (res["name"], field) in bad else "✓"
            else:
                row["match"] = "—"
            rows.append(row)
        rows.append(
            {
                "case": res["name"],
                "field": "finite",
                "expected": "—",
                "actual": "yes" if res["finite"] else "**NO**",
                "match": "—",
            }
        )
    return table(rows, ["case", "field", "expected", "actual", "match"])


def _num(v: Any) -> Any:
    """Case-file numbers may be the strings 'nan' / 'inf' / '-inf'."""
    if isinstance(v, list):
        return [_num(x) for x in v]
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return v
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v
