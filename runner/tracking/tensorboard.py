"""tensorboard: event files in `RUN/tensorboard/` through torch.utils.tensorboard (which needs the
tensorboard package): every value of a row as a scalar at the row's step, flushed as written; at the end
the run's config as hparams (a sweep job's: its swept keys), with the final J and reward as the metrics
the HParams tab compares; `is-study plot` adds its figures as images. A sweep's jobs each log into
their own `SWEEP/JOB/tensorboard/SWEPT/`, so `tensorboard --logdir SWEEP` shows one curve per job,
named by its job and swept values."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from runner.tracking.base import Tracker
from runner.tracking.run_info import RunInfo

DIR = "tensorboard"
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
        from tensorboard.compat.proto.summary_pb2 import Summary
        from torch.utils.tensorboard.writer import FileWriter

        super().__init__(info)
        self.log_dir = log_dir(info)
        # One Summary of every value a row, written by FileWriter, rather than SummaryWriter.add_scalar per value:
        # the same scalars (a simple_value each, as add_scalar writes them), one event and one flush a row,
        # which made the tracker ~4× cheaper on a default run (scripts/bench_trackers.py)
        self._summary, self._value = Summary, Summary.Value
        self.file_writer = FileWriter(str(self.log_dir))
        self.last: dict[str, float] = {}

    def log(self, step: int, data: Mapping[str, Any]) -> None:
        value = self._value
        summary = self._summary(value=[value(tag=name, simple_value=v) for name, v in data.items()])
        self.file_writer.add_summary(summary, step)
        self.file_writer.flush()
        for name in FINAL_METRICS:
            if name in data:
                self.last[name] = data[name]

    def close(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.file_writer.close()
        info = self.info
        keys = info.swept if info.swept else tuple(info.config)
        hparams = {key: _hparam(info.config.get(key)) for key in keys}
        metrics = {FINAL_METRICS[name]: value for name, value in self.last.items()}
        if hparams and metrics:
            with SummaryWriter(log_dir=str(self.log_dir)) as writer:
                # run_name=".": the hparams go into this run's own dir, not a timestamped subdir
                writer.add_hparams(hparams, metrics, run_name=".")


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
    from torch.utils.tensorboard import SummaryWriter

    events = sorted(base.rglob("events.out.tfevents.*"))
    with SummaryWriter(log_dir=str(events[0].parent if events else base)) as writer:
        add_figures(writer, paths)
    return True
