"""Claim 4: the engine's precision matters more than the correction (Qi et al. 2025).

Per seed, how far plain PPO's objective under a bf16 or fp16 engine strays from the fp32 run, and how far the
corrections spread apart: fp16 must track fp32 far more closely and shrink the spread. Read top to bottom:
the reducer (one row per update), the per-seed gaps, the rule (`precision_verdict`), the figure, `evaluate`.
"""

from __future__ import annotations

import math

import numpy as np

from analysis import style as st
from analysis.claims.figures import headline, legend_below, new_figure, ordered_presets
from analysis.claims.frames import band_text, required, run_frame, update_index, with_keys, world_of
from analysis.claims.stats import (EPS, FAILS, FINAL_FRACTION, SIGMAS, UNSURE, Verdict, all_of, effect, mean_se,
                                   plus_minus, sig)
from analysis.load import Dataset
from runner.errors import UserError

NAME = "precision-vs-algorithm"  # = conf/experiment/NAME.yaml and the figure's file name
TITLE = "4. Precision matters more than the algorithm"
SOURCE = "Qi et al. 2025, “Defeating the training-inference mismatch via FP16”"

# Thresholds of the rule (named in its docstring and the experiment's header).
CLOSER_MARGIN = math.log(2.0)  # (a): fp16 at least 2× closer to fp32 than bf16
SHRINK_MARGIN = math.log(1.25)  # (b): the spread across corrections at least 1.25× smaller
# Where J is a Monte Carlo estimate (the run logged objective_se), two runs' J differ by noise alone: the
# expected |difference| of 2, and the expected range of n, independent estimates with SE σ is d_n σ (the
# range constants of n normal draws). A gap or spread within 2× that floor is not resolved from the noise.
RANGE_CONSTANTS = {2: 1.128, 3: 1.693, 4: 2.059, 5: 2.326, 6: 2.534, 7: 2.704, 8: 2.847}
RESOLVED = 2.0


def precision_frame(ds: Dataset):
    """One row per update where J was evaluated: precision, correction, seed, t (global update index), step,
    objective, objective_se (NaN where J is exact)."""
    df = required(ds.metrics, "training metrics (sweep.csv)", ds.path)
    df = df[df["reward"].notna()] if "reward" in df.columns else df  # the updates' J, as before metrics.csv's final row
    df = with_keys(ds, df, precision="mismatch.precision", correction="correction", seed="seed")
    if "objective_se" not in df.columns:
        df["objective_se"] = np.nan
    df = df.assign(t=update_index(df))[["precision", "correction", "seed", "t", "step", "objective", "objective_se"]]
    return df.dropna(subset=["objective"])  # the updates of the steps where J was evaluated


def noise_floor(traj, k: int) -> float:
    """The expected range of k Monte Carlo estimates of the same J: d_k × the mean logged SE (NaN where J is
    exact, i.e. no objective_se)."""
    if "objective_se" not in traj.columns or not traj["objective_se"].notna().any():
        return math.nan
    return RANGE_CONSTANTS.get(k, RANGE_CONSTANTS[8]) * float(traj["objective_se"].astype(float).mean())


def precision_stats(traj, baseline: str = "none", reference: str = "fp32"):
    """Per (precision, seed): gap = mean_t |J_baseline,prec − J_baseline,reference| and spread = mean_t of
    max − min of J across the corrections."""
    import pandas as pd

    piv = traj.pivot_table(index=["seed", "t"], columns=["precision", "correction"], values="objective",
                           aggfunc="first")
    rows = []
    precs = sorted({p for p, _ in piv.columns})
    for prec in precs:
        cols = [c for c in piv.columns if c[0] == prec]
        spread = (piv[cols].max(axis=1) - piv[cols].min(axis=1)).groupby(level="seed").mean()
        if (prec, baseline) in piv.columns and (reference, baseline) in piv.columns:
            gap = (piv[(prec, baseline)] - piv[(reference, baseline)]).abs().groupby(level="seed").mean()
        else:
            gap = spread * np.nan
        for seed in spread.index:
            rows.append({"precision": prec, "seed": seed, "gap": float(gap.get(seed, np.nan)),
                         "spread": float(spread[seed]), "corrections": len(cols)})
    return pd.DataFrame(rows)


def precision_verdict(traj, baseline: str = "none", reference: str = "fp32", low: str = "bf16",
                      high: str = "fp16") -> Verdict:
    """Claim 4 (Qi et al. 2025) on per-update objectives (precision, correction, seed, t, objective), paired per
    seed (precision_stats gives gap and spread per precision and seed):
      (a) L = log(gap_bf16 / gap_fp16) per seed; effect(L, log 2): fp16 tracks fp32 at least 2× more closely.
      (b) L = log(spread_bf16 / spread_fp16) per seed; effect(L, log 1.25): the spread across corrections shrinks
          by at least 1.25×.
    all_of(a, b). (A tiny 1e-12 keeps a zero gap, identical runs, from dividing by zero.)
    Where J is a Monte Carlo estimate (objective_se logged), the gaps and spreads carry noise: its floor is
    noise_floor (the expected |difference| of 2, or range of k, estimates of the same J). A part whose bf16
    value is within 2× its floor is inconclusive (noise, not precision, sets it); one whose fp16 value alone is
    within it cannot be ruled out (the true ratio may be larger), so "does not hold" becomes inconclusive there."""
    s = precision_stats(traj, baseline, reference)
    need = {low, high, reference}
    if not need <= set(s["precision"]):
        raise UserError(f"precision-vs-algorithm: needs precisions {sorted(need)}, got {sorted(set(s['precision']))}")
    a = s[s["precision"] == low].set_index("seed")
    b = s[s["precision"] == high].set_index("seed")
    seeds = a.index.intersection(b.index)
    a, b = a.loc[seeds], b.loc[seeds]
    la = np.log((a["gap"] + EPS) / (b["gap"] + EPS)).to_numpy(float)
    lb = np.log((a["spread"] + EPS) / (b["spread"] + EPS)).to_numpy(float)
    va, vb = effect(la, CLOSER_MARGIN), effect(lb, SHRINK_MARGIN)
    k = int(a["corrections"].max())
    floors = {"a": noise_floor(traj, 2), "b": noise_floor(traj, k)}
    noise = ""
    for part, col in (("a", "gap"), ("b", "spread")):
        f = floors[part]
        if not math.isfinite(f):
            continue
        if a[col].mean() <= RESOLVED * f:
            va, vb = (UNSURE, vb) if part == "a" else (va, UNSURE)
        elif b[col].mean() <= RESOLVED * f and (va if part == "a" else vb) == FAILS:
            va, vb = (UNSURE, vb) if part == "a" else (va, UNSURE)
        noise += f"{'; ' if noise else ''}({part}) {sig(f, 2)}"
    if noise:
        noise = (f" Monte Carlo J: the noise floor (expected |difference| or range of estimates of one J) is {noise}; "
                 f"a bf16 value within {RESOLVED:g}× it is unresolved, an fp16 one makes its ratio a lower bound.")
    ref = s[s["precision"] == reference]
    ma, sa, n = mean_se(la)
    mb, sb, _ = mean_se(lb)
    piv = traj[traj["precision"] == low].pivot_table(index=["seed", "t"], columns="correction", values="objective",
                                                    aggfunc="first")
    far = ""
    if baseline in piv.columns and len(piv.columns) > 1:
        dev = piv.drop(columns=[baseline]).sub(piv[baseline], axis=0).abs().mean()
        far = f", most of it {dev.idxmax()} (mean |J − J_{baseline}| {sig(dev.max())} at {low})"
    statement = (f"(a) gap to fp32 of plain PPO's J (mean over updates, {n} seeds): {high} {sig(b['gap'].mean())} vs "
                 f"{low} {sig(a['gap'].mean())}, ratio e^({plus_minus(ma, sa)}) = {sig(math.exp(ma), 2)}×: {va}; "
                 f"(b) spread of J across {k} corrections: {reference} {sig(ref['spread'].mean())}, "
                 f"{high} {sig(b['spread'].mean())}, {low} {sig(a['spread'].mean())}, "
                 f"ratio e^({plus_minus(mb, sb)}) = {sig(math.exp(mb), 2)}×{far}: {vb}.{noise}")
    key = f"fp16 {sig(math.exp(ma), 2)}× closer to fp32 (a {va}); spread {sig(math.exp(mb), 2)}× smaller (b {vb})"
    return Verdict(all_of([va, vb]), statement, {"a": va, "b": vb, "log_gap_ratio": (ma, sa),
                                                 "log_spread_ratio": (mb, sb), "noise_floor": floors}, key=key)


# The colours every figure gives an engine precision (analysis/style.py), so bf16 here is bf16 in the gallery.
PRECISION_COLORS = st.dimension_colors("mismatch.precision", st.PRECISION_ORDER)


def _by_step(ax, series, per: int, color) -> None:
    """One point per training step (J is constant over a step's updates), with markers where J was evaluated
    only a few times (a Monte Carlo J every 10 steps): otherwise a lone evaluation is an invisible line."""
    by_step = series.groupby(series.index // per).first()
    few = by_step.dropna().nunique() <= 25
    ax.plot(by_step.index, by_step.where(by_step > 0), color=color, linewidth=1.1,
            marker="o" if few else None, markersize=4)


def precision_figure(traj, verdict: Verdict, style: str, world: str = "", baseline: str = "none"):
    from matplotlib.lines import Line2D

    fig, axes = new_figure(3, 1, style, panel=(3.7, 3.1))
    ax_g, ax_s, ax_c = axes[0]
    per = max(int(traj["t"].max()) // max(int(traj["step"].max()), 1), 1) if traj["step"].max() > 0 else 1
    piv = traj.pivot_table(index=["seed", "t"], columns=["precision", "correction"], values="objective",
                           aggfunc="first")
    present = {c[0] for c in piv.columns}
    precs = [p for p in ("fp32", "fp16", "bf16", "fp8") if p in present]
    handles, labels = [], []
    for prec in precs:
        color = PRECISION_COLORS[prec]
        cols = [c for c in piv.columns if c[0] == prec]
        if prec != "fp32":
            if (prec, baseline) in piv.columns and ("fp32", baseline) in piv.columns:
                gap = (piv[(prec, baseline)] - piv[("fp32", baseline)]).abs().groupby(level="t").mean()
                _by_step(ax_g, gap, per, color)
            spread = (piv[cols].max(axis=1) - piv[cols].min(axis=1)).groupby(level="t").mean()
            _by_step(ax_s, spread, per, color)
        handles.append(Line2D([], [], color=color, marker="o", markersize=4))
        labels.append(f"{prec} engine" + (" (no mismatch: the reference)" if prec == "fp32" else ""))
    # A Monte Carlo J: differences below the expected range of estimates of one J are noise, not precision.
    n_corr = traj["correction"].nunique()
    for ax, floor in ((ax_g, noise_floor(traj, 2)), (ax_s, noise_floor(traj, n_corr))):
        if math.isfinite(floor) and floor > 0:
            ax.axhline(floor, color="0.4", linestyle="--", linewidth=0.9)
            ax.text(0.02, floor, " Monte Carlo noise floor", transform=ax.get_yaxis_transform(), va="bottom",
                    fontsize="x-small", color="0.35")
    from matplotlib.ticker import MaxNLocator

    last_step = int(traj["step"].max()) if len(traj) else 0
    for ax in (ax_g, ax_s):
        ax.set_yscale("log")
        ax.set_xlabel("training step")
        # Steps are whole numbers, and the axis spans the whole run: a lone evaluation (a short run whose
        # step-0 gap is 0, off the log axis) must not fill the panel with fractional steps around it.
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlim(-0.02 * max(last_step, 1), last_step * 1.02 + (0 if last_step else 1))
    ax_g.set_ylabel(r"$|J_{\mathrm{prec}} - J_{\mathrm{fp32}}|$ of plain PPO")
    ax_g.set_title("(a) distance to the fp32 run (mean over seeds)", fontsize="medium")
    ax_s.set_ylabel(r"$\max_c J_c - \min_c J_c$ over the corrections")
    ax_s.set_title("(b) spread across corrections", fontsize="medium")
    if "fp32" in present:
        ax_s.text(0.98, 0.02, "fp32: every correction is plain PPO (spread 0)", transform=ax_s.transAxes,
                  ha="right", va="bottom", fontsize="x-small", color="0.35")
    # (c) final J by correction and precision, relative to fp32 plain PPO of the same seed
    last = traj[traj["t"] >= traj["t"].max() * (1 - FINAL_FRACTION)]
    fin = last.groupby(["precision", "correction", "seed"])["objective"].mean().reset_index()
    ref = fin[(fin["precision"] == "fp32") & (fin["correction"] == baseline)].set_index("seed")["objective"]
    fin["delta"] = fin["objective"] - fin["seed"].map(ref)
    names = ordered_presets(fin["correction"].unique())
    width = 0.8 / max(len(precs), 1)
    for i, prec in enumerate(precs):
        cur = fin[fin["precision"] == prec].groupby("correction")["delta"].agg(["mean", "sem"])
        xs = np.arange(len(names)) + (i - (len(precs) - 1) / 2) * width
        ys = [cur["mean"].get(n, np.nan) for n in names]
        es = [SIGMAS * cur["sem"].get(n, np.nan) for n in names]
        ax_c.errorbar(xs, ys, yerr=np.nan_to_num(es), color=PRECISION_COLORS[prec], marker="o", markersize=4,
                      linestyle="none", capsize=2)
    ax_c.axhline(0, color="0.4", linewidth=0.8)
    ax_c.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax_c.set_ylabel(r"final $J$ − final $J$ of fp32 plain PPO")
    ax_c.set_title(f"(c) final J (last {FINAL_FRACTION:.0%} of updates, ± 2 SE)", fontsize="medium")
    legend_below(fig, handles, labels, style)
    headline(fig, TITLE + (f" [{world} world]" if world else ""), SOURCE, verdict, style)
    return fig


def evaluate(ds: Dataset, style: str):
    traj = precision_frame(ds)
    v = precision_verdict(traj)
    bands, degenerate = band_text(run_frame(ds, correction="correction", precision="mismatch.precision"),
                                  ["precision"])
    if bands:
        v.statement += f" {bands[0].upper()}{bands[1:]}."
    v.parts["degenerate"] = degenerate
    return v, precision_figure(traj, v, style, world_of(ds))
