"""`is-study replay PATH`: read the dump step by step, evaluate the presets on each step, write the files.

Outputs in the replay dir (default runs/DATE/TIME-replay-XXXXXX, beside `is-study run`'s run dirs):
  replay.csv           one row per step × preset × mini-batch (runner/replay/evaluate.py REPLAY_COLUMNS), flushed
                       as written
  replay_summary.csv   one row per preset over all steps
  tokens.csv           one row per masked-in token: step, seq, pos, old, roll, lp, log_ratio (old − roll, or
                       lp − roll without old), ratio; absent values are nan
  DONE                 written last
A step's rows are written before the next step is read, so a dump of any length is replayed in the memory of
one step, and an interrupted replay keeps every step it finished.

Mini-batches (`--minibatches N`): a framework dump's step is one batch (N = 1); an is-study run's tokens.csv is
split as its train steps were, into the run's `train.updates_per_step` (read from its .hydra/config.yaml), so
each replay row matches one metrics.csv row.
"""

from __future__ import annotations

import itertools
import math
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

from runner.core.corrections import Correction
from runner.core.losses import LossSpec
from runner.errors import UserError
from runner.records import CsvWriter, mark_done
from runner.replay import formats
from runner.replay.evaluate import REPLAY_COLUMNS, replay_step
from runner.replay.limits import Limits
from runner.replay.schema import FIELDS, StepBatch

TOKEN_OUT_COLUMNS = ("step", "seq", "pos", "old", "roll", "lp", "log_ratio", "ratio")
TOKEN_TEMPLATE = "%d,%d,%d,%.9g,%.9g,%.9g,%.9g,%.9g\n"
SUMMARY_COLUMNS = (
    "preset",
    "applies",
    "steps",
    "tokens",
    "token_masked_fraction",
    "seq_masked_fraction",
    "clamped_fraction",
    "ess_mean",
    "ess_min",
    "kl_k3_mean",
    "max_abs_prob_diff",
    "nonfinite_loss_steps",
    "first_nonfinite_step",
    "note",
)


@dataclass
class Request:
    path: Path
    fmt: str | None = None
    overrides: list[str] = field(default_factory=list)
    every: bool = False
    out: Path | None = None
    limits: Limits = Limits()
    seed: int = 0
    tokens: bool = True
    minibatches: int | None = None  # None: the run's train.updates_per_step for an is-study run, else 1


def parse_overrides(overrides: list[str], every: bool) -> tuple[list[str], str]:
    """correction=A[,B] (repeatable) and loss=NAME; nothing named (or --all): every preset."""
    from runner import registry

    names: list[str] = []
    loss = "ppo"
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or key not in ("correction", "loss") or not value:
            raise UserError(f"replay: {item!r}: expected correction=PRESET[,PRESET...] or loss=NAME")
        if key == "loss":
            loss = value
        else:
            names += [v.strip() for v in value.split(",") if v.strip()]
    valid = registry.group_options("correction")
    for name in names:
        if name not in valid:
            raise UserError(f"replay: unknown preset {name!r}; valid: {', '.join(valid)}")
    if every and names:
        raise UserError("replay: --all runs every preset; name presets with correction=... or give --all, not both")
    if not names:
        names = registry.own_presets() + registry.faithful_presets()
    return list(dict.fromkeys(names)), loss


def load_loss(name: str) -> LossSpec:
    from runner import registry

    valid = registry.group_options("loss")
    if name not in valid:
        raise UserError(f"replay: unknown loss {name!r}; valid: {', '.join(valid)}")
    return LossSpec.from_config(yaml.safe_load((registry.conf_dir() / "loss" / f"{name}.yaml").read_text("utf-8")))


def load_preset(name: str) -> Correction:
    from runner import registry

    return Correction.from_config(
        yaml.safe_load((registry.conf_dir() / "correction" / f"{name}.yaml").read_text("utf-8"))
    )


def default_out() -> Path:
    """runs/DATE/TIME-replay-XXXXXX, as `is-study run` names its run dirs (conf/config.yaml's hydra.run.dir)."""
    now = time.localtime()
    return (
        Path("runs")
        / time.strftime("%Y-%m-%d", now)
        / f"{time.strftime('%H-%M-%S', now)}-replay-{secrets.token_hex(3)}"
    )


class Summary:
    """replay_summary.csv's row of one preset, accumulated step by step."""

    def __init__(self, preset: str):
        self.preset = preset
        self.steps = self.applies = self.tokens = self.sequences = self.nonfinite_steps = 0
        self.masked = self.seq_masked = self.clamped = self.ess = self.k3 = 0.0
        self.ess_min = math.inf
        self.max_dp = 0.0
        self.first_nonfinite: int | None = None
        self.note = ""
        self.rows = 0  # the applied rows (steps × mini-batches) the ESS is averaged over
        self.last_step: int | None = None
        self.last_bad_step: int | None = None

    def add(self, row: dict) -> None:
        new_step = row["step"] != self.last_step
        self.last_step = row["step"]
        self.steps += new_step
        self.note = self.note or row["note"]
        if not row["applies"]:
            return
        self.applies += new_step
        self.rows += 1
        n, s = row["tokens"], row["sequences"]
        self.tokens += n
        self.sequences += s
        self.masked += row["token_masked_fraction"] * n
        self.clamped += row["clamped_fraction"] * n
        self.k3 += row["kl_k3"] * n
        self.seq_masked += row["seq_masked_fraction"] * s
        self.ess += row["ess"]
        self.ess_min = min(self.ess_min, row["ess"])
        self.max_dp = max(self.max_dp, row["max_abs_prob_diff"])
        if (row.get("nonfinite_loss") or row.get("nonfinite_grad")) and self.last_bad_step != row["step"]:
            self.last_bad_step = row["step"]  # a step counts once, whichever of its mini-batches went bad
            self.nonfinite_steps += 1
            if self.first_nonfinite is None:
                self.first_nonfinite = row["step"]

    def row(self) -> dict:
        n, s, k = max(self.tokens, 1), max(self.sequences, 1), max(self.rows, 1)
        out = {
            "preset": self.preset,
            "applies": self.applies,
            "steps": self.steps,
            "tokens": self.tokens,
            "note": self.note,
        }
        if self.applies:
            out.update(
                token_masked_fraction=self.masked / n,
                seq_masked_fraction=self.seq_masked / s,
                clamped_fraction=self.clamped / n,
                ess_mean=self.ess / k,
                ess_min=self.ess_min,
                kl_k3_mean=self.k3 / n,
                max_abs_prob_diff=self.max_dp,
                nonfinite_loss_steps=self.nonfinite_steps,
                first_nonfinite_step=self.first_nonfinite,
            )
        return out


@dataclass(frozen=True)
class Split:
    """How each step's batch is split into mini-batches, and how many sequences a step holds (None: as read)."""

    minibatches: int = 1
    sequences: int | None = None


def run_config(path: Path) -> Path | None:
    """The .hydra/config.yaml of an is-study run dir, given the dir or a file in it (its tokens.csv)."""
    run_dir = path if path.is_dir() else path.parent
    config = run_dir / ".hydra" / "config.yaml"
    return config if config.is_file() else None


def choose_split(path: Path, found: list[tuple[Path, object]], minibatches: int | None) -> Split:
    """--minibatches as given, else the run's own: an is-study run's tokens.csv with its saved config is split
    into the run's train.updates_per_step, and each step padded to the run's batch (rollout.batch_size ×
    group_size) so every sequence keeps the index, hence the mini-batch, it had in the train step."""
    if minibatches is not None and minibatches < 1:
        raise UserError(f"--minibatches must be at least 1, got {minibatches}")
    config = run_config(path)
    if config is None or any(module.NAME != "tokens-csv" for _, module in found):
        return Split(minibatches or 1)
    from runner.hydra_app.job_config import resolved_values

    keys = ["train.updates_per_step", "rollout.batch_size", "rollout.group_size"]
    values = resolved_values(config, keys)
    if not all(isinstance(values[k], int) and not isinstance(values[k], bool) for k in keys):
        return Split(minibatches or 1)
    sequences = values["rollout.batch_size"] * values["rollout.group_size"]
    return Split(minibatches or values["train.updates_per_step"], sequences)


def pad_sequences(batch: StepBatch, sequences: int | None) -> StepBatch:
    """The step with empty sequences appended up to `sequences` (a tokens.csv names only sequences with a
    logged token; the rows it lacks sit at the end of the batch, and hold nothing the metrics count)."""
    missing = 0 if sequences is None else sequences - batch.mask.shape[0]
    if missing <= 0:
        return batch
    pad = {
        name: torch.nn.functional.pad(batch.tensor(name), (0, 0, 0, missing))
        for name in FIELDS
        if batch.tensor(name) is not None
    }
    seq = torch.cat([batch.seq, batch.seq.max() + 1 + torch.arange(missing)])
    return StepBatch(step=batch.step, seq=seq, source=batch.source, **pad)


TOKEN_CHUNK = 8192  # tokens.csv rows formatted at a time: a step's rows as Python objects would cost ~300 B a token


def token_rows(batch: StepBatch) -> Iterator[list[tuple]]:
    """tokens.csv's rows of one step, in chunks: the masked-in tokens, nan for what the dump does not hold."""
    seq_index, pos = (batch.mask > 0).nonzero(as_tuple=True)
    for start in range(0, len(seq_index), TOKEN_CHUNK):
        s, p = seq_index[start : start + TOKEN_CHUNK], pos[start : start + TOKEN_CHUNK]
        nan = torch.full(s.shape, math.nan, dtype=torch.float64)

        def at(t, s=s, p=p, nan=nan):
            return t[s, p].double() if t is not None else nan

        old, roll, lp = at(batch.old), at(batch.roll), at(batch.lp)
        log_ratio = (old if batch.old is not None else lp) - roll
        columns = [batch.seq[s].tolist(), p.tolist(), old.tolist(), roll.tolist(), lp.tolist()]
        columns += [log_ratio.tolist(), torch.exp(log_ratio).tolist()]
        yield [(batch.step, *values) for values in zip(*columns)]


def run(req: Request, on_step: Callable[[int], None] | None = None) -> Path:
    # One thread, as the train study runs: on the shared 2-core machine torch's second OpenMP thread spins
    # against every other process, and a 256k-token dump took 4.1 s with 2 threads against 0.54 s with 1.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(req, on_step)
    finally:
        torch.set_num_threads(threads)


def _run(req: Request, on_step: Callable[[int], None] | None) -> Path:
    names, loss_name = parse_overrides(req.overrides, req.every)
    presets = [load_preset(n) for n in names]
    loss = load_loss(loss_name)
    if req.fmt is not None:
        formats.reader(req.fmt)  # an unknown format fails before anything is created
    found = formats.files(req.path, req.fmt)  # a path with nothing to read fails before anything is created
    split = choose_split(req.path, found, req.minibatches)
    batches = formats.steps(found, req.limits)
    first = next(batches)  # a dump that cannot be read fails before the replay dir is made
    out = req.out if req.out is not None else default_out()
    if (out / "replay.csv").exists():
        raise UserError(f"{out} already holds a replay.csv; choose another --out (nothing was overwritten)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create the replay dir {out}: {exc.strerror or exc}") from None
    generator = torch.Generator().manual_seed(req.seed)  # only a shuffled filter (a control) draws from it
    summaries = {p.name: Summary(p.name) for p in presets}
    replay_csv = CsvWriter(out / "replay.csv", REPLAY_COLUMNS)
    tokens_csv = CsvWriter(out / "tokens.csv", TOKEN_OUT_COLUMNS) if req.tokens else None
    try:
        for batch in itertools.chain([first], batches):
            if tokens_csv is not None:
                for rows in token_rows(batch):
                    tokens_csv.write_number_rows(rows, TOKEN_TEMPLATE)
            for row in replay_step(pad_sequences(batch, split.sequences), presets, loss, generator, split.minibatches):
                replay_csv.write(row)
                summaries[row["preset"]].add(row)
            if on_step is not None:
                on_step(batch.step)
    finally:
        replay_csv.close()
        if tokens_csv is not None:
            tokens_csv.close()
    with CsvWriter(out / "replay_summary.csv", SUMMARY_COLUMNS) as summary_csv:
        for summary in summaries.values():
            summary_csv.write(summary.row())
    mark_done(out)
    return out
