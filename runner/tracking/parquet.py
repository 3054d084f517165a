"""log.format=parquet: metrics.parquet and tokens.parquet beside metrics.csv and tokens.csv (which every
reader of a run dir, plots, sweeps and claims, still reads), and `is-study aggregate DIR --format parquet`'s
sweep.parquet beside sweep.csv. pandas reads each back with the CSV's columns and dtypes.

tokens.parquet is the table that needs it (a long-horizon run's tokens.csv is most of its run dir): it is
written as the run goes, one row group per logged step from the same rows as tokens.csv, with the CSV's
dtypes (ints int64, the run's names strings, the float32 log-probs widened to float64, which is what pandas
makes of their 9-digit text, up to its last bits). Parquet's footer is written on close, so a run killed
mid-way has a tokens.csv but no readable tokens.parquet. metrics.parquet is metrics.csv as pandas reads
it, written at the end: its dtypes then are the CSV's by construction (a 0/1 flag column holds floats,
because the final row leaves it empty)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from runner.core.schema import TOKEN_COLUMNS

INT_TOKEN_COLUMNS = ("step", "seq", "pos", "token")
FLOAT_TOKEN_COLUMNS = ("old", "roll")


def parquet_path(csv_path: Path) -> Path:
    return Path(csv_path).with_suffix(".parquet")


def csv_to_parquet(csv_path: Path) -> Path:
    """The CSV as pandas reads it, as Parquet beside it (same name, .parquet)."""
    import pandas as pd

    from runner.records import write_failed

    out = parquet_path(csv_path)
    try:
        pd.read_csv(csv_path).to_parquet(out, index=False)
    except OSError as exc:  # pyarrow's I/O errors are OSErrors too
        raise write_failed(out, exc, f"{out} is incomplete; {csv_path} is whole") from None
    return out


class TokenParquetWriter:
    """tokens.parquet, one row group per write: the rows tokens.csv gets (step, seq, pos, token, old,
    roll) with the run's constants (seed, correction, ...) in their columns."""

    def __init__(self, path: Path, constants: Mapping[str, Any]):
        import pyarrow as pa
        import pyarrow.parquet as pq

        self._pa = pa
        self.constants = dict(constants)
        fields = []
        for column in TOKEN_COLUMNS:
            if column in FLOAT_TOKEN_COLUMNS:
                fields.append(pa.field(column, pa.float64()))
            elif column in INT_TOKEN_COLUMNS or isinstance(self.constants.get(column), int):
                fields.append(pa.field(column, pa.int64()))
            else:
                fields.append(pa.field(column, pa.string()))
        self.schema = pa.schema(fields)
        self.variable = [c for c in TOKEN_COLUMNS if c not in self.constants]
        self._writer = pq.ParquetWriter(str(path), self.schema)

    def write_columns(self, columns: Sequence[Sequence[int | float]]) -> None:
        """One row group: the variable columns (step, seq, pos, token, old, roll), each a list, as
        tokens.csv's rows hold them; the constants are filled in."""
        pa = self._pa
        n = len(columns[0])
        by_name = dict(zip(self.variable, columns))
        arrays = [
            pa.array([self.constants[f.name]] * n, type=f.type)
            if f.name in self.constants
            else pa.array(by_name[f.name], type=f.type)
            for f in self.schema
        ]
        self._writer.write_table(pa.Table.from_arrays(arrays, schema=self.schema))

    def close(self) -> None:
        self._writer.close()
