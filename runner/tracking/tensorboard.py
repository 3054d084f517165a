"""tensorboard: event files in `RUN/tensorboard/` written by tensorboardX (read by TensorBoard, which the
tracking extra brings too): every value of a row as a scalar at the row's step, flushed at most FLUSH_S
seconds apart and at the end; at the end the run's config as hparams (a sweep job's: its swept keys), with the final J and reward as the metrics
the HParams tab compares; `is-study plot` adds its figures as images. A sweep's jobs each log into
their own `SWEEP/JOB/tensorboard/SWEPT/`, so `tensorboard --logdir SWEEP` shows one curve per job,
named by its job and swept values."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from runner.tracking.base import Tracker
from runner.tracking.run_info import RunInfo

DIR = "tensorboard"
# the event file is flushed (and fsynced, as tensorboardX flushes) at the first row this long after the last
# flush, and at the end; TensorBoard itself reloads every 5-30 s. A flush a row cost about a millisecond each.
FLUSH_S = 1.0
FINAL_METRICS = {"training/objective": "hparams/final_objective", "training/reward": "hparams/final_reward"}


def log_dir(info: RunInfo) -> Path:
    """RUN/tensorboard, and for a sweep's job RUN/tensorboard/KEY=VALUE,...: TensorBoard names a run by
    its path under --logdir, so a sweep's curves are labelled by their swept values (02/tensorboard/
    correction=tis,mismatch.staleness=4)."""
    base = info.run_dir / DIR
    if not info.swept:
        return base
    return base / ",".join(f"{key}={info.config.get(key)}" for key in info.swept).replace("/", "_")


def _hparam(value: Any) -> Any:
    """What the HParams plugin takes: a bool, a number or a string (None and lists as text)."""
    return value if isinstance(value, (bool, int, float, str)) else str(value)


class TensorboardTracker(Tracker):
    name = "tensorboard"

    def __init__(self, info: RunInfo):
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.proto.summary_pb2 import Summary

        super().__init__(info)
        self.log_dir = log_dir(info)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # One Summary of every value a row (a simple_value each, as add_scalar writes them), in one Event
        # written here by tensorboardX's own event writer. Why tensorboardX, not torch.utils.tensorboard: with
        # the crc32c package it checksums each record in C, where torch's writer runs TensorBoard's pure-Python
        # CRC-32C (~0.4 ms a row of 31 values). Why not its FileWriter: that hands every event through a
        # multiprocessing queue to two threads (pickled, piped, unpickled), which took ~0.1 s of a 0.9 s run.
        self._event, self._summary, self._value = Event, Summary, Summary.Value
        self.events = EventsWriter(str(self.log_dir / "events"))
        self._flushed = time.monotonic()
        self.last: dict[str, float] = {}

    def _write(self, summary: Any, step: int = 0) -> None:
        self.events.write_event(self._event(wall_time=time.time(), step=step, summary=summary))

    def log(self, step: int, data: Mapping[str, Any]) -> None:
        value = self._value
        self._write(self._summary(value=[value(tag=name, simple_value=v) for name, v in data.items()]), step)
        if time.monotonic() - self._flushed >= FLUSH_S:  # its flush fsyncs: about a millisecond
            self.events.flush()
            self._flushed = time.monotonic()
        for name in FINAL_METRICS:
            if name in data:
                self.last[name] = data[name]

    def close(self) -> None:
        from tensorboardX.summary import hparams as hparams_summaries

        info = self.info
        keys = info.swept if info.swept else tuple(info.config)
        hparams = {key: _hparam(info.config.get(key)) for key in keys}
        metrics = {FINAL_METRICS[name]: value for name, value in self.last.items()}
        if hparams and metrics:
            # into the run's own event file, as SummaryWriter.add_hparams writes them into a file of their own:
            # tensorboardX names a file by the second it opens and the host, so a second writer opened in
            # the same second would replace the first's file
            for summary in hparams_summaries(hparams, metrics):
                self._write(summary)
            value = self._value
            self._write(self._summary(value=[value(tag=k, simple_value=v) for k, v in metrics.items()]))
        self.events.close()


def add_figures(writer: Any, paths: Sequence[Path]) -> None:
    """Each PNG as an image, tagged figures/NAME."""
    import matplotlib.image

    for path in paths:
        image = matplotlib.image.imread(str(path))  # H×W×C floats in [0, 1]
        writer.add_image(f"figures/{Path(path).stem}", image[..., :3], 0, dataformats="HWC")
    writer.flush()


def add_figures_to_run(run_dir: Path, paths: Sequence[Path]) -> bool:
    """Add `paths` to the TensorBoard log of the run in run_dir, when it has one (its figures made
    after the run, by `is-study plot`); returns whether it did."""
    base = Path(run_dir) / DIR
    if not base.is_dir() or not paths:
        return False
    from tensorboardX import SummaryWriter

    events = sorted(base.rglob("events.out.tfevents.*"))
    # a suffix of its own: a file opened in the run's last second would otherwise take the run's file name
    suffix = f".figures.{time.time_ns()}"
    with SummaryWriter(logdir=str(events[0].parent if events else base), filename_suffix=suffix) as writer:
        add_figures(writer, paths)
    return True
