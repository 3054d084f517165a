"""Claim 1: token TIS tames the training–inference mismatch (Yao et al. 2025).

Plain PPO against token TIS (C = 2) under an engine mismatch, at each engine precision (and, where swept,
logit noise), paired over seeds: under the mismatch PPO collapses (the runner's relative rules: J 30% below
its peak for 20 steps, a run of grad-norm spikes, NaN parameters) and loses objective from its peak; TIS
must prevent the collapses and the loss. Read top to bottom: the reducer (one row per run), the rule
(`tis_verdict`), the figure, `evaluate`.
"""

from __future__ import annotations

import math

import numpy as np

from analysis import style as st
from analysis.claims.figures import headline, legend_below, line_handle, new_figure, ordered_presets
from analysis.claims.frames import band_text, run_frame, setting_label, update_index, with_keys, world_of
from analysis.claims.stats import (FAILS, HOLDS, UNSURE, Verdict, all_of, any_of, effect, mean_se, pct, plus_minus,
                                   rate, sig, steps_text)
from analysis.load import Dataset
from runner.errors import UserError

NAME = "tis-tames-mismatch"  # = conf/experiment/[WORLD/]NAME.yaml and the figure's file name
TITLE = "1. Token TIS tames the training–inference mismatch"
SOURCE = "Yao et al. 2025, “Your efficient RL framework secretly brings you off-policy RL training”"

# Thresholds of the rule (named in its docstring and the experiments' headers).
COLLAPSE_RATE = 0.5  # PPO "collapses" at a setting when at least half of its seeds do
PREVENTED = 0.5  # TIS must bring the collapse rate down by at least half of the seeds
DROP_MARGIN = 0.05  # peak-to-final drop of J, as a fraction of the peak: 5% less is a practical difference
J_MARGIN = 0.01  # final J (J ∈ [0, 1]): 0.01 higher is a practical difference

SETTING_KEYS = {"precision": "mismatch.precision", "noise": "mismatch.logit_noise"}
_ARM_NAMES = {"none": "plain PPO", "tis": "token TIS"}


def tis_runs(ds: Dataset):
    """One row per run (frames.run_frame) with precision, noise, correction, seed and `setting`: the label of
    the mismatch keys the experiment varied (precision always)."""
    runs = run_frame(ds, correction="correction", seed="seed", **SETTING_KEYS)
    runs["noise"] = runs["noise"].astype(float)
    cols = setting_cols(runs)
    runs["setting"] = [setting_label(r, cols) for _, r in runs.iterrows()]
    return runs.sort_values(["precision", "noise", "correction", "seed"]).reset_index(drop=True)


def setting_cols(runs) -> list[str]:
    return ["precision"] + [c for c in ("noise",) if runs[c].nunique() > 1]


def tis_verdict(runs, baseline: str = "none") -> Verdict:
    """Claim 1 (Yao et al. 2025), per setting (an engine precision, and the logit noise where swept), paired
    over seeds between plain PPO (`baseline`) and token TIS (the one other correction):
      (i) stability: c = the fraction of seeds that collapsed (summary.json: the runner's relative rules).
          Holds when c_PPO ≥ 0.5 and c_TIS ≤ c_PPO − 0.5 (TIS prevents the collapse in at least half of the
          seeds); does not hold when c_PPO = 0 (nothing to tame) or c_TIS ≥ c_PPO; else inconclusive.
      (ii) objective: effect(drop_PPO − drop_TIS, 0.05) with drop = (peak J − final J) / peak J, or
          effect(J_final,TIS − J_final,PPO, 0.01) (final J: the mean over the last quarter of the
          evaluations), combined with any_of ("loses objective OR ends lower").
    A setting's verdict is all_of(i, ii): TIS must prevent both. The claim is existential over the settings
    ("an engine mismatch"): any_of. The statement gives each arm's collapses with their steps (time to
    collapse), peak-to-final drop and final J, and every banded arm's rejection at the measured mismatch.
    `runs`: setting, correction, seed, collapsed, collapse_step, collapse_kind, peak, final, drop (tis_runs)."""
    others = sorted(set(runs["correction"]) - {baseline})
    if baseline not in set(runs["correction"]) or len(others) != 1:
        raise UserError(f"tis-tames-mismatch: needs runs of {baseline!r} and exactly one correction to compare, "
                        f"got {sorted(set(runs['correction']))}")
    treat = others[0]
    settings, texts, keys, parts = [], [], [], {}
    for setting, w in runs.groupby("setting", sort=False):
        a = w[w["correction"] == baseline].set_index("seed")
        b = w[w["correction"] == treat].set_index("seed")
        seeds = a.index.intersection(b.index)
        a, b = a.loc[seeds], b.loc[seeds]
        c_a, c_b = rate(a["collapsed"]), rate(b["collapsed"])
        if not len(seeds):
            v_st = UNSURE
        elif c_a == 0 or c_b >= c_a:
            v_st = FAILS
        elif c_a >= COLLAPSE_RATE and c_b <= c_a - PREVENTED:
            v_st = HOLDS
        else:
            v_st = UNSURE
        d_drop = (a["drop"] - b["drop"]).to_numpy(float)
        d_j = (b["final"] - a["final"]).to_numpy(float)
        v_obj = any_of([effect(d_drop, DROP_MARGIN), effect(d_j, J_MARGIN)])
        v = all_of([v_st, v_obj])
        settings.append(v)
        m_d, se_d, n = mean_se(d_drop)
        m_j, se_j, _ = mean_se(d_j)
        parts[setting] = {"verdict": v, "stability": v_st, "objective": v_obj, "n": n,
                          "collapsed_ppo": c_a, "collapsed_tis": c_b,
                          "steps_ppo": a.loc[a["collapsed"] > 0, "collapse_step"].tolist(),
                          "steps_tis": b.loc[b["collapsed"] > 0, "collapse_step"].tolist(),
                          "drop_ppo": float(a["drop"].mean()), "drop_tis": float(b["drop"].mean()),
                          "j_ppo": float(a["final"].mean()), "j_tis": float(b["final"].mean()),
                          "d_drop": (m_d, se_d), "d_j": (m_j, se_j)}

        def arm(f, label):
            k = int(f["collapsed"].sum())
            kinds = sorted({x for x in f.loc[f["collapsed"] > 0, "collapse_kind"] if x})
            return (f"{label} {k}/{len(f)} collapsed{steps_text(f.loc[f['collapsed'] > 0, 'collapse_step'])}"
                    f"{' (' + ', '.join(kinds) + ')' if kinds else ''}, peak-to-final drop {pct(f['drop'].mean())}, "
                    f"final J {sig(f['final'].mean(), 4)}")
        texts.append(f"{setting}: {arm(a, 'PPO')}; {arm(b, 'TIS')}; Δdrop {plus_minus(m_d, se_d)}, "
                     f"ΔJ {plus_minus(m_j, se_j)} [{v}]")
        keys.append(f"{setting}: collapsed {int(a['collapsed'].sum())}/{len(a)}→{int(b['collapsed'].sum())}/{len(b)}, "
                    f"drop {pct(a['drop'].mean())}→{pct(b['drop'].mean())}")
    verdict = any_of(settings)
    n = max((p["n"] for p in parts.values()), default=0)
    bands, degenerate = band_text(runs, ["setting"])
    statement = (f"{_ARM_NAMES.get(baseline, baseline)} → {_ARM_NAMES.get(treat, treat)} (paired over {n} seeds, "
                 f"mean ± SE; collapse = the runner's relative rules): " + "; ".join(texts) + "."
                 + (f" {bands[0].upper()}{bands[1:]}." if bands else ""))
    parts["degenerate"] = degenerate
    return Verdict(verdict, statement, parts, key="; ".join(keys))


def tis_figure(ds: Dataset, runs, verdict: Verdict, style: str):
    """Per setting, a column: J against step (mean over seeds, band min–max; crosses at each run's collapse),
    and the grad norm before clipping (median over seeds)."""
    from matplotlib.lines import Line2D

    df = with_keys(ds, ds.metrics, correction="correction", seed="seed", **SETTING_KEYS)
    df["noise"] = df["noise"].astype(float)
    df = df.assign(_t=update_index(df))
    per = int(df["update"].max()) + 1 if "update" in df.columns else 1
    cols = setting_cols(runs)
    df["setting"] = [setting_label(r, cols) for _, r in df[cols].iterrows()]
    settings = list(dict.fromkeys(runs["setting"]))
    names = ordered_presets(df["correction"].unique())
    mc = runs["j_se"].notna().any()
    fig, axes = new_figure(len(settings), 2, style, sharey="row")
    for c, setting in enumerate(settings):
        sub = df[df["setting"] == setting]
        ax_j, ax_g = axes[0][c], axes[1][c]
        for name in names:
            cur = sub[sub["correction"] == name]
            lk = st.look(name)
            ev = cur.dropna(subset=["objective"]).groupby(["job", "step"])["objective"].first().reset_index()
            stats = ev.groupby("step")["objective"].agg(["mean", "min", "max"])
            ax_j.plot(stats.index, stats["mean"], color=lk.color, linestyle=lk.linestyle, marker=".", markersize=3)
            ax_j.fill_between(stats.index, stats["min"], stats["max"], color=lk.color, alpha=0.15, linewidth=0)
            gn = cur.assign(x=cur["_t"] / per, gn=cur["grad_norm"].where(cur["grad_norm"] > 0))
            med = gn.groupby("x")["gn"].median()
            ax_g.plot(med.index, med.to_numpy(), color=lk.color, linestyle=lk.linestyle, linewidth=0.9)
            fell = runs[(runs["setting"] == setting) & (runs["correction"] == name) & (runs["collapsed"] > 0)]
            for _, r in fell.iterrows():
                if math.isfinite(r["collapse_step"]):
                    ax_j.axvline(r["collapse_step"], color=lk.color, linestyle=":", linewidth=0.9)
                    ax_j.plot([r["collapse_step"]], [r["peak"] * 0.7], marker="x", color=lk.color, markersize=7)
        ax_g.set_yscale("log")
        p = verdict.parts.get(setting, {})
        ax_j.set_title(f"engine {setting}" + (f"\n[{p['verdict']}]" if p else ""), fontsize="medium")
        ax_g.set_xlabel("training step")
        if c == 0:
            ax_j.set_ylabel(r"objective $J(\theta)$" + (" (Monte Carlo)" if mc else " (exact)"))
            ax_g.set_ylabel(r"$\|\nabla L\|$ before clipping (median)")
    handles = [line_handle(n) for n in names]
    labels = [("token TIS, min(ρ, 2)" if n == "tis" else "plain PPO" if n == "none" else n) for n in names]
    handles.append(Line2D([], [], linestyle=":", marker="x", color="0.3"))
    labels.append("a run's collapse (at 70% of its peak J)")
    handles.append(Line2D([], [], color="0.5", linewidth=6, alpha=0.3))
    labels.append("band: min–max over seeds")
    legend_below(fig, handles, labels, style)
    headline(fig, f"{TITLE} [{world_of(ds)} world]", SOURCE, verdict, style)
    return fig


def evaluate(ds: Dataset, style: str):
    runs = tis_runs(ds)
    v = tis_verdict(runs)
    return v, tis_figure(ds, runs, v, style)
