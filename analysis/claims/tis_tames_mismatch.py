"""Claim 1: token TIS tames the training–inference mismatch (Yao et al. 2025).

Plain PPO against token TIS under a bf16 engine, with and without logit noise, paired over seeds: TIS must
cut grad-norm spikes and leave a better or steadier objective. Read top to bottom: the reducer (one row per
run), the rule (`tis_verdict`), the figure, `evaluate`.
"""

from __future__ import annotations

import numpy as np

from analysis import style as st
from analysis.claims.figures import headline, legend_below, line_handle, new_figure, ordered_presets
from analysis.claims.frames import required, update_index, with_keys
from analysis.claims.stats import (SPIKE_FACTOR, SPIKE_WINDOW, Verdict, all_of, any_of, drawdown_of, effect,
                                   final_of, mean_se, plus_minus, sig, spikes_of)
from analysis.load import Dataset, fmt_value
from runner.errors import UserError

NAME = "tis-tames-mismatch"  # = conf/experiment/NAME.yaml and the figure's file name
TITLE = "1. Token TIS tames the training–inference mismatch"
SOURCE = "Yao et al. 2025, “Your efficient RL framework secretly brings you off-policy RL training”"

# Thresholds of the rule (named in its docstring and the experiment's header).
SPIKE_MARGIN = 1.0  # spikes per run: a smaller reduction is no reduction
J_MARGIN = 0.01  # of the exact objective J ∈ [0, 1]

_ARM_NAMES = {"none": "plain PPO", "tis": "token TIS"}


def tis_runs(ds: Dataset):
    """One row per run: world (the logit noise σ, and the precision when several), correction, seed, spikes,
    j_final, drawdown, max_grad_norm."""
    import pandas as pd

    df = required(ds.metrics, "training metrics (sweep.csv)", ds.path)
    df = with_keys(ds, df, noise="mismatch.logit_noise", prec="mismatch.precision", correction="correction",
                   seed="seed")
    df = df.assign(_t=update_index(df)).sort_values(["job", "_t"])
    rows = []
    several_prec = df["prec"].nunique() > 1
    for job, g in df.groupby("job", sort=True):
        noise, prec = g["noise"].iloc[0], g["prec"].iloc[0]
        world = f"σ={fmt_value(float(noise))}" + (f" {prec}" if several_prec else "")
        rows.append({"job": job, "world": world, "noise": float(noise), "precision": prec,
                     "correction": str(g["correction"].iloc[0]), "seed": int(g["seed"].iloc[0]),
                     "spikes": spikes_of(g["grad_norm"]), "j_final": final_of(g["objective"]),
                     "drawdown": drawdown_of(g["objective"]),
                     "max_grad_norm": float(np.nanmax(g["grad_norm"].where(np.isfinite(g["grad_norm"]))))})
    return pd.DataFrame(rows).sort_values(["noise", "precision", "correction", "seed"]).reset_index(drop=True)


def tis_verdict(runs, baseline: str = "none") -> Verdict:
    """Claim 1 (Yao et al. 2025), per world (a mismatch setting), paired over seeds between plain PPO
    (`baseline`) and token TIS (the one other correction):
      spikes:    d = spikes_PPO − spikes_TIS per run; effect(d, margin 1 spike per run)
      objective: effect(J_final,TIS − J_final,PPO, 0.01) or effect(drawdown_PPO − drawdown_TIS, 0.01), combined
                 with any_of ("a worse OR unstable objective")
    A world's verdict is all_of(spikes, objective): TIS must reduce both. The claim is existential over the
    worlds ("a bf16 OR a noise mismatch"): any_of over worlds.
    `runs`: world, correction, seed, spikes, j_final, drawdown (tis_runs)."""
    others = sorted(set(runs["correction"]) - {baseline})
    if baseline not in set(runs["correction"]) or len(others) != 1:
        raise UserError(f"tis-tames-mismatch: needs runs of {baseline!r} and exactly one correction to compare, "
                        f"got {sorted(set(runs['correction']))}")
    treat = others[0]
    worlds, texts, parts = [], [], {}
    for world, w in runs.groupby("world", sort=False):
        a = w[w["correction"] == baseline].set_index("seed")
        b = w[w["correction"] == treat].set_index("seed")
        seeds = a.index.intersection(b.index)
        a, b = a.loc[seeds], b.loc[seeds]
        d_spk = (a["spikes"] - b["spikes"]).to_numpy(float)
        d_j = (b["j_final"] - a["j_final"]).to_numpy(float)
        d_dd = (a["drawdown"] - b["drawdown"]).to_numpy(float)
        v_spk = effect(d_spk, SPIKE_MARGIN)
        v_obj = any_of([effect(d_j, J_MARGIN), effect(d_dd, J_MARGIN)])
        v = all_of([v_spk, v_obj])
        worlds.append(v)
        m_j, se_j, n = mean_se(d_j)
        parts[world] = {"verdict": v, "spikes": v_spk, "objective": v_obj, "n": n,
                        "spikes_ppo": float(a["spikes"].mean()), "spikes_tis": float(b["spikes"].mean()),
                        "j_ppo": float(a["j_final"].mean()), "j_tis": float(b["j_final"].mean()),
                        "d_j": (m_j, se_j), "d_spikes": mean_se(d_spk)[:2], "d_drawdown": mean_se(d_dd)[:2]}
        texts.append(f"{world}: spikes/run {sig(a['spikes'].mean(), 2)} → {sig(b['spikes'].mean(), 2)}, "
                     f"final J {sig(a['j_final'].mean(), 4)} → {sig(b['j_final'].mean(), 4)} "
                     f"(ΔJ {plus_minus(m_j, se_j)}) [{v}]")
    verdict = any_of(worlds)
    n = max((p["n"] for p in parts.values()), default=0)
    statement = (f"{_ARM_NAMES.get(baseline, baseline)} → {_ARM_NAMES.get(treat, treat)} (paired over {n} seeds, "
                 f"mean ± SE): " + "; ".join(texts) + ".")
    return Verdict(verdict, statement, parts)


def tis_figure(ds: Dataset, runs, verdict: Verdict, style: str):
    df = with_keys(ds, ds.metrics, noise="mismatch.logit_noise", correction="correction", seed="seed")
    df = df.assign(_t=update_index(df))
    per = int(df["update"].max()) + 1 if "update" in df.columns else 1
    worlds = sorted(df["noise"].astype(float).unique())
    names = ordered_presets(df["correction"].unique())
    fig, axes = new_figure(len(worlds), 2, style, sharey="row")
    for c, noise in enumerate(worlds):
        sub = df[df["noise"].astype(float) == noise]
        ax_j, ax_g = axes[0][c], axes[1][c]
        for name in names:
            cur = sub[sub["correction"] == name]
            lk = st.look(name)
            x = cur["_t"] / per
            short = (1.0 - cur["objective"]).clip(lower=1e-6)
            stats = cur.assign(short=short, x=x).groupby("x")["short"].agg(["mean", "min", "max"])
            ax_j.plot(stats.index, stats["mean"], color=lk.color, linestyle=lk.linestyle, label=name)
            ax_j.fill_between(stats.index, stats["min"], stats["max"], color=lk.color, alpha=0.15, linewidth=0)
            gn = cur.assign(x=x, gn=cur["grad_norm"].where(cur["grad_norm"] > 0)).groupby("x")["gn"].median()
            ax_g.plot(gn.index, gn.to_numpy(), color=lk.color, linestyle=lk.linestyle, linewidth=0.9)
            # spikes, per run
            for _, run in cur.sort_values("_t").groupby("job"):
                g = run["grad_norm"].astype(float)
                ref = g.where(g > 0).shift(1).rolling(SPIKE_WINDOW, min_periods=3).median()
                sp = run[(g > SPIKE_FACTOR * ref) & (ref > 0)]
                if len(sp):
                    ax_g.plot(sp["_t"] / per, sp["grad_norm"], linestyle="none", marker="o", markersize=5,
                              markerfacecolor="none", markeredgecolor=lk.color)
        ax_j.set_yscale("log")
        ax_g.set_yscale("log")
        p = verdict.parts.get(f"σ={fmt_value(float(noise))}", {})
        ax_j.set_title(f"bf16 engine, logit noise σ = {fmt_value(float(noise))}"
                       + (f"\n[{p['verdict']}]" if p else ""), fontsize="medium")
        ax_g.set_xlabel("training step")
        if c == 0:
            ax_j.set_ylabel(r"shortfall $1 - J(\theta)$ (log)")
            ax_g.set_ylabel(r"$\|\nabla L\|$ before clipping (median)")
    from matplotlib.lines import Line2D

    handles = [line_handle(n) for n in names]
    labels = [("token TIS, min(ρ, 2)" if n == "tis" else "plain PPO" if n == "none" else n) for n in names]
    handles.append(Line2D([], [], linestyle="none", marker="o", markerfacecolor="none", markeredgecolor="0.3"))
    labels.append(f"spike (> {SPIKE_FACTOR:g}× trailing median)")
    handles.append(Line2D([], [], color="0.5", linewidth=6, alpha=0.3))
    labels.append("band: min–max over seeds")
    legend_below(fig, handles, labels, style)
    headline(fig, TITLE, SOURCE, verdict, style)
    return fig


def evaluate(ds: Dataset, style: str):
    runs = tis_runs(ds)
    v = tis_verdict(runs)
    return v, tis_figure(ds, runs, v, style)
