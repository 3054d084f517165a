"""Refactoring guard: every shipped experiment, run tiny, writes the same bytes it wrote before.

Each case below is one job of a shipped experiment (its config group choices and swept values), shrunk
to a few steps, plus a few engine settings no experiment sweeps (fp8, EOS padding, top-p, logit
noise). With log.timing=false a run's metrics.csv, tokens.csv and probe.csv depend only on the config
and the seed, so they are compared byte for byte with the files in tests/golden/experiments/, which
were written by the code before the world protocol and the training library existed.

Floating-point results legitimately differ between torch builds, so the comparison runs only under the
torch version that wrote the files (recorded in VERSION there); elsewhere the test says why it skips.
To rewrite the files after an intended change of behaviour: ISSTUDY_WRITE_GOLDEN=1 python -m pytest
tests/test_behaviour_unchanged.py, and say why in the commit.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from conftest import run_cli

GOLDEN = Path(__file__).resolve().parent / "golden" / "experiments"
WRITE = os.environ.get("ISSTUDY_WRITE_GOLDEN") == "1"
FILES = ("metrics.csv", "tokens.csv", "probe.csv")

TRAIN_TINY = ["train.steps=6", "rollout.batch_size=2", "rollout.group_size=4", "log.timing=false",
              "log.tokens_every=3"]
PROBE_TINY = ["probe.repeats=8", "probe.n_boot=100", "probe.pretrain_steps=2", "rollout.batch_size=2",
              "rollout.group_size=4"]

CASES = {
    "tis-tames-mismatch-0": ["experiment=tis-tames-mismatch", "mismatch.logit_noise=0.0", "correction=none", "seed=0",
                             *TRAIN_TINY],
    "tis-tames-mismatch-1": ["experiment=tis-tames-mismatch", "mismatch.logit_noise=1.0", "correction=tis", "seed=1",
                             *TRAIN_TINY],
    "bias-variance-by-level": ["experiment=bias-variance-by-level", "rollout.seq_len=8", *PROBE_TINY],
    "mismatch-low-prob-tokens": ["experiment=mismatch-low-prob-tokens", "mismatch.precision=fp16", "seed=2",
                                 *TRAIN_TINY],
    "precision-vs-algorithm": ["experiment=precision-vs-algorithm", "mismatch.precision=bf16", "correction=geo-mask",
                               "seed=1", *TRAIN_TINY],
    "staleness-breaks-tis": ["experiment=staleness-breaks-tis", "correction=seq-mis", "mismatch.staleness=4", "seed=2",
                             *TRAIN_TINY],
    "seed-bug-end-to-end": ["experiment=seed-bug-end-to-end", "correction=openrlhf-bc71bb1/seq-mask-tis",
                            "train.on_nonfinite=apply", "seed=0", "mismatch.outlier_rate=0.2", *TRAIN_TINY],
    "staleness-ladder": ["experiment=staleness-ladder", "correction=seq-tis", "mismatch.staleness=2", "seed=1",
                         *TRAIN_TINY],
    "threshold-tradeoff": ["experiment=threshold-tradeoff", "correction=icepop", "band=tight",
                           "mismatch.staleness=2", "seed=2", *TRAIN_TINY],
    "default-probe": ["study=probe", *PROBE_TINY],
    "engine-fp8-eos-topp": ["mismatch.precision=fp8", "rollout.eos_token=5", "mismatch.top_p=0.9",
                            "policy.init_std=1.0", "correction=icepop", "loss=gspo", *TRAIN_TINY],
    "engine-noise-threshold": ["mismatch.logit_noise=0.3", "task=target-threshold", "task.min_count=3",
                               "mismatch.temperature=0.8", "correction=seq-mask-tis", "loss=reinforce",
                               "train.updates_per_step=3", "rollout.prompt_len=3", *TRAIN_TINY],
}


def _torch_version() -> str:
    import torch

    return torch.__version__


@pytest.mark.parametrize("name", sorted(CASES))
def test_tiny_run_is_byte_identical(name, tmp_path):
    version_file = GOLDEN / "VERSION"
    if not WRITE and version_file.read_text().strip() != _torch_version():
        pytest.skip(f"golden files were written under torch {version_file.read_text().strip()}, "
                    f"this is {_torch_version()}: floating-point results differ between builds")
    run_dir = tmp_path / name
    code, _, err = run_cli("run", *CASES[name], f"hydra.run.dir={run_dir}", "--quiet")
    assert code == 0, err
    written = [f for f in FILES if (run_dir / f).is_file()]
    assert written, f"{name}: no data file in {run_dir}"
    golden = GOLDEN / name
    if WRITE:
        golden.mkdir(parents=True, exist_ok=True)
        for f in written:
            shutil.copyfile(run_dir / f, golden / f)
        version_file.write_text(_torch_version() + "\n")
        return
    assert sorted(written) == sorted(p.name for p in golden.iterdir()), name
    for f in written:
        assert (run_dir / f).read_bytes() == (golden / f).read_bytes(), f"{name}/{f} changed"
