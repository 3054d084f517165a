"""Claim 4: the engine's precision matters more than the correction (Qi et al. 2025).

Per seed, how far plain PPO's objective under a bf16 or fp16 engine strays from the fp32 run, and how far the
corrections spread apart: fp16 must track fp32 far more closely and shrink the spread. Both are judged against
a chaos floor: how far an fp32 run with another sampling stream (mismatch=none-stream1: the same θ₀, other
prompts and tokens) strays from the fp32 run. Once J saturates, any perturbation sends a run down its own path,
so a gap of that size measures the chaotic divergence of two trajectories, not the precision's bias. Read top to
bottom: the reducer (one row per update), the per-seed gaps and floor, the rule (`precision_verdict`), the
figure, `evaluate`.
"""

from __future__ import annotations

import math

import numpy as np

from analysis import style as st
from analysis.claims.figures import headline, legend_below, new_figure, ordered_presets
from analysis.claims.frames import band_text, required, run_frame, update_index, with_keys, world_of
from analysis.claims.stats import (
    FAILS,
    FINAL_FRACTION,
    HOLDS,
    SIGMAS,
    UNSURE,
    UNTESTABLE,
    Verdict,
    all_of,
    effect,
    mean_se,
    plus_minus,
    sig,
)
from analysis.load import Dataset
from runner.errors import UserError

NAME = "precision-vs-algorithm"  # = conf/experiment/WORLD/NAME.yaml and the figure's file name
TITLE = "4. Precision matters more than the algorithm"
SOURCE = "Qi et al. 2025, “Defeating the training-inference mismatch via FP16”"

# Thresholds of the rule (named in its docstring and the experiment's header): how much smaller fp16's excess
# over the chaos floor must be than bf16's.
CLOSER_FACTOR = 2.0  # (a): fp16 at least 2× closer to fp32 than bf16, beyond the floor
SHRINK_FACTOR = 1.25  # (b): the spread across corrections at least 1.25× smaller, beyond the floor
# The expected range of n independent normal draws is d_n σ (the range constants; d_2 σ is the expected
# |difference| of two). Where J is a Monte Carlo estimate (the run logged objective_se), two runs' J differ by
# that noise alone; and the chaos floor of a spread over k corrections is the floor of two runs × d_k / d_2.
RANGE_CONSTANTS = {2: 1.128, 3: 1.693, 4: 2.059, 5: 2.326, 6: 2.534, 7: 2.704, 8: 2.847}
RESOLVED = 2.0  # a bf16 gap or spread within 2× the Monte Carlo noise floor is not resolved from the noise


def precision_frame(ds: Dataset):
    """One row per update where J was evaluated: precision, correction, seed, stream (mismatch.sampling_stream,
    0 = the seed's own), t (global update index), step, objective, objective_se (NaN where J is exact)."""
    df = required(ds.metrics, "training metrics (sweep.csv)", ds.path)
    df = df[df["reward"].notna()] if "reward" in df.columns else df  # the updates' J, as before metrics.csv's final row
    df = with_keys(
        ds, df, precision="mismatch.precision", correction="correction", seed="seed", stream="mismatch.sampling_stream"
    )
    df["stream"] = df["stream"].fillna(0).astype(int)  # a dataset from before the key: every run on stream 0
    if "objective_se" not in df.columns:
        df["objective_se"] = np.nan
    df = df.assign(t=update_index(df))[
        ["precision", "correction", "seed", "stream", "t", "step", "objective", "objective_se"]
    ]
    return df.dropna(subset=["objective"])  # the updates of the steps where J was evaluated


def noise_floor(traj, k: int) -> float:
    """The expected range of k Monte Carlo estimates of the same J: d_k × the mean logged SE (NaN where J is
    exact, i.e. no objective_se)."""
    if "objective_se" not in traj.columns or not traj["objective_se"].notna().any():
        return math.nan
    return RANGE_CONSTANTS.get(k, RANGE_CONSTANTS[8]) * float(traj["objective_se"].astype(float).mean())


def precision_stats(traj, baseline: str = "none", reference: str = "fp32"):
    """Per (precision, seed), on the seed's own sampling stream: gap = mean_t |J_baseline,prec −
    J_baseline,reference| and spread = mean_t of max − min of J across the corrections."""
    import pandas as pd

    own = traj[traj["stream"] == 0]
    piv = own.pivot_table(index=["seed", "t"], columns=["precision", "correction"], values="objective", aggfunc="first")
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
            rows.append(
                {
                    "precision": prec,
                    "seed": seed,
                    "gap": float(gap.get(seed, np.nan)),
                    "spread": float(spread[seed]),
                    "corrections": len(cols),
                }
            )
    return pd.DataFrame(rows)


def chaos_gaps(traj, baseline: str = "none", reference: str = "fp32"):
    """Per (seed, t): |J_baseline,reference on another sampling stream − J_baseline,reference on the seed's own|
    (the mean over the other streams where there are several): the chaos floor, update by update."""
    ref = traj[(traj["precision"] == reference) & (traj["correction"] == baseline)]
    piv = ref.pivot_table(index=["seed", "t"], columns="stream", values="objective", aggfunc="first")
    others = [c for c in piv.columns if c != 0]
    if 0 not in piv.columns or not others:
        return None
    return piv[others].sub(piv[0], axis=0).abs().mean(axis=1).dropna()


def chaos_floor(traj, baseline: str = "none", reference: str = "fp32"):
    """Per seed: the mean over updates of chaos_gaps, the floor of a precision's gap to the reference."""
    gaps = chaos_gaps(traj, baseline, reference)
    if gaps is None:
        raise UserError(
            "precision-vs-algorithm: no chaos-floor arm (an fp32 plain-PPO run with another sampling "
            "stream, mismatch=none-stream1); run the experiment as shipped"
        )
    return gaps.groupby(level="seed").mean()


def judge_part(low, high, floor, factor: float) -> tuple[str, float, float]:
    """One part of the rule on per-seed values (aligned Series) of bf16 (`low`), fp16 (`high`) and the floor:
    the control c = low − floor (bf16 must move J beyond chaos) and the test d = (low − floor) −
    factor·(high − floor). Returns (verdict, mean c, mean d): untestable here unless effect(c, 0) holds, else
    effect(d, 0)."""
    c = (low - floor).to_numpy(float)
    d = ((low - floor) - factor * (high - floor)).to_numpy(float)
    if effect(c, 0.0) != HOLDS:
        return UNTESTABLE, mean_se(c)[0], mean_se(d)[0]
    return effect(d, 0.0), mean_se(c)[0], mean_se(d)[0]


def precision_verdict(
    traj, baseline: str = "none", reference: str = "fp32", low: str = "bf16", high: str = "fp16"
) -> Verdict:
    """Claim 4 (Qi et al. 2025) on per-update objectives (precision, correction, seed, stream, t, objective),
    paired per seed. Per seed: gap_p = mean_t |J_none,p − J_none,fp32| and spread_p = mean_t (max_c J_c,p −
    min_c J_c,p) over the k corrections (precision_stats, the seed's own stream); the chaos floor f = mean_t
    |J_none,fp32 on stream 1 − J_none,fp32| (chaos_floor), and f·d_k/d_2 for the spread (the expected range
    of k draws against the expected |difference| of two). The precision arms share the seed's stream and start
    coupled to the fp32 run, the floor arm does not: a gap beyond the floor cannot be chaos alone.
      (a) control: bf16's gap beyond the floor, effect(gap_bf16 − f, 0) holds; else (a) is "untestable here"
          (bf16's rounding moves J no further than other random draws do). Test: d = (gap_bf16 − f) −
          2·(gap_fp16 − f) per seed; effect(d, 0): fp16's excess over the floor at most half of bf16's.
      (b) the same on the spreads, with the floor f·d_k/d_2 and the factor 1.25.
    effect is the shared paired test (analysis/claims/stats.py: significant at its interval for the number of
    seeds). Where J is a Monte Carlo estimate (objective_se logged) it also carries noise, whose floor is
    noise_floor (the expected |difference| of 2, or range of k, estimates of one J): a part whose bf16 value
    is within 2× it is "untestable here" (the estimate of J cannot resolve a precision effect at this size);
    one whose fp16 value alone is within it cannot be ruled out, so "does not hold" becomes inconclusive.
    The claim: "does not hold" if a part does not hold, else "untestable here" if a part is, else all_of."""
    s = precision_stats(traj, baseline, reference)
    need = {low, high, reference}
    if not need <= set(s["precision"]):
        raise UserError(f"precision-vs-algorithm: needs precisions {sorted(need)}, got {sorted(set(s['precision']))}")
    floor2 = chaos_floor(traj, baseline, reference)
    a = s[s["precision"] == low].set_index("seed")
    b = s[s["precision"] == high].set_index("seed")
    seeds = a.index.intersection(b.index).intersection(floor2.index)
    a, b, f2 = a.loc[seeds], b.loc[seeds], floor2.loc[seeds]
    k = int(a["corrections"].max())
    fk = f2 * RANGE_CONSTANTS.get(k, RANGE_CONSTANTS[8]) / RANGE_CONSTANTS[2]
    va, ca, da = judge_part(a["gap"], b["gap"], f2, CLOSER_FACTOR)
    vb, cb, db = judge_part(a["spread"], b["spread"], fk, SHRINK_FACTOR)
    floors = {"a": noise_floor(traj, 2), "b": noise_floor(traj, k)}
    noise = ""
    unresolved = []
    for part, col in (("a", "gap"), ("b", "spread")):
        mc = floors[part]
        if not math.isfinite(mc):
            continue
        v = va if part == "a" else vb
        if a[col].mean() <= RESOLVED * mc:
            v = UNTESTABLE
            unresolved.append(part)
        elif b[col].mean() <= RESOLVED * mc and v == FAILS:
            v = UNSURE
        va, vb = (v, vb) if part == "a" else (va, v)
        noise += f"{'; ' if noise else ''}({part}) {sig(mc, 2)}"
    if noise:
        noise = (
            f" Monte Carlo J: the noise floor (expected |difference| or range of estimates of one J) is {noise}"
            + (f"; ({', '.join(unresolved)}) at bf16 within {RESOLVED:g}× it: unresolved" if unresolved else "")
            + "; an fp16 value within it makes a 'does not hold' inconclusive."
        )
    ref = s[s["precision"] == reference]
    n = len(seeds)
    piv = traj[(traj["precision"] == low) & (traj["stream"] == 0)].pivot_table(
        index=["seed", "t"], columns="correction", values="objective", aggfunc="first"
    )
    far = ""
    if baseline in piv.columns and len(piv.columns) > 1:
        dev = piv.drop(columns=[baseline]).sub(piv[baseline], axis=0).abs().mean()
        far = f", most of it {dev.idxmax()} (mean |J − J_{baseline}| {sig(dev.max())} at {low})"

    def excess(col, fl):
        return {p: mean_se((x[col] - fl).to_numpy(float)) for p, x in ((low, a), (high, b))}

    ea, eb = excess("gap", f2), excess("spread", fk)
    statement = (
        f"(a) gap to fp32 of plain PPO's J (mean over updates, n = {n} seeds): {high} {sig(b['gap'].mean())}, "
        f"{low} {sig(a['gap'].mean())}, against a chaos floor (fp32 on another sampling stream) of "
        f"{sig(f2.mean())}; beyond it {high} {plus_minus(*ea[high][:2])}, {low} {plus_minus(*ea[low][:2])}"
        f"{'' if va != UNTESTABLE or unresolved else ' (bf16 not beyond the floor)'}: {va}; "
        f"(b) spread of J across {k} corrections: {reference} {sig(ref['spread'].mean())}, "
        f"{high} {sig(b['spread'].mean())}, {low} {sig(a['spread'].mean())}{far}, against a floor of "
        f"{sig(fk.mean())}; beyond it {high} {plus_minus(*eb[high][:2])}, {low} {plus_minus(*eb[low][:2])}"
        f"{'' if vb != UNTESTABLE or 'b' in unresolved else ' (bf16 not beyond the floor)'}: {vb}.{noise}"
    )
    key = (
        f"gap to fp32 {high} {sig(b['gap'].mean(), 2)}, {low} {sig(a['gap'].mean(), 2)} vs chaos floor "
        f"{sig(f2.mean(), 2)} (a {va}); spread {high} {sig(b['spread'].mean(), 2)}, {low} "
        f"{sig(a['spread'].mean(), 2)} vs {sig(fk.mean(), 2)} (b {vb}); n = {n}"
    )
    parts = [va, vb]
    verdict = FAILS if FAILS in parts else UNTESTABLE if UNTESTABLE in parts else all_of(parts)
    return Verdict(
        verdict,
        statement,
        {
            "a": va,
            "b": vb,
            "chaos_floor": (float(f2.mean()), float(fk.mean())),
            "control": (ca, cb),
            "test": (da, db),
            "noise_floor": floors,
        },
        key=key,
    )


# The colours every figure gives an engine precision (analysis/style.py), so bf16 here is bf16 in the gallery.
PRECISION_COLORS = st.dimension_colors("mismatch.precision", st.PRECISION_ORDER)
CHAOS_COLOR = "#2a9d8f"  # the chaos floor: teal, far from the precisions' greys and purples


def _by_step(ax, series, per: int, color, linestyle: str = "-", marker: str = "o") -> None:
    """One point per training step (J is constant over a step's updates), with markers where J was evaluated
    only a few times (a Monte Carlo J every 10 steps): otherwise a lone evaluation is an invisible line."""
    by_step = series.groupby(series.index // per).first()
    few = by_step.dropna().nunique() <= 25
    ax.plot(
        by_step.index,
        by_step.where(by_step > 0),
        color=color,
        linewidth=1.1,
        linestyle=linestyle,
        marker=marker if few else None,
        markersize=4,
    )


def precision_figure(traj, verdict: Verdict, style: str, world: str = "", baseline: str = "none"):
    from matplotlib.lines import Line2D

    fig, axes = new_figure(3, 1, style, panel=(3.7, 3.1))
    ax_g, ax_s, ax_c = axes[0]
    per = max(int(traj["t"].max()) // max(int(traj["step"].max()), 1), 1) if traj["step"].max() > 0 else 1
    chaos = chaos_gaps(traj, baseline)
    other = traj[traj["stream"] != 0]
    traj = traj[traj["stream"] == 0]
    piv = traj.pivot_table(
        index=["seed", "t"], columns=["precision", "correction"], values="objective", aggfunc="first"
    )
    present = {c[0] for c in piv.columns}
    precs = [p for p in ("fp32", "fp16", "bf16", "fp8") if p in present]
    handles, labels = [], []
    fp32_spread_zero = False
    for prec in precs:
        color = PRECISION_COLORS[prec]
        cols = [c for c in piv.columns if c[0] == prec]
        if prec != "fp32" and (prec, baseline) in piv.columns and ("fp32", baseline) in piv.columns:
            gap = (piv[(prec, baseline)] - piv[("fp32", baseline)]).abs().groupby(level="t").mean()
            _by_step(ax_g, gap, per, color)
        spread = (piv[cols].max(axis=1) - piv[cols].min(axis=1)).groupby(level="t").mean()
        # With fp32 every correction's weight is 1 up to rounding: its spread is 0 (off the log axis) unless
        # the rounding of a cached forward pass grows, through chaos, into other trajectories
        if prec == "fp32" and not (spread.fillna(0) > 0).any():
            fp32_spread_zero = True
        else:
            _by_step(ax_s, spread, per, color)
        handles.append(Line2D([], [], color=color, marker="o", markersize=4))
        labels.append(f"{prec} engine" + (" (no mismatch: the reference)" if prec == "fp32" else ""))
    # The chaos floor: an fp32 run on another sampling stream against the fp32 run, and for the spread the
    # expected range of that many runs (the rule's floors, update by update).
    n_corr = traj["correction"].nunique()
    if chaos is not None:
        floor_t = chaos.groupby(level="t").mean()
        scale = RANGE_CONSTANTS.get(n_corr, RANGE_CONSTANTS[8]) / RANGE_CONSTANTS[2]
        _by_step(ax_g, floor_t, per, CHAOS_COLOR, linestyle="--", marker="D")
        _by_step(ax_s, floor_t * scale, per, CHAOS_COLOR, linestyle="--", marker="D")
        handles.append(Line2D([], [], color=CHAOS_COLOR, linestyle="--", marker="D", markersize=4))
        labels.append(f"chaos floor: fp32 with another sampling stream ((b): its expected range over {n_corr} runs)")
    # A Monte Carlo J: differences below the expected range of estimates of one J are noise, not precision.
    for ax, floor in ((ax_g, noise_floor(traj, 2)), (ax_s, noise_floor(traj, n_corr))):
        if math.isfinite(floor) and floor > 0:
            ax.axhline(floor, color="0.4", linestyle="--", linewidth=0.9)
            ax.text(
                0.02,
                floor,
                " Monte Carlo noise floor",
                transform=ax.get_yaxis_transform(),
                va="bottom",
                fontsize="x-small",
                color="0.35",
            )
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
    if fp32_spread_zero:
        ax_s.text(
            0.98,
            0.02,
            "fp32: every correction is plain PPO (spread 0)",
            transform=ax_s.transAxes,
            ha="right",
            va="bottom",
            fontsize="x-small",
            color="0.35",
        )
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
        ax_c.errorbar(
            xs,
            ys,
            yerr=np.nan_to_num(es),
            color=PRECISION_COLORS[prec],
            marker="o",
            markersize=4,
            linestyle="none",
            capsize=2,
        )
    floor_arm = other[(other["precision"] == "fp32") & (other["correction"] == baseline)]
    if len(floor_arm) and baseline in names:
        last = floor_arm[floor_arm["t"] >= floor_arm["t"].max() * (1 - FINAL_FRACTION)]
        delta = last.groupby("seed")["objective"].mean() - ref
        x = names.index(baseline) + ((len(precs) - 1) / 2 + 0.5) * width  # right of the precisions' points
        ax_c.errorbar(
            [x],
            [delta.mean()],
            yerr=[np.nan_to_num(SIGMAS * delta.sem())],
            color=CHAOS_COLOR,
            marker="D",
            markersize=4,
            linestyle="none",
            capsize=2,
        )
        ax_c.annotate(
            "chaos floor arm",
            (x, delta.mean()),
            textcoords="offset points",
            xytext=(4, 4),
            fontsize="x-small",
            color=CHAOS_COLOR,
        )
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
    bands, degenerate = band_text(run_frame(ds, correction="correction", precision="mismatch.precision"), ["precision"])
    if bands:
        v.statement += f" {bands[0].upper()}{bands[1:]}."
    v.parts["degenerate"] = degenerate
    return v, precision_figure(traj, v, style, world_of(ds))
