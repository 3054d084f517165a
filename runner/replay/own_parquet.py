"""is-study's own Parquet format: one row per sequence, any number of steps in a file, the JSONL format's fields
as columns.

    step, seq                      int64 (optional: step 0, and the row's number within its step)
    old, roll, mask, lp            list<float> per row, one value per token (old and lp optional)
    advantages                     list<float> per row, or one float per row (one per sequence)

Read with pyarrow (the `tracking` extra); Parquet holds typed columns only, so reading it builds no object.
A run dir's tokens.parquet (log.format=parquet) is another table, tokens.csv's rows: it is not read here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from runner.errors import UserError
from runner.replay.limits import Limits, check_size
from runner.replay.schema import FIELDS, REQUIRED, BatchError, StepBatch, from_rows

NAME = "parquet"
INSTALL_HINT = "pip install 'is-study[tracking]'"


def accepts(path: Path) -> bool:
    return path.suffix == ".parquet" and not path.name.endswith("tokens.parquet")


def _pyarrow_parquet(path: Path):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError(f"{path}: reading Parquet needs pyarrow: {INSTALL_HINT}") from None
    return pq


def read(path: Path, limits: Limits) -> Iterator[StepBatch]:
    pq = _pyarrow_parquet(path)
    import pyarrow as pa

    check_size(path, limits)
    src = str(path)
    try:
        parquet = pq.ParquetFile(path)
        meta = parquet.metadata  # what the columns expand to, before any is read
        check_size(path, limits, sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)))
        table = parquet.read()
    except UserError:
        raise
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise UserError(f"{src}: not a readable Parquet file ({str(exc).splitlines()[0][:300]}; truncated?)") from None
    names = set(table.column_names)
    for name in REQUIRED:
        if name not in names:
            raise BatchError(src, None, name, f"missing (the file holds: {', '.join(sorted(names)) or 'nothing'})")
    columns = {name: table.column(name).to_pylist() for name in (*FIELDS, "step", "seq") if name in names}
    steps = columns.get("step", [0] * table.num_rows)
    by_step: dict[int, list[int]] = {}
    for row, step in enumerate(steps):
        if isinstance(step, bool) or not isinstance(step, int):
            raise UserError(f"{src}: row {row}: field 'step' must be an integer, got {step!r}")
        by_step.setdefault(step, []).append(row)
    for step in sorted(by_step):
        rows_of = by_step[step]
        rows = [{name: columns[name][r] for name in FIELDS if name in columns} for r in rows_of]
        seq = [columns["seq"][r] for r in rows_of] if "seq" in columns else list(range(len(rows_of)))
        if any(isinstance(s, bool) or not isinstance(s, int) for s in seq):
            raise BatchError(src, step, "seq", "must be integers")
        yield from_rows(src, step, rows, seq)
