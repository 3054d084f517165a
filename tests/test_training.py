"""The training library's rules, with the numbers they must give: relative collapse detection, the
objective's schedule and its Monte Carlo estimate, the clip flag, and their config checks."""

from __future__ import annotations

import csv
import json
import math

import pytest
import torch

from runner.errors import UserError
from runner.hydra_app.app import compose
from runner.studies import run_study
from runner.training.faults import CollapseRules, CollapseWatch
from runner.training.objective import ExactObjective, MonteCarloObjective

pytestmark = pytest.mark.usefixtures("one_thread")


def train(tmp_path, overrides, name="run"):
    run_dir = tmp_path / name
    return run_study(compose([*overrides, "log.quiet=true"]), run_dir), run_dir


def rows(run_dir):
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


# ------------------------------------------------------------------------------ the drop rule
def _drop_watch(values, **rules):
    watch = CollapseWatch(CollapseRules(**rules), values[0])
    events = [e for step, v in enumerate(values) if (e := watch.observe_objective(step, v)) is not None]
    return watch, events


def test_a_sustained_drop_of_30_percent_is_a_collapse_from_its_first_step():
    climb = [0.1 + 0.09 * i for i in range(11)]  # peak 1.0 at step 10
    watch, events = _drop_watch(climb + [0.69] * 21)  # 31% below the peak from step 11
    assert len(events) == 1 and events[0].kind == "collapse"
    assert watch.step == 11 and events[0].step == 11  # the first step of the stretch, found 20 steps later
    assert watch.peak == pytest.approx(1.0) and watch.peak_step == 10 and watch.learned
    assert "since step 11" in watch.reason


@pytest.mark.parametrize(
    "tail,why",
    [
        ([0.7] * 40, "exactly 30% below is not more"),
        ([0.69] * 20, "20 steps below, the window needs 21 observations"),
        ([0.69] * 15 + [0.95] + [0.69] * 15, "a recovery restarts the window"),
    ],
)
def test_no_collapse_at_the_edges_of_the_drop_rule(tail, why):
    climb = [0.1 + 0.09 * i for i in range(11)]
    watch, events = _drop_watch(climb + tail)
    assert events == [] and watch.reason is None, why


def test_a_flat_run_never_learned():
    watch, events = _drop_watch([0.25] * 50)
    assert events == [] and not watch.learned
    assert _drop_watch([0.25] * 10 + [0.2601])[0].learned  # 0.0101 above the start: it learned


# ----------------------------------------------------------------------------- the spike rule
def _spike_watch(norms, **rules):
    watch = CollapseWatch(CollapseRules(**rules), 0.5)
    events = [e for i, n in enumerate(norms) if (e := watch.observe_grad_norm(i // 2, i % 2, n)) is not None]
    return watch, events


def test_three_consecutive_updates_above_ten_times_the_running_median():
    watch, events = _spike_watch([1.0] * 10 + [10.5, 11.0, 12.0] + [1.0] * 5)
    assert len(events) == 1
    assert watch.step == 5  # update 10 is step 5, update 0
    assert "3 consecutive updates from step 5 update 0" in watch.reason and "running median (1)" in watch.reason


@pytest.mark.parametrize(
    "norms,why",
    [
        ([1.0] * 10 + [10.5, 10.5, 1.0, 10.5, 10.5], "two, a normal one, two: never three in a row"),
        ([1.0] * 10 + [10.0, 10.0, 10.0], "exactly 10× the median is not above it"),
        ([1.0] * 9 + [50.0, 50.0, 50.0], "fewer than min_history norms before the run: not judged"),
        ([1.0] * 10 + [10.5, math.inf, 10.5, 10.5], "a non-finite norm breaks the run (it is a fault, logged apart)"),
    ],
)
def test_no_spike_collapse_at_the_edges(norms, why):
    watch, events = _spike_watch(norms)
    assert events == [] and watch.reason is None, why


def test_each_kind_is_logged_once_and_the_first_is_the_runs_collapse():
    watch = CollapseWatch(CollapseRules(), 1.0)
    for i in range(10):
        watch.observe_grad_norm(i, 0, 1.0)
    kinds = [watch.observe_grad_norm(10 + i, 0, 20.0) for i in range(6)]
    assert [e is not None for e in kinds] == [False, False, True, False, False, False]
    nan_event = watch.nonfinite_params(30, "update 1")
    assert nan_event is not None and nan_event.action == "stop"
    assert watch.step == 10 and "consecutive" in watch.reason  # the first collapse stays the run's


def test_collapse_config_errors():
    with pytest.raises(UserError, match=r"train.collapse.drop must be <= 1"):
        CollapseRules.from_config({"drop": 1.5})
    with pytest.raises(UserError, match=r"did you mean train.collapse.window\?"):
        CollapseRules.from_config({"windw": 3})
    with pytest.raises(UserError, match="spike_factor must be > 1"):
        CollapseRules.from_config({"spike_factor": 1.0})


# ------------------------------------------------------------------ the objective and the clip flag
def test_objective_every_leaves_empty_cells_between_evaluations(tmp_path):
    summary, run_dir = train(tmp_path, ["train.steps=12", "train.objective_every=5"])
    by_step = {int(r["step"]): r["objective"] for r in rows(run_dir)}
    assert [s for s, v in sorted(by_step.items()) if v != ""] == [0, 5, 10, 12]  # 12: the final row
    assert float(by_step[0]) == pytest.approx(0.25)
    assert summary["objective_every"] == 5 and summary["objective_kind"] == "exact"
    assert math.isfinite(summary["final_objective"]) and summary["final_objective"] > 0.25


def test_clipped_says_when_the_clip_bound(tmp_path):
    _, tight = train(tmp_path, ["train.steps=3", "train.grad_clip=1e-6"], "tight")
    _, off = train(tmp_path, ["train.steps=3", "train.grad_clip=null"], "off")
    assert [r["clipped"] for r in rows(tight)] == ["1"] * 6 + [""]  # "": the final row (J after the last update)
    assert [r["clipped"] for r in rows(off)] == ["0"] * 6 + [""]
    _, mid = train(tmp_path, ["train.steps=3", "train.grad_clip=0.005"], "mid")
    for r in rows(mid)[:-1]:
        assert r["clipped"] == str(int(float(r["grad_norm"]) > 0.005))


@pytest.mark.slow
def test_another_sampling_stream_keeps_theta0_and_draws_other_tokens(tmp_path):
    """mismatch.sampling_stream=1 (claim 4's chaos floor): the seed's θ₀ (init_std = 1 draws it from the
    sampling generator first, so the same J₀ = 0.2224), other prompts and tokens from step 0; stream 0 is the
    seed's own run, and the probe, which draws from its own streams, refuses the key."""
    base = ["policy.init_std=1.0", "train.steps=2", "mismatch=none", "log.timing=false", "rollout.prompt_len=2"]
    own, d0 = train(tmp_path, base, "own")
    _, d0b = train(tmp_path, [*base, "mismatch.sampling_stream=0"], "own-again")
    other, d1 = train(tmp_path, [*base, "mismatch.sampling_stream=1"], "other")
    assert own["initial_objective"] == other["initial_objective"] == pytest.approx(0.22243, abs=1e-5)
    assert (d0 / "metrics.csv").read_bytes() == (d0b / "metrics.csv").read_bytes()
    t0, t1 = [(d / "tokens.csv").read_text().splitlines() for d in (d0, d1)]
    assert t0[0] == t1[0] and len(t0) == len(t1)
    assert sum(a != b for a, b in zip(t0[1:], t1[1:])) > 0.8 * (len(t0) - 1)  # ≥ 80% of the token rows differ
    with pytest.raises(UserError, match="sampling_stream applies to training runs only"):
        run_study(compose(["study=probe", "mismatch.sampling_stream=1", "log.quiet=true"]), tmp_path / "probe")


def test_monte_carlo_objective_agrees_with_the_exact_one():
    """The MC estimate (4096 on-policy fp32 rollouts, common random numbers) is within 3 standard
    errors of the exact J, and two evaluations of the same θ give the same number."""
    from runner.studies.train import load

    s = load(compose(["policy.init_std=1.0", "task=target-threshold", "task.min_count=4"]))
    params = s.world.init_params(torch.Generator().manual_seed(0))
    exact, _ = ExactObjective(s.world.exact)(params)
    mc = MonteCarloObjective(s.world, s.task, samples=4096, seed=0)
    est, se = mc(params)
    assert 0.05 < float(exact) < 0.95 and float(se) > 0
    assert abs(float(est) - float(exact)) < 3 * float(se)
    assert torch.equal(mc(params)[0], est)  # common random numbers


def test_train_config_errors(tmp_path):
    for override, match in (
        ("train.objective_every=0", "objective_every must be >= 1"),
        ("train.collapse.drop=0", "train.collapse.drop must be > 0"),
        ("train.objective_samples=1", "objective_samples must be >= 2"),
    ):
        with pytest.raises(UserError, match=match):
            train(tmp_path, [override])


def test_updates_without_signal_are_no_evidence_of_scale():
    """A sparse reward gives zero gradients until a response scores: those zeros are not a running
    median of 0 against which the first real gradient is a spike."""
    watch, events = _spike_watch([0.0] * 50 + [0.05, 0.06, 0.05] + [0.05] * 10)
    assert events == [] and watch.reason is None
    watch, events = _spike_watch([0.0] * 5 + [1.0] * 10 + [0.0] * 3 + [20.0] * 3)
    assert len(events) == 1 and watch.step == 9  # zeros neither count nor break a run of spikes


def test_between_evaluations_the_sampled_reward_shows_a_drop_but_never_sets_the_peak():
    watch = CollapseWatch(CollapseRules(), 0.1)
    watch.observe_objective(0, 0.1)
    watch.observe_objective(20, 1.0)
    events = [watch.observe_objective(step, 1.5 if step == 25 else 0.2, estimate=True) for step in range(21, 40)]
    assert watch.peak == 1.0 and watch.peak_step == 20  # a lucky batch's reward is no peak
    assert watch.reason is None  # 0.2 from step 26: 13 steps, not yet 20
    events += [watch.observe_objective(40, 0.2)] + [
        watch.observe_objective(s, 0.2, estimate=True) for s in range(41, 47)
    ]
    assert [e.step for e in events if e is not None] == [26] and watch.step == 26


# ------------------------------------------------------------------------------------ the device
def test_device_names_and_a_missing_gpu_are_one_line_errors():
    from runner.training.device import resolve

    assert str(resolve("cpu")) == "cpu"
    assert str(resolve("auto")) == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(UserError, match="is not one of: auto, cpu, cuda, cuda:N"):
        resolve("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="sees no CUDA device here"):
            resolve("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
@pytest.mark.parametrize(
    "world",
    [
        ["policy=bigram"],
        ["policy=mlp", "rollout.seq_len=16"],
        [
            "policy=transformer",
            "policy.sft.steps=0",
            "rollout.seq_len=8",
            "task.length=7",
            "train.objective_samples=64",
        ],
    ],
)
def test_the_same_seed_on_cuda_gives_the_same_metrics(tmp_path, world):
    args = [*world, "device=cuda", "train.steps=3", "log.timing=false"]
    _, a = train(tmp_path, args, "a")
    _, b = train(tmp_path, args, "b")
    assert (a / "metrics.csv").read_bytes() == (b / "metrics.csv").read_bytes()
    assert json.loads((a / "summary.json").read_text())["device"].startswith("cuda")


def test_the_transformers_monte_carlo_objective_agrees_with_a_ten_times_larger_one():
    """J of a small transformer (partial credit, so J is not 0) by 512 rollouts against 5120 rollouts
    on another stream: within 3 standard errors of their difference."""
    from runner.studies.train import load

    s = load(
        compose(
            [
                "policy=transformer",
                "policy.sft.steps=0",
                "policy.n_layer=1",
                "policy.d_model=16",
                "policy.n_head=2",
                "task.values=8",
                "task.partial_credit=true",
                "rollout.seq_len=6",
                "device=cpu",
            ]
        )
    )
    params = s.world.init_params(torch.Generator().manual_seed(0))
    small, small_se = MonteCarloObjective(s.world, s.task, samples=512, seed=0)(params)
    large, large_se = MonteCarloObjective(s.world, s.task, samples=5120, seed=1)(params)
    assert 0.005 < float(large) < 0.98 and float(small_se) > 0
    assert abs(float(small) - float(large)) < 3 * math.hypot(float(small_se), float(large_se))
