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
    "rollout.eos_token=0",  # responses of several lengths: tokens.csv skips their padding
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
def assert_replay_matches_metrics(replay_csv: Path, metrics_csv: Path, updates: int) -> None:
    """Every replay row equals metrics.csv's row of the same step and update in every correction metric."""
    logged = {(int(r["step"]), int(r["update"])): r for r in read_csv(metrics_csv)}
    rows = read_csv(replay_csv)
    assert [(int(r["step"]), int(r["update"])) for r in rows] == [(t, u) for t in (0, 2, 4) for u in range(updates)]
    assert all(float(r["kl_k3"]) > 1e-6 for r in rows)  # a mismatch to measure
    for r in rows:
        want = logged[int(r["step"]), int(r["update"])]
        for name in CORRECTION_METRICS:
            got = float(r[name])
            assert math.isclose(got, float(want[name]), rel_tol=1e-6, abs_tol=1e-9), (r["step"], r["update"], name)
    assert all(r["loss"] == "" and "no advantages" in r["note"] for r in rows)  # tokens.csv has none


def every_preset() -> list[str]:
    from runner import registry

    return registry.own_presets() + registry.faithful_presets()


FAST_REPLAY = (
    "seq-mask-tis",
    "openrlhf-bc71bb1/seq-mask-tis",
    "trl/sequence-mask",
    "verl/seq-mis",
    "nemo-rl/seq-mask-tis",
    "areal/m2po",
    "skyrl/geometric-token-mask-is",
    "roll/ratio-diff-segment",
    "slime/mis-batch-normalize",
)


def _without_opsm(presets: list[str]) -> list[str]:
    """Off-policy sequence masking reads the advantages and the current policy's log-probs, which a run's
    tokens.csv does not hold, so a replay of it cannot decide what the run's OPSM decided."""
    import yaml

    from runner import registry

    def opsm(name: str) -> bool:
        cfg = yaml.safe_load((registry.conf_dir() / "correction" / f"{name}.yaml").read_text())
        return cfg.get("opsm_delta") is not None

    return [p for p in presets if not opsm(p)]


@pytest.mark.parametrize(
    ("preset", "updates"),
    [
        # one preset a framework in the fast subset (make test-fast), every one under `make test`
        (p, 2) if p in FAST_REPLAY else pytest.param(p, 2, marks=pytest.mark.slow)
        for p in _without_opsm(every_preset())
    ]
    + [(p, 4) for p in ("seq-mask-tis", "icepop", "tis", "verl/geo-rs")],
)
def test_replay_reproduces_every_correction_metric_of_the_run(tmp_path, preset, updates):
    """At the run's own mini-batching (read from its .hydra/config.yaml; 2 is the default): a replay row per
    update, equal to that update's metrics.csv row."""
    run_dir = tmp_path / "run"
    # bf16 and staleness 2 give a mismatch that the preset's default band partly rejects
    code, _, err = run_cli(
        "run",
        *TINY_TRAIN,
        f"train.updates_per_step={updates}",
        f"correction={preset}",
        "mismatch.staleness=2",
        f"hydra.run.dir={run_dir}",
    )
    assert code == 0, err
    tokens = read_csv(run_dir / "tokens.csv")
    lengths = {}
    for t in tokens:
        lengths[t["step"], t["seq"]] = lengths.get((t["step"], t["seq"]), 0) + 1
    assert min(lengths.values()) < max(lengths.values())  # EOS padding: sequences of several lengths
    out = tmp_path / "replay"
    code, _, err = replay(run_dir / "tokens.csv", f"correction={preset}", "--out", out)
    assert code == 0, err
    assert_replay_matches_metrics(out / "replay.csv", run_dir / "metrics.csv", updates)


def test_replay_of_a_run_dir_at_every_preset_and_an_explicit_split(tmp_path):
    """The run dir itself as PATH, every preset, at the default updates_per_step (2); --minibatches 1 then
    gives one row a step, whose token counts add up its two mini-batches'."""
    run_dir = tmp_path / "run"
    code, _, err = run_cli("run", *TINY_TRAIN, "correction=tis", "mismatch.staleness=2", f"hydra.run.dir={run_dir}")
    assert code == 0, err
    presets = every_preset()
    code, _, err = replay(run_dir, "--out", tmp_path / "all")
    assert code == 0, err
    rows = read_csv(tmp_path / "all" / "replay.csv")
    assert len(rows) == 3 * 2 * len(presets)
    own = [r for r in rows if r["preset"] == "tis"]
    with open(tmp_path / "tis.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(own[0]))
        writer.writeheader()
        writer.writerows(own)
    assert_replay_matches_metrics(tmp_path / "tis.csv", run_dir / "metrics.csv", 2)
    code, _, err = replay(run_dir, "correction=tis", "--minibatches", "1", "--out", tmp_path / "whole")
    assert code == 0, err
    whole = read_csv(tmp_path / "whole" / "replay.csv")
    assert [int(r["update"]) for r in whole] == [0, 0, 0]
    for r in whole:
        parts = [int(o["tokens"]) for o in own if o["step"] == r["step"]]
        assert int(r["tokens"]) == sum(parts) and len(parts) == 2


def test_minibatches_split_by_sequence_index_and_refuse_too_many(tmp_path):
    old, roll, mask, adv = synthetic(sequences=5)
    path = write_npz(tmp_path / "d.npz", old, roll, mask, adv)
    code, _, err = replay(path, "correction=tis", "--minibatches", "2", "--out", tmp_path / "two")
    assert code == 0, err
    rows = read_csv(tmp_path / "two" / "replay.csv")
    # tensor_split(5, 2): sequences 0-2, then 3-4; the mask drops the last two tokens of sequences 0 and 3
    assert [(int(r["update"]), int(r["sequences"]), int(r["tokens"])) for r in rows] == [(0, 3, 16), (1, 2, 10)]
    err = one_line_exit_2(replay(path, "--minibatches", "6", "--out", tmp_path / "six"))
    assert "--minibatches 6" in err and "5 sequences" in err
    err = one_line_exit_2(replay(path, "--minibatches", "0", "--out", tmp_path / "zero"))
    assert "--minibatches" in err


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
    assert len([line for line in code.splitlines() if line.strip()]) <= 10
    namespace: dict = {}
    exec(code, namespace)
    old, roll, mask, adv = (torch.from_numpy(x) for x in synthetic())
    namespace["dump_replay_batch"](tmp_path / "step_7.npz", 7, old, roll, mask, adv)
    out = tmp_path / "out"
    code, _, err = replay(tmp_path, "correction=tis", "--out", out)
    assert code == 0, err
    (row,) = read_csv(out / "replay.csv")
    assert row["step"] == "7" and int(row["tokens"]) == int(mask.sum()) and row["loss"] != ""


def same_replay(a: Path, b: Path) -> None:
    """Two replay dirs agree on every number of replay.csv (to float32 rounding) and on every text cell."""
    left, right = read_csv(a / "replay.csv"), read_csv(b / "replay.csv")
    assert len(left) == len(right) > 0
    for x, y in zip(left, right):
        for key in x:
            if key in ("note", "preset", "ratio", "step"):
                assert x[key] == y[key], key
            elif x[key] != "" or y[key] != "":
                assert float(x[key]) == pytest.approx(float(y[key]), rel=1e-6, abs=1e-9), (x["preset"], key)


def npz_replay(tmp_path: Path, old, roll, mask, adv, step: int = 0, name: str = "npz") -> Path:
    n = len(mask)
    path = write_npz(tmp_path / f"{name}.npz", old, roll, mask, adv, step=np.full(n, step), seq=np.arange(n))
    out = tmp_path / f"{name}-out"
    code, _, err = replay(path, "--out", out)
    assert code == 0, err
    return out


# ----------------------------------------------------------------------------------------- slice 3: frameworks
SLIME_COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"  # THUDM/slime, slime/observability/train_data_utils.py


def slime_payload(old, roll, mask, adv, rollout_id: int) -> dict:
    """`_build_dump_payload`'s output at SLIME_COMMIT for one DP shard: format_version 2, samples sorted by
    rollout_position, each a dict of its response's tensors (response_lengths long)."""
    import torch

    samples = []
    for i in range(len(mask)):
        length = int(mask[i].sum())  # slime's tensors hold only the response: no padding
        keep = mask[i] > 0
        samples.append(
            {
                "data_parallel_rank": 0,
                "rollout_position": i,
                "tokens": torch.arange(length + 3),
                "response_lengths": length,
                "rollout_log_probs": torch.from_numpy(roll[i][keep]),
                "log_probs": torch.from_numpy(old[i][keep]),
                "advantages": torch.full((length,), float(adv[i])),
                "loss_masks": torch.ones(length, dtype=torch.int),
            }
        )
    layout = [{"rank": 0, "data_parallel_rank": 0, "sample_indices": None, "partition": list(range(len(mask)))}]
    return {"format_version": 2, "rollout_id": rollout_id, "rank": 0, "samples": samples, "dp_shards": layout}


def test_slime_reader(tmp_path):
    import torch

    old, roll, mask, adv = synthetic(seed=2, shift=0.6)
    dump = tmp_path / "dump" / "train_data"
    dump.mkdir(parents=True)
    torch.save(slime_payload(old, roll, mask, adv, 4), dump / "4.pt")
    (tmp_path / "dump" / "rollout_data").mkdir()
    torch.save({"samples": []}, tmp_path / "dump" / "rollout_data" / "4.pt")  # not read
    out = tmp_path / "slime-out"
    code, _, err = replay(tmp_path / "dump", "--format", "slime", "--out", out)
    assert code == 0, err
    same_replay(out, npz_replay(tmp_path, old, roll, mask, adv, step=4))


@pytest.mark.skipif(
    "IS_STUDY_SLIME_SRC" not in __import__("os").environ, reason="set IS_STUDY_SLIME_SRC to a slime checkout"
)
def test_slime_reader_reads_what_slimes_own_payload_builder_writes(tmp_path):
    """slime's `_build_dump_payload` is plain torch: run it from a checkout (IS_STUDY_SLIME_SRC), never copied here."""
    import importlib.util
    import os

    import torch

    source = Path(os.environ["IS_STUDY_SLIME_SRC"]) / "slime" / "observability" / "train_data_utils.py"
    spec = importlib.util.spec_from_file_location("slime_train_data_utils", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    old, roll, mask, adv = synthetic(seed=3, shift=0.6)
    keep = [mask[i] > 0 for i in range(len(mask))]
    rollout_data = {
        "partition": list(range(len(mask)))[::-1],  # slime sorts the samples back into rollout order
        "response_lengths": [int(k.sum()) for k in keep][::-1],
        "rollout_log_probs": [torch.from_numpy(roll[i][keep[i]]) for i in range(len(mask))][::-1],
        "log_probs": [torch.from_numpy(old[i][keep[i]]) for i in range(len(mask))][::-1],
        "advantages": [torch.full((int(keep[i].sum()),), float(adv[i])) for i in range(len(mask))][::-1],
        "loss_masks": [torch.ones(int(keep[i].sum()), dtype=torch.int) for i in range(len(mask))][::-1],
    }
    shard = {"rank": 0, "data_parallel_rank": 0, "rollout_data": rollout_data}
    (tmp_path / "train_data").mkdir()
    torch.save(module._build_dump_payload([shard], rollout_id=2, writer_rank=0), tmp_path / "train_data" / "2.pt")
    out = tmp_path / "slime-out"
    code, _, err = replay(tmp_path / "train_data", "--out", out)
    assert code == 0, err
    same_replay(out, npz_replay(tmp_path, old, roll, mask, adv, step=2))


NEMO_RL_COMMIT = "7ea279abfbeb698b092856d0dab61e7cf39bc909"  # NVIDIA-NeMo/RL, nemo_rl/utils/logger.py, grpo.py


def test_nemo_rl_reader(tmp_path):
    """Lines as log_batched_dict_as_jsonl writes them at NEMO_RL_COMMIT: make_microbatch_iterator(1) keeps the
    batch dimension, so every field of a line is a one-sample batch; prompt tokens (mask 0) lead each row."""
    old, roll, mask, adv = synthetic(seed=4, shift=0.6)
    prompt = 2
    path = tmp_path / "logs" / "train_data_step7.jsonl"
    path.parent.mkdir()
    with open(path, "w") as f:
        for i in range(len(mask)):
            pad = [0.0] * prompt
            sample = {
                "content": [["a prompt"]],
                "rewards": [1.0],
                "input_lengths": [prompt + mask.shape[1]],
                "token_ids": [list(range(prompt + mask.shape[1]))],
                "token_loss_mask": [[0] * prompt + mask[i].astype(int).tolist()],
                "sample_loss_mask": [1.0],
                "advantages": [pad + [float(adv[i])] * mask.shape[1]],
                "generation_logprobs": [pad + roll[i].tolist()],
                "prev_logprobs": [pad + old[i].tolist()],
            }
            f.write(json.dumps({**sample, "idx": i}) + "\n")
    out = tmp_path / "nemo-out"
    code, _, err = replay(path.parent, "--out", out)
    assert code == 0, err
    same_replay(out, npz_replay(tmp_path, old, roll, mask, adv, step=7))


SKYRL_COMMIT = (
    "a9564572eb8e91076be43c1bd5e4615e3de17265"  # NovaSky-AI/SkyRL, skyrl/backends/skyrl_train/training_batch.py
)


def write_skyrl_pickle(path: Path, tensors: dict, monkeypatch, metadata=None) -> None:
    """TrainingInputBatch.save at SKYRL_COMMIT: pickle.dump of a batch whose __reduce__ is
    (_rebuild_tensor_batch, (TrainingInputBatch, state)), tensors serialised by _serialize_tensor's numpy path.
    The module names are registered under SkyRL's own so that pickle records them as SkyRL does."""
    import pickle
    import sys
    import types

    name = "skyrl.backends.skyrl_train.training_batch"
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        monkeypatch.setitem(sys.modules, ".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    module = sys.modules[name]

    def _rebuild_tensor_batch(cls, state):
        raise AssertionError("never called: the reader must not run SkyRL's code")

    class TrainingInputBatch(dict):
        def __reduce__(self):
            batch_dict = {
                k: {"format": "numpy", "data": v.tobytes(), "shape": v.shape, "dtype": str(v.dtype)}
                for k, v in self.items()
            }
            return (
                _rebuild_tensor_batch,
                (type(self), {"batch_dict": batch_dict, "batch_size": 8, "device": None, "metadata": metadata or {}}),
            )

    for obj in (_rebuild_tensor_batch, TrainingInputBatch):
        obj.__module__, obj.__qualname__ = name, obj.__name__
        setattr(module, obj.__name__, obj)
    with open(path, "wb") as f:
        pickle.dump(TrainingInputBatch(tensors), f)


def left_pad(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Each row's masked-in values right-aligned, as SkyRL pads."""
    out = np.zeros_like(x)
    for i in range(len(x)):
        values = x[i][mask[i] > 0]
        out[i, x.shape[1] - len(values) :] = values
    return out


def test_skyrl_reader_left_padded(tmp_path, monkeypatch):
    old, roll, mask, adv = synthetic(seed=5, shift=0.6)
    adv_tokens = np.broadcast_to(adv[:, None], mask.shape).astype(np.float32)
    dump = tmp_path / "export" / "dumped_data"
    dump.mkdir(parents=True)
    tensors = {
        "rollout_logprobs": left_pad(roll, mask),
        "action_log_probs": left_pad(old, mask),
        "advantages": left_pad(adv_tokens, mask),
        "loss_mask": left_pad(mask, mask),
        "response_mask": left_pad(mask, mask).astype(np.int64),
        "sequences": np.zeros((len(mask), 9), dtype=np.int64),
    }
    write_skyrl_pickle(dump / "global_step_3_training_input.pkl", tensors, monkeypatch)
    out = tmp_path / "skyrl-out"
    code, _, err = replay(tmp_path / "export", "--out", out)
    assert code == 0, err
    same_replay(out, npz_replay(tmp_path, old, roll, mask, adv, step=3))


PRIME_RL_COMMIT = "559b44772e471d1538537b8805cc77f3824a5e64"  # PrimeIntellect-ai/prime-rl, transports/rollouts/types.py


def write_prime_rl(path: Path, roll, mask, adv, per_micro: int = 3) -> None:
    """rank_{r}.bin at PRIME_RL_COMMIT: msgspec's msgpack of list[MicroBatch]; array_like structs are arrays in
    field order, samples packed end to end (sequence_lengths)."""
    import msgpack

    micro_batches = []
    for start in range(0, len(mask), per_micro):
        rows = range(start, min(start + per_micro, len(mask)))
        lengths = [mask.shape[1]] * len(rows)
        flat = lambda x: [float(v) for i in rows for v in x[i]]  # noqa: E731
        micro_batches.append(
            [
                list(range(sum(lengths))),  # input_ids
                [bool(m) for i in rows for m in mask[i]],  # loss_mask
                [float(adv[i]) for i in rows for _ in range(mask.shape[1])],  # advantages
                flat(roll),  # inference_logprobs
                [p for _ in rows for p in range(mask.shape[1])],  # position_ids
                lengths,  # sequence_lengths
                [1.0] * sum(lengths),  # temperatures
                ["env"] * sum(lengths),  # env_names
                lengths,  # seq_lens
            ]
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgpack.packb(micro_batches))


def test_prime_rl_reader_has_no_trainer_logprobs(tmp_path):
    old, roll, mask, adv = synthetic(seed=6)
    half = len(mask) // 2
    write_prime_rl(tmp_path / "rollouts" / "step_5" / "rank_0.bin", roll[:half], mask[:half], adv[:half])
    write_prime_rl(tmp_path / "rollouts" / "step_5" / "rank_1.bin", roll[half:], mask[half:], adv[half:])
    write_prime_rl(tmp_path / "rollouts" / "step_6" / "rank_0.bin", roll, mask, adv)
    out = tmp_path / "prime-out"
    code, _, err = replay(tmp_path / "rollouts", "correction=tis,icepop", "--out", out)
    assert code == 0, err
    rows = read_csv(out / "replay.csv")
    assert [(r["step"], r["preset"]) for r in rows] == [("5", "tis"), ("5", "icepop"), ("6", "tis"), ("6", "icepop")]
    assert all(r["applies"] == "0" and "neither old" in r["note"] for r in rows)
    assert int(rows[0]["tokens"]) == int(mask.sum())
    tokens = read_csv(out / "tokens.csv")
    step5 = [t for t in tokens if t["step"] == "5"]
    assert [float(t["roll"]) for t in step5] == pytest.approx(roll[mask > 0].tolist(), abs=1e-6)
    assert all(t["old"] == "nan" for t in step5)


# ----------------------------------------------------------------------------------------- slice 2: safety
class Planted:
    """A class a dump must not be able to name."""

    def __reduce__(self):
        import os

        return (os.system, ("touch PLANTED",))


def one_line_exit_2(result) -> str:
    code, _, err = result
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_pickle_that_runs_code_is_refused_and_not_run(tmp_path, monkeypatch):
    import pickle

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "dumped_data" / "global_step_1_training_input.pkl"
    path.parent.mkdir()
    path.write_bytes(pickle.dumps({"batch_dict": Planted()}))
    err = one_line_exit_2(replay(path, "--out", tmp_path / "out"))
    assert str(path) in err and "refused to unpickle" in err and ("posix.system" in err or "os.system" in err)
    assert not (tmp_path / "PLANTED").exists()


def test_pt_that_names_a_class_is_refused(tmp_path, monkeypatch):
    import torch

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "train_data" / "1.pt"
    path.parent.mkdir()
    torch.save({"format_version": 2, "samples": [Planted()]}, path)
    err = one_line_exit_2(replay(path, "--out", tmp_path / "out"))
    assert str(path) in err and "weights_only=True" in err and ("system" in err or "Planted" in err), err
    assert not (tmp_path / "PLANTED").exists()


def test_trust_lifts_the_restriction_and_says_so(tmp_path, monkeypatch):
    """A SkyRL batch whose metadata holds a datetime (a type outside the allow-list): refused, then read with --trust."""
    import datetime

    old, roll, mask, adv = synthetic()
    path = tmp_path / "dumped_data" / "global_step_0_training_input.pkl"
    path.parent.mkdir()
    tensors = {
        "rollout_logprobs": roll,
        "action_log_probs": old,
        "advantages": np.broadcast_to(adv[:, None], mask.shape).copy(),
        "loss_mask": mask,
    }
    write_skyrl_pickle(path, tensors, monkeypatch, metadata={"when": datetime.datetime(2026, 1, 1)})
    err = one_line_exit_2(replay(path, "--out", tmp_path / "refused"))
    assert "datetime.datetime" in err and "--trust" in err
    code, _, err = replay(path, "--trust", "--out", tmp_path / "trusted")
    assert code == 0 and "--trust" in err and "can run any code" in err
    assert len(read_csv(tmp_path / "trusted" / "replay.csv")) == len(every_preset())


def test_trust_loads_a_pt_that_holds_a_non_tensor_object_and_says_so(tmp_path):
    """A slime payload whose metadata holds a datetime (not a tensor, a container or a torch type): torch.load
    with weights_only=True refuses it, naming the file and the type; with --trust it is loaded, the stderr line
    says so, and the replay equals the NPZ of the same batch."""
    import datetime

    import torch

    old, roll, mask, adv = synthetic(seed=3, shift=0.5)
    path = tmp_path / "dump" / "train_data" / "6.pt"
    path.parent.mkdir(parents=True)
    payload = slime_payload(old, roll, mask, adv, 6)
    payload["saved_at"] = datetime.datetime(2026, 12, 2, 3, 30)
    torch.save(payload, path)
    err = one_line_exit_2(replay(path, "--format", "slime", "--out", tmp_path / "refused"))
    assert str(path) in err and "datetime" in err and "weights_only=True" in err and "--trust" in err, err
    assert not (tmp_path / "refused").exists()
    code, _, err = replay(path, "--format", "slime", "--trust", "--out", tmp_path / "trusted")
    assert code == 0, err
    (line,) = err.strip().splitlines()
    assert "--trust" in line and ".pt files are loaded unrestricted" in line and "can run any code" in line
    same_replay(tmp_path / "trusted", npz_replay(tmp_path, old, roll, mask, adv, step=6))


def test_size_cap(tmp_path):
    old, roll, mask, adv = synthetic()
    path = write_npz(tmp_path / "d.npz", old, roll, mask, adv)
    err = one_line_exit_2(replay(path, "--max-bytes", "100", "--out", tmp_path / "out"))
    assert str(path) in err and "cap" in err


def test_truncated_files_give_one_line(tmp_path, monkeypatch):
    import torch

    old, roll, mask, adv = synthetic()
    cases = {}
    pt = tmp_path / "train_data" / "1.pt"
    pt.parent.mkdir()
    torch.save(slime_payload(old, roll, mask, adv, 1), pt)
    cases[pt] = pt.read_bytes()
    pkl = tmp_path / "dumped_data" / "global_step_1_training_input.pkl"
    pkl.parent.mkdir()
    write_skyrl_pickle(pkl, {"rollout_logprobs": roll, "loss_mask": mask, "advantages": mask}, monkeypatch)
    cases[pkl] = pkl.read_bytes()
    binary = tmp_path / "step_1" / "rank_0.bin"
    write_prime_rl(binary, roll, mask, adv)
    cases[binary] = binary.read_bytes()
    npz = write_npz(tmp_path / "d.npz", old, roll, mask, adv)
    cases[npz] = npz.read_bytes()
    jsonl = write_jsonl(tmp_path / "d.jsonl", old, roll, mask, adv)
    cases[jsonl] = jsonl.read_bytes()
    for path, data in cases.items():
        path.write_bytes(data[: len(data) * 2 // 3])
        err = one_line_exit_2(replay(path, "--out", tmp_path / "out"))
        assert str(path) in err, err
        assert not (tmp_path / "out").exists()  # nothing read, nothing made


def test_mismatched_and_missing_fields_name_file_step_and_field(tmp_path):
    old, roll, mask, adv = synthetic()
    # a sequence whose old has one value more than its mask
    path = tmp_path / "bad.jsonl"
    path.write_text(
        json.dumps(
            {"step": 4, "seq": 0, "old": [-1.0, -2.0, -3.0], "roll": [-1.0, -2.0], "mask": [1, 1], "advantages": 1.0}
        )
        + "\n"
    )
    err = one_line_exit_2(replay(path, "--out", tmp_path / "o1"))
    assert str(path) in err and "step 4" in err and "'old'" in err
    # a missing field
    np.savez(tmp_path / "noroll.npz", old=old, mask=mask, advantages=adv)
    err = one_line_exit_2(replay(tmp_path / "noroll.npz", "--out", tmp_path / "o2"))
    assert "noroll.npz" in err and "'roll'" in err and "missing" in err
    # NaN where a mask belongs
    bad = mask.copy()
    bad[2, 1] = np.nan
    np.savez(tmp_path / "nanmask.npz", old=old, roll=roll, mask=bad, advantages=adv, step=np.full(len(mask), 9))
    err = one_line_exit_2(replay(tmp_path / "nanmask.npz", "--out", tmp_path / "o3"))
    assert "nanmask.npz" in err and "step 9" in err and "'mask'" in err and "nan" in err
    # shapes that disagree
    np.savez(tmp_path / "shape.npz", old=old[:, :-1], roll=roll, mask=mask, advantages=adv)
    err = one_line_exit_2(replay(tmp_path / "shape.npz", "--out", tmp_path / "o4"))
    assert "'old'" in err and "disagrees" in err
    # prime-rl: sequence_lengths that do not add up
    import msgpack

    binary = tmp_path / "step_2" / "rank_0.bin"
    binary.parent.mkdir()
    binary.write_bytes(
        msgpack.packb([[[1, 2], [True, True], [0.5, 0.5], [-1.0, -1.0], [0, 1], [3], [1.0, 1.0], ["e", "e"], [2]]])
    )
    err = one_line_exit_2(replay(binary, "--out", tmp_path / "o5"))
    assert "step 2" in err and "'sequence_lengths'" in err
    # a NeMo-RL line without its rollout log-probs
    nemo = tmp_path / "train_data_step3.jsonl"
    nemo.write_text(json.dumps({"token_loss_mask": [[1]], "advantages": [[1.0]], "idx": 0}) + "\n")
    err = one_line_exit_2(replay(nemo, "--out", tmp_path / "o6"))
    assert "step 3" in err and "'generation_logprobs'" in err


# ----------------------------------------------------------------------------------------- slice 5: figures, report
def replayed(tmp_path: Path, name: str = "r", *presets: str) -> Path:
    old, roll, mask, adv = synthetic(seed=7, sequences=24, tokens=12, shift=0.5)
    path = write_npz(tmp_path / f"{name}.npz", old, roll, mask, adv, step=np.arange(24) // 8)
    out = tmp_path / f"{name}-out"
    code, _, err = replay(path, *presets, "--out", out)
    assert code == 0, err
    return out


@pytest.mark.parametrize("style", ["default", "paper"])
def test_plot_on_a_replay_dir_draws_its_kinds_with_the_bands(tmp_path, style):
    import math as m

    from analysis.figures import replay as replay_figures
    from analysis.replay import read_replay, read_tokens

    out = replayed(tmp_path, "r", "correction=tis,trl/token-mask,seq-mask-tis,geo-mask")
    code, stdout, err = run_cli("plot", str(out), "--style", style)
    assert code == 0, err
    names = sorted(Path(p).name for p in stdout.split())
    assert names == sorted(f"{k}.{e}" for k in replay_figures.KINDS for e in ("png", "pdf"))
    fig = replay_figures.mismatch_figure(out, read_replay(out), read_tokens(out), style)
    histogram = fig.axes[1]
    edges = sorted(round(line.get_xdata()[0], 6) for line in histogram.get_lines() if line.get_gid() == "band")
    assert edges == [round(m.log(0.5), 6), round(m.log(3.0), 6), round(m.log(5.0), 6)]  # tis [0.5, 5], trl [—, 3]
    assert histogram.get_xlabel() and histogram.get_ylabel() and histogram.get_yscale() == "log"
    bands = replay_figures.bands_figure(out, read_replay(out), read_tokens(out), style)
    geo = sorted(round(line.get_xdata()[0], 6) for line in bands.axes[1].get_lines() if line.get_gid() == "band")
    # seq-mask-tis filters on the geometric mean at [0.5, 5], geo-mask at [0.999, 1.001]
    assert geo == [round(m.log(v), 6) for v in (0.5, 0.999, 1.001, 5.0)]


def test_plot_skips_what_a_dump_without_trainer_logprobs_cannot_show(tmp_path):
    old, roll, mask, adv = synthetic()
    np.savez(tmp_path / "bare.npz", roll=roll, mask=mask, advantages=adv)
    assert replay(tmp_path / "bare.npz", "--out", tmp_path / "bare")[0] == 0
    code, _, err = run_cli("plot", str(tmp_path / "bare"))
    assert code == 2 and "nothing to plot" in err and "no trainer log-probs" in err


def test_report_on_a_replay_dir(tmp_path):
    """The report's shipped-band rejection (pandas over tokens.csv) equals the algebra's masked fraction
    (replay_summary.csv); its advised bands reject what they say; the NaN step is named."""
    from analysis.replay import band_of, read_tokens, statistics, symmetric_band_rejecting

    old, roll, mask, adv = synthetic(seed=8, sequences=40, tokens=10, shift=0.4)
    roll[5, 1] = np.nan  # a masked-in token of step 1 (sequences 4-7)
    path = write_npz(tmp_path / "d.npz", old, roll, mask, adv, step=np.arange(40) // 4)
    out = tmp_path / "out"
    assert replay(path, "correction=icepop,seq-mis,tis", "--out", out)[0] == 0
    code, stdout, err = run_cli("report", str(out))
    assert code == 0, err
    text = (out / "report.md").read_text()
    summary = {r["preset"]: r for r in read_csv(out / "replay_summary.csv")}
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]]
        for line in text.splitlines()
        if line.startswith(("| seq-mis ", "| icepop "))
    }
    seq_masked = float(summary["seq-mis"]["seq_masked_fraction"])
    assert seq_masked > 0.05
    assert rows["seq-mis"][4] == f"{100 * seq_masked:.3g}%"
    nonfinite = text.split("## Non-finite losses")[1].split("## Threshold advice")[0]
    # the NaN roll: tis weights it (NaN loss at step 1); icepop and seq-mis reject it (NaN fails every band test)
    assert "| tis      | 1       | 1       | 1 " in nonfinite
    assert "| icepop " not in nonfinite and "| seq-mis " not in nonfinite
    # an advised band rejects its fraction of the finite units
    stats = statistics(read_tokens(out))
    band = band_of("icepop")
    for fraction in (0.01, 0.05, 0.2):
        low, high = symmetric_band_rejecting(stats["token"], fraction, two_sided=True)
        finite = stats["token"][np.isfinite(stats["token"])]
        outside = ((finite < np.log(low)) | (finite > np.log(high))).mean()
        assert outside == pytest.approx(fraction, abs=2 / len(finite))
    assert band.level == "token" and band.kind == "filter"


def test_restricted_unpickler_rebuilds_tensors_and_arrays_and_nothing_else(tmp_path):
    """A pickled torch tensor names torch.storage._load_from_bytes, whose bytes are a torch.save stream: it is
    loaded with weights_only=True, so a planted class inside it is refused too."""
    import io
    import pickle

    import torch

    from runner.errors import UserError
    from runner.replay.limits import Limits
    from runner.replay.safe_load import load_pickle

    good = tmp_path / "good.pkl"
    good.write_bytes(pickle.dumps({"t": torch.tensor([1.5, -2.0]), "a": np.arange(3.0), "d": torch.device("cpu")}))
    loaded = load_pickle(good, Limits())
    assert torch.equal(loaded["t"], torch.tensor([1.5, -2.0])) and loaded["a"].tolist() == [0.0, 1.0, 2.0]
    inner = io.BytesIO()
    torch.save(Planted(), inner)
    bad = tmp_path / "bad.pkl"

    class Storage:
        def __reduce__(self):
            return (torch.storage._load_from_bytes, (inner.getvalue(),))

    bad.write_bytes(pickle.dumps([Storage()]))
    with pytest.raises(UserError, match=r"bad.pkl: refused to load .*system.* inside a pickled tensor"):
        load_pickle(bad, Limits())
    assert not Path("PLANTED").exists()


def test_skyrl_bfloat16_entries_are_read_through_weights_only_load():
    import io

    import torch

    from runner.replay.skyrl import _tensor

    buffer = io.BytesIO()
    torch.save(torch.tensor([[0.5, -1.25]], dtype=torch.bfloat16), buffer)
    value = _tensor({"format": "torch", "data": buffer.getvalue()}, "f.pkl", 0, "rollout_logprobs")
    assert value.dtype == torch.float32 and value.tolist() == [[0.5, -1.25]]


def test_figures_and_report_join_a_steps_minibatch_rows(tmp_path):
    """A replay split in two mini-batches, joined by analysis.replay.by_step, gives the unsplit replay's step
    rows (token counts, token- and sequence-weighted fractions, k3, max|Δp|); plot and report read it."""
    from analysis.replay import read_replay

    run_dir = tmp_path / "run"
    code, _, err = run_cli("run", *TINY_TRAIN, "correction=tis", "mismatch.staleness=2", f"hydra.run.dir={run_dir}")
    assert code == 0, err
    presets = "correction=tis,seq-mis,icepop"
    assert replay(run_dir, presets, "--out", tmp_path / "split")[0] == 0
    assert replay(run_dir, presets, "--minibatches", "1", "--out", tmp_path / "whole")[0] == 0
    assert len(read_csv(tmp_path / "split" / "replay.csv")) == 2 * len(read_csv(tmp_path / "whole" / "replay.csv"))
    split, whole = read_replay(tmp_path / "split"), read_replay(tmp_path / "whole")
    assert list(split["step"]) == list(whole["step"]) and list(split["preset"]) == list(whole["preset"])
    assert list(split["tokens"]) == list(whole["tokens"]) and list(split["sequences"]) == list(whole["sequences"])
    assert split["seq_masked_fraction"].between(0.01, 0.99).any()  # seq-mis rejects some sequences: weights matter
    for column in ("token_masked_fraction", "seq_masked_fraction", "clamped_fraction", "kl_k3", "max_abs_prob_diff"):
        assert np.allclose(split[column], whole[column], rtol=1e-6, atol=1e-12), column
    code, stdout, err = run_cli("plot", str(tmp_path / "split"))
    assert code == 0, err
    assert run_cli("report", str(tmp_path / "split"))[0] == 0
    report = (tmp_path / "split" / "report.md").read_text()
    assert f"{int(whole.groupby('step')['tokens'].first().sum()):,} tokens" in report


# ----------------------------------------------------------------------------------------- Parquet
def docs_block(marker: str) -> str:
    import re

    text = (Path(__file__).resolve().parent.parent / "docs" / "replay.md").read_text()
    return next(block for block in re.findall(r"```python\n(.*?)```", text, re.S) if marker in block)


def test_parquet_written_by_the_docs_ten_lines_replays_as_the_npz(tmp_path):
    """The docs' Parquet writer, step 3 in one file and step 5 in another: the same replay as the NPZ of the
    same batches, row for row."""
    pytest.importorskip("pyarrow")
    import torch

    code = docs_block("def dump_replay_parquet")
    assert len([line for line in code.splitlines() if line.strip()]) <= 10
    namespace: dict = {}
    exec(code, namespace)
    dump = tmp_path / "dump"
    dump.mkdir()
    npz_rows = []
    for step, seed in ((3, 1), (5, 2)):
        old, roll, mask, adv = synthetic(seed=seed, shift=0.8)
        namespace["dump_replay_parquet"](
            dump / f"step_{step}.parquet", step, *map(torch.from_numpy, (old, roll, mask, adv))
        )
        npz_rows.append((old, roll, mask, adv, np.full(len(mask), step)))
    old, roll, mask, adv, steps = (np.concatenate(parts) for parts in zip(*npz_rows))
    npz = write_npz(tmp_path / "d.npz", old, roll, mask, adv, step=steps, seq=np.tile(np.arange(8), 2))
    assert replay(npz, "--out", tmp_path / "npz")[0] == 0
    code, _, err = replay(dump, "--out", tmp_path / "parquet")
    assert code == 0, err
    same_replay(tmp_path / "npz", tmp_path / "parquet")
    assert {r["step"] for r in read_csv(tmp_path / "parquet" / "replay.csv")} == {"3", "5"}
    assert replay(dump / "step_3.parquet", "--format", "parquet", "--out", tmp_path / "named")[0] == 0


def test_parquet_checks_and_one_line_errors(tmp_path):
    pytest.importorskip("pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    def table(**columns) -> Path:
        path = tmp_path / f"t{len(list(tmp_path.iterdir()))}.parquet"
        pq.write_table(pa.table(columns), path)
        return path

    good = dict(step=[0, 0], roll=[[-1.0, -2.0], [-1.5]], old=[[-1.1, -2.0], [-1.4]], mask=[[1, 1], [1]])
    code, _, err = replay(table(**good, advantages=[1.0, -1.0]), "correction=tis", "--out", tmp_path / "ok")
    assert code == 0, err
    (row,) = read_csv(tmp_path / "ok" / "replay.csv")
    assert int(row["tokens"]) == 3 and row["loss"] != ""
    # ratio old − roll at the three tokens: e^-0.1, e^0, e^0.1; tis's weight is not clamped there
    assert float(row["raw_weight_mean"]) == pytest.approx((math.exp(-0.1) + 1 + math.exp(0.1)) / 3, rel=1e-6)
    err = one_line_exit_2(replay(table(**{**good, "old": [[-1.1], [-1.4]]}), "--out", tmp_path / "a"))
    assert "step 0" in err and "'old'" in err and "sequence 0 has 1 values, its mask 2" in err
    err = one_line_exit_2(replay(table(step=[0], roll=[[-1.0]]), "--out", tmp_path / "b"))
    assert "'mask'" in err and "missing" in err
    err = one_line_exit_2(replay(table(**{**good, "mask": [[1, float("nan")], [1]]}), "--out", tmp_path / "c"))
    assert "'mask'" in err and "nan" in err
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(table(**good).read_bytes()[:-20])
    err = one_line_exit_2(replay(broken, "--out", tmp_path / "d"))
    assert str(broken) in err and "Parquet" in err


def test_parquet_without_pyarrow_names_the_extra(tmp_path, monkeypatch):
    import sys

    path = tmp_path / "d.parquet"
    path.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow now raises ImportError
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    err = one_line_exit_2(replay(path, "--out", tmp_path / "out"))
    assert str(path) in err and "pip install 'is-study[tracking]'" in err
    assert not (tmp_path / "out").exists()


def test_a_run_tokens_csv_missing_its_last_sequences_keeps_the_runs_split(tmp_path):
    """tokens.csv names only sequences with a logged token. With the last four sequences' rows gone, the step
    is still rebuilt at the run's 16 sequences, so mini-batch 0 (sequences 0-7) is the run's update 0 exactly;
    split at the 12 rows left it would be sequences 0-5."""
    run_dir = tmp_path / "run"
    code, _, err = run_cli("run", *TINY_TRAIN, "correction=tis", "mismatch.staleness=2", f"hydra.run.dir={run_dir}")
    assert code == 0, err
    lines = (run_dir / "tokens.csv").read_text().splitlines(keepends=True)
    seq_at = lines[0].strip().split(",").index("seq")
    kept = [line for line in lines[1:] if int(line.split(",")[seq_at]) < 12]
    (run_dir / "tokens.csv").write_text("".join([lines[0], *kept]))
    out = tmp_path / "replay"
    assert replay(run_dir / "tokens.csv", "correction=tis", "--out", out)[0] == 0
    rows = read_csv(out / "replay.csv")
    logged = {(r["step"], r["update"]): r for r in read_csv(run_dir / "metrics.csv")}
    assert [(r["step"], r["update"], r["sequences"]) for r in rows] == [
        (t, u, n) for t in ("0", "2", "4") for u, n in (("0", "8"), ("1", "4"))
    ]
    for r in (r for r in rows if r["update"] == "0"):
        for name in CORRECTION_METRICS:
            want = float(logged[r["step"], "0"][name])
            assert math.isclose(float(r[name]), want, rel_tol=1e-6, abs_tol=1e-9), (r["step"], name)
