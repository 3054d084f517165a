"""Claim 5: staleness, as the sources that measured it report it (VCPO, M2PO, AReaL PR #1218).

Three parts, each on the runs of one experiment (corrections × staleness k × trust region × seeds):
  V  VCPO (Huang et al. 2026, arXiv 2602.17616): at a policy lag of k = 2, sequence-level TIS shows a
     grad-norm spike followed by collapse, and the effective sample size (ESS) falls ahead of it;
  M  M2PO (Zheng et al. 2025, arXiv 2510.01161, "Prosperity before Collapse"): with a stale policy and no
     trust region (PPO's clip removed), J first rises ("prosperity") and then collapses, where the clipped
     run does not;
  A  AReaL PR #1218 (its table from PR #1084): token-MIS alone (IcePop's token mask) collapses (at about 250
     steps there), and geometric rejection sampling alone (geo-RS, here geo-mask) makes the grad norm explode.
Time-to-collapse (the step the runner's relative rules name) is measured for every arm, not only whether.
Read top to bottom: the reducer (one row per run), the rule (`staleness_verdict`), the figure, `evaluate`.
"""

from __future__ import annotations

import math

import numpy as np

from analysis import style as st
from analysis.claims.figures import headline, legend_below, new_figure, ordered_presets
from analysis.claims.frames import band_text, objective_series, required, run_frame, update_index, with_keys, world_of
from analysis.claims.stats import (FAILS, HOLDS, SPIKE_FACTOR, SPIKE_WINDOW, UNSURE, Verdict, all_of, pct, rate,
                                   sig, steps_text)
from analysis.load import Dataset
from runner.errors import UserError

NAME = "staleness-breaks-tis"  # = conf/experiment/[WORLD/]NAME.yaml and the figure's file name
TITLE = "5. Staleness: sequence TIS, token-MIS and untrusted updates collapse"
SOURCE = "VCPO (arXiv 2602.17616); M2PO (arXiv 2510.01161); AReaL PR #1218"

# Thresholds of the rule (named in its docstring and the experiments' headers).
VCPO_LAG = 2  # V is judged at k = 2, the lag VCPO reports
MAJORITY = 0.5  # a part's event must happen in at least half of the seeds (or of the collapsed runs)
PRECURSOR_STEPS = 10  # the window before a collapse (and at a run's start) in which precursors are looked for
ESS_DROP = 0.05  # the ESS "falls ahead": its mean over the window before the collapse is ≥ 0.05 below the first window's
PROSPERITY = 0.5  # M: before collapsing, the untrusted run gains at least half of what the clipped run gains
EXPLODE = 10.0  # A: the grad norm "explodes" when its maximum exceeds 10× the run's early median
UNTRUSTED_EPS = 100.0  # loss.eps_high at or above this (or loss=reinforce) is "no trust region"

SEQ_TIS, TOKEN_MIS, GEO_RS, PLAIN = "seq-tis", "icepop", "geo-mask", "none"


def staleness_runs(ds: Dataset):
    """One row per run (frames.run_frame) with correction, staleness, seed, trust (clip | none: PPO's clip
    removed, loss.eps_high ≥ 100 or loss=reinforce) and the precursors of its collapse, if any:
    ess_early (mean ESS over its first PRECURSOR_STEPS steps), ess_before (over the PRECURSOR_STEPS steps before
    the collapse step), spike_before (a grad-norm spike, > 5× the trailing 20-update median, in that window or
    at the collapse step, or a collapse by the spike rule itself), explode (max grad norm / early median)."""
    runs = run_frame(ds, correction="correction", staleness="mismatch.staleness", seed="seed", loss="loss.name",
                     eps_high="loss.eps_high")
    runs["staleness"] = runs["staleness"].astype(int)
    eps = runs["eps_high"].astype(float)
    runs["trust"] = np.where((runs["loss"].astype(str) == "reinforce") | (eps >= UNTRUSTED_EPS), "none", "clip")
    df = required(ds.metrics, "training metrics (metrics.csv)", ds.path)
    df = df.assign(_t=update_index(df)).sort_values(["job", "_t"])
    pre = {}
    for job, g in df.groupby("job", sort=True):
        step = g["step"].astype(int)
        early = g[step < step.min() + PRECURSOR_STEPS]["ess"].astype(float).mean()
        pre[job] = {"ess_early": early, "ess_before": math.nan, "spike_before": math.nan}
        r = runs[runs["job"] == job].iloc[0]
        if r["collapsed"] > 0 and math.isfinite(r["collapse_step"]):
            cs = int(r["collapse_step"])
            window = (step >= cs - PRECURSOR_STEPS) & (step < cs)
            pre[job]["ess_before"] = g[window]["ess"].astype(float).mean() if window.any() else math.nan
            gn = g["grad_norm"].astype(float).where(lambda x: np.isfinite(x) & (x > 0))
            ref = gn.shift(1).rolling(SPIKE_WINDOW, min_periods=3).median()
            spike = ((gn > SPIKE_FACTOR * ref) & (ref > 0)) | ~np.isfinite(g["grad_norm"].astype(float))
            near = (step >= cs - PRECURSOR_STEPS) & (step <= cs)
            pre[job]["spike_before"] = float(bool((spike & near).any()) or r["collapse_kind"] == "spike")
    for col in ("ess_early", "ess_before", "spike_before"):
        runs[col] = runs["job"].map({j: p[col] for j, p in pre.items()})
    runs["explode"] = runs["max_grad_norm"] / runs["grad_norm_early"]
    return runs.sort_values(["correction", "trust", "staleness", "seed"]).reset_index(drop=True)


def _arm(runs, correction: str, k: int, trust: str = "clip"):
    return runs[(runs["correction"] == correction) & (runs["staleness"] == k) & (runs["trust"] == trust)]


def _collapses(f, label: str) -> str:
    n = int(f["collapsed"].sum())
    kinds = sorted({x for x in f.loc[f["collapsed"] > 0, "collapse_kind"] if x})
    return (f"{label} {n}/{len(f)} collapsed{steps_text(f.loc[f['collapsed'] > 0, 'collapse_step'])}"
            + (f" ({', '.join(kinds)})" if kinds else "") + f" in {int(f['steps'].max()) + 1 if len(f) else 0} steps")


def _majority(x: float) -> bool:
    return math.isfinite(x) and x >= MAJORITY


def vcpo_part(runs) -> tuple[str, str, dict]:
    """V: seq-tis at k = 2 under PPO's clip. Holds when at least half of its seeds collapse and, among the
    collapsed runs, at least half had a grad-norm spike in the PRECURSOR_STEPS steps before (or at) the collapse
    and at least half had their ESS ≥ ESS_DROP lower over those steps than over their first PRECURSOR_STEPS.
    Does not hold when no seed collapses, or when runs collapse but none shows either precursor. Else
    inconclusive."""
    f = _arm(runs, SEQ_TIS, VCPO_LAG)
    if f.empty:
        raise UserError(f"staleness-breaks-tis: needs {SEQ_TIS} runs at k = {VCPO_LAG} (VCPO's lag) under PPO's clip")
    c = rate(f["collapsed"])
    fell = f[f["collapsed"] > 0]
    spiked = rate(fell["spike_before"]) if len(fell) else math.nan
    ess_fell = (fell["ess_before"] <= fell["ess_early"] - ESS_DROP) if len(fell) else []
    ess_rate = rate(ess_fell) if len(fell) else math.nan
    if c == 0:
        v = FAILS
    elif _majority(c) and _majority(spiked) and _majority(ess_rate):
        v = HOLDS
    elif len(fell) and spiked == 0 and ess_rate == 0:
        v = FAILS
    else:
        v = UNSURE
    ess = f"ESS {sig(f['ess_early'].mean(), 2)} over the first {PRECURSOR_STEPS} steps"
    if len(fell):
        ess += f", {sig(fell['ess_before'].mean(), 2)} before the collapses"
    spikes = f"{int(fell['spike_before'].sum())}/{len(fell)}" if len(fell) else "— (no collapse)"
    text = f"V (VCPO, k={VCPO_LAG}): {_collapses(f, SEQ_TIS)}; a spike before the collapse in {spikes}; {ess}: {v}"
    key = f"V: {SEQ_TIS} k={VCPO_LAG} {int(f['collapsed'].sum())}/{len(f)} collapsed"
    return v, text, {"verdict": v, "collapsed": c, "spike_before": spiked, "ess_fell": ess_rate, "key": key}


def m2po_part(runs, k: int) -> tuple[str, str, dict]:
    """M: plain PPO (correction none) at the largest k, without the trust region against with it. Per seed,
    prosperity-then-collapse = the untrusted run collapsed at or after its peak step and had gained at least
    PROSPERITY × the clipped run's gain (peak J − J₀) by then. Holds when at least half of the seeds show it and
    the clipped arm collapses in fewer seeds; does not hold when the untrusted arm collapses in no seed, or
    only the clipped arm's rate is as high; else inconclusive. Untestable (n/a) without untrusted runs."""
    free, clip = _arm(runs, PLAIN, k, "none").set_index("seed"), _arm(runs, PLAIN, k, "clip").set_index("seed")
    if free.empty or clip.empty:
        return "n/a", f"M (M2PO, k={k}): no {PLAIN} runs with and without the trust region: n/a", {"verdict": "n/a"}
    seeds = free.index.intersection(clip.index)
    free, clip = free.loc[seeds], clip.loc[seeds]
    gain_free = free["peak"] - free["initial"]
    gain_clip = (clip["peak"] - clip["initial"]).clip(lower=1e-12)
    prosper = gain_free >= PROSPERITY * gain_clip
    after = (free["collapsed"] > 0) & (free["collapse_step"] >= free["peak_step"])
    both = prosper & after
    c_free, c_clip = rate(free["collapsed"]), rate(clip["collapsed"])
    if c_free == 0 or c_clip >= c_free:
        v = FAILS
    elif _majority(rate(both)):
        v = HOLDS
    else:
        v = UNSURE
    text = (f"M (M2PO, k={k}, {PLAIN}): {_collapses(free.reset_index(), 'no trust region')}, peak J "
            f"{sig(free['peak'].mean(), 3)} (gain {sig(gain_free.mean(), 2)} vs {sig((clip['peak'] - clip['initial']).mean(), 2)} "
            f"clipped), final {sig(free['final'].mean(), 3)}; {_collapses(clip.reset_index(), 'PPO clip')}, final "
            f"{sig(clip['final'].mean(), 3)}; prosperity then collapse in {int(both.sum())}/{len(both)}: {v}")
    key = f"M: no-TR {int(free['collapsed'].sum())}/{len(free)} vs clip {int(clip['collapsed'].sum())}/{len(clip)} collapsed"
    return v, text, {"verdict": v, "collapsed_free": c_free, "collapsed_clip": c_clip,
                     "prosper_then_collapse": rate(both), "key": key}


def areal_part(runs, k: int) -> tuple[str, str, dict]:
    """A: at the largest k under PPO's clip, (A1) icepop (token-MIS alone) collapses in at least half of the
    seeds, and (A2) geo-mask (geo-RS alone) explodes the grad norm (max ≥ EXPLODE × its early median, or a
    collapse by the spike rule) in at least half. Each: holds at a majority, does not hold in no seed,
    else inconclusive; A = all_of(A1, A2) over the arms present."""
    verdicts, texts, parts, keys = [], [], {}, []
    mis = _arm(runs, TOKEN_MIS, k)
    if len(mis):
        c = rate(mis["collapsed"])
        v1 = HOLDS if _majority(c) else FAILS if c == 0 else UNSURE
        verdicts.append(v1)
        texts.append(f"A1 token-MIS ({TOKEN_MIS}): {_collapses(mis, TOKEN_MIS)} [AReaL: ~250 steps]: {v1}")
        parts["A1"] = v1
        keys.append(f"{TOKEN_MIS} {int(mis['collapsed'].sum())}/{len(mis)} collapsed")
    geo = _arm(runs, GEO_RS, k)
    if len(geo):
        boom = (geo["explode"] >= EXPLODE) | (geo["collapse_kind"] == "spike")
        e = rate(boom)
        v2 = HOLDS if _majority(e) else FAILS if e == 0 else UNSURE
        verdicts.append(v2)
        texts.append(f"A2 geo-RS ({GEO_RS}): max grad norm / early median {sig(geo['explode'].min(), 2)}–"
                     f"{sig(geo['explode'].max(), 2)}× (explodes: ≥ {EXPLODE:g}×) in {int(boom.sum())}/{len(geo)}; "
                     f"{_collapses(geo, GEO_RS)}: {v2}")
        parts["A2"] = v2
        keys.append(f"{GEO_RS} grad ×{sig(geo['explode'].max(), 2)}")
    if not verdicts:
        return "n/a", f"A (AReaL, k={k}): no {TOKEN_MIS} or {GEO_RS} runs: n/a", {"verdict": "n/a"}
    v = all_of(verdicts)
    parts.update(verdict=v, key="A: " + ", ".join(keys))
    return v, f"A (AReaL, k={k}): " + "; ".join(texts) + f": {v}", parts


def staleness_verdict(runs) -> Verdict:
    """Claim 5 on runs (correction, staleness, trust, seed, collapsed, collapse_step, collapse_kind, peak,
    initial, final, ess_early, ess_before, spike_before, explode; staleness_runs): V at k = 2 (vcpo_part), M and
    A at the largest k present (m2po_part, areal_part). Overall all_of over the parts that can be tested (a part
    without its arms is n/a and left out); every part's time-to-collapse is in the statement, with every
    banded arm's rejection at the measured mismatch."""
    ks = sorted(runs["staleness"].unique())
    if VCPO_LAG not in ks:
        raise UserError(f"staleness-breaks-tis: needs runs at k = {VCPO_LAG} (VCPO's lag), got k = {ks}")
    kmax = int(ks[-1])
    v_v, t_v, p_v = vcpo_part(runs)
    v_m, t_m, p_m = m2po_part(runs, kmax)
    v_a, t_a, p_a = areal_part(runs, kmax)
    tested = [v for v in (v_v, v_m, v_a) if v != "n/a"]
    verdict = all_of(tested)
    # every other arm's collapses, so nothing is hidden
    shown = {(SEQ_TIS, VCPO_LAG, "clip"), (PLAIN, kmax, "none"), (PLAIN, kmax, "clip"), (TOKEN_MIS, kmax, "clip"),
             (GEO_RS, kmax, "clip")}
    rest = []
    for (c, k, tr), f in runs.groupby(["correction", "staleness", "trust"], sort=True):
        if (c, k, tr) in shown:
            continue
        n = int(f["collapsed"].sum())
        rest.append(f"{c} k={k}{' no-TR' if tr == 'none' else ''} {n}/{len(f)}{steps_text(f.loc[f['collapsed'] > 0, 'collapse_step'])}")
    bands, degenerate = band_text(runs, ["staleness", "trust"])
    statement = (f"{t_v}; {t_m}; {t_a}. Other arms (collapsed/seeds): {', '.join(rest) or 'none'}."
                 + (f" {bands[0].upper()}{bands[1:]}." if bands else ""))
    key = "; ".join(p["key"] for p in (p_v, p_m, p_a) if "key" in p)
    return Verdict(verdict, statement, {"V": v_v, "M": v_m, "A": v_a, "vcpo": p_v, "m2po": p_m, "areal": p_a,
                                        "degenerate": degenerate, "kmax": kmax}, key=key)


def staleness_figure(ds: Dataset, runs, verdict: Verdict, style: str):
    """2 × 2: at k = 2, J and the ESS of seq-tis (and tis, plain PPO) with each collapse marked (V); at the
    largest k, J and the grad norm of plain PPO with and without the trust region, icepop and geo-mask (M, A)."""
    from matplotlib.lines import Line2D

    df = with_keys(ds, ds.metrics, correction="correction", staleness="mismatch.staleness", seed="seed")
    df = df.assign(_t=update_index(df))
    trust = dict(zip(runs["job"], runs["trust"]))
    df["trust"] = df["job"].map(trust)
    df["staleness"] = df["staleness"].astype(int)
    per = int(df["update"].max()) + 1 if "update" in df.columns else 1
    kmax = int(runs["staleness"].max())
    fig, axes = new_figure(2, 2, style, panel=(4.6, 2.7))
    panels = [(VCPO_LAG, [(SEQ_TIS, "clip"), ("tis", "clip"), (PLAIN, "clip")]),
              (kmax, [(PLAIN, "clip"), (PLAIN, "none"), (TOKEN_MIS, "clip"), (GEO_RS, "clip")])]
    handles, labels = {}, {}
    for col, (k, arms) in enumerate(panels):
        ax_j, ax_x = axes[0][col], axes[1][col]
        for name, tr in arms:
            cur = df[(df["correction"] == name) & (df["staleness"] == k) & (df["trust"] == tr)]
            if cur.empty:
                continue
            lk = st.look(name)
            ls = "--" if tr == "none" else lk.linestyle
            ev = [objective_series(g)["objective"] for _, g in cur.groupby("job")]
            j = np.nanmean(np.vstack([e.reindex(ev[0].index).to_numpy() for e in ev]), axis=0) if ev else []
            if len(ev):
                ax_j.plot(ev[0].index, j, color=lk.color, linestyle=ls, marker=".", markersize=3)
            y = "ess" if col == 0 else "grad_norm"
            med = cur.assign(x=cur["_t"] / per).groupby("x")[y].median()
            ax_x.plot(med.index, med.to_numpy(), color=lk.color, linestyle=ls, linewidth=0.9)
            fell = runs[(runs["correction"] == name) & (runs["staleness"] == k) & (runs["trust"] == tr)
                        & (runs["collapsed"] > 0)]
            for _, r in fell.iterrows():
                for ax in (ax_j, ax_x):
                    ax.axvline(r["collapse_step"], color=lk.color, linestyle=":", linewidth=0.9)
            label = name + (" (no trust region)" if tr == "none" else "")
            handles[label] = Line2D([], [], color=lk.color, linestyle=ls)
        ax_j.set_title(f"({'a' if col == 0 else 'c'}) k = {k}: J ({'V' if col == 0 else 'M, A'})",
                       fontsize="medium")
        ax_j.set_ylabel(r"objective $J(\theta)$ (mean over seeds)")
        ax_x.set_xlabel("training step")
        if col == 0:
            ax_x.set_ylabel("ESS (median over seeds)")
            ax_x.set_title(f"(b) k = {k}: ESS, ahead of a collapse?", fontsize="medium")
        else:
            ax_x.set_yscale("log")
            ax_x.set_ylabel(r"$\|\nabla L\|$ before clipping (median)")
            ax_x.set_title(f"(d) k = {k}: grad norm (A2: explodes?)", fontsize="medium")
    handles["collapse"] = Line2D([], [], color="0.4", linestyle=":")
    legend_below(fig, list(handles.values()), [*list(handles)[:-1], "a run's collapse step"], style)
    headline(fig, f"{TITLE} [{world_of(ds)} world]", SOURCE, verdict, style)
    return fig


def evaluate(ds: Dataset, style: str):
    runs = staleness_runs(ds)
    v = staleness_verdict(runs)
    return v, staleness_figure(ds, runs, v, style)
