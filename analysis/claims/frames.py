"""From an experiment's dataset (analysis.load) to the small tidy frames the claims' rules read: each job's
override and config values as columns, a clear error when the experiment has not run, and one update index
per job."""

from __future__ import annotations

from typing import Any

from analysis.load import Dataset
from runner.errors import UserError


def _job_map(ds: Dataset, key: str) -> dict[int, Any]:
    """job -> the value of an override key or dotted config key (a group gives its name)."""
    return {j.index: j.value(key) for j in ds.jobs}


def with_keys(ds: Dataset, df, **keys: str):
    """Add columns (name=key) from each job's override/config value, replacing any column of that name."""
    df = df.copy()
    for col, key in keys.items():
        df[col] = df["job"].map(_job_map(ds, key))
    return df


def required(frame, what: str, path: Any):
    """`frame`, or a one-line error when the experiment left none."""
    if frame is None or len(frame) == 0:
        raise UserError(f"{path}: no {what} here; run the experiment first (scripts/figures.sh)")
    return frame


def update_index(df):
    """A global update index per job: step × updates_per_step + update."""
    per = int(df["update"].max()) + 1 if "update" in df.columns else 1
    return df["step"].astype(int) * per + (df["update"].astype(int) if "update" in df.columns else 0)
