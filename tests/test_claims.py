"""The literature's claims (conf/experiment/*.yaml + analysis/claims/ + scripts/figures.sh).

Two kinds of test:
  - every verdict rule on small hand-made frames: a case that holds, one that does not (and where the rule has
    one, an inconclusive case), so the rules themselves are pinned, independent of what the world produces;
  - every experiment end to end at a tiny size: `is-study sweep experiment=NAME` (in-process, narrowed by
    overrides) into a tmp dir, then `is-study claims` on it: it completes, writes the figure and prints
    a verdict line (a verdict word and numbers).
"""

from __future__ import annotations

import math
import os
import re
import subprocess

import numpy as np
import pandas as pd
import pytest

from analysis.claims import bias_variance_by_level as level
from analysis.claims import mismatch_low_prob_tokens as lowprob
from analysis.claims import precision_vs_algorithm as precision
from analysis.claims import seed_bug_end_to_end as seedbug
from analysis.claims import staleness_breaks_tis as staleness
from analysis.claims import stats, verdicts
from analysis.claims import tis_tames_mismatch as tis
from analysis.claims.registry import CLAIMS
from analysis.claims.stats import FAILS, HOLDS, UNSURE
from tests.conftest import REPO

EXPERIMENTS = list(CLAIMS)
LINE = re.compile(r"^(?P<name>[a-z0-9-]+): (?P<verdict>holds|does not hold|inconclusive) — (?P<text>.*\d.*)$")


# ----------------------------------------------------------------------------------------- shared statistics
def test_effect_and_combinations():
    assert stats.effect([1.0, 1.1, 0.9, 1.0], margin=0.5) == HOLDS
    assert stats.effect([0.0, 0.01, -0.01, 0.0], margin=0.5) == FAILS  # mean + 2 SE below the margin
    assert stats.effect([2.0, -1.0, 3.0, -2.0], margin=0.5) == UNSURE  # too noisy either way
    assert stats.effect([0.3, 0.3, 0.3], margin=0.5) == FAILS  # significant but too small to matter
    assert stats.effect([1.0], margin=0.5) == UNSURE  # one seed: no standard error
    assert stats.all_of([HOLDS, HOLDS]) == HOLDS and stats.all_of([HOLDS, UNSURE]) == UNSURE
    assert stats.all_of([HOLDS, FAILS, UNSURE]) == FAILS
    assert stats.any_of([FAILS, HOLDS]) == HOLDS and stats.any_of([FAILS, FAILS]) == FAILS
    assert stats.any_of([FAILS, UNSURE]) == UNSURE


def test_run_summaries():
    calm = [1.0] * 30
    assert stats.spikes_of(calm) == 0
    assert stats.spikes_of(calm[:25] + [6.0] + calm[:4]) == 1  # 6 > 5 × median 1
    assert stats.spikes_of(calm[:10] + [float("nan")] + calm[:5]) == 1  # NaN/inf counts as a spike
    # the factor is 5 and the comparison strict: exactly 5 × the median is no spike, 5.01 × is
    assert [stats.spikes_of(calm[:25] + [x] + calm[:4]) for x in (4.5, 5.0, 5.01)] == [0, 0, 1]
    assert stats.drawdown_of([0.1, 0.5, 0.3, 0.6, 0.55]) == pytest.approx(0.2)
    assert stats.final_of(list(range(8))) == pytest.approx(6.5)  # the last quarter: 6, 7


def test_mean_se_and_effect_edges():
    """The edges of the shared test, each where a flipped comparison or a changed count changes the verdict."""
    m, se, n = stats.mean_se([1.0, 2.0, 3.0, float("nan")])  # the NaN is dropped; sd (n − 1) = 1, SE = 1/√3
    assert (m, n) == (2.0, 3) and se == pytest.approx(1 / math.sqrt(3), rel=1e-12)
    m, se, n = stats.mean_se([5.0])
    assert (m, n) == (5.0, 1) and math.isnan(se)
    m, se, n = stats.mean_se([])
    assert n == 0 and math.isnan(m) and math.isnan(se)
    # mean exactly at the margin with SE 0: holds (mean ≥ margin); a strict > would make it inconclusive
    assert stats.effect([1.0, 1.0, 1.0], margin=1.0) == HOLDS
    # mean − 2 SE = 0 = mean + 2 SE = margin: neither significant (> 0) nor ruled out (< margin)
    assert stats.effect([0.0, 0.0, 0.0], margin=0.0) == UNSURE
    assert stats.effect([1.0, 1.2], margin=0.5) == HOLDS  # two seeds suffice: 1.1 − 2·0.1 > 0
    # mean 1.5, SE 0.645: 2.3 SE from 0, so significant at 2 SE (not at 3)
    assert stats.effect([0.0, 1.0, 2.0, 3.0], margin=0.1) == HOLDS
    assert stats.all_of([]) == UNSURE and stats.any_of([]) == UNSURE  # no parts: nothing shown either way


def test_spike_window_edges_and_final_quarter():
    # the trailing median needs 3 earlier norms, and excludes the update itself
    assert stats.spikes_of([1.0, 1.0, 1.0, 10.0]) == 1
    assert stats.spikes_of([1.0, 1.0, 10.0]) == 0
    # zero norms are left out of the median: with them the median of the 8 before 15 would be 0.5 (a
    # spike); without, it is 4 (15 < 20, none)
    assert stats.spikes_of([0.0, 0.0, 0.0, 0.0, 1.0, 4.0, 4.0, 4.0, 15.0]) == 0
    assert math.isnan(stats.drawdown_of([float("nan")])) and math.isnan(stats.final_of([]))
    assert stats.drawdown_of([3.0, 2.0, 1.0]) == 2.0 and stats.drawdown_of([1.0, 2.0, 3.0]) == 0.0
    assert stats.final_of([1.0, 2.0]) == 2.0  # ceil(2/4) = 1 update
    assert stats.final_of(list(range(7))) == 5.5  # ceil(7/4) = 2 updates: 5, 6


def test_run_summaries_take_missing_values_as_nan_and_warn_about_nothing():
    """A missing value (None, as a JSON null arrives) is NaN: left out of the mean and the objective, a
    spike in the grad norms. One value has no SE, quietly (no NumPy 'degrees of freedom' warning)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m, se, n = stats.mean_se([1.0, None, 3.0])
        assert (m, n) == (2.0, 2) and se == pytest.approx(1.0, rel=1e-12)  # sd √2, SE √2/√2
        assert math.isnan(stats.mean_se([5.0])[1])
        assert stats.spikes_of([1.0, None, 1.0]) == 1
        assert stats.drawdown_of([0.5, None, 0.2]) == pytest.approx(0.3)
        assert stats.final_of([None, 3.0]) == 3.0 and stats.final_of([4.0]) == 4.0
        assert math.isnan(stats.final_of([None]))


def test_numbers_in_statements():
    assert [stats.sig(v) for v in (None, math.inf, -math.inf, math.nan, 0.0)] == ["nan", "∞", "−∞", "nan", "0"]
    # plain from 1e-3 up to (not including) 1e4, else an exponent without its leading zero
    assert [stats.sig(v) for v in (1e-3, 9.9e-4, 123.456, -0.5, 1e4, 12345.0, 2.5e-7)] == \
        ["0.001", "9.90e-4", "123", "-0.5", "1.00e4", "1.23e4", "2.50e-7"]
    assert [stats.sig(v, 2) for v in (9.9e-4, 12345.0, 0.04567)] == ["9.9e-4", "1.2e4", "0.046"]
    assert stats.plus_minus(1.234, 0.0567) == "1.23 ± 0.057" and stats.plus_minus(1.0, math.nan) == "1"
    assert stats.as_float("2.5") == 2.5
    assert all(math.isnan(stats.as_float(v)) for v in (None, "", "x"))


# ----------------------------------------------------------------------------------------- 1. TIS tames mismatch
def _tis_runs(spikes_ppo, spikes_tis, j_ppo, j_tis, seeds=4, world="σ=0"):
    rows = []
    for s in range(seeds):
        jitter = 0.001 * (s - seeds / 2)
        rows.append({"world": world, "correction": "none", "seed": s, "spikes": spikes_ppo + (s % 2),
                     "j_final": j_ppo + jitter, "drawdown": 0.0})
        rows.append({"world": world, "correction": "tis", "seed": s, "spikes": spikes_tis,
                     "j_final": j_tis + jitter, "drawdown": 0.0})
    return pd.DataFrame(rows)


def test_tis_rule():
    assert tis.tis_verdict(_tis_runs(6, 0, 0.80, 0.95)).verdict == HOLDS
    assert tis.tis_verdict(_tis_runs(0, 0, 0.99, 0.99)).verdict == FAILS
    # spikes removed but the objective is unchanged: TIS must reduce both
    assert tis.tis_verdict(_tis_runs(6, 0, 0.99, 0.99)).verdict == FAILS
    # existential over worlds: one world where it holds is enough
    both = pd.concat([_tis_runs(0, 0, 0.99, 0.99), _tis_runs(6, 0, 0.80, 0.95, world="σ=1")])
    v = tis.tis_verdict(both)
    assert v.verdict == HOLDS and v.parts["σ=0"]["verdict"] == FAILS and v.parts["σ=1"]["verdict"] == HOLDS
    noisy = _tis_runs(0, 0, 0.9, 0.9)
    noisy.loc[noisy["correction"] == "tis", "j_final"] += [0.05, -0.04, 0.06, -0.03]
    assert tis.tis_verdict(noisy).verdict == UNSURE


# ----------------------------------------------------------------------------------------- 2. bias–variance by level
def _probe(token_bias, seq_var, mid_bias=None, mid_var=None, Ts=(2, 4, 8, 16, 32), ci=0.01):
    rows = []
    for i, T in enumerate(Ts):
        arms = {"token-is": (token_bias[i], 1.0), "seq-is": (0.01, seq_var[i])}
        if mid_bias is not None:
            arms["seq-tis"] = (mid_bias[i], mid_var[i])
        for preset, (bias, var) in arms.items():
            rows.append({"preset": preset, "seq_len": T, "bias_norm": bias, "bias_norm_lo": max(bias - ci, 0),
                         "bias_norm_hi": bias + ci, "variance": var, "exact_grad_norm": 1.0})
    return pd.DataFrame(rows)


def test_level_rule():
    exp_var = [math.exp(0.3 * T) for T in (2, 4, 8, 16, 32)]
    good = _probe([0.05, 0.1, 0.2, 0.3, 0.4], exp_var, mid_bias=[0.02, 0.05, 0.1, 0.15, 0.2],
                  mid_var=[1.2, 1.5, 2.0, 3.0, 5.0])
    v = level.level_verdict(good)
    assert v.verdict == HOLDS and (v.parts["a"], v.parts["b"], v.parts["c"]) == (HOLDS, HOLDS, HOLDS)
    # token bias falls, variance ratio barely grows, the middle arm is more biased than token IS
    bad = _probe([0.4, 0.3, 0.2, 0.1, 0.05], [1.0, 1.2, 1.5, 2.0, 3.0], mid_bias=[0.9] * 5, mid_var=[0.5] * 5)
    v = level.level_verdict(bad)
    assert v.verdict == FAILS and (v.parts["a"], v.parts["b"], v.parts["c"]) == (FAILS, FAILS, FAILS)
    # a 10×+ rise that a power law fits better than an exponential: (b) inconclusive
    power = _probe([0.05, 0.1, 0.2, 0.3, 0.4], [T ** 2 for T in (2, 4, 8, 16, 32)])
    assert level.level_verdict(power).parts["b"] == UNSURE
    # overlapping CIs on the token bias: (a) inconclusive
    flat = _probe([0.1, 0.1, 0.1, 0.1, 0.11], exp_var, ci=0.05)
    assert level.level_verdict(flat).parts["a"] == UNSURE


# ----------------------------------------------------------------------------------------- 3. low-probability tokens
def _tokens(low_is_worse: bool, n=4000, seed=0):
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.01, 1.0, n)
    scale = (1.0 - p) if low_is_worse else p
    d = np.abs(rng.normal(0, 1e-3, n)) * (0.1 + scale)
    return pd.DataFrame({"precision": "bf16", "seed": 0, "p_train": p, "abs_dlogp": d})


def test_lowprob_rule():
    assert lowprob.lowprob_verdict(_tokens(True)).verdict == HOLDS
    assert lowprob.lowprob_verdict(_tokens(False)).verdict == FAILS
    flat = _tokens(True).assign(abs_dlogp=lambda f: np.abs(np.random.default_rng(1).normal(0, 1e-3, len(f))))
    assert lowprob.lowprob_verdict(flat).verdict == UNSURE
    # every precision must show it; fp32 (no mismatch) is left out
    mixed = pd.concat([_tokens(True), _tokens(False).assign(precision="fp16"), _tokens(False).assign(precision="fp32")])
    assert lowprob.lowprob_verdict(mixed).verdict == FAILS


# ----------------------------------------------------------------------------------------- 4. precision vs algorithm
def _traj(gap16, gap_b16, spread16, spread_b16, seeds=4, T=20):
    rows = []
    for s in range(seeds):
        for t in range(T):
            base = 0.5 + 0.02 * t + 0.001 * s
            wiggle = 1 + 0.1 * ((s + t) % 3)
            for prec, gap, spread in (("fp32", 0.0, 0.0), ("fp16", gap16, spread16), ("bf16", gap_b16, spread_b16)):
                for i, corr in enumerate(("none", "tis", "geo-mask")):
                    rows.append({"precision": prec, "correction": corr, "seed": s, "t": t, "step": t,
                                 "objective": base + gap * wiggle + (spread * wiggle * i / 2 if corr != "none" else 0)})
    return pd.DataFrame(rows)


def test_precision_rule():
    v = precision.precision_verdict(_traj(0.001, 0.01, 0.001, 0.02))
    assert v.verdict == HOLDS and (v.parts["a"], v.parts["b"]) == (HOLDS, HOLDS)
    v = precision.precision_verdict(_traj(0.01, 0.01, 0.02, 0.02))  # fp16 no closer, no shrinkage
    assert v.verdict == FAILS and (v.parts["a"], v.parts["b"]) == (FAILS, FAILS)
    v = precision.precision_verdict(_traj(0.007, 0.01, 0.001, 0.02))  # only 1.4× closer: not "far more closely"
    assert v.verdict == FAILS and v.parts["a"] == FAILS and v.parts["b"] == HOLDS


# ----------------------------------------------------------------------------------------- 5. staleness
def _stale(tis_breaks_at=None, mask_breaks_at=None, ess_drop=0.2, seeds=3):
    rows = []
    for corr, k_break in (("tis", tis_breaks_at), ("seq-mis", mask_breaks_at), ("geo-mask", mask_breaks_at)):
        for k in (0, 1, 2, 4, 8, 16):
            for s in range(seeds):
                broken = k_break is not None and k >= k_break
                rows.append({"correction": corr, "staleness": k, "seed": s, "collapsed": float(broken),
                             "nonfinite": 0, "ess": 1.0 - ess_drop * (k > 0) - 0.01 * k,
                             "final_objective": 0.2 if broken else 0.99})
    return pd.DataFrame(rows)


def test_staleness_rule():
    v = staleness.staleness_verdict(_stale(tis_breaks_at=4))
    assert v.verdict == HOLDS and v.parts["kstar"]["tis"] == 4 and math.isinf(v.parts["kstar"]["seq-mis"])
    v = staleness.staleness_verdict(_stale())  # nothing breaks: token TIS does not break first
    assert v.verdict == FAILS and v.parts["b"] == "n/a"
    assert staleness.staleness_verdict(_stale(tis_breaks_at=8, mask_breaks_at=4)).verdict == FAILS
    # ESS flat until the break: (b) contradicts "ESS falls ahead of collapse"
    v = staleness.staleness_verdict(_stale(tis_breaks_at=4, ess_drop=0.0))
    assert v.parts["a"] == HOLDS and v.parts["b"] == FAILS and v.verdict == FAILS
    # one tis seed of three breaks: below the rate, but not nothing either
    some = _stale()
    some.loc[(some["correction"] == "tis") & (some["staleness"] == 16) & (some["seed"] == 0), "nonfinite"] = 3
    assert staleness.staleness_verdict(some).parts["a"] == UNSURE


# ----------------------------------------------------------------------------------------- 6. the seed bug
def _bug(nan_apply=True, skips=True, fixed_faults=0, fixed_j=0.97, seeds=3):
    rows = []
    for s in range(seeds):
        for mode in ("apply", "skip"):
            bug = "openrlhf-bc71bb1/seq-mask-tis"
            rows.append({"correction": bug, "mode": mode, "seed": s,
                         "nan_params": float(nan_apply and mode == "apply"),
                         "skipped": 10 if (skips and mode == "skip") else 0, "updates": 10,
                         "nonfinite_events": 10.0, "collapsed": float(mode == "apply"), "final_objective": np.nan})
            rows.append({"correction": "seq-mask-tis", "mode": mode, "seed": s, "nan_params": 0.0, "skipped": 0,
                         "updates": 10, "nonfinite_events": float(fixed_faults if s == 0 else 0), "collapsed": 0.0,
                         "final_objective": fixed_j + 0.002 * s})
            rows.append({"correction": "none", "mode": mode, "seed": s, "nan_params": 0.0, "skipped": 0,
                         "updates": 10, "nonfinite_events": 0.0, "collapsed": 0.0, "final_objective": 0.98 + 0.002 * s})
    return pd.DataFrame(rows)


def test_seedbug_rule():
    assert seedbug.seedbug_verdict(_bug()).verdict == HOLDS
    assert seedbug.seedbug_verdict(_bug(nan_apply=False)).verdict == FAILS
    assert seedbug.seedbug_verdict(_bug(skips=False)).verdict == FAILS
    assert seedbug.seedbug_verdict(_bug(fixed_faults=2)).verdict == FAILS
    assert seedbug.seedbug_verdict(_bug(fixed_j=0.5)).verdict == FAILS  # trains, but far worse than PPO


# ----------------------------------------------------------------------------------------- experiment files
def test_experiment_headers():
    for name in EXPERIMENTS:
        lines = (REPO / "conf" / "experiment" / f"{name}.yaml").read_text(encoding="utf-8").splitlines()
        assert lines[0] == "# @package _global_", name
        assert lines[1] == f"# is-study sweep experiment={name}", name
        header = "\n".join(ln for ln in lines if ln.startswith("#"))
        for word in ("Claim", "Source", "Verdict rule", "can show", "cannot", "Size"):
            assert word in header, (name, word)


# ----------------------------------------------------------------------------------------- end to end, tiny
TINY_RUN = ["train.steps=4", "rollout.batch_size=2", "rollout.group_size=4", "log.timing=false"]
TINY = {
    "tis-tames-mismatch": ["mismatch.logit_noise=0,1.0", "seed=range(0,2)", *TINY_RUN],
    "bias-variance-by-level": ["rollout.seq_len=2,4,8", "probe.repeats=16", "probe.n_boot=100",
                               "probe.pretrain_steps=2"],
    "mismatch-low-prob-tokens": ["seed=0", "log.tokens_every=2", *TINY_RUN],
    "precision-vs-algorithm": ["correction=none,geo-mask", "seed=range(0,2)", *TINY_RUN],
    "staleness-breaks-tis": ["correction=tis,seq-mis", "mismatch.staleness=0,2", "seed=range(0,2)", *TINY_RUN],
    "seed-bug-end-to-end": ["seed=range(0,2)", *TINY_RUN],
}


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_end_to_end(name, cli, tmp_path):
    sweep_dir = tmp_path / name
    code, out, err = cli("sweep", f"experiment={name}", *TINY[name], f"hydra.sweep.dir={sweep_dir}")
    assert code == 0, err
    assert (sweep_dir / "sweep_summary.csv").is_file()
    figs = tmp_path / "figures"
    code, out, err = cli("claims", str(sweep_dir), "--claim", name, "--out", str(figs))
    assert code == 0, err
    printed = out.strip().splitlines()
    assert len(printed) == 1, printed
    m = LINE.match(printed[0])
    assert m and m["name"] == name, printed[0]
    assert (figs / f"{name}.png").stat().st_size > 10_000 and (figs / f"{name}.pdf").is_file()


def test_all_writes_verdicts(tmp_path, cli):
    """--all over a folder of experiment dirs: one line per claim in VERDICTS.md (here, a missing experiment
    dir is an error with exit code 2, as figures.sh relies on)."""
    code, _, err = cli("claims", str(tmp_path), "--all", "--only", "seed-bug-end-to-end", "--out", str(tmp_path))
    assert code == 2 and "seed-bug-end-to-end" in err


@pytest.mark.parametrize("args,needle", [
    (["--claim", "no-such-claim"], "unknown claim 'no-such-claim'; valid: tis-tames-mismatch, "),
    (["--all", "--only", "tis-tames-mismatch nope"], "unknown claim 'nope'"),
    ([], "give either --claim NAME or --all"),
    (["--all", "--claim", "tis-tames-mismatch"], "give either --claim NAME or --all"),
    (["--all", "--style", "poster"], "unknown --style 'poster'; valid: default, paper"),
])
def test_bad_claims_input_is_one_line_with_exit_code_2(args, needle, cli, tmp_path):
    code, out, err = cli("claims", str(tmp_path), *args, "--out", str(tmp_path / "figs"))
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("is-study: error:") and needle in lines[0], err
    assert out == "" and not (tmp_path / "figs").exists()  # checked before anything is read or written


def test_verdicts_markdown_one_line_per_claim():
    results = [(n, stats.Verdict(HOLDS, f"x = {i}")) for i, n in enumerate(EXPERIMENTS)]
    text = verdicts.verdicts_markdown(results)
    bullets = [ln for ln in text.splitlines() if ln.startswith("- ")]
    assert len(bullets) == len(EXPERIMENTS)
    assert all("**holds**" in b and f"experiment={n}" in b for b, n in zip(bullets, EXPERIMENTS))


def test_figures_script_rejects_bad_input(tmp_path):
    script = REPO / "scripts" / "figures.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    bad = subprocess.run(["bash", str(script), "--bogus"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown argument" in bad.stderr
    env = {**os.environ, "FIGURES_ONLY": "no-such-claim", "FIGURES_WORK": str(tmp_path / "work"),
           "FIGURES_OUT": str(tmp_path / "out")}
    missing = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env)
    assert missing.returncode == 2 and "no-such-claim" in missing.stderr
    assert not (tmp_path / "work").exists()  # checked before anything is created or run
