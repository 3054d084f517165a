"""A tracker run on a thread of its own, so the run hands it a row and goes on.

MLflow's file store and W&B spend most of their time waiting: on the file system (two directory listings
and one file append per value) and on W&B's service process (a socket send per row, its start-up). On
the run's thread that waiting is wall time; on a thread of its own it overlaps the run's compute. The
rows reach the tracker in the order they were written, as soon as the thread is free: it takes every row
waiting in the queue at once (a tracker may write them in one call, `Tracker.log_rows`). The tracker's
first error is kept and raised on the run's thread at its next row or at close, where runner/tracking/
base.py reports it in one line and drops the tracker, as if it had failed there; metrics.csv has every
row already. The thread is a daemon: a run that dies loses at most the rows still queued, never the CSV.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Mapping
from typing import Any

from runner.tracking.base import Tracker

_CLOSE = object()  # the queue's last item


class BackgroundTracker(Tracker):
    def __init__(self, name: str, open_tracker: Callable[[], Tracker]):
        self.name = name
        self._rows: queue.SimpleQueue = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, args=(open_tracker,), name=f"is-study {name}", daemon=True)
        self._thread.start()  # the tracker opens while the run goes on

    def _work(self, open_tracker: Callable[[], Tracker]) -> None:
        tracker = None
        try:
            tracker = open_tracker()
            while True:
                rows = [self._rows.get()]
                while not self._rows.empty():  # every row already waiting, in one call
                    rows.append(self._rows.get_nowait())
                closing = rows[-1] is _CLOSE
                if closing:
                    rows.pop()
                if rows:
                    tracker.log_rows(rows)
                if closing:
                    tracker.close()
                    return
        except BaseException as exc:  # noqa: BLE001 - raised on the run's thread, which reports it
            self._error = exc
            if tracker is not None:
                try:
                    tracker.close()
                except Exception:  # noqa: BLE001 - the first error is the one reported
                    pass

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def log(self, step: int, data: Mapping[str, Any]) -> None:
        self._raise_error()
        self._rows.put((step, data))

    def close(self) -> None:
        self._rows.put(_CLOSE)
        self._thread.join()  # every queued row written and the tracker closed: its files are whole
        self._raise_error()
