"""`is-study replay PATH`: read the dump step by step, evaluate the presets on each step, write the files.

Outputs in the replay dir (default runs/DATE/TIME-replay-XXXXXX, beside `is-study run`'s run dirs):
  replay.csv           one row per step × preset (runner/replay/evaluate.py REPLAY_COLUMNS), flushed as written
  replay_summary.csv   one row per preset over all steps
  tokens.csv           one row per masked-in token: step, seq, pos, old, roll, lp, log_ratio (old − roll, or
                       lp − roll without old), ratio; absent values are nan
  DONE                 written last
A step's rows are written before the next step is read, so a dump of any length is replayed in the memory of
one step, and an interrupted replay keeps every step it finished.
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
from runner.replay.schema import StepBatch

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

    def add(self, row: dict) -> None:
        self.steps += 1
        self.note = self.note or row["note"]
        if not row["applies"]:
            return
        self.applies += 1
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
        if row.get("nonfinite_loss") or row.get("nonfinite_grad"):
            self.nonfinite_steps += 1
            if self.first_nonfinite is None:
                self.first_nonfinite = row["step"]

    def row(self) -> dict:
        n, s, k = max(self.tokens, 1), max(self.sequences, 1), max(self.applies, 1)
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
            for row in replay_step(batch, presets, loss, generator):
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
