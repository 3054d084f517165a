"""The `train` study end to end, on configs composed from conf/ exactly as the CLI composes them."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from runner.core.schema import UPDATE_METRICS as METRICS
from runner.errors import UserError
from runner.hydra_app.app import compose
from runner.studies import STUDIES, run_study
from runner.studies.train import NonfiniteError

FAITHFUL = "correction=openrlhf-bc71bb1/seq-mask-tis"
OUTLIERS = ["mismatch.outlier_rate=0.01", "mismatch.outlier_shift=-1000"]


def train(tmp_path, overrides, name="run"):
    run_dir = tmp_path / name
    summary = run_study(compose([*overrides, "log.quiet=true"]), run_dir)
    return summary, run_dir


def rows(run_dir, name="metrics.csv"):
    with open(run_dir / name, newline="") as f:
        return list(csv.DictReader(f))


def update_rows(run_dir):
    """metrics.csv without its final row (J after the last update: no reward, no update)."""
    return [r for r in rows(run_dir) if r["reward"] != ""]


def test_outputs_and_columns(tmp_path):
    summary, run_dir = train(tmp_path, ["correction=seq-mask-tis", "train.steps=5"])
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "DONE",
        "events.csv",
        "metrics.csv",
        "summary.json",
        "tokens.csv",
    ]
    with open(run_dir / "tokens.csv", newline="") as fh:
        tokens = list(csv.DictReader(fh))
    assert len(tokens) == 8 * 8 * 16  # step 0 only (tokens_every=50): every generated token of the batch
    assert {t["step"] for t in tokens} == {"0"}
    assert float(tokens[0]["old"]) == pytest.approx(math.log(1 / 16), abs=1e-6)  # uniform θ₀ in fp32
    assert float(tokens[0]["roll"]) == -2.765625  # log(1/16) rounded to bf16
    # the run's keys on every token row, as on metrics.csv's, so concatenated runs keep them
    assert {(t["seed"], t["correction"], t["staleness"], t["precision"]) for t in tokens} == {
        ("0", "seq-mask-tis", "1", "bf16")
    }
    metrics = rows(run_dir)
    assert len(metrics) == 5 * 2 + 1  # one row per update (steps × updates_per_step), then the final row
    required = [
        "step",
        "update",
        "seed",
        "correction",
        "staleness",
        "reward",
        "objective",
        "loss",
        "grad_norm",
        "update_norm",
        "nonfinite_loss",
        "nonfinite_grad",
        "skipped",
        "entropy",
        "wall_ms",
        *METRICS,
    ]
    assert set(required) <= set(metrics[0])
    assert metrics[0]["correction"] == "seq-mask-tis" and metrics[0]["staleness"] == "1"
    assert float(metrics[0]["objective"]) == pytest.approx(0.25)  # uniform θ₀, 4 targets of 16
    assert float(metrics[0]["entropy"]) == pytest.approx(math.log(16), abs=1e-5)
    assert float(metrics[0]["kl_k1"]) != 0.0  # bf16 rounding of log(1/16): a real mismatch
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert on_disk["steps_run"] == 5 and on_disk["updates_run"] == 10 and not on_disk["collapsed"]
    assert on_disk["final_objective"] == summary["final_objective"] > 0.25
    assert on_disk["events"] == dict.fromkeys(
        ("nonfinite_loss", "nonfinite_grad", "all_rejected", "nonfinite_params", "collapse"), 0
    )
    assert summary["run_dir"] == str(run_dir)


@pytest.mark.slow
def test_on_policy_training_improves_the_exact_objective(tmp_path):
    """k=0, fp32, no noise, correction=none, default steps: J rises from 0.25 to above 0.9."""
    summary, run_dir = train(tmp_path, ["mismatch=none", "correction=none"])
    metrics = update_rows(run_dir)
    assert len(metrics) == 200 * 2
    # With no mismatch at all, the engine's log-probs are the trainer's: every weight is exactly 1.
    assert all(float(r["kl_k1"]) == 0.0 and float(r["is_weight_mean"]) == 1.0 for r in metrics)
    assert summary["initial_objective"] == pytest.approx(0.25)
    assert summary["final_objective"] > 0.9
    assert summary["events"]["nonfinite_loss"] == 0 and not summary["collapsed"]


@pytest.mark.slow
def test_outliers_poison_only_the_faithful_preset(tmp_path):
    faithful, _ = train(tmp_path, [FAITHFUL, *OUTLIERS, "train.steps=20"], "faithful")
    assert faithful["events"]["nonfinite_loss"] > 0
    assert faithful["updates_skipped"] > 0
    for preset in ("seq-mask-tis", "tis"):
        summary, run_dir = train(tmp_path, [f"correction={preset}", *OUTLIERS, "train.steps=20"], preset)
        assert summary["events"]["nonfinite_loss"] == 0 and summary["events"]["nonfinite_grad"] == 0, preset
        assert rows(run_dir, "events.csv") == []
        assert summary["final_objective"] > summary["initial_objective"] + 0.1


def test_apply_lets_nan_reach_the_parameters(tmp_path):
    summary, run_dir = train(tmp_path, [FAITHFUL, *OUTLIERS, "train.on_nonfinite=apply"])
    assert summary["nonfinite_params"] and summary["collapsed"]
    assert math.isnan(summary["final_objective"])
    kinds = [e["kind"] for e in rows(run_dir, "events.csv")]
    assert "nonfinite_params" in kinds and "collapse" in kinds
    assert (run_dir / "DONE").exists()


def test_raise_stops_with_one_line_and_no_done(tmp_path):
    with pytest.raises(NonfiniteError) as err:
        train(tmp_path, [FAITHFUL, *OUTLIERS, "train.on_nonfinite=raise"])
    assert isinstance(err.value, UserError) and "\n" not in str(err.value)
    run_dir = tmp_path / "run"
    assert not (run_dir / "DONE").exists()
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "error"
    assert rows(run_dir)[-1]["nonfinite_loss"] == "1"  # the failing update's row is on disk


@pytest.mark.slow
def test_deterministic_bytes(tmp_path):
    args = ["correction=seq-mask-tis", "train.steps=30", "mismatch.logit_noise=0.05", "seed=3"]
    _, a = train(tmp_path, [*args, "log.timing=false"], "a")
    _, b = train(tmp_path, [*args, "log.timing=false"], "b")
    assert "wall_ms" not in rows(a)[0]
    assert (a / "metrics.csv").read_bytes() == (b / "metrics.csv").read_bytes()
    # With timing on, everything but wall_ms is still identical.
    _, c = train(tmp_path, args, "c")
    timed = [{k: v for k, v in r.items() if k != "wall_ms"} for r in rows(c)]
    assert timed == rows(a)
    _, d = train(tmp_path, [*args[:-1], "seed=4", "log.timing=false"], "d")
    assert (d / "metrics.csv").read_bytes() != (a / "metrics.csv").read_bytes()


def test_staleness_shows_in_the_mismatch_metrics(tmp_path):
    """k=3 in fp32: roll ≠ old once θ has moved (kl_k1 ≠ 0 from step 1 on); k=0 fp32: exactly 0."""
    _, stale = train(tmp_path, ["mismatch=none", "mismatch.staleness=3", "train.steps=6"], "stale")
    kl = [float(r["kl_k1"]) for r in update_rows(stale) if r["update"] == "0"]
    assert kl[0] == 0.0 and all(abs(v) > 1e-4 for v in kl[1:])


@pytest.mark.parametrize(
    "override,match",
    [
        ("mismatch.staleness=-1", "staleness"),
        ("mismatch.precision=fp4", "precision"),
        ("mismatch.top_p=1.5", "top_p"),
        ("mismatch.top_p=0", "top_p"),
        ("rollout.seq_len=0", "seq_len"),
        ("rollout.vocab_size=1", "vocab_size"),
        ("rollout.batch_size=0", "batch_size"),
        ("rollout.group_size=0", "group_size"),
        ("train.optimizer=rmsprop", "optimizer"),
        ("train.on_nonfinite=ignore", "on_nonfinite"),
        ("train.lr=-1", "lr"),
        ("train.updates_per_step=65", "updates_per_step"),
        ("seed=-1", "seed"),
    ],
)
def test_config_errors_before_any_file(tmp_path, override, match):
    with pytest.raises(UserError, match=match) as err:
        train(tmp_path, [override])
    assert "\n" not in str(err.value)
    assert not (tmp_path / "run").exists()


def test_unwritable_run_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UserError, match="run dir"):
        run_study(compose(["log.quiet=true", "train.steps=1"]), blocker / "run")


def test_unknown_study_and_cheap_import():
    cfg = compose([])
    OmegaConf.set_struct(cfg, False)
    cfg.study.name = "nope"
    with pytest.raises(UserError, match="study.name"):
        run_study(cfg, "unused")
    assert STUDIES["train"] == "runner.studies.train:run"
    probe = "import sys, runner.studies; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_validate_study_writes_nothing(tmp_path):
    from runner.studies import validate_study

    validate_study(compose([]))
    with pytest.raises(UserError, match="top_p"):
        validate_study(compose(["mismatch.top_p=2"]))


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_optimizer_matches_torch_optim(kind):
    import torch

    from runner.training.optim import Optimizer

    g = torch.Generator().manual_seed(0)
    shapes = {"w": (17, 16), "b": (5,), "scale": ()}  # several tensors, as an MLP or a transformer has
    ours = {k: torch.randn(shape, generator=g).requires_grad_(True) for k, shape in shapes.items()}
    ref = {k: p.detach().clone().requires_grad_(True) for k, p in ours.items()}
    start = {k: p.detach().clone() for k, p in ours.items()}
    opt = Optimizer(ours, kind, lr=0.05)
    # foreach=False: torch's single-tensor formulas, which ours follow operation for operation
    ref_opt = (torch.optim.Adam if kind == "adam" else torch.optim.SGD)(list(ref.values()), lr=0.05, foreach=False)
    for _ in range(25):
        grads = {k: torch.randn(shape, generator=g) * 0.01 for k, shape in shapes.items()}
        opt.zero_grad()
        ref_opt.zero_grad()
        for k in shapes:
            ours[k].grad = grads[k].clone()
            ref[k].grad = grads[k].clone()
        opt.step()
        ref_opt.step()
    for k in shapes:
        assert torch.equal(ours[k].detach(), ref[k].detach()), k  # the same operations, so the same bits
        assert not torch.equal(ours[k].detach(), start[k]), k


def test_fast_writers_write_what_csv_writer_writes(tmp_path):
    """metrics.csv and tokens.csv skip the csv module's per-cell work; the bytes are CsvWriter's,
    a constant that needs quoting (or holds a %) and nan/±inf included."""
    from runner.records import CsvWriter, NumberCsvWriter

    columns = ["step", "seed", "correction", "x", "precision", "y"]
    constants = {"seed": 0, "correction": 'a "quoted",%s name', "precision": "bf16"}
    values = [0.1, math.nan, math.inf, -math.inf, 1e-300, 2**60, 3, -0.0]
    plain = CsvWriter(tmp_path / "plain.csv", columns)
    fast = NumberCsvWriter(tmp_path / "fast.csv", columns, constants)
    for i, v in enumerate(values):
        plain.write({"step": i, "x": v, "y": -v, **constants})
        fast.write({"step": i, "x": v, "y": -v, **constants})
    rows_plain = CsvWriter(tmp_path / "rows_plain.csv", columns)
    rows_fast = CsvWriter(tmp_path / "rows_fast.csv", columns)
    numbers = [[i, 7, -1, v, 2, -v] for i, v in enumerate(values)]
    rows_plain.write_rows(numbers)
    rows_fast.write_number_rows(numbers, ",".join(["%r"] * len(columns)) + "\n")  # repr: what fmt gives a number
    for w in (plain, fast, rows_plain, rows_fast):
        w.close()
    assert (tmp_path / "fast.csv").read_bytes() == (tmp_path / "plain.csv").read_bytes()
    assert (tmp_path / "rows_fast.csv").read_bytes() == (tmp_path / "rows_plain.csv").read_bytes()
    assert 'a ""quoted"",%s name' in (tmp_path / "fast.csv").read_text()


def test_one_correction_evaluation_per_step_changes_no_number(tmp_path, monkeypatch):
    """A decoupled correction is evaluated once per step and sliced per update; evaluating it in
    each update instead gives the same losses, gradients and parameters bit for bit, and the same
    correction metrics to float32 rounding."""
    from runner.training import loop as train_module

    args = ["correction=seq-mask-tis", "train.steps=15", "train.updates_per_step=3", "log.timing=false"]
    _, once = train(tmp_path, args, "once")
    monkeypatch.setattr(
        train_module, "apply_correction_split", lambda corr, old, roll, mask, groups, **kw: [None] * len(groups)
    )
    _, each = train(tmp_path, args, "each")
    a, b = rows(once), rows(each)
    assert len(a) == len(b) == 45 + 1
    for ra, rb in zip(a, b):
        for key in ra:
            if key in METRICS and key != "ppo_clip_fraction" and ra[key] != "":
                assert float(ra[key]) == pytest.approx(float(rb[key]), rel=1e-5, abs=1e-7), key
            else:
                assert ra[key] == rb[key], key


def test_a_bypass_ratio_is_evaluated_by_each_update(tmp_path, monkeypatch):
    """ratio=bypass (lp − roll) moves with θ within a step, so it is never evaluated once per step."""
    from runner.training import loop as train_module

    calls = []
    split = train_module.apply_correction_split
    monkeypatch.setattr(
        train_module, "apply_correction_split", lambda *a, **k: calls.append(a[0].ratio) or split(*a, **k)
    )
    summary, run_dir = train(tmp_path, ["correction=tis", "correction.ratio=bypass", "train.steps=10"], "bypass")
    assert calls == [] and summary["status"] == "ok"
    assert summary["final_objective"] > summary["initial_objective"]
    assert len(update_rows(run_dir)) == 20
    assert all(math.isfinite(float(r["is_weight_mean"])) for r in update_rows(run_dir))
    train(tmp_path, ["correction=tis", "train.steps=10"], "decoupled")
    assert calls == ["decoupled"] * 10


def test_tokens_csv_gives_back_the_float32_log_probs_exactly(tmp_path):
    import numpy as np

    from runner.studies.train import token_row_template

    row = token_row_template({"seed": 3, "correction": "a,b%", "staleness": 2, "precision": "bf16"})
    values = np.array([-2.7725887298583984, -1e-8, -87.33654, -0.1, np.nan, -np.inf], dtype=np.float32)
    line = "".join(row % (0, i, 1, 2, float(v), float(v)) for i, v in enumerate(values))
    back = np.array([float(next(csv.reader([ln]))[8]) for ln in line.splitlines()], dtype=np.float32)
    assert np.array_equal(back, values, equal_nan=True)
    assert line.splitlines()[0] == '0,3,"a,b%",2,bf16,0,1,2,-2.77258873,-2.77258873'


def test_zero_grad_fraction_counts_the_updates_whose_gradient_is_exactly_zero(tmp_path):
    """One response per prompt: every GRPO advantage is r − mean(r) = 0, so every gradient is exactly 0 (1.0).
    Two responses per prompt and a 0/1 reward that both often miss: some updates are exactly 0, some not (here
    8 of 20); the fraction is the count of grad_norm = 0 rows over the updates. The default run: 0.0."""
    alone, _ = train(tmp_path, ["rollout.group_size=1", "train.steps=3"], "alone")
    assert alone["zero_grad_fraction"] == 1.0
    mixed, run_dir = train(
        tmp_path,
        [
            "rollout.batch_size=1",
            "rollout.group_size=2",
            "train.updates_per_step=1",
            "train.steps=20",
            "task=target-threshold",
            "task.min_count=4",
        ],
        "mixed",
    )
    norms = [float(r["grad_norm"]) for r in update_rows(run_dir)]
    assert 0 < mixed["zero_grad_fraction"] < 1
    assert mixed["zero_grad_fraction"] == sum(g == 0.0 for g in norms) / len(norms)
    assert json.loads((run_dir / "summary.json").read_text())["zero_grad_fraction"] == mixed["zero_grad_fraction"]
    default, _ = train(tmp_path, ["train.steps=3"], "default")
    assert default["zero_grad_fraction"] == 0.0


def test_a_weighted_correction_against_the_behaviour_policy_is_refused_before_any_file(tmp_path):
    with pytest.raises(UserError, match="count it twice") as err:
        train(tmp_path, ["correction=tis", "loss.ratio_against=behaviour"])
    assert "\n" not in str(err.value)
    assert not (tmp_path / "run").exists()


def test_the_last_logged_j_is_the_summarys_final_j(tmp_path):
    """One definition of final J: J(θ_T) after the last update. metrics.csv ends with a row at step T =
    train.steps (update 0, no reward, no update cells) holding it, so the table's last J is summary.json's
    final_objective to the last bit, also when J is evaluated only every few steps (7 steps, J every 3:
    evaluated at 0, 3, 6 and after the last update, at 7)."""
    import pandas as pd

    summary, run_dir = train(tmp_path, ["train.steps=7", "train.objective_every=3", "log.timing=false"])
    df = pd.read_csv(run_dir / "metrics.csv")
    last = df.iloc[-1]
    assert (last["step"], last["update"]) == (7, 0)
    assert last["objective"] == summary["final_objective"] == df["objective"].dropna().iloc[-1]
    per_update = [
        c
        for c in df.columns
        if c not in ("step", "update", "seed", "correction", "staleness", "precision", "objective")
    ]
    assert last[per_update].isna().all()
    assert sorted(df.dropna(subset=["objective"])["step"].unique().tolist()) == [0, 3, 6, 7]
    assert len(df[df["reward"].notna()]) == 7 * 2  # the update rows
    # summary.json's `objective` was the string "exact" while metrics.csv's is a number: renamed
    assert summary["objective_kind"] == "exact" and "objective" not in summary


def test_a_run_stopped_by_nan_parameters_has_no_final_row(tmp_path):
    """Its J after the last update is undefined (NaN parameters): summary.json says null, and no final
    row claims a number."""
    summary, run_dir = train(tmp_path, [FAITHFUL, *OUTLIERS, "train.on_nonfinite=apply", "train.steps=40"])
    assert summary["nonfinite_params"] and math.isnan(summary["final_objective"])
    assert all(r["reward"] != "" for r in rows(run_dir))
