"""Claim 6: the seed bug, end to end (the OpenRLHF seq-mask-tis bug report, commit bc71bb1).

The as-shipped preset must poison the parameters under on_nonfinite=apply and be caught under skip, while
the fixed preset trains as well as plain PPO. Read top to bottom: the reducer (one row per run, from
summary.json), the rule (`seedbug_verdict`), the figure, `evaluate`.
"""

from __future__ import annotations

import math

import numpy as np

from analysis import style as st
from analysis.claims.figures import headline, legend_below, line_handle, new_figure, ordered_presets
from analysis.claims.frames import band_text, required, run_frame, update_index, with_keys, world_of
from analysis.claims.stats import FAILS, HOLDS, UNSURE, Verdict, as_float, mean_se, plus_minus, sig, t_interval
from analysis.load import Dataset
from runner.errors import UserError

NAME = "seed-bug-end-to-end"  # = conf/experiment/WORLD/NAME.yaml and the figure's file name
TITLE = "6. The seed bug, end to end"
SOURCE = "the OpenRLHF seq-mask-tis bug report, commit bc71bb1"

SHORTFALL = 0.05  # the fixed preset's final J at most 0.05 below plain PPO's

SHIPPED_PREFIX = "openrlhf-bc71bb1/"
FIXED = "seq-mask-tis"


def seedbug_runs(ds: Dataset):
    """One row per run: correction, mode (train.on_nonfinite), seed, nan_params, skipped (updates),
    nonfinite_events (NaN/inf loss + gradient events), collapsed, collapse_reason, initial/final_objective,
    updates."""
    import pandas as pd

    summ = required(ds.summary, "summary.json files", ds.path)
    summ = with_keys(ds, summ, correction="correction", mode="train.on_nonfinite", seed="seed")
    rows = []
    for _, s in summ.iterrows():
        ev = float(s.get("events.nonfinite_loss", 0) or 0) + float(s.get("events.nonfinite_grad", 0) or 0)
        rows.append(
            {
                "job": int(s["job"]),
                "correction": str(s["correction"]),
                "mode": str(s["mode"]),
                "seed": int(s["seed"]),
                "nan_params": float(bool(s.get("nonfinite_params", False))),
                "skipped": int(s.get("updates_skipped", 0) or 0),
                "updates": int(s.get("updates_run", 0) or 0),
                "nonfinite_events": ev,
                "collapsed": float(bool(s.get("collapsed", False))),
                "collapse_reason": str(s.get("collapse_reason", "") or "") if bool(s.get("collapsed", False)) else "",
                "initial_objective": as_float(s.get("initial_objective")),
                "final_objective": as_float(s.get("final_objective")),
            }
        )
    return pd.DataFrame(rows)


def fault_words(run) -> list[str]:
    """What went wrong in one run of the fixed preset, in the runner's words where it has them."""
    words = []
    if run["nonfinite_events"] > 0:
        words.append(f"{int(run['nonfinite_events'])} NaN/inf events")
    if run["nan_params"] > 0:
        words.append("NaN parameters")
    if run["collapsed"] > 0:
        words.append(f"collapse ({run.get('collapse_reason', '') or 'by the runner’s rules'})")
    return words


def seedbug_verdict(runs) -> Verdict:
    """Claim 6 (the seed bug) on runs (correction, mode, seed, nan_params, skipped, nonfinite_events, collapsed,
    final_objective):
      (i)   the as-shipped openrlhf-bc71bb1/seq-mask-tis under on_nonfinite=apply: NaN parameters (fraction of seeds)
      (ii)  the same under skip: skipped updates > 0 and finite parameters (fraction of seeds)
      (iii) the fixed seq-mask-tis, both modes: no NaN/inf event, no NaN parameters, no collapse in any seed, and
            final J − plain PPO's final J non-inferior by SHORTFALL: the two-sided 95% Student-t interval (n − 1
            df) lies above −0.05 (below −0.05: does not hold). The difference is paired by mode and seed, then
            averaged over the modes within a seed: n counts seeds, because a run without a non-finite event is
            the same run under apply and skip, and counting it twice would narrow the interval (to a seventh of
            its width with 2 seeds).
    Holds when (i) and (ii) hold in every seed and (iii) holds. Does not hold when (i) or (ii) holds in no seed,
    the fixed preset has any fault, or it is significantly more than 0.05 below PPO. Else inconclusive."""
    shipped = sorted(c for c in set(runs["correction"]) if c.startswith(SHIPPED_PREFIX))
    if len(shipped) != 1 or FIXED not in set(runs["correction"]):
        raise UserError(
            f"seed-bug-end-to-end: needs one {SHIPPED_PREFIX}* preset and {FIXED}, "
            f"got {sorted(set(runs['correction']))}"
        )
    bug = shipped[0]
    ap = runs[(runs["correction"] == bug) & (runs["mode"] == "apply")]
    sk = runs[(runs["correction"] == bug) & (runs["mode"] == "skip")]
    fx = runs[runs["correction"] == FIXED]
    if ap.empty or sk.empty:
        raise UserError("seed-bug-end-to-end: needs train.on_nonfinite=apply and skip runs of the as-shipped preset")
    f_i = float(ap["nan_params"].mean())
    sk_ok = (sk["skipped"] > 0) & (sk["nan_params"] == 0)
    f_ii = float(sk_ok.mean())
    faulty = (fx["nonfinite_events"] > 0) | (fx["nan_params"] > 0) | (fx["collapsed"] > 0)
    faults = int(faulty.sum())
    by_seed: dict[int, list[float]] = {}
    if "none" in set(runs["correction"]):
        base = runs[runs["correction"] == "none"].set_index(["mode", "seed"])["final_objective"]
        for _, row in fx.iterrows():
            key = (row["mode"], row["seed"])
            if key in base.index:
                by_seed.setdefault(int(row["seed"]), []).append(row["final_objective"] - base[key])
    d = [float(np.mean(v)) for _, v in sorted(by_seed.items())]
    m, se, n = mean_se(d)
    _, lo, hi, _ = t_interval(d)
    if n >= 2 and math.isfinite(lo):
        v_j = HOLDS if lo > -SHORTFALL else FAILS if hi < -SHORTFALL else UNSURE
    else:
        v_j = UNSURE
    v_iii = FAILS if faults else v_j
    if f_i == 0 or f_ii == 0 or v_iii == FAILS:
        verdict = FAILS
    elif f_i == 1 and f_ii == 1 and v_iii == HOLDS:
        verdict = HOLDS
    else:
        verdict = UNSURE
    frac_skipped = float((sk["skipped"] / sk["updates"].clip(lower=1)).mean())
    fault_text = "; ".join(
        f"{r['mode']} seed {r['seed']}: {', '.join(fault_words(r))}" for _, r in fx[faulty].iterrows()
    )
    kinds = [
        (int((fx[col] > 0).sum()), word)
        for col, word in (("nonfinite_events", "NaN/inf"), ("nan_params", "NaN θ"), ("collapsed", "collapsed"))
    ]
    fault_kinds = f" ({', '.join(f'{k} {w}' for k, w in kinds if k)})" if faults else ""
    statement = (
        f"{bug}: NaN parameters under apply in {int(ap['nan_params'].sum())}/{len(ap)} seeds (i); under "
        f"skip {int(sk_ok.sum())}/{len(sk)} seeds skip updates ({sig(100 * frac_skipped, 3)}% of them) with "
        f"finite parameters (ii); fixed {FIXED}: {faults} faulty runs of {len(fx)}"
        f"{f' ({fault_text})' if fault_text else ''}, final J "
        f"{sig(fx['final_objective'].mean(), 3)} vs plain PPO "
        f"{sig(runs[runs['correction'] == 'none']['final_objective'].mean(), 3)} "
        f"(paired Δ {plus_minus(m, se)}, 95% t CI [{sig(lo, 2)}, {sig(hi, 2)}], n = {n} seeds, each the mean of "
        f"its modes) (iii) {v_iii}."
    )
    key = (
        f"as shipped: NaN θ {int(ap['nan_params'].sum())}/{len(ap)} (apply), caught {int(sk_ok.sum())}/{len(sk)} "
        f"(skip); fixed: {faults} faults{fault_kinds}, ΔJ {sig(m, 2)}"
    )
    return Verdict(verdict, statement, {"i": f_i, "ii": f_ii, "iii": v_iii, "bug": bug}, key=key)


def seedbug_figure(ds: Dataset, runs, verdict: Verdict, style: str):
    from matplotlib.lines import Line2D

    df = with_keys(
        ds,
        required(ds.metrics, "training metrics", ds.path),
        correction="correction",
        mode="train.on_nonfinite",
        seed="seed",
    )
    df = df.assign(_t=update_index(df))
    per = int(df["update"].max()) + 1 if "update" in df.columns else 1
    fig, axes = new_figure(3, 1, style, panel=(3.7, 3.1))
    names = ordered_presets(df["correction"].unique())
    for c, mode in enumerate(("apply", "skip")):
        ax = axes[0][c]
        sub = df[df["mode"] == mode]
        for name in names:
            cur = sub[sub["correction"] == name]
            if cur.empty:
                continue
            lk = st.look(name)
            # J is evaluated every train.objective_every steps and at the end: the line joins those points only
            stats = cur.dropna(subset=["objective"]).groupby("_t")["objective"].agg(["mean", "min", "max"])
            x = stats.index / per
            few = len(stats) <= 12  # sparse evaluations are drawn as points too, or a lone one would not show
            ax.plot(
                x,
                stats["mean"],
                color=lk.color,
                linestyle=lk.linestyle,
                linewidth=1.3,
                marker="o" if few else None,
                markersize=3.5,
            )
            ax.fill_between(x, stats["min"], stats["max"], color=lk.color, alpha=0.12, linewidth=0)
            nanp = runs[(runs["correction"] == name) & (runs["mode"] == mode) & (runs["nan_params"] > 0)]
            if len(nanp):
                last = cur[cur["job"].isin(nanp["job"])].groupby("job")["_t"].max() / per
                ax.plot(
                    last,
                    np.full(len(last), stats["mean"].iloc[-1] if len(stats) else 0),
                    linestyle="none",
                    marker="X",
                    markersize=9,
                    color=lk.color,
                    markeredgecolor="black",
                    markeredgewidth=0.6,
                    zorder=5,
                )
        ax.set_xlabel("training step")
        ax.set_ylim(-0.03, 1.03)
        ax.set_title(f"train.on_nonfinite={mode}", fontsize="medium")
    axes[0][0].set_ylabel(r"objective $J(\theta)$ (mean, band: min–max)")
    ax = axes[0][2]
    order = list(names)
    xs = np.arange(len(order))
    w = 0.38
    sk = runs[runs["mode"] == "skip"].assign(frac=lambda f: f["skipped"] / f["updates"].clip(lower=1))
    ap = runs[runs["mode"] == "apply"]
    v_skip = [sk[sk["correction"] == n]["frac"].mean() for n in order]
    v_nan = [ap[ap["correction"] == n]["nan_params"].mean() for n in order]
    ax.bar(xs - w / 2, v_skip, w, color="#E69F00", label="updates skipped (skip)")
    ax.bar(xs + w / 2, v_nan, w, color="#D55E00", hatch="//", edgecolor="white", label="runs with NaN θ (apply)")
    for x, a, b in zip(xs, v_skip, v_nan):
        ax.text(x - w / 2, a + 0.02, f"{a:.0%}", ha="center", fontsize="x-small")
        ax.text(x + w / 2, b + 0.02, f"{b:.0%}", ha="center", fontsize="x-small")
    ax.set_xticks(xs, [n.replace(SHIPPED_PREFIX, "bc71bb1/\n") for n in order], fontsize="small")
    ax.set_ylim(0, 1.45)
    ax.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
    ax.set_ylabel("fraction")
    ax.set_title("faults, by preset", fontsize="medium")
    ax.legend(loc="upper left", fontsize="small", frameon=False)
    handles = [line_handle(n) for n in names]
    labels = [
        n
        + (
            " (as shipped)"
            if n.startswith(SHIPPED_PREFIX)
            else " (fixed)"
            if n == FIXED
            else " (plain PPO)"
            if n == "none"
            else ""
        )
        for n in names
    ]
    handles.append(Line2D([], [], linestyle="none", marker="X", markersize=8, color="0.5", markeredgecolor="black"))
    labels.append("NaN parameters: the run stops")
    legend_below(fig, handles, labels, style)
    headline(fig, f"{TITLE} [{world_of(ds)} world]", SOURCE, verdict, style)
    return fig


def evaluate(ds: Dataset, style: str):
    runs = seedbug_runs(ds)
    v = seedbug_verdict(runs)
    bands, degenerate = band_text(run_frame(ds, correction="correction", mode="train.on_nonfinite"), ["mode"])
    if bands:
        v.statement += f" {bands[0].upper()}{bands[1:]}."
    v.parts["degenerate"] = degenerate
    return v, seedbug_figure(ds, runs, v, style)
