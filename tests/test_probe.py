"""The `probe` study: exact bias/variance of every correction's gradient against the exact ∇J(θ).

Statistical tests use fixed seeds and say their tolerance; each claim is checked on two seeds.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pandas as pd
import pytest
import torch

from runner.core.corrections import apply_correction
from runner.errors import UserError
from runner.hydra_app.app import compose
from runner.probe.estimator import fast_estimates, plan, reference_estimates
from runner.probe.settings import default_preset_names
from runner.probe.world import build, validate
from runner.registry import faithful_presets, own_presets
from runner.registry import presets as registry_presets
from runner.studies import plain_config, run_study
from runner.studies.probe import COLUMNS

SEQ_IS = "{name:seq-is,weight:sequence,log_clamp:20}"  # untruncated sequence-level IS


pytestmark = pytest.mark.usefixtures("one_thread")  # small tensors: see conftest.py


def probe(tmp_path, overrides, name="run"):
    run_dir = tmp_path / name
    run_study(compose(["study=probe", "log.quiet=true", *overrides]), run_dir)
    return pd.read_csv(run_dir / "probe.csv"), run_dir


def row(df, preset):
    (i,) = df.index[df.preset == preset]
    return df.loc[i]


# ------------------------------------------------------------------------------ outputs
@pytest.mark.slow
def test_outputs_columns_and_rows(tmp_path):
    bands = [[0.5, 5.0], [None, 2.0]]
    df, run_dir = probe(
        tmp_path,
        ["probe.repeats=4", "probe.pretrain_steps=2", "rollout.seq_len=6", "probe.bands=[[0.5,5.0],[null,2.0]]"],
    )
    assert sorted(p.name for p in run_dir.iterdir()) == ["DONE", "probe.csv", "summary.json"]
    assert list(df.columns) == list(COLUMNS)
    presets = default_preset_names()
    assert presets == own_presets() + faithful_presets()  # every preset, by default
    n = len(presets)
    assert n == len(registry_presets()) and len(df) == n * 2  # one row per preset × band
    assert list(df.preset) == [p for p in presets for _ in bands]
    assert df.low.isna().tolist() == [False, True] * n and (df.high == [5.0, 2.0] * n).all()
    assert (df.faithful == [int(p in faithful_presets()) for p in presets for _ in bands]).all()
    first = df.iloc[0]
    assert (first.seed, first.staleness, first.precision, first.seq_len, first.vocab_size) == (0, 1, "bf16", 6, 16)
    assert (first.repeats, first.batch_size, first.group_size, first.pretrain_steps) == (4, 64, 8, 2)
    assert (first.baseline, first.reduction, first.ci, first.loss) == ("rloo", "seq-mean-token-sum", "bootstrap", "ppo")
    assert math.isnan(first.eos_token) and first.outlier_rate == 0.0 and first.logit_noise == 0.0
    assert (df.n_finite == 4).all() and (df.nonfinite_rate == 0).all()
    for col in ("bias_norm", "bias_norm_ci", "variance", "mse", "cosine", "mean_grad_norm", "mean_ess"):
        assert df[col].notna().all() and (df[col].abs() < 1e3).all(), col
    assert ((df.bias_norm_lo <= df.bias_norm) & (df.bias_norm <= df.bias_norm_hi)).all()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["study"] == "probe" and summary["status"] == "ok" and summary["n_arms"] == n * 2
    assert summary["world"]["objective"] == pytest.approx(first.objective)


def test_own_bands_and_inline_preset(tmp_path):
    df, _ = probe(
        tmp_path,
        [
            "probe.repeats=3",
            "probe.pretrain_steps=0",
            "rollout.seq_len=4",
            f"probe.presets=[seq-tis,geo-mask,trl/token-mask,{SEQ_IS}]",
        ],
    )
    assert list(df.preset) == ["seq-tis", "geo-mask", "trl/token-mask", "seq-is"]
    assert math.isnan(row(df, "seq-tis").low) and row(df, "seq-tis").high == 5.0
    assert (row(df, "geo-mask").low, row(df, "geo-mask").high) == (0.999, 1.001)
    assert math.isnan(row(df, "trl/token-mask").low) and row(df, "trl/token-mask").high == 3.0
    assert df.objective.iloc[0] == pytest.approx(0.25)  # θ₀ is uniform: 4 targets of 16


# ------------------------------------------------------------------ fast path = reference path
WORLDS = {
    "outliers-eos-bf16": [
        "mismatch=outliers",
        "mismatch.outlier_rate=0.02",
        "rollout.eos_token=3",
        "mismatch.staleness=2",
    ],
    "noise-topp-prompts-dualclip-token-mean": [
        "mismatch.logit_noise=0.5",
        "mismatch.top_p=0.9",
        "rollout.prompt_len=3",
        "loss.dual_clip=3",
        "mismatch.staleness=3",
        "probe.reduction=token-mean",
        "mismatch.precision=fp16",
    ],
    "reinforce-eos-seq-mean-token-mean": [
        "loss=reinforce",
        "rollout.eos_token=0",
        "mismatch.precision=fp8",
        "probe.reduction=seq-mean-token-mean",
        "probe.baseline=none",
    ],
}


@pytest.mark.parametrize("world_name", list(WORLDS))
def test_vectorised_path_matches_reference(world_name):
    """Every preset × 4 bands: the batched weighting equals one policy_loss + backward per
    arm to 1e-5 (absolute, or relative where an estimate is large), non-finite estimates are
    flagged alike, and the per-arm ESS / masked fractions are correction_metrics' values."""
    presets = "[" + ",".join(own_presets() + faithful_presets()) + "]"
    cfg = compose(
        [
            "study=probe",
            "rollout.vocab_size=6",
            "rollout.seq_len=7",
            "rollout.batch_size=4",
            "probe.pretrain_steps=3",
            "probe.repeats=2",
            f"probe.presets={presets}",
            "probe.bands=[[0.5,5.0],[null,2.0],[0.9,1.1],[0.0,1.0e9]]",
            *WORLDS[world_name],
        ]
    )
    setup, settings, n = validate(plain_config(cfg))
    world = build(setup, settings, n)
    arms = settings.arms()
    assert len(arms) == len(own_presets() + faithful_presets()) * 4
    groups = plan(arms)
    spec = replace(setup.loss, reduction=settings.reduction)
    gen, noise_gen = world.generators()
    T = setup.world.seq_len
    for _ in range(2):
        batch = world.sample(gen, noise_gen)
        fast = fast_estimates(groups, len(arms), batch, world.policy, world.params, settings.reduction, T)
        slow = reference_estimates(arms, batch, world.policy, world.params, spec, T)
        f_ok, s_ok = torch.isfinite(fast.grad).flatten(1).all(1), torch.isfinite(slow).flatten(1).all(1)
        assert torch.equal(f_ok, s_ok)
        assert f_ok.sum() >= len(arms) // 2
        # 1e-5 absolute, and relative for the huge (finite) estimates an unclamped exp(L_i) gives
        torch.testing.assert_close(fast.grad[f_ok], slow[f_ok], atol=1e-5, rtol=1e-5)
        for k, arm in enumerate(arms):
            m = apply_correction(arm.correction, batch.old, batch.roll, batch.mask, lp=batch.old, adv=batch.adv).metrics
            for ours, theirs in (
                (fast.ess, "ess"),
                (fast.masked, "token_masked_fraction"),
                (fast.seq_masked, "seq_masked_fraction"),
                (fast.clamped, "clamped_fraction"),
            ):
                torch.testing.assert_close(
                    ours[k],
                    torch.tensor(m[theirs]),
                    atol=1e-5,
                    rtol=0,
                    equal_nan=True,
                    msg=f"{arm.preset} {arm.low} {arm.high} {theirs}",
                )
    if world_name.startswith("outliers"):
        assert not f_ok.all()  # the faithful presets' inf·0 = NaN is reproduced, not hidden


def test_degenerate_arms_are_flagged_and_never_best(tmp_path):
    """The default world: ‖∇J‖² is below one batch's variance, so geo-mask, which masks ~96% of the
    tokens, has the lowest raw MSE (relative MSE ≈ 1: it barely moves). It is flagged degenerate and
    summary.json's best_mse picks the best arm that learns; relative MSE = MSE / ‖∇J‖²."""
    df, run_dir = probe(tmp_path, ["probe.repeats=60", "probe.n_boot=100", "probe.presets=[tis,geo-mask,seq-tis]"])
    geo, tis = row(df, "geo-mask"), row(df, "tis")
    assert geo.mean_masked_fraction > 0.9 and geo.degenerate == 1
    assert geo.mse < tis.mse and geo.mse == df.mse.min()  # the trap: raw MSE rewards doing nothing
    assert tis.degenerate == 0 and row(df, "seq-tis").degenerate == 0
    g2 = df.exact_grad_norm.iloc[0] ** 2
    assert (df.rel_mse - df.mse / g2).abs().max() < 1e-9 and 0.8 < geo.rel_mse < 1.2
    assert geo.norm_ratio < 0.5 and 0.5 < tis.norm_ratio < 2
    best = json.loads((run_dir / "summary.json").read_text())["best_mse"]
    assert best["preset"] != "geo-mask" and best["mse"] == df[df.degenerate == 0].mse.min()
    assert json.loads((run_dir / "summary.json").read_text())["n_degenerate"] == 1


def test_clamped_fraction_shows_truncation(tmp_path):
    """probe.csv's clamped_fraction: TIS at a tight band clamps tokens and masks none; IcePop at the
    same band masks and clamps none; the untruncated `none` does neither."""
    df, _ = probe(
        tmp_path,
        [
            "probe.repeats=8",
            "probe.n_boot=100",
            "mismatch.staleness=8",
            "probe.presets=[none,tis,icepop]",
            "probe.bands=[[0.9,1.1]]",
        ],
    )
    tis, icepop, none = row(df, "tis"), row(df, "icepop"), row(df, "none")
    assert tis.clamped_fraction > 0.3 and tis.mean_masked_fraction == 0
    assert icepop.clamped_fraction == 0 and icepop.mean_masked_fraction > 0.3
    assert none.clamped_fraction == 0 and none.mean_masked_fraction == 0


# ----------------------------------------------------------------------------- unbiasedness
@pytest.mark.slow
@pytest.mark.parametrize("seed,ci", [(0, "bootstrap"), (1, "clt")])
def test_on_policy_every_preset_is_unbiased(tmp_path, seed, ci):
    """k=0, fp32, no noise: every preset's weight is exactly 1, and the RLOO + seq-mean-token-sum
    estimate is unbiased: ‖mean − ∇J‖ lies inside its 95% CI radius (300 batches × 64 rollouts;
    the radius is ~10% of ‖∇J‖, so a (1 − 1/G) scale error would show: see the next test)."""
    df, _ = probe(tmp_path, ["mismatch=none", f"seed={seed}", "probe.repeats=300", f"probe.ci={ci}"])
    assert len(df) == len(registry_presets())
    assert (df.bias_norm <= df.bias_norm_ci).all() and (df.bias_norm_lo == 0).all()
    assert (df.bias_significant == 0).all() and (df.nonfinite_rate == 0).all()
    assert df.bias_norm_ci.max() < 0.15 * df.exact_grad_norm.iloc[0]
    assert (df.cosine > 0.98).all() and (df.mean_ess == 1).all() and (df.mean_masked_fraction == 0).all()
    assert df.bias_norm.nunique() == 1 and df.variance.nunique() == 1  # the same estimate for every preset
    assert df.engine_kl.iloc[0] == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_group_mean_baseline_bias_is_detected(tmp_path, seed):
    """Power check: the group-mean baseline scales the on-policy expectation by exactly (1 − 1/G), so
    the true bias norm is ‖∇J‖/G; the probe flags it and its CI for the bias norm contains it."""
    df, _ = probe(
        tmp_path,
        ["mismatch=none", f"seed={seed}", "probe.repeats=300", "probe.baseline=group-mean", "probe.presets=[none]"],
    )
    r = df.iloc[0]
    true_bias = r.exact_grad_norm / r.group_size
    assert r.bias_significant == 1 and r.bias_norm > r.bias_norm_ci
    assert r.bias_norm_lo <= true_bias <= r.bias_norm_hi


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_stale_uncorrected_gradient_is_biased(tmp_path, seed):
    """k=4 drift steps plus logit noise σ=0.1 (fp32): `none` is biased far outside its CI (> 2×
    the radius), and token TIS removes part of that bias."""
    df, _ = probe(
        tmp_path,
        [
            "mismatch=none",
            "mismatch.staleness=4",
            "mismatch.logit_noise=0.1",
            f"seed={seed}",
            "probe.repeats=300",
            "probe.presets=[none,tis]",
        ],
    )
    none, tis = row(df, "none"), row(df, "tis")
    assert none.bias_norm > 2 * none.bias_norm_ci and none.bias_significant == 1
    assert tis.bias_norm < 0.8 * none.bias_norm
    assert none.engine_kl > 0.005


# ------------------------------------------------------------------------- literature claims
@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_bias_variance_tradeoff_over_length(tmp_path, seed):
    """Liu & Li (2025): under a fixed per-token mismatch (k=8 drift steps + logit noise σ=0.3, fp32;
    engine KL ≈ 0.1 nats/token at both lengths), as rollout.seq_len goes 2 → 32:
    1. untruncated sequence IS's variance grows by > 100× while token TIS's grows by < 3×;
    2. token TIS's bias grows: ≥ 2× larger, with disjoint CIs (lo at 32 > hi at 2)."""
    runs = {}
    for T in (2, 32):
        runs[T], _ = probe(
            tmp_path,
            [
                "mismatch=none",
                "mismatch.staleness=8",
                "mismatch.logit_noise=0.3",
                f"rollout.seq_len={T}",
                "rollout.batch_size=16",
                f"seed={seed}",
                "probe.repeats=300",
                f"probe.presets=[tis,{SEQ_IS}]",
            ],
            name=f"T{T}",
        )
    kl = [runs[T].engine_kl.iloc[0] for T in (2, 32)]
    assert 0.05 < min(kl) and max(kl) < 1.5 * min(kl)  # the per-token mismatch is held (roughly) fixed
    seq_growth = row(runs[32], "seq-is").variance / row(runs[2], "seq-is").variance
    tis_growth = row(runs[32], "tis").variance / row(runs[2], "tis").variance
    assert seq_growth > 100 and tis_growth < 3 and seq_growth > 30 * tis_growth
    short, long = row(runs[2], "tis"), row(runs[32], "tis")
    assert long.bias_norm > 2 * short.bias_norm
    assert long.bias_norm_lo > short.bias_norm_hi


# ----------------------------------------------------------------------------- bad configs
BAD = [
    (["probe.repeats=1"], "probe.repeats must be >= 2"),
    (["probe.bands=[[2.0,1.0]]"], "low > high"),
    (["probe.bands=[[0.5]]"], "is not a [low, high] pair"),
    (["probe.presets=[tis,nope]"], "unknown preset 'nope'"),
    (["probe.batch_size=12"], "multiple of rollout.group_size"),
    (["probe.baseline=mean"], "probe.baseline"),
    (["+probe.foo=1"], "unknown key(s) foo"),
    (["loss=gspo"], "loss=gspo is not supported"),
    (["rollout.group_size=1"], "group_size >= 2"),
]


@pytest.mark.parametrize("overrides,message", BAD, ids=[b[1] for b in BAD])
def test_bad_probe_config_fails_before_any_file(tmp_path, overrides, message):
    run_dir = tmp_path / "run"
    with pytest.raises(UserError, match=None) as info:
        run_study(compose(["study=probe", "log.quiet=true", *overrides]), run_dir)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert not run_dir.exists()


@pytest.mark.slow
def test_cli_end_to_end_and_bad_config(cli, tmp_path):
    run_dir = tmp_path / "cli-run"
    code, out, err = cli(
        "run",
        "study=probe",
        "probe.repeats=3",
        "probe.pretrain_steps=1",
        "rollout.seq_len=4",
        "probe.presets=[none,tis,openrlhf-bc71bb1/seq-mask-tis]",
        "mismatch=outliers",
        f"hydra.run.dir={run_dir}",
        "--quiet",
    )
    assert code == 0, err
    assert out.strip() == str(run_dir)
    assert (run_dir / "DONE").is_file() and (run_dir / "summary.json").is_file()
    df = pd.read_csv(run_dir / "probe.csv")
    assert list(df.preset) == ["none", "tis", "openrlhf-bc71bb1/seq-mask-tis"] and df.outlier_rate.iloc[0] == 0.01

    bad_dir = tmp_path / "bad"
    code, out, err = cli("run", "study=probe", "probe.bands=[[3,1]]", f"hydra.run.dir={bad_dir}")
    assert code == 2
    assert err.strip().splitlines()[-1].startswith("is-study: error: probe.bands: low > high")
    assert not (bad_dir / "probe.csv").exists() and not (bad_dir / "DONE").exists()


def test_world_theta_is_shared_across_mismatch():
    """θ and ∇J(θ) do not depend on the mismatch: worlds that differ in staleness compare paired."""
    worlds = []
    for extra in (["mismatch=none"], ["mismatch.staleness=3", "mismatch.logit_noise=0.2"]):
        setup, settings, n = validate(
            plain_config(compose(["study=probe", "probe.pretrain_steps=3", "rollout.seq_len=5", *extra]))
        )
        worlds.append(build(setup, settings, n))
    a, b = worlds
    assert torch.equal(a.params["theta"], b.params["theta"]) and torch.equal(a.grad, b.grad)
    assert torch.equal(a.engine_params["theta"], a.params["theta"])
    assert not torch.equal(b.engine_params["theta"], b.params["theta"])
    # drift goes down J: the engine's policy is worse than the trainer's
    assert float(b.setup.world.exact.objective(b.engine_params)) < b.objective


@pytest.mark.slow
def test_bench_tiny_smoke(monkeypatch, capsys):
    from scripts import bench_probe

    monkeypatch.setattr("sys.argv", ["bench_probe.py", "--tiny"])
    assert bench_probe.main() == 0
    out = capsys.readouterr().out
    assert "ratio slow/fast" in out and "agreement: max |fast − slow|" in out


# ------------------------------------------------------------------------------ summarise, by hand
def test_summarise_golden_values():
    """Every figure of runner.probe.stats.summarise on estimates small enough to do by hand, ∇J = (0.5, 1):
    arm 0 has 4 finite batches, arm 1 two (a NaN and an inf batch dropped), arm 2 one (every figure
    NaN), arm 3 four batches all exactly ∇J (bias 0 = radius 0: not significant)."""
    from runner.probe.stats import summarise

    nan, inf = math.nan, math.inf
    est = torch.tensor(
        [
            [[1.0, 0.0], [0.0, 0.0], [nan, 0.0], [0.5, 1.0]],
            [[3.0, 0.0], [nan, 0.0], [nan, 0.0], [0.5, 1.0]],
            [[1.0, 2.0], [2.0, 2.0], [nan, 0.0], [0.5, 1.0]],
            [[3.0, 2.0], [inf, 1.0], [1.0, 1.0], [0.5, 1.0]],
        ]
    )  # [R=4, K=4, D=2]
    grad = torch.tensor([0.5, 1.0])
    s = summarise(est, grad, "clt", 0.9, 500, torch.Generator().manual_seed(0))
    # arm 0: mean (2, 1), bias (1.5, 0); deviations (±1, ±1): tr Cov = 8/3; ‖x − ∇J‖² = 1.25, 7.25, 1.25, 7.25
    # arm 1: mean (1, 1), bias (0.5, 0); tr Cov = (2 + 2)/1; ‖x − ∇J‖² = 1.25, 3.25
    g2 = 1.25  # ‖∇J‖²
    expected = {
        "bias_norm": [1.5, 0.5, nan, 0.0],
        "variance": [8 / 3, 4.0, nan, 0.0],
        "mse": [4.25, 2.25, nan, 0.0],
        "rel_bias": [1.5 / math.sqrt(g2), 0.5 / math.sqrt(g2), nan, 0.0],
        "rel_mse": [4.25 / g2, 2.25 / g2, nan, 0.0],
        "norm_ratio": [2.0, math.sqrt(2 / g2), nan, 1.0],
        "cosine": [0.8, 1.5 / math.sqrt(2.5), nan, 1.0],
        "mean_grad_norm": [(1 + 3 + math.sqrt(5) + math.sqrt(13)) / 4, math.sqrt(2), nan, math.sqrt(g2)],
        "bias_norm_debiased": [math.sqrt(2.25 - 2 / 3), 0.0, nan, 0.0],  # sqrt(max(0, bias² − tr Cov / n))
        "nonfinite_rate": [0.0, 0.5, 0.75, 0.0],
        "n_finite": [4.0, 2.0, 1.0, 4.0],
    }
    for name, values in expected.items():
        assert s[name].tolist() == pytest.approx(values, rel=1e-12, abs=1e-15, nan_ok=True), name
    r = s["bias_norm_ci"]
    assert bool((r[:2] > 0).all()) and r[3].item() == 0.0  # identical batches: no spread at all
    bias = torch.tensor([1.5, 0.5], dtype=torch.float64)
    assert s["bias_norm_hi"][:2].tolist() == pytest.approx((bias + r[:2]).tolist(), rel=1e-12)
    assert s["bias_norm_lo"][:2].tolist() == pytest.approx((bias - r[:2]).clamp(min=0).tolist(), rel=1e-12)
    assert s["bias_significant"].tolist()[:2] == [float(1.5 > r[0].item()), float(0.5 > r[1].item())]
    assert s["bias_significant"][3].item() == 0.0  # 0 > 0 is false: no bias shown
    for name, value in s.items():  # arm 2: one finite batch, so no figure but the counts
        if name not in ("nonfinite_rate", "n_finite"):
            assert math.isnan(value[2].item()), name
    # a Monte Carlo reference's own error widens every radius by exactly its size
    wide = summarise(est, grad, "clt", 0.9, 500, torch.Generator().manual_seed(0), grad_noise=0.25)
    assert (wide["bias_norm_ci"][[0, 1, 3]] - r[[0, 1, 3]]).tolist() == pytest.approx([0.25] * 3, rel=1e-12)
    # a small ∇J (norm 0.56 < 1) = half of arm 3's constant estimate: bias = ∇J, so rel_bias = rel_mse = 1,
    # norm_ratio 2, cosine 1
    half = summarise(est, grad / 2, "clt", 0.9, 50, torch.Generator().manual_seed(0))
    assert [half[k][3].item() for k in ("rel_bias", "rel_mse", "norm_ratio", "cosine")] == pytest.approx(
        [1.0, 1.0, 2.0, 1.0], rel=1e-12
    )
    # ∇J = 0: the relative figures are NaN, the cosine 0 (never 0/0)
    flat = summarise(est, torch.zeros(2), "clt", 0.9, 50, torch.Generator().manual_seed(0))
    assert all(math.isnan(flat[k][0].item()) for k in ("rel_bias", "rel_mse", "norm_ratio"))
    assert flat["cosine"][:2].tolist() == [0.0, 0.0]


def test_radius_clt_and_bootstrap_quantiles():
    """The CI radius against its definition. CLT, D = 1: x̄* − x̄ ~ N(0, s²/n), so the 0.95 quantile of
    |x̄* − x̄| is 1.95996·s/√n (here s² = 20/3, n = 4 finite of 5: 2.5303), to 2% with 100k draws.
    Bootstrap of {0, 2, NaN}: the finite resampled mean is off by 1 (14/27), 1/3 (6/27) or 0 (7/27),
    so its 0.9 quantile is exactly 1 and its 0.4 quantile exactly 1/3 (counting the NaN batch in the
    denominator would give 2/3 at 0.9)."""
    from runner.probe.stats import summarise

    x = torch.tensor([0.0, 2.0, 4.0, 6.0, math.nan]).reshape(5, 1, 1)
    r = summarise(x, torch.zeros(1), "clt", 0.95, 100_000, torch.Generator().manual_seed(1))["bias_norm_ci"]
    assert r.item() == pytest.approx(1.959964 * math.sqrt(20 / 3 / 4), rel=0.02)
    b = torch.tensor([0.0, 2.0, math.nan]).reshape(3, 1, 1)
    # a resample with one finite batch is off by that batch's whole deviation (1, not 1/2), so the 0.6
    # quantile is 1 (P(< 1) = 13/27)
    for level, radius in ((0.9, 1.0), (0.6, 1.0), (0.4, 1 / 3)):
        got = summarise(b, torch.zeros(1), "bootstrap", level, 4000, torch.Generator().manual_seed(2))["bias_norm_ci"]
        assert got.item() == pytest.approx(radius, rel=1e-12), level
    # one draw is one draw: its norm, 0 or 1 here
    one = summarise(b, torch.zeros(1), "bootstrap", 0.5, 1, torch.Generator().manual_seed(2))["bias_norm_ci"]
    assert one.item() in (0.0, 1.0)


def test_radius_draws_only_from_the_given_generator():
    """The CI radius is reproducible from the probe's own generator, whatever the global RNG did."""
    from runner.probe.stats import summarise

    est = torch.randn(7, 2, 3, generator=torch.Generator().manual_seed(5))
    radii = []
    with torch.random.fork_rng():  # the global stream is moved here, and restored for the other tests
        for global_seed in (0, 1):
            torch.manual_seed(global_seed)
            for ci in ("bootstrap", "clt"):
                radii.append(
                    summarise(est, torch.zeros(3), ci, 0.9, 300, torch.Generator().manual_seed(3))["bias_norm_ci"]
                )
    assert torch.equal(radii[0], radii[2]) and torch.equal(radii[1], radii[3])
