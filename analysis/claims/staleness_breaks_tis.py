"""Claim 5: staleness breaks token TIS before sequence masking (the async-RL setting).

A ladder of staleness k: the smallest k at which a preset breaks (collapse or NaN/inf in at least half of the
seeds) must come first for token TIS, with the ESS falling ahead of the break. Read top to bottom: the
reducer (one row per run), the rule (`staleness_verdict`), the figure, `evaluate`.
"""

from __future__ import annotations

import math

import numpy as np

from analysis import style as st
from analysis.claims.figures import headline, legend_below, line_handle, new_figure, ordered_presets
from analysis.claims.frames import required, with_keys
from analysis.claims.stats import FAILS, HOLDS, UNSURE, Verdict, as_float, sig
from analysis.load import Dataset
from runner.errors import UserError

NAME = "staleness-breaks-tis"  # = conf/experiment/NAME.yaml and the figure's file name
TITLE = "5. Staleness breaks token TIS before sequence masking"
SOURCE = "the async-RL setting"

# Thresholds of the rule (named in its docstring and the experiment's header).
BROKEN_RATE = 0.5  # broken at k when at least half of the seeds collapsed or had a NaN/inf update
ESS_DROP = 0.05  # (b): ESS one rung before the break at least 0.05 below its k = 0 value

TOKEN_TIS = "tis"
SEQ_MASKS = ("seq-mask-tis", "seq-mis", "geo-mask")


def staleness_runs(ds: Dataset):
    """One row per run: correction, staleness, seed, collapsed (0/1), nonfinite (updates with a NaN/inf loss or
    gradient), nan_params, ess (mean over updates), final_objective."""
    import pandas as pd

    df = required(ds.metrics, "training metrics (sweep.csv)", ds.path)
    df = with_keys(ds, df, correction="correction", k="mismatch.staleness", seed="seed")
    summ = {j.index: (j.summary or {}) for j in ds.jobs}
    rows = []
    for job, g in df.groupby("job", sort=True):
        s = summ.get(job, {})
        bad = (g["nonfinite_loss"].fillna(0) + g["nonfinite_grad"].fillna(0)) > 0
        rows.append({"job": job, "correction": str(g["correction"].iloc[0]), "staleness": int(g["k"].iloc[0]),
                     "seed": int(g["seed"].iloc[0]), "collapsed": float(bool(s.get("collapsed", False))),
                     "nonfinite": int(bad.sum()), "nan_params": float(bool(s.get("nonfinite_params", False))),
                     "ess": float(g["ess"].mean()),
                     "final_objective": as_float(s.get("final_objective", g["objective"].iloc[-1]))})
    return pd.DataFrame(rows)


def staleness_verdict(runs) -> Verdict:
    """Claim 5 (async RL) on runs (correction, staleness, seed, collapsed, nonfinite, ess, final_objective):
    broken(c, k) = at least half (BROKEN_RATE) of c's seeds at k collapsed or had a NaN/inf update; k*(c) = the
    smallest broken k (∞ if none).
      (a) holds when k*(tis) is finite and below k* of every sequence mask present (seq-mask-tis, seq-mis,
          geo-mask); does not hold when tis never breaks (and no tis seed broke anywhere) or some mask breaks at
          or before tis; inconclusive when tis never reaches the rate but some of its seeds broke.
      (b) every preset with 0 < k* < ∞: the mean ESS at the rung before k* must be ≥ ESS_DROP below its k = 0
          value, else (b) does not hold; untestable (n/a) when no preset breaks after k = 0.
    Holds when (a) holds and (b) is not contradicted; does not hold when either does not hold; else
    inconclusive."""
    r = runs.assign(broken=((runs["collapsed"] > 0) | (runs["nonfinite"] > 0)).astype(float))
    rate = r.groupby(["correction", "staleness"])["broken"].mean()
    ks = sorted(r["staleness"].unique())
    names = ordered_presets(r["correction"].unique())

    def kstar(c):
        hit = [k for k in ks if rate.get((c, k), 0.0) >= BROKEN_RATE]
        return hit[0] if hit else math.inf

    kst = {c: kstar(c) for c in names}
    if TOKEN_TIS not in kst:
        raise UserError(f"staleness-breaks-tis: needs runs of {TOKEN_TIS!r}, got {names}")
    masks = [m for m in SEQ_MASKS if m in kst]
    if not masks:
        raise UserError(f"staleness-breaks-tis: needs at least one sequence mask of {SEQ_MASKS}, got {names}")
    kt = kst[TOKEN_TIS]
    if any(math.isfinite(kst[m]) and kst[m] <= kt for m in masks):
        va = FAILS
    elif math.isfinite(kt):
        va = HOLDS
    elif rate.loc[TOKEN_TIS].max() > 0:
        va = UNSURE
    else:
        va = FAILS
    ess = r.groupby(["correction", "staleness"])["ess"].mean()
    checks = []
    for c in names:
        k = kst[c]
        if not math.isfinite(k) or k == ks[0]:
            continue
        prev = ks[ks.index(k) - 1]
        checks.append((c, ess[(c, prev)] <= ess[(c, ks[0])] - ESS_DROP))
    vb = "n/a" if not checks else (HOLDS if all(ok for _, ok in checks) else FAILS)
    verdict = FAILS if FAILS in (va, vb) else (HOLDS if va == HOLDS else UNSURE)
    kmax = ks[-1]
    fin = r.groupby(["correction", "staleness"])["final_objective"].mean()
    seeds = int(r.groupby(["correction", "staleness"])["seed"].nunique().min())
    broke = ", ".join(f"{c} {'never' if not math.isfinite(kst[c]) else f'at k={kst[c]}'}" for c in names)
    ess_txt = ", ".join(f"{c} {sig(ess[(c, ks[0])], 2)}→{sig(ess[(c, kmax)], 2)}" for c in names)
    fin_txt = ", ".join(f"{c} {sig(fin[(c, kmax)], 3)}" for c in names)
    statement = (f"broken (≥{BROKEN_RATE:g} of {seeds} seeds collapsed or NaN/inf) over k={ks[0]}…{kmax}: {broke}: "
                 f"(a) {va}; ESS k={ks[0]}→{kmax}: {ess_txt}: (b) {vb}; final J at k={kmax}: {fin_txt}.")
    return Verdict(verdict, statement, {"a": va, "b": vb, "kstar": kst})


def staleness_figure(runs, verdict: Verdict, style: str):
    fig, axes = new_figure(3, 1, style, panel=(3.6, 3.0))
    ax_r, ax_e, ax_j = axes[0]
    r = runs.assign(broken=((runs["collapsed"] > 0) | (runs["nonfinite"] > 0)).astype(float))
    ks = sorted(r["staleness"].unique())
    pos = {k: i for i, k in enumerate(ks)}
    names = ordered_presets(r["correction"].unique())
    # Small horizontal offsets: presets that coincide (tis and seq-mask-tis often do) stay visible.
    off = {n: (i - (len(names) - 1) / 2) * 0.09 for i, n in enumerate(names)}
    for name in names:
        cur = r[r["correction"] == name]
        lk = st.look(name)
        kw = dict(color=lk.color, linestyle=lk.linestyle, marker=lk.marker, markersize=4)
        for ax, col in ((ax_r, "broken"), (ax_e, "ess"), (ax_j, "final_objective")):
            s = cur.groupby("staleness")[col].agg(["mean", "min", "max"])
            xs = np.array([pos[k] for k in s.index], float) + off[name]
            ax.plot(xs, s["mean"], **kw)
            if col != "broken":
                ax.vlines(xs, s["min"], s["max"], color=lk.color, linewidth=1.0, alpha=0.6)
    ax_r.axhline(BROKEN_RATE, color="0.5", linestyle="--", linewidth=0.8)
    ax_r.text(0.02, BROKEN_RATE + 0.02, "break threshold", color="0.4", fontsize="x-small",
              transform=ax_r.get_yaxis_transform())
    ax_r.set_ylim(-0.05, 1.05)
    ax_r.set_ylabel("collapsed or NaN/inf (fraction of seeds)")
    ax_r.set_title("(a) broken runs", fontsize="medium")
    ax_e.set_ylabel("ESS (fraction of tokens, mean over updates)")
    ax_e.set_title("(b) effective sample size (bars: min–max)", fontsize="medium")
    ax_j.set_ylabel(r"final objective $J(\theta)$")
    ax_j.set_title("(c) final objective (bars: min–max over seeds)", fontsize="medium")
    for ax in (ax_r, ax_e, ax_j):
        ax.set_xticks(range(len(ks)), [str(k) for k in ks])
        ax.set_xlabel("staleness k (optimizer steps)")
    legend_below(fig, [line_handle(n, True) for n in names], names, style)
    headline(fig, TITLE, SOURCE, verdict, style)
    return fig


def evaluate(ds: Dataset, style: str):
    runs = staleness_runs(ds)
    v = staleness_verdict(runs)
    return v, staleness_figure(runs, v, style)
