"""is-study replay: the readers, the safety rules and the consistency with a train run's own metrics."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from runner.core.schema import CORRECTION_METRICS
from tests.helpers.cli import run_cli

TINY_TRAIN = [
    "train.steps=5",
    "rollout.batch_size=4",
    "rollout.group_size=4",
    "train.updates_per_step=1",  # one update a step: metrics.csv's row is the whole logged batch's
    "log.tokens_every=2",
    "log.quiet=true",
    "log.timing=false",
]


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def replay(*args: str) -> tuple[int, str, str]:
    return run_cli("replay", *map(str, args))


def synthetic(seed: int = 0, sequences: int = 8, tokens: int = 6, shift: float = 0.3):
    rng = np.random.default_rng(seed)
    old = rng.normal(-1.5, 0.5, (sequences, tokens)).astype(np.float32)
    roll = (old + rng.normal(0, shift, old.shape)).astype(np.float32)
    mask = np.ones(old.shape, dtype=np.float32)
    mask[::3, -2:] = 0.0
    adv = rng.normal(0, 1, sequences).astype(np.float32)
    return old, roll, mask, adv


# ----------------------------------------------------------------------------------------- slice 1
@pytest.mark.parametrize("preset", ["seq-mask-tis", "icepop", "tis", "verl/geo-rs"])
def test_replay_reproduces_every_correction_metric_of_the_run(tmp_path, preset):
    run_dir = tmp_path / "run"
    # bf16 and staleness 2 give a mismatch that the preset's default band partly rejects
    code, _, err = run_cli(
        "run", *TINY_TRAIN, f"correction={preset}", "mismatch.staleness=2", f"hydra.run.dir={run_dir}"
    )
    assert code == 0, err
    out = tmp_path / "replay"
    code, _, err = replay(run_dir / "tokens.csv", f"correction={preset}", "--out", out)
    assert code == 0, err
    logged = {int(r["step"]): r for r in read_csv(run_dir / "metrics.csv") if r["reward"]}
    rows = read_csv(out / "replay.csv")
    assert [int(r["step"]) for r in rows] == [0, 2, 4]
    assert all(float(r["kl_k3"]) > 1e-6 for r in rows)  # a mismatch to measure
    for r in rows:
        want = logged[int(r["step"])]
        for name in CORRECTION_METRICS:
            assert math.isclose(float(r[name]), float(want[name]), rel_tol=1e-6, abs_tol=1e-9), (r["step"], name)
    assert all(r["loss"] == "" and "no advantages" in r["note"] for r in rows)  # tokens.csv has none


def write_npz(path: Path, old, roll, mask, adv, **extra) -> Path:
    np.savez(path, old=old, roll=roll, mask=mask, advantages=adv, **extra)
    return path


def write_jsonl(path: Path, old, roll, mask, adv, step: int = 0) -> Path:
    with open(path, "w") as f:
        for i in range(len(mask)):
            n = int(mask[i].sum())  # each line holds only its sequence's own tokens: no padding at all
            keep = mask[i] > 0
            f.write(
                json.dumps(
                    {
                        "step": step,
                        "seq": i,
                        "old": old[i][keep].tolist(),
                        "roll": roll[i][keep].tolist(),
                        "mask": [1] * n,
                        "advantages": float(adv[i]),
                    }
                )
                + "\n"
            )
    return path


def test_npz_replay_matches_the_formulas(tmp_path):
    """none: kl_k1 = mean(roll − old), max|Δp|, loss −mean(A) and ‖∂loss/∂lp‖ = √ΣA² / n at lp = old;
    tis: mean of clamp(e^(old − roll), 0.5, 5); over the masked-in tokens only."""
    old, roll, mask, adv = synthetic()
    out = tmp_path / "out"
    code, _, err = replay(write_npz(tmp_path / "d.npz", old, roll, mask, adv), "correction=none,tis", "--out", out)
    assert code == 0, err
    rows = {r["preset"]: r for r in read_csv(out / "replay.csv")}
    keep = mask > 0
    a = np.broadcast_to(adv[:, None], mask.shape)[keep].astype(np.float64)
    lr = (old.astype(np.float64) - roll)[keep]
    n = keep.sum()
    none, tis = rows["none"], rows["tis"]
    assert int(none["tokens"]) == n
    assert float(none["kl_k1"]) == pytest.approx(-lr.mean(), rel=1e-6)
    assert float(none["max_abs_prob_diff"]) == pytest.approx(np.abs(np.exp(old) - np.exp(roll))[keep].max(), rel=1e-6)
    assert float(none["loss"]) == pytest.approx(-a.mean(), rel=1e-6)
    assert float(none["grad_norm"]) == pytest.approx(np.sqrt((a**2).sum()) / n, rel=1e-6)
    clamped = np.clip(np.exp(lr), 0.5, 5.0)
    assert float(tis["is_weight_mean"]) == pytest.approx(clamped.mean(), rel=1e-6)
    assert float(tis["raw_weight_max"]) == pytest.approx(np.exp(lr).max(), rel=1e-6)
    assert float(tis["clamped_fraction"]) == pytest.approx(((np.exp(lr) < 0.5) | (np.exp(lr) > 5)).mean(), abs=1e-12)
    tokens = read_csv(out / "tokens.csv")
    assert len(tokens) == n
    assert float(tokens[0]["log_ratio"]) == pytest.approx(float(old[0, 0]) - float(roll[0, 0]), abs=1e-6)
    assert (out / "DONE").is_file()
    summary = {r["preset"]: r for r in read_csv(out / "replay_summary.csv")}
    assert int(summary["tis"]["tokens"]) == n and summary["tis"]["steps"] == "1"


def test_jsonl_and_npz_give_the_same_replay(tmp_path):
    """The same batch, padded in NPZ and ragged in JSONL, replays to the same numbers (rows differ in width
    only by padding, which no correction reads)."""
    old, roll, mask, adv = synthetic(seed=1, shift=0.8)
    a, b = tmp_path / "a", tmp_path / "b"
    assert replay(write_npz(tmp_path / "d.npz", old, roll, mask, adv), "--out", a)[0] == 0
    code, _, err = replay(write_jsonl(tmp_path / "d.jsonl", old, roll, mask, adv), "--out", b)
    assert code == 0, err
    left, right = read_csv(a / "replay.csv"), read_csv(b / "replay.csv")
    assert len(left) == len(right) > 10
    for x, y in zip(left, right):
        for key in x:
            if key in ("note", "preset", "ratio"):
                assert x[key] == y[key]
            elif x[key] != "":
                assert float(x[key]) == pytest.approx(float(y[key]), rel=1e-6, abs=1e-9), (x["preset"], key)


def test_npz_steps_are_separate_rows_and_rows_are_flushed(tmp_path):
    old, roll, mask, adv = synthetic(sequences=6)
    path = write_npz(tmp_path / "d.npz", old, roll, mask, adv, step=np.array([3, 3, 7, 7, 7, 9]))
    out = tmp_path / "out"
    assert replay(path, "correction=tis", "--out", out)[0] == 0
    rows = read_csv(out / "replay.csv")
    assert [(r["step"], r["sequences"]) for r in rows] == [("3", "2"), ("7", "3"), ("9", "1")]


def test_a_dump_without_old_evaluates_the_bypass_form_or_says_why_not(tmp_path):
    old, roll, mask, adv = synthetic()
    np.savez(tmp_path / "lp.npz", lp=old, roll=roll, mask=mask, advantages=adv)
    np.savez(tmp_path / "bare.npz", roll=roll, mask=mask, advantages=adv)
    out = tmp_path / "lp"
    assert replay(tmp_path / "lp.npz", "correction=tis", "--out", out)[0] == 0
    (row,) = read_csv(out / "replay.csv")
    assert row["ratio"] == "bypass" and "bypass form" in row["note"]
    keep = mask > 0
    assert float(row["kl_k1"]) == pytest.approx(-(old.astype(np.float64) - roll)[keep].mean(), rel=1e-6)
    out = tmp_path / "bare"
    assert replay(tmp_path / "bare.npz", "correction=tis", "--out", out)[0] == 0
    (row,) = read_csv(out / "replay.csv")
    assert row["applies"] == "0" and row["is_weight_mean"] == "" and "neither old" in row["note"]


def test_replay_refuses_to_overwrite_and_bad_names(tmp_path):
    old, roll, mask, adv = synthetic()
    path = write_npz(tmp_path / "d.npz", old, roll, mask, adv)
    out = tmp_path / "out"
    assert replay(path, "correction=tis", "--out", out)[0] == 0
    before = (out / "replay.csv").read_bytes()
    code, _, err = replay(path, "--out", out)
    assert code == 2 and "already holds" in err and len(err.strip().splitlines()) == 1
    assert (out / "replay.csv").read_bytes() == before
    for args, says in (
        (["correction=nope"], "unknown preset"),
        (["seed=3"], "expected correction="),
        (["--format", "tensorflow"], "--format"),
        (["loss=nope"], "unknown loss"),
    ):
        code, _, err = replay(path, *args, "--out", tmp_path / "x")
        assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err


def test_replay_is_deterministic(tmp_path):
    old, roll, mask, adv = synthetic(shift=1.0)
    path = write_npz(tmp_path / "d.npz", old, roll, mask, adv)
    assert replay(path, "--out", tmp_path / "a")[0] == 0
    assert replay(path, "--out", tmp_path / "b")[0] == 0
    for name in ("replay.csv", "replay_summary.csv", "tokens.csv"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_the_ten_lines_in_the_docs_write_a_file_replay_reads(tmp_path):
    import re

    import torch

    text = (Path(__file__).resolve().parent.parent / "docs" / "replay.md").read_text()
    code = next(block for block in re.findall(r"```python\n(.*?)```", text, re.S) if "def dump_replay_batch" in block)
    assert len(code.strip().splitlines()) <= 10
    namespace: dict = {}
    exec(code, namespace)
    old, roll, mask, adv = (torch.from_numpy(x) for x in synthetic())
    namespace["dump_replay_batch"](tmp_path / "step_7.npz", 7, old, roll, mask, adv)
    out = tmp_path / "out"
    code, _, err = replay(tmp_path, "correction=tis", "--out", out)
    assert code == 0, err
    (row,) = read_csv(out / "replay.csv")
    assert row["step"] == "7" and int(row["tokens"]) == int(mask.sum()) and row["loss"] != ""
