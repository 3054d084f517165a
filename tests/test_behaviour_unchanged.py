"""Refactoring guard: every shipped experiment, run tiny, writes the same bytes it wrote before.

Bigram's experiments, three of each of the mlp's and the transformer's (train and probe), a few engine settings,
and one small sweep with its claim's verdict line are pinned.

Each case below is one job of a shipped experiment (its config group choices and swept values), shrunk
to a few steps, plus a few engine settings no experiment sweeps (fp8, EOS padding, top-p, logit
noise). With log.timing=false a run's metrics.csv, tokens.csv and probe.csv depend only on the config
and the seed, so they are compared byte for byte with the files in tests/golden/experiments/, which
were written by the code before the world protocol and the training library existed.

The bytes depend on the platform as well as on the code: torch's CPU kernels (MKL's matmuls and vector maths,
ATen's SIMD reductions) round differently on different processors, and six training steps carry a last bit up
to ~1e-3 relative in the smallest metrics. tests/conftest.py pins that arithmetic to one branch every x86-64
CPU with AVX2 computes alike (tests/helpers/arithmetic.py), and tests/golden/PLATFORM records the torch version
and the fingerprint of the arithmetic that wrote the files. Where this machine's matches, the comparison is
byte for byte; elsewhere it is cell by cell: every non-numeric cell and the row count exact, every number
within REL_TOL relative (ABS_TOL for values near 0), which a real change of behaviour (a different token, a
changed formula) exceeds.
To rewrite the files after an intended change of behaviour: ISSTUDY_WRITE_GOLDEN=1 python -m pytest
tests/test_behaviour_unchanged.py (it writes tests/golden/PLATFORM too; the claims' pins in
tests/test_claims.py are then re-read on the same platform), and say why in the commit.
"""

from __future__ import annotations

import csv
import math
import os
import shutil
from pathlib import Path

import pytest

from tests.helpers.arithmetic import PLATFORM_FILE, pinned_platform, platform
from tests.helpers.cli import run_cli

pytestmark = pytest.mark.slow  # tiny runs of every shipped experiment in every world, and a sweep

GOLDEN = Path(__file__).resolve().parent / "golden" / "experiments"
WRITE = os.environ.get("ISSTUDY_WRITE_GOLDEN") == "1"
FILES = ("metrics.csv", "tokens.csv", "probe.csv")
REL_TOL = 3e-3  # another platform's rounding, carried through six steps: measured ≤ 1.9e-3 (mlp bf16, unpinned)
ABS_TOL = 1e-9

TRAIN_TINY = ["train.steps=6", "rollout.batch_size=2", "rollout.group_size=4", "log.timing=false", "log.tokens_every=3"]
PROBE_TINY = [
    "probe.repeats=8",
    "probe.n_boot=100",
    "probe.pretrain_steps=2",
    "rollout.batch_size=2",
    "rollout.group_size=4",
]

# A short SFT warm start, cached per test (the cache directory is set per run below).
TRANSFORMER_TINY = ["policy.sft.steps=10", "policy.sft.eval_samples=32"]

CASES = {
    "tis-tames-mismatch-0": [
        "experiment=bigram/tis-tames-mismatch",
        "mismatch.logit_noise=0.0",
        "correction=none",
        "seed=0",
        *TRAIN_TINY,
    ],
    "tis-tames-mismatch-1": [
        "experiment=bigram/tis-tames-mismatch",
        "mismatch.logit_noise=1.0",
        "correction=tis",
        "seed=1",
        *TRAIN_TINY,
    ],
    "bias-variance-by-level": ["experiment=bigram/bias-variance-by-level", "rollout.seq_len=8", *PROBE_TINY],
    "mismatch-low-prob-tokens": [
        "experiment=bigram/mismatch-low-prob-tokens",
        "mismatch.precision=fp16",
        "seed=2",
        *TRAIN_TINY,
    ],
    "precision-vs-algorithm": [
        "experiment=bigram/precision-vs-algorithm",
        "mismatch.precision=bf16",
        "correction=geo-mask",
        "seed=1",
        *TRAIN_TINY,
    ],
    "staleness-breaks-tis": [
        "experiment=bigram/staleness-breaks-tis",
        "correction=seq-mis",
        "mismatch.staleness=4",
        "seed=2",
        *TRAIN_TINY,
    ],
    "seed-bug-end-to-end": [
        "experiment=bigram/seed-bug-end-to-end",
        "correction=openrlhf-bc71bb1/seq-mask-tis",
        "train.on_nonfinite=apply",
        "seed=0",
        "mismatch.outlier_rate=0.2",
        *TRAIN_TINY,
    ],
    "staleness-ladder": [
        "experiment=bigram/staleness-ladder",
        "correction=seq-tis",
        "mismatch.staleness=2",
        "seed=1",
        *TRAIN_TINY,
    ],
    "threshold-tradeoff": [
        "experiment=bigram/threshold-tradeoff",
        "correction=icepop",
        "band=tight",
        "mismatch.staleness=2",
        "seed=2",
        *TRAIN_TINY,
    ],
    "default-probe": ["study=probe", *PROBE_TINY],
    "mlp-tis-tames-mismatch": [
        "experiment=mlp/tis-tames-mismatch",
        "mismatch.precision=bf16",
        "correction=tis",
        "seed=1",
        *TRAIN_TINY,
    ],
    "mlp-seed-bug-end-to-end": [
        "experiment=mlp/seed-bug-end-to-end",
        "correction=openrlhf-bc71bb1/seq-mask-tis",
        "train.on_nonfinite=apply",
        "seed=0",
        *TRAIN_TINY,
    ],
    "mlp-bias-variance-by-level": ["experiment=mlp/bias-variance-by-level", "rollout.seq_len=8", *PROBE_TINY],
    "transformer-tis-tames-mismatch": [
        "experiment=transformer/tis-tames-mismatch",
        "mismatch.precision=fp8",
        "correction=tis",
        "seed=0",
        *TRANSFORMER_TINY,
        *TRAIN_TINY,
    ],
    "transformer-staleness-breaks-tis": [
        "experiment=transformer/staleness-breaks-tis",
        "correction=icepop",
        "mismatch.staleness=2",
        "seed=1",
        *TRANSFORMER_TINY,
        *TRAIN_TINY,
    ],
    "transformer-bias-variance-by-level": [
        "experiment=transformer/bias-variance-by-level",
        "rollout.seq_len=8",
        "probe.reference_rollouts=64",
        *TRANSFORMER_TINY,
        *PROBE_TINY,
    ],
    "engine-fp8-eos-topp": [
        "mismatch.precision=fp8",
        "rollout.eos_token=5",
        "mismatch.top_p=0.9",
        "policy.init_std=1.0",
        "correction=icepop",
        "loss=gspo",
        *TRAIN_TINY,
    ],
    "engine-noise-threshold": [
        "mismatch.logit_noise=0.3",
        "task=target-threshold",
        "task.min_count=3",
        "mismatch.temperature=0.8",
        "correction=seq-mask-tis",
        "loss=reinforce",
        "train.updates_per_step=3",
        "rollout.prompt_len=3",
        *TRAIN_TINY,
    ],
}


def _cells_close(written: Path, golden: Path) -> str:
    """'' when the two CSVs agree cell by cell (numbers to REL_TOL/ABS_TOL, the rest exactly), else the first
    difference."""
    with open(written, newline="") as a, open(golden, newline="") as b:
        got, want = list(csv.reader(a)), list(csv.reader(b))
    if len(got) != len(want):
        return f"{len(got)} rows, golden has {len(want)}"
    for i, (row, ref) in enumerate(zip(got, want)):
        if len(row) != len(ref):
            return f"row {i}: {len(row)} cells, golden has {len(ref)}"
        for j, (x, y) in enumerate(zip(row, ref)):
            if x == y:
                continue
            try:
                fx, fy = float(x), float(y)
            except ValueError:
                return f"row {i}, column {want[0][j]!r}: {x!r} != {y!r}"
            if not math.isclose(fx, fy, rel_tol=REL_TOL, abs_tol=ABS_TOL):
                return f"row {i}, column {want[0][j]!r}: {x} != {y}"
    return ""


def test_cell_comparison_tolerates_rounding_but_not_a_changed_value(tmp_path):
    golden, same, moved, token = (tmp_path / n for n in ("g.csv", "s.csv", "m.csv", "t.csv"))
    golden.write_text("step,token,kl\n0,3,2.0346918596170545e-05\n")
    same.write_text("step,token,kl\n0,3,2.034691859617055e-05\n")
    moved.write_text("step,token,kl\n0,3,2.05e-05\n")
    token.write_text("step,token,kl\n0,4,2.0346918596170545e-05\n")
    assert _cells_close(same, golden) == ""
    assert "'kl'" in _cells_close(moved, golden)
    assert "'token'" in _cells_close(token, golden)


@pytest.mark.parametrize("name", sorted(CASES))
def test_tiny_run_is_byte_identical(name, tmp_path):
    if WRITE:
        PLATFORM_FILE.write_text(platform() + "\n")
    written_on = pinned_platform()
    torch_version = platform().split()[0]
    if not WRITE and written_on.split()[0] != torch_version:
        pytest.skip(
            f"golden files were written under torch {written_on.split()[0]}, "
            f"this is {torch_version}: floating-point results differ between builds"
        )
    run_dir = tmp_path / name
    cache = [f"policy.sft.cache_dir={tmp_path / 'sft'}"] if any("transformer" in a for a in CASES[name]) else []
    code, _, err = run_cli("run", *CASES[name], *cache, f"hydra.run.dir={run_dir}", "--quiet")
    assert code == 0, err
    written = [f for f in FILES if (run_dir / f).is_file()]
    assert written, f"{name}: no data file in {run_dir}"
    golden = GOLDEN / name
    if WRITE:
        golden.mkdir(parents=True, exist_ok=True)
        for f in written:
            shutil.copyfile(run_dir / f, golden / f)
        return
    assert sorted(written) == sorted(p.name for p in golden.iterdir()), name
    for f in written:
        if written_on == platform():
            assert (run_dir / f).read_bytes() == (golden / f).read_bytes(), f"{name}/{f} changed"
        else:
            difference = _cells_close(run_dir / f, golden / f)
            assert not difference, f"{name}/{f} changed beyond another platform's rounding: {difference}"


def _without_timing(path: Path) -> str:
    """A CSV's text without its wall-clock columns (the only cells that vary between runs)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    keep = [j for j, name in enumerate(rows[0]) if "wall" not in name]
    return "\n".join(",".join(row[j] for j in keep) for row in rows) + "\n"


def test_tiny_sweep_and_its_verdict_are_unchanged(tmp_path):
    """An 8-job sweep of the first claim's experiment: its sweep.csv (timing dropped) and the claim's verdict line."""
    written_on = pinned_platform()
    if not WRITE and written_on.split()[0] != platform().split()[0]:
        pytest.skip("golden files were written under another torch build")
    sweep_dir = tmp_path / "sweep"
    code, _, err = run_cli(
        "sweep",
        "experiment=bigram/tis-tames-mismatch",
        "mismatch.logit_noise=0.0,1.0",
        "mismatch.precision=fp32,bf16",
        "correction=none,tis",
        "seed=0",
        *TRAIN_TINY,
        f"hydra.sweep.dir={sweep_dir}",
    )
    assert code == 0, err
    code, verdict, err = run_cli("claims", str(sweep_dir), "--claim", "tis-tames-mismatch")
    assert code in (0, 1), err
    got = {"sweep.csv": _without_timing(sweep_dir / "sweep.csv"), "verdict.txt": verdict}
    golden = GOLDEN / "sweep-tis-tames-mismatch"
    if WRITE:
        golden.mkdir(parents=True, exist_ok=True)
        for f, text in got.items():
            (golden / f).write_text(text)
        return
    assert got["verdict.txt"] == (golden / "verdict.txt").read_text()
    if written_on == platform():
        assert got["sweep.csv"] == (golden / "sweep.csv").read_text()
    else:
        (tmp_path / "got.csv").write_text(got["sweep.csv"])
        difference = _cells_close(tmp_path / "got.csv", golden / "sweep.csv")
        assert not difference, f"sweep.csv changed beyond another platform's rounding: {difference}"
