"""The six claims in the field's regime (issue 32): one experiment per claim in conf/experiment/mlp/regime/,
each the claim's own sweep on top of experiment=mlp/field-regime; the dose-response experiment over T with its
length arms; the regime's columns of VERDICTS.md; and the dose-response figure's table, checked by hand."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from omegaconf import OmegaConf

from analysis.claims import registry, verdicts
from analysis.claims.registry import CLAIMS
from runner.hydra_app import app as hydra_app
from tests.helpers.repo import REPO

REGIME_WORLDS = ("mlp", "transformer")  # the worlds with conf/experiment/WORLD/regime/
FIELD = {  # what experiment=WORLD/field-regime fixes, which every regime experiment of the world must inherit
    "mlp": {
        "task.name": "count-asked",
        "rollout.vocab_size": 256,
        "rollout.seq_len": 256,
        "policy.name": "mlp",
        "policy.init_std": 20,
        "policy.state": ["prompt", "position"],
        "train.lr": 3.0e-4,
    },
    "transformer": {
        "task.name": "count-in-text",
        "task.words": 256,
        "rollout.seq_len": 256,
        "policy.name": "transformer",
        "policy.context": 258,
        "policy.sft.steps": 800,
        "train.lr": 1.0e-4,
    },
}
# Where a regime experiment sweeps otherwise than its world's claim experiment, and what it sweeps instead.
NOT_THE_WORLDS_SWEEP = {
    ("mlp", "bias-variance-by-level"): {"rollout.seq_len": "64,128,256"},  # over T, at the regime's lengths
    # over T with the task scaled to each T, so that each length's warm start reads its question
    ("transformer", "bias-variance-by-level"): {"arm": "length/t64,length/t128,length/t256"},
    # the 4-expert world, where the bf16 engine's mismatch reaches the field's (the dense one is 10x under it)
    ("transformer", "tis-tames-mismatch"): {"mismatch.precision": "fp32,bf16"},
}


def _value(cfg, dotted):
    out = OmegaConf.select(cfg, dotted)
    return OmegaConf.to_container(out) if OmegaConf.is_config(out) else out


@pytest.mark.parametrize("world", REGIME_WORLDS)
@pytest.mark.parametrize("number_name", list(enumerate(CLAIMS, 1)), ids=list(CLAIMS))
def test_every_claim_has_a_regime_experiment(number_name, world):
    number, name = number_name
    path = REPO / "conf" / "experiment" / world / "regime" / f"{name}.yaml"
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "# @package _global_"
    assert lines[1] == f"# is-study sweep experiment={registry.experiment(name, world, regime=True)}"
    assert lines[2].startswith(f"# Claim {number} (") and "field regime" in lines[2]
    own = OmegaConf.load(path)
    assert f"/experiment/{world}/field-regime@_here_" in own.defaults
    # the claim's own sweep is the world's claim experiment's: the same arms, in the regime's world
    world_sweep = OmegaConf.load(REPO / "conf" / "experiment" / world / f"{name}.yaml").hydra.sweeper.params
    regime_sweep = own.hydra.sweeper.params
    instead = NOT_THE_WORLDS_SWEEP.get((world, name), {})
    for key, value in instead.items():
        assert str(regime_sweep[key]) == value, (world, name, key)
    replaced = {"rollout.seq_len"} if name == "bias-variance-by-level" else set()  # by the regime's lengths
    for key in set(world_sweep) - {"seed"} - set(instead) - replaced:
        assert str(regime_sweep[key]) == str(world_sweep[key]), (world, name, key)
    cfg = hydra_app.compose([f"experiment={world}/regime/{name}"])
    for key, value in FIELD[world].items():
        assert _value(cfg, key) == value, (world, name, key)


def test_transformer_claim_one_runs_the_four_expert_world():
    cfg = hydra_app.compose(["experiment=transformer/regime/tis-tames-mismatch"])
    assert cfg.policy.experts == 4 and not cfg.mismatch.router_replay and cfg.mismatch.staleness == 0


@pytest.mark.parametrize("world", REGIME_WORLDS)
def test_precision_arms_pick_their_engine(world):
    """Claim 4's mismatch arms are groups: the field regime must not pin a precision over them (the
    transformer's once did, so that every arm, fp32 and the chaos floor too, ran a bf16 engine)."""
    arms = {"none": ("fp32", 0), "none-stream1": ("fp32", 1), "fp16": ("fp16", 0), "bf16": ("bf16", 0)}
    for arm, (precision, stream) in arms.items():
        cfg = hydra_app.compose([f"experiment={world}/regime/precision-vs-algorithm", f"mismatch={arm}"])
        assert (cfg.mismatch.precision, cfg.mismatch.sampling_stream, cfg.mismatch.staleness) == (precision, stream, 0)


@pytest.mark.parametrize("world", REGIME_WORLDS)
def test_seed_bug_keeps_the_outliers_per_response(world):
    """The injected outliers are a fault, not the calibrated mismatch: their rate per response stays the world's
    (mlp: 0.01 a token at T = 64, transformer: 0.01 at T = 32), and the outliers preset's staleness of 1
    survives field-regime's 0."""
    own = hydra_app.compose([f"experiment={world}/seed-bug-end-to-end"])
    regime = hydra_app.compose([f"experiment={world}/regime/seed-bug-end-to-end"])
    per_response = own.mismatch.outlier_rate * own.rollout.seq_len
    assert regime.mismatch.outlier_rate * regime.rollout.seq_len == pytest.approx(per_response)
    assert regime.mismatch.staleness == own.mismatch.staleness == 1


@pytest.mark.parametrize("T", [64, 128, 256, 512, 1024])
def test_length_arms_scale_the_task(T):
    """arm=length/tT: k_i = T/256 · k_i(256), ties rounded up, and the tolerance 2·√(T/256) rounded (a count's
    binomial spread grows as √T), so every T asks for the same share of target tokens."""
    base = hydra_app.compose(["experiment=mlp/field-regime"]).task
    cfg = hydra_app.compose(["experiment=mlp/regime/dose-response", f"arm=length/t{T}"])
    assert cfg.rollout.seq_len == T
    assert list(cfg.task.k) == [math.floor(k * T / 256 + 0.5) for k in base.k]
    assert cfg.task.tolerance == round(2 * math.sqrt(T / 256))


def test_regime_columns_in_verdicts(tmp_path):
    """--size regime writes OUT/regime/WORLD/verdicts.json naming experiment=WORLD/regime/NAME, and VERDICTS.md
    shows it as its own column beside the world's default size."""
    from analysis.claims.stats import HOLDS, UNTESTABLE, Verdict

    name = "seed-bug-end-to-end"
    verdicts.write_world(tmp_path, "mlp", "default", [(name, Verdict(UNTESTABLE, "old world", key="k0"))])
    path = verdicts.write_world(tmp_path, "mlp", "regime", [(name, Verdict(HOLDS, "regime world", key="k1"))])
    assert path == tmp_path / "regime" / "mlp" / "verdicts.json"
    entry = json.loads(path.read_text())["claims"][name]
    assert entry["experiment"] == f"experiment=mlp/regime/{name}"
    assert entry["figure"] == f"regime/mlp/{name}.png"
    md = verdicts.verdicts_markdown(tmp_path)
    head = next(line for line in md.splitlines() if line.startswith("| claim"))
    assert head == "| claim | mlp (default size) | mlp (field regime, default size) |"
    row = next(line for line in md.splitlines() if line.startswith("| 6."))
    assert "**untestable here**: k0" in row and "**holds**: k1" in row
    assert f"- **mlp** (field regime, default size; `is-study sweep experiment=mlp/regime/{name}`" in md


@pytest.fixture(scope="module")
def tiny_dose(tmp_path_factory):
    from tests.helpers.cli import run_cli

    out = tmp_path_factory.mktemp("dose") / "sweep"
    code, _, err = run_cli(
        "sweep",
        "experiment=mlp/regime/dose-response",
        "arm=length/t64,length/t128",
        "mismatch.precision=bf16,fp8",
        "seed=range(0,2)",
        "train.steps=3",
        "rollout.batch_size=2",
        "rollout.group_size=4",
        "train.objective_every=3",
        "log.timing=false",
        f"hydra.sweep.dir={out}",
    )
    assert code == 0, err
    return out


@pytest.mark.slow
def test_dose_table_by_hand(tiny_dose):
    """Each cell's dose is the mean over its seeds of (the run's mean kl_k3 over its updates) × T, and its final J
    the mean of the runs' summary.json final_objective: recomputed here from the files."""
    from analysis.figures.dose_response import dose_table
    from analysis.load import load_dataset

    table = dose_table(load_dataset(tiny_dose)).set_index(["correction", "precision", "T"])
    assert len(table) == 2 * 2 * 2 and (table["seeds"] == 2).all()
    runs = []
    for job in sorted(p for p in tiny_dose.iterdir() if (p / "summary.json").is_file()):
        summary = json.loads((job / "summary.json").read_text())
        overrides = dict(o.split("=", 1) for o in (job / ".hydra" / "overrides.yaml").read_text().split("- ")[1:])
        metrics = pd.read_csv(job / "metrics.csv")
        kl = metrics.loc[metrics["reward"].notna(), "kl_k3"].mean()
        T = int(overrides["arm"].strip().removeprefix("length/t"))
        runs.append((summary["correction"], summary["precision"], T, kl * T, summary["final_objective"]))
    by_cell = pd.DataFrame(runs, columns=["correction", "precision", "T", "dose", "J"]).groupby(
        ["correction", "precision", "T"]
    )
    for key, cur in by_cell:
        assert table.loc[key, "dose"] == pytest.approx(cur["dose"].mean(), rel=1e-12)
        assert table.loc[key, "final_J"] == pytest.approx(cur["J"].mean(), rel=1e-12)
    # fp8 carries more mismatch per response than bf16 at every T, and a longer response more than a shorter
    for name in ("none", "tis"):
        assert table.loc[(name, "fp8", 64), "dose"] > 10 * table.loc[(name, "bf16", 64), "dose"]
        assert table.loc[(name, "bf16", 128), "dose"] > table.loc[(name, "bf16", 64), "dose"]


@pytest.mark.slow
def test_dose_response_figure(tiny_dose):
    from analysis import figures
    from analysis.load import load_dataset

    ds = load_dataset(tiny_dose)
    fig = figures.figure("dose-response", ds)
    j_ax, c_ax = fig.axes[:2]
    assert j_ax.get_xscale() == "log" and "T" in j_ax.get_xlabel()
    assert "final J" in j_ax.get_ylabel() and "collapse" in c_ax.get_ylabel()
    assert len([line for line in c_ax.get_lines() if line.get_gid() == "series"]) == 4  # 2 corrections × 2 engines
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["none", "tis", "bf16 engine", "fp8 engine"]


# Each regime experiment narrowed to seconds on the command line: its pipeline, world and rule run end to end.
TINY = {
    "tis-tames-mismatch": ["mismatch.precision=fp32,fp8", "seed=range(0,2)"],
    "bias-variance-by-level": ["probe.repeats=4", "probe.n_boot=100"],
    "mismatch-low-prob-tokens": ["mismatch.precision=bf16,fp8", "log.tokens_every=1"],
    "precision-vs-algorithm": ["correction=none,geo-mask", "seed=0"],
    "staleness-breaks-tis": ["arm=staleness/none,staleness/seq-tis", "mismatch.staleness=2", "seed=0"],
    "seed-bug-end-to-end": ["seed=0"],
}
TINY_TRAIN = ["train.steps=3", "rollout.batch_size=2", "rollout.group_size=4", "train.objective_every=1"]
TINY_WORLD = {
    "mlp": {"bias-variance-by-level": ["rollout.seq_len=64,128"]},
    # a 1-layer, 16-wide model over 32 words (4 of them targets) whose warm start trains in a second
    "transformer": {
        "*": [
            "policy.n_layer=1",
            "policy.d_model=16",
            "policy.n_head=2",
            "policy.sft.steps=20",
            "policy.sft.warmup=5",
            "policy.sft.batch_size=8",
            "policy.sft.eval_samples=32",
            "task.words=32",
            "task.targets=[0,1,2,3]",
            "task.tolerance=1",
            "train.objective_samples=32",
            "device=cpu",
        ],
        "bias-variance-by-level": [
            "arm=length/t64",
            "rollout.seq_len=4,8",
            "task.k=[1,2]",
            "probe.reference_rollouts=64",
        ],
        "train": ["rollout.seq_len=8", "policy.context=10", "task.k=[1,2,3]"],
    },
}


@pytest.mark.slow
@pytest.mark.parametrize("world", REGIME_WORLDS)
@pytest.mark.parametrize("name", list(CLAIMS))
def test_regime_experiment_end_to_end(name, world, cli, tmp_path_factory):
    own = TINY_WORLD[world]
    probe = name == "bias-variance-by-level"
    extra = [*TINY[name], *([] if probe else TINY_TRAIN), *own.get("*", []), *own.get(name if probe else "train", [])]
    if world == "transformer":  # one warm start per shape, shared by the module's runs
        extra.append(f"policy.sft.cache_dir={tmp_path_factory.getbasetemp() / 'regime-sft-cache'}")
    sweep = tmp_path_factory.mktemp(name)
    code, _, err = cli(
        "sweep", f"experiment={world}/regime/{name}", *extra, "log.timing=false", f"hydra.sweep.dir={sweep}"
    )
    assert code == 0, err
    code, out, err = cli("claims", str(sweep), "--claim", name)
    assert code == 0, err
    line = out.strip().splitlines()
    assert len(line) == 1 and line[0].startswith(f"{name}: "), line
    assert line[0].split(": ", 1)[1].split(" — ")[0] in ("holds", "does not hold", "inconclusive", "untestable here")


@pytest.mark.slow
def test_seed_bug_figure_draws_sparse_evaluations(cli, tmp_path):
    """J evaluated only at the start and the end (train.objective_every past the last step, as in the regime's
    41-step runs with J every 50): each preset's curve still joins its evaluated steps, with markers, and holds no
    NaN that would break it (it once drew step 0 alone)."""
    import numpy as np

    sweep = tmp_path / "sweep"
    code, _, err = cli(
        "sweep",
        "experiment=mlp/regime/seed-bug-end-to-end",
        "seed=0",
        *TINY_TRAIN[:3],
        "train.objective_every=50",
        "log.timing=false",
        f"hydra.sweep.dir={sweep}",
    )
    assert code == 0, err
    _, fig = registry.evaluate("seed-bug-end-to-end", sweep)
    for ax in fig.axes[:2]:
        curves = [line for line in ax.get_lines() if len(line.get_xdata()) >= 2]
        assert curves, ax.get_title()
        for line in curves:
            assert np.isfinite(np.asarray(line.get_ydata(), float)).all() and line.get_marker() == "o"
        # plain PPO and the fix reach the final J after step 3 from J₀ (on each of step 0's updates)
        assert sum(line.get_xdata()[0] == 0 and line.get_xdata()[-1] == 3 for line in curves) >= 2
