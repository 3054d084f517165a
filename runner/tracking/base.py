"""The tracker interface, and the fan-out that feeds every chosen tracker and survives their failures.

A tracker is told each metrics.csv row (as `tracker_data` names it) with a step that counts updates, and
is closed at the end. Its errors never reach the run: the first one a tracker
raises is reported in one line on stderr, that tracker is dropped, and the run carries on with its CSV
files, which are written before any tracker sees a row.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from runner.tracking.names import tracker_data
from runner.tracking.run_info import RunInfo


class Tracker:
    """One experiment tracker's run. Subclasses open it in __init__ (raising if they cannot)."""

    name = "tracker"

    def __init__(self, info: RunInfo):
        self.info = info

    def log(self, step: int, data: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def log_rows(self, rows: Sequence[tuple[int, Mapping[str, Any]]]) -> None:
        """Several (step, data) rows in order (runner/tracking/background.py hands over all it has)."""
        for step, data in rows:
            self.log(step, data)

    def close(self) -> None:
        pass


class Trackers:
    """Every chosen tracker of a run, fed together; a failing one is reported once and dropped."""

    def __init__(self, trackers: Sequence[Tracker], updates_per_step: int):
        self.live = list(trackers)
        self.updates_per_step = updates_per_step

    def row(self, row: Mapping[str, Any]) -> None:
        """A metrics.csv row, just written: step (the tracker's x axis) counts updates, so each update
        of a step gets its own point, and the final row lands one update after the last."""
        if not self.live:
            return
        step = int(row["step"]) * self.updates_per_step + int(row["update"])
        data = tracker_data(row)
        self._each("log", step, data)

    def close(self) -> None:
        self._each("close")
        self.live = []

    def _each(self, method: str, *args: Any) -> None:
        for tracker in list(self.live):
            try:
                getattr(tracker, method)(*args)
            except Exception as exc:  # noqa: BLE001 - a tracker's failure must never stop the run or lose its CSV
                self.live.remove(tracker)
                report_failure(tracker.name, exc)
                if method != "close":
                    try:
                        tracker.close()
                    except Exception:  # noqa: BLE001 - already reported; its files may be incomplete
                        pass


def report_failure(name: str, exc: BaseException) -> None:
    text = str(exc).strip().splitlines()
    what = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    print(
        f"is-study: tracker {name} failed ({what}); it is off for the rest of the run, the CSV files go on",
        file=sys.stderr,
    )
