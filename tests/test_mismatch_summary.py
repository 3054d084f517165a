"""summary.json's `mismatch` block (runner/training/mismatch_summary.py): a small bigram run's block recomputed
by hand from its tokens.csv and metrics.csv, one step's values on hand-made tensors, the window arithmetic,
and the block in the mlp and the transformer worlds."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from runner.hydra_app.app import compose
from runner.studies import run_study
from runner.training.mismatch_summary import MismatchSummary, step_mismatch, window_means, window_size

WINDOWED = ("token_kl_k3", "seq_kl_k3", "ratio_outside_0.5_2")
REL = 1e-9  # tokens.csv's 9 significant digits give the float32 log-probs back exactly


def train(tmp_path, overrides, name="run"):
    run_dir = tmp_path / name
    summary = run_study(compose([*overrides, "log.quiet=true"]), run_dir)
    return summary, run_dir


def k3_by_hand(lr: np.ndarray) -> np.ndarray:
    bounded = np.clip(lr, -20.0, 20.0)  # the ±20 safety bound of metrics.csv's kl_k3
    return np.expm1(bounded) - bounded


def test_the_block_is_what_tokens_csv_and_metrics_csv_give_by_hand(tmp_path):
    """13 steps × 2 updates = 26 updates: windows of ceil(2.6) = 3 updates, so the first window is step 0
        twice and step 1 once (a step's value counts once per update). bf16, staleness 2 and logit noise make old ≠
    roll, some ratios beyond [0.5, 2]; an
        EOS token makes the responses' lengths differ, so a per-sequence sum is not T times the token mean."""
    summary, run_dir = train(
        tmp_path,
        [
            "train.steps=13",
            "train.updates_per_step=2",
            "mismatch.precision=bf16",
            "mismatch.staleness=2",
            "mismatch.logit_noise=1.0",
            "rollout.eos_token=5",
            "policy.init_std=1.0",
            "log.tokens_every=1",
            "log.metrics=false",  # the block does not depend on it
        ],
    )
    block = summary["mismatch"]
    assert json.loads((run_dir / "summary.json").read_text())["mismatch"] == block

    # 9 significant digits name one float32: read them as float32, then widen (float64 parsing alone is off by ~1e-9)
    tokens = pd.read_csv(run_dir / "tokens.csv", dtype={"old": np.float32, "roll": np.float32})
    tokens = tokens.astype({"old": np.float64, "roll": np.float64})
    metrics = pd.read_csv(run_dir / "metrics.csv")
    updates = metrics[metrics.reward.notna()]
    lr = tokens.old.to_numpy() - tokens.roll.to_numpy()
    tokens = tokens.assign(
        k3=k3_by_hand(lr),
        outside=~((np.exp(lr) >= 0.5) & (np.exp(lr) <= 2.0)),
        diff=np.abs(np.exp(tokens.old) - np.exp(tokens.roll)),
    )
    lengths = tokens.groupby(["step", "seq"]).size()
    assert lengths.nunique() > 1, "every response had the same length: the per-sequence test would be vacuous"
    per_step = pd.DataFrame(
        {
            "token_kl_k3": tokens.groupby("step").k3.mean(),
            "seq_kl_k3": tokens.groupby(["step", "seq"]).k3.sum().groupby("step").mean(),
            "ratio_outside_0.5_2": tokens.groupby("step").outside.mean(),
        }
    )
    assert per_step.index.tolist() == list(range(13))
    counts = updates.groupby("step").size()
    assert (counts == 2).all() and len(updates) == 26
    per_update = per_step.loc[updates.step.to_numpy()]
    for name in WINDOWED:
        want = {"first": per_update[name].iloc[:3].mean(), "last": per_update[name].iloc[-3:].mean()}
        assert want["first"] > 0 and want["last"] > 0, name
        for end in ("first", "last"):
            assert block[name][end] == pytest.approx(want[end], rel=REL), (name, end)
    assert block["max_abs_prob_diff"] == pytest.approx(tokens["diff"].max(), rel=REL)
    zero_grad = float((updates.grad_norm == 0.0).mean())
    assert block["zero_grad_fraction"] == summary["zero_grad_fraction"] == zero_grad


def test_one_step_by_hand():
    """Two sequences of three slots; the first has tokens at 0 and 1 (lr = ln 1.5 and −25: the bound makes the
    second one's k3 e^−20 − 1 + 20), the second none. Padding holds NaN and −inf, which must not leak in."""
    nan, ninf = float("nan"), float("-inf")
    old = torch.tensor([[math.log(0.75), -25.0, nan], [nan, 0.0, 0.0]])
    roll = torch.tensor([[math.log(0.5), 0.0, ninf], [0.0, nan, ninf]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    got = step_mismatch(old, roll, mask)
    lr1 = float(old[0, 0].double() - roll[0, 0].double())  # ln 1.5, as float32 log-probs give it
    k3 = [math.expm1(lr1) - lr1, math.expm1(-20.0) + 20.0]
    assert got["token_kl_k3"] == pytest.approx(sum(k3) / 2, rel=1e-12)
    assert got["seq_kl_k3"] == pytest.approx(sum(k3), rel=1e-12)  # one sequence with tokens: its sum
    assert got["ratio_outside_0.5_2"] == 0.5  # ρ = 1.5 is inside the band, e^−25 is not
    assert got["max_abs_prob_diff"] == pytest.approx(1 - math.exp(-25), rel=1e-12)  # |e^−25 − e^0| beats 0.75 − 0.5
    assert step_mismatch(old, roll, torch.zeros(2, 3)) == dict.fromkeys(got)


def test_the_sign_follows_metrics_csv_kl_k3():
    """lr = old − roll: old = 0, roll = ln 0.5 gives lr = ln 2 and k3 = 1 − ln 2 (the other sign would give
    ln 2 − 0.5)."""
    got = step_mismatch(torch.tensor([[0.0]]), torch.tensor([[math.log(0.5)]]), torch.ones(1, 1))
    lr = float(torch.tensor(0.0).double() - torch.tensor(math.log(0.5)).double())
    assert got["token_kl_k3"] == pytest.approx(math.expm1(lr) - lr, rel=1e-12)
    assert got["token_kl_k3"] == pytest.approx(1 - math.log(2), rel=1e-7)


@pytest.mark.parametrize(
    "updates,width", [(1, 1), (5, 1), (10, 1), (11, 2), (20, 2), (25, 3), (30, 3), (31, 4), (1000, 100)]
)
def test_the_windows_are_the_ceiling_of_ten_percent(updates, width):
    assert window_size(updates) == width


def test_window_means_by_hand():
    """25 updates 0..24: windows of 3, means 1 and 23; missing values (a step with no token) are left out."""
    assert window_means([float(v) for v in range(25)]) == {"first": 1.0, "last": 23.0}
    assert window_means([None, 4.0, 8.0, *[0.0] * 19, 1.0, None, 2.0]) == {"first": 6.0, "last": 1.5}
    assert window_means([]) == {"first": None, "last": None}
    assert window_means([None] * 5) == {"first": None, "last": None}


def test_a_step_counts_once_per_update():
    """Steps with 3, 0 and 7 updates (10 updates: windows of 1): the first window is the first step's, the last
    the third's; a step with no update is in no window."""
    summary = MismatchSummary()
    for value, updates in [(1.0, 3), (50.0, 0), (9.0, 7)]:
        summary.add_values(dict.fromkeys([*WINDOWED, "max_abs_prob_diff"], value), updates)
    block = summary.block(0.25)
    assert block["token_kl_k3"] == {"first": 1.0, "last": 9.0}
    assert block["max_abs_prob_diff"] == 50.0  # the maximum over every step
    assert block["zero_grad_fraction"] == 0.25
    two = MismatchSummary()
    for value, updates in [(1.0, 5), (3.0, 5), *[(0.0, 1)] * 10]:  # 20 updates: windows of 2, both from step 0
        two.add_values(dict.fromkeys([*WINDOWED, "max_abs_prob_diff"], value), updates)
    assert two.block(0.0)["seq_kl_k3"] == {"first": 1.0, "last": 0.0}
    nan = MismatchSummary()
    nan.add_values(dict.fromkeys([*WINDOWED, "max_abs_prob_diff"], math.nan), 1)
    nan.add_values(dict.fromkeys([*WINDOWED, "max_abs_prob_diff"], 2.0), 1)
    assert math.isnan(nan.block(0.0)["max_abs_prob_diff"])
    assert MismatchSummary().block(0.0)["ratio_outside_0.5_2"] == {"first": None, "last": None}


def _assert_finite_block(block):
    for name in WINDOWED:
        assert set(block[name]) == {"first", "last"}
        assert all(math.isfinite(v) and v >= 0 for v in block[name].values()), (name, block[name])
    assert math.isfinite(block["max_abs_prob_diff"]) and 0 < block["max_abs_prob_diff"] <= 1
    assert block["token_kl_k3"]["first"] > 0


def test_the_block_in_the_mlp_world(tmp_path):
    summary, _ = train(
        tmp_path,
        ["policy=mlp", "rollout.seq_len=8", "rollout.batch_size=2", "rollout.group_size=4", "train.steps=3"],
    )
    _assert_finite_block(summary["mismatch"])


def test_the_block_in_the_transformer_world(tmp_path):
    summary, _ = train(
        tmp_path,
        [
            "policy=transformer",
            "policy.n_layer=1",
            "policy.d_model=16",
            "policy.n_head=2",
            "task.values=8",
            "rollout.seq_len=6",
            "rollout.batch_size=2",
            "rollout.group_size=2",
            "train.steps=3",
            "train.objective_samples=16",
            "policy.sft.steps=10",
            "policy.sft.eval_samples=32",
            f"policy.sft.cache_dir={tmp_path / 'sft'}",
        ],
    )
    _assert_finite_block(summary["mismatch"])


def test_steps_wait_and_are_computed_in_batches_with_the_values_one_by_one(monkeypatch):
    """MismatchSummary holds each step's tensors and computes every waiting step in one batched pass (when
    PENDING_ELEMENTS have come, when the shape changes, at block()); each step's values are those of
    step_mismatch on that step alone, and the order of steps is kept."""
    from runner.training import mismatch_summary

    gen = torch.Generator().manual_seed(0)
    shapes = [(4, 6)] * 5 + [(3, 6)] * 2 + [(4, 6)]  # a shape change flushes
    batches = []
    for n, t in shapes:
        old = -torch.rand(n, t, generator=gen) * 3
        roll = old + 0.3 * torch.randn(n, t, generator=gen)
        mask = (torch.rand(n, t, generator=gen) < 0.8).float()
        mask[0] = 0  # an empty sequence in every step
        batches.append((old, roll, mask))
    batches[2][2].zero_()  # a step with no token masked in
    monkeypatch.setattr(mismatch_summary.MismatchSummary, "PENDING_ELEMENTS", 3 * 24)  # a pass every 3 steps
    summary = mismatch_summary.MismatchSummary()
    for i, (old, roll, mask) in enumerate(batches):
        summary.add(old, roll, mask, updates=1 + i % 2)
        assert len(summary.steps) == {0: 0, 1: 0, 2: 3, 3: 3, 4: 3, 5: 5, 6: 5, 7: 7}[i]  # passes at 3, then shapes
    summary.block(0.0)
    assert len(summary.steps) == 8 and [u for _, u in summary.steps] == [1 + i % 2 for i in range(8)]
    for (values, _), (old, roll, mask) in zip(summary.steps, batches):
        alone = step_mismatch(old, roll, mask)
        assert values.keys() == alone.keys()
        for key in values:
            assert (values[key] is None and alone[key] is None) or values[key] == pytest.approx(alone[key], rel=1e-12)
    assert summary.steps[2][0]["token_kl_k3"] is None
