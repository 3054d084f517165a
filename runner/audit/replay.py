"""`is-study case FILE --target ...`: run a case file's tensors through an external target, as the
audit called it (float32, the target's convention), and report loss, gradient and, with a weights
function, the coefficients. A case on which the target raises reports the exception and its line,
so a crash's counterexample replays as the crash."""

from __future__ import annotations

import math
from typing import Any

from runner.cases import Case, encode_nested, encode_number


def evaluate_target(case: Case, subject) -> dict[str, Any]:
    import torch

    from runner.audit.crashes import message_of, raising_frame, short_path
    from runner.audit.subjects import Batch, SubjectRaised

    try:
        out = subject(Batch.from_case(case), torch.float32)
    except SubjectRaised as raised:
        file, line = raising_frame(raised.error)
        msg = message_of(raised.error)
        return {"name": case.name, "loss": None, "grad": None, "finite": False, "weights": None,
                "raised": f"{type(raised.error).__name__}{': ' + msg if msg else ''} at {short_path(file)}:{line}"}
    loss = float(out.loss)
    return {"name": case.name, "loss": encode_number(loss), "grad": encode_nested(out.grad.tolist()),
            "finite": math.isfinite(loss) and bool(torch.isfinite(out.grad).all()),
            "weights": encode_nested(out.coef.tolist()) if out.coef is not None else None, "raised": None}


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
        table.add_row(escape(r["name"]), fmt(r["loss"]), matrix(r["grad"]), matrix(r["weights"]),
                      "[green]yes[/green]" if r["finite"] else "[red]NO[/red]")
    console.print(table)
