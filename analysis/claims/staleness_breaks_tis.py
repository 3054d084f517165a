"""Claim 5: staleness, as the sources that measured it report it (VCPO, M2PO, AReaL PR #1218).

Three parts, each on the runs of one experiment (arms × staleness k × seeds; an arm is a correction and
what PPO's ratio is taken against, conf/arm/staleness/):
  V  VCPO (Huang et al. 2026, arXiv 2602.17616): at a policy lag of k = 2, sequence-level TIS shows a
     grad-norm spike followed by collapse, and the effective sample size (ESS) falls ahead of it;
  M  M2PO (Zheng et al. 2025, arXiv 2510.01161, "Prosperity before Collapse"): with a stale policy and no
     trust region, J first rises ("prosperity") and then collapses, where the clipped run does not. Their
     arms, here: PPO's ratio and clip taken against the behaviour policy (loss.ratio_against=behaviour, as
     M2PO and verl's bypass mode: the clip sees the staleness), and the same ratio π_θ / π_behaviour with
     the clip removed. (PPO against `old`, recomputed at θ_t, has ratio exactly 1 at each step's first
     update, so its clip never sees the staleness; it is the `none` arm, shown, not M's.)
  A  AReaL PR #1218 (its table from PR #1084): token-MIS alone (IcePop's token mask) collapses (at about 250
     steps there), and geometric rejection sampling alone (geo-RS, here geo-mask) makes the grad norm explode.
     geo-mask's band rejects most tokens here, and a token-mean over the few left is noisier by that alone:
     its grad-norm growth is judged against a control that rejects as many sequences at random
     (geo-mask-shuffled, correction.filter_shuffle).
Time-to-collapse (the step the runner's relative rules name) is measured for every arm, not only whether.
Staleness is counted in training steps k; with U updates a step the engine is k·U to k·U + U − 1 optimizer
updates behind (M2PO's unit), and both are stated.
Collapse counts are read with the exact machinery every claim shares (analysis/claims/stats.py; n = seeds): each
arm's count with its Clopper–Pearson 95% interval, and an arm "collapses more often" than its comparator only by
Fisher's exact test (one-sided p < 0.05, `stats.collapse_effect`): 1/1 against 0/1 (p = 0.5) is inconclusive,
never "holds" or "does not hold". The same test reads A2's explosion counts.
A part whose arms never collapse, with or without the correction (or the trust region), cannot test "X
collapses" in this world: it is "untestable here", with its numbers, never "does not hold". Updates whose
gradient is exactly 0 (θ not moving) are left out of every ESS and grad-norm statistic: there ESS ≡ 1 says
nothing about stability.
Read top to bottom: the reducer (one row per run), the rule (`staleness_verdict`), the figure, `evaluate`.

About 600 lines in one module on purpose: the three parts share one frame (arms × k × seeds), one
collapse rule and one positive control, and the verdict reads top to bottom in the sources' order.
"""

from __future__ import annotations

import math

import numpy as np

from analysis import style as st
from analysis import zero_grad
from analysis.claims.figures import headline, legend_below, new_figure
from analysis.claims.frames import band_text, objective_series, required, run_frame, update_index, world_of
from analysis.claims.stats import (
    ALPHA,
    FAILS,
    HOLDS,
    SPIKE_FACTOR,
    SPIKE_WINDOW,
    UNSURE,
    UNTESTABLE,
    Verdict,
    all_of,
    collapse_effect,
    count_text,
    fisher_exact,
    pct,
    rate,
    sig,
    sign_test,
    steps_text,
)
from analysis.load import Dataset
from runner.errors import UserError

NAME = "staleness-breaks-tis"  # = conf/experiment/[WORLD/]NAME.yaml and the figure's file name
TITLE = "5. Staleness: sequence TIS, token-MIS and untrusted updates collapse"
SOURCE = "VCPO (arXiv 2602.17616); M2PO (arXiv 2510.01161); AReaL PR #1218"

# Thresholds of the rule (named in its docstring and the experiments' headers).
VCPO_LAG = 2  # V is judged at k = 2, the lag VCPO reports
MAJORITY = 0.5  # M's prosperity then collapse in at least half of the seeds, V's precursors in half of its collapses
PRECURSOR_STEPS = 10  # the window before a collapse (and at a run's start) in which precursors are looked for
ESS_DROP = (
    0.05  # the ESS "falls ahead": its mean over the window before the collapse is ≥ 0.05 below the first window's
)
PROSPERITY = 0.5  # M: before collapsing, the untrusted run gains at least half of what the clipped run gains
EXPLODE = 10.0  # A: the grad norm "explodes" when its maximum exceeds 10× the run's early median
CONTROL_FACTOR = 2.0  # A2: ... and that ratio is at least 2× the shuffled control's (same seed)
UNTRUSTED_EPS = 100.0  # loss.eps_high at or above this (or loss=reinforce) is "no trust region"

# The arms (conf/arm/staleness/NAME.yaml): a correction's name under PPO's ratio against old, or M2PO's two.
SEQ_TIS, TOKEN_MIS, GEO_RS, PLAIN = "seq-tis", "icepop", "geo-mask", "none"
GEO_CONTROL = "geo-mask-shuffled"
M2PO_CLIP, M2PO_FREE = "m2po-clip", "m2po-free"
ARM_TEXT = {
    M2PO_CLIP: "clip vs behaviour",
    M2PO_FREE: "no trust region",
    GEO_CONTROL: "geo-mask shuffled",
    PLAIN: "none (clip vs old)",
}


def arm_of(correction: str, against: str, trust: str, shuffled: bool) -> str:
    """A run's arm: m2po-clip | m2po-free against the behaviour policy, else the correction's name
    (+ '-shuffled' for a shuffled filter, + ' (no trust region)' without PPO's clip)."""
    if against == "behaviour":
        return M2PO_CLIP if trust == "clip" else M2PO_FREE
    name = f"{correction}-shuffled" if shuffled else str(correction)
    return name if trust == "clip" else f"{name} (no trust region)"


def _flag(v) -> bool:
    return str(v).strip().lower() in ("true", "1", "1.0")


def staleness_runs(ds: Dataset):
    """One row per run (frames.run_frame) with correction, arm (arm_of), trust (clip | none: PPO's clip removed,
    loss.eps_high ≥ 100 or loss=reinforce), against (old | behaviour), staleness (k, training steps),
    staleness_updates (k·U, optimizer updates), seed, clip_fraction (mean ppo_clip_fraction over updates) and
    the precursors of its collapse, if any, all over the updates whose gradient is not exactly 0:
    ess_early (mean ESS over its first PRECURSOR_STEPS steps), ess_before (over the PRECURSOR_STEPS steps before
    the collapse step), spike_before (a grad-norm spike, > 5× the trailing 20-update median, in that window or
    at the collapse step, or a collapse by the spike rule itself), explode (max grad norm / early median)."""
    runs = run_frame(
        ds,
        correction="correction",
        staleness="mismatch.staleness",
        seed="seed",
        loss="loss.name",
        eps_high="loss.eps_high",
        against="loss.ratio_against",
        shuffled="correction.filter_shuffle",
        per_step="train.updates_per_step",
    )
    runs["staleness"] = runs["staleness"].astype(int)
    eps = runs["eps_high"].astype(float)
    runs["trust"] = np.where((runs["loss"].astype(str) == "reinforce") | (eps >= UNTRUSTED_EPS), "none", "clip")
    runs["against"] = [("behaviour" if str(a) == "behaviour" else "old") for a in runs["against"]]
    runs["arm"] = [
        arm_of(c, a, t, _flag(s))
        for c, a, t, s in zip(runs["correction"], runs["against"], runs["trust"], runs["shuffled"])
    ]
    per_step = runs["per_step"].map(lambda v: int(float(v)) if v is not None and str(v) != "nan" else 1)
    runs["staleness_updates"] = runs["staleness"] * per_step
    df = required(ds.metrics, "training metrics (metrics.csv)", ds.path)
    df = df.assign(_t=update_index(df)).sort_values(["job", "_t"])
    pre = {}
    for job, g in df.groupby("job", sort=True):
        step = g["step"].astype(int)
        moving = g["grad_norm"].astype(float) != 0  # a frozen θ's ESS ≡ 1 is no sign of health
        early = g[(step < step.min() + PRECURSOR_STEPS) & moving]["ess"].astype(float).mean()
        clip = g["ppo_clip_fraction"].astype(float).mean() if "ppo_clip_fraction" in g.columns else math.nan
        pre[job] = {"ess_early": early, "ess_before": math.nan, "spike_before": math.nan, "clip_fraction": clip}
        r = runs[runs["job"] == job].iloc[0]
        if r["collapsed"] > 0 and math.isfinite(r["collapse_step"]):
            cs = int(r["collapse_step"])
            window = (step >= cs - PRECURSOR_STEPS) & (step < cs) & moving
            pre[job]["ess_before"] = g[window]["ess"].astype(float).mean() if window.any() else math.nan
            gn = g["grad_norm"].astype(float).where(lambda x: np.isfinite(x) & (x > 0))
            ref = gn.shift(1).rolling(SPIKE_WINDOW, min_periods=3).median()
            spike = ((gn > SPIKE_FACTOR * ref) & (ref > 0)) | ~np.isfinite(g["grad_norm"].astype(float))
            near = (step >= cs - PRECURSOR_STEPS) & (step <= cs)
            pre[job]["spike_before"] = float(bool((spike & near).any()) or r["collapse_kind"] == "spike")
    for col in ("ess_early", "ess_before", "spike_before", "clip_fraction"):
        runs[col] = runs["job"].map({j: p[col] for j, p in pre.items()})
    runs["explode"] = runs["max_grad_norm"] / runs["grad_norm_early"]
    return runs.sort_values(["arm", "staleness", "seed"]).reset_index(drop=True)


def _arm(runs, arm: str, k: int):
    return runs[(runs["arm"] == arm) & (runs["staleness"] == k)]


def _units(runs, k: int) -> str:
    """'k=16 steps = 32–33 updates': the staleness in training steps and in optimizer updates (M2PO's unit)."""
    f = runs[runs["staleness"] == k]
    if "staleness_updates" not in f.columns or f.empty:
        return f"k={k}"
    lo = int(f["staleness_updates"].min())
    per = lo // k if k else 1
    return f"k={k} steps = {lo}" + (f"–{lo + per - 1}" if per > 1 else "") + " updates" if k else "k=0"


def _collapses(f, label: str) -> str:
    """'seq-tis 3/4 collapsed [19%, 99%] at steps 30, 35, 40 (drop) in 100 steps': the count with its exact 95%
    interval, the time to each collapse and the run length."""
    n = int(f["collapsed"].sum())
    kinds = sorted({x for x in f.loc[f["collapsed"] > 0, "collapse_kind"] if x})
    return (
        f"{label} {count_text(n, len(f))}{steps_text(f.loc[f['collapsed'] > 0, 'collapse_step'])}"
        + (f" ({', '.join(kinds)})" if kinds else "")
        + f" in {int(f['steps'].max()) + 1 if len(f) else 0} steps"
    )


def more_often(k_a: int, n_a: int, k_b: int, n_b: int, a: str, b: str, event: str = "collapses") -> tuple[str, str]:
    """Does arm a's event (a collapse; A2: an explosion) happen more often than arm b's? `stats.collapse_effect`
    on the two counts (holds at Fisher's one-sided p < 0.05, does not hold when b's is significantly more often,
    else inconclusive), with its text: 'Fisher p = 0.014 that seq-tis collapses more often than plain PPO (1 the
    other way)'. Inconclusive, with no p, when an arm has no runs."""
    if not (n_a and n_b):
        return UNSURE, f"no Fisher test of {a} against {b} (an arm without runs)"
    p_more, p_less = fisher_exact(k_a, n_a, k_b, n_b, "greater"), fisher_exact(k_a, n_a, k_b, n_b, "less")
    return (
        collapse_effect(k_a, n_a, k_b, n_b),
        f"Fisher p = {sig(p_more, 2)} that {a} {event} more often than {b} ({sig(p_less, 2)} the other way)",
    )


def _count(f) -> tuple[int, int]:
    return int(f["collapsed"].sum()), len(f)


def _majority(x: float) -> bool:
    return math.isfinite(x) and x >= MAJORITY


def _never_collapses(*frames) -> bool:
    """The positive control of a 'collapses' claim failed: none of these arms collapses in any seed."""
    return all(int(f["collapsed"].sum()) == 0 for f in frames if len(f))


def _zero_text(f) -> str:
    """', gradient exactly 0 in 12% of updates' where an arm's θ stood still for a while."""
    z = f["zero_grad"].astype(float).mean() if "zero_grad" in f.columns and len(f) else math.nan
    return f", gradient exactly 0 in {pct(z)} of updates" if math.isfinite(z) and z > 0 else ""


def combine(verdicts) -> str:
    """The conjunction of parts: 'n/a' (no arms) is left out; any part that does not hold sinks it; untestable
    here when every part is; holds only when every part holds; else (some part inconclusive, or untestable
    while the rest hold) inconclusive."""
    vs = [v for v in verdicts if v != "n/a"]
    if not vs:
        return "n/a"
    if FAILS in vs:
        return FAILS
    if all(v == UNTESTABLE for v in vs):
        return UNTESTABLE
    return all_of(vs) if UNTESTABLE not in vs else UNSURE


def vcpo_part(runs) -> tuple[str, str, dict]:
    """V: seq-tis at k = 2 under PPO's clip, against plain PPO (none) at k = 2 by Fisher's exact test
    (more_often). Untestable when neither collapses in any seed. Holds when seq-tis collapses significantly
    more often and, among its collapsed runs, at least half had a grad-norm spike in the PRECURSOR_STEPS steps
    before (or at) the collapse and at least half had their ESS ≥ ESS_DROP lower over those steps than over
    their first PRECURSOR_STEPS. Does not hold when plain PPO collapses significantly more often, or when
    seq-tis does but none of its collapses shows either precursor. Else inconclusive (so with one or two
    seeds per arm it can be no more)."""
    f = _arm(runs, SEQ_TIS, VCPO_LAG)
    if f.empty:
        raise UserError(f"staleness-breaks-tis: needs {SEQ_TIS} runs at k = {VCPO_LAG} (VCPO's lag) under PPO's clip")
    plain = _arm(runs, PLAIN, VCPO_LAG)
    c = rate(f["collapsed"])
    v_more, fisher = more_often(*_count(f), *_count(plain), SEQ_TIS, "plain PPO")
    fell = f[f["collapsed"] > 0]
    spiked = rate(fell["spike_before"]) if len(fell) else math.nan
    ess_fell = (fell["ess_before"] <= fell["ess_early"] - ESS_DROP) if len(fell) else []
    ess_rate = rate(ess_fell) if len(fell) else math.nan
    if _never_collapses(f, plain):
        v = UNTESTABLE
    elif v_more == FAILS:
        v = FAILS
    elif v_more == HOLDS and _majority(spiked) and _majority(ess_rate):
        v = HOLDS
    elif v_more == HOLDS and spiked == 0 and ess_rate == 0:
        v = FAILS
    else:
        v = UNSURE
    ess = f"ESS {sig(f['ess_early'].mean(), 2)} over the first {PRECURSOR_STEPS} steps"
    if len(fell):
        ess += f", {sig(fell['ess_before'].mean(), 2)} before the collapses"
    spikes = f"{int(fell['spike_before'].sum())}/{len(fell)}" if len(fell) else "— (no collapse)"
    control = f"; {_collapses(plain, 'plain PPO')}; {fisher}" if len(plain) else ""
    why = (
        " (neither seq-tis nor plain PPO collapses at this lag: the world shows no collapse to explain)"
        if v == UNTESTABLE
        else ""
    )
    text = (
        f"V (VCPO, {_units(runs, VCPO_LAG)}): {_collapses(f, SEQ_TIS)}{_zero_text(f)}; a spike before the "
        f"collapse in {spikes}; {ess}{control}: {v}{why}"
    )
    key = f"V: {SEQ_TIS} k={VCPO_LAG} {int(f['collapsed'].sum())}/{len(f)} collapsed"
    return v, text, {"verdict": v, "collapsed": c, "spike_before": spiked, "ess_fell": ess_rate, "key": key}


def m2po_part(runs, k: int) -> tuple[str, str, dict]:
    """M: at the largest k, M2PO's two arms, both with no correction and PPO's ratio against the behaviour
    policy: without the trust region (m2po-free) against with it (m2po-clip). Per seed, prosperity-then-collapse
    = the untrusted run collapsed at or after its peak step and had gained at least PROSPERITY × the clipped
    run's gain (peak J − J₀) by then. Untestable when neither arm collapses in any seed. Holds when the untrusted
    arm collapses significantly more often than the clipped one (Fisher, more_often) and at least half of the
    seeds show prosperity then collapse; does not hold when the clipped arm collapses significantly more often;
    else inconclusive (equal counts, 3/3 against 3/3 as 0/1 against 1/1, show no difference either way).
    n/a without both arms. The clipped arm's clip fraction is stated (PPO against old: 0 at a step's first
    update)."""
    free, clip = _arm(runs, M2PO_FREE, k).set_index("seed"), _arm(runs, M2PO_CLIP, k).set_index("seed")
    if free.empty or clip.empty:
        return (
            "n/a",
            (
                f"M (M2PO, k={k}): no runs of {M2PO_CLIP} and {M2PO_FREE} (PPO against the behaviour "
                "policy, with and without its clip): n/a"
            ),
            {"verdict": "n/a"},
        )
    seeds = free.index.intersection(clip.index)
    free, clip = free.loc[seeds], clip.loc[seeds]
    gain_free = free["peak"] - free["initial"]
    gain_clip = (clip["peak"] - clip["initial"]).clip(lower=1e-12)
    prosper = gain_free >= PROSPERITY * gain_clip
    after = (free["collapsed"] > 0) & (free["collapse_step"] >= free["peak_step"])
    both = prosper & after
    c_free, c_clip = rate(free["collapsed"]), rate(clip["collapsed"])
    v_more, fisher = more_often(*_count(free), *_count(clip), "no trust region", "clipped")
    if _never_collapses(free, clip):
        v = UNTESTABLE
    elif v_more == FAILS:
        v = FAILS
    elif v_more == HOLDS and _majority(rate(both)):
        v = HOLDS
    else:
        v = UNSURE
    old = _arm(runs, PLAIN, k)
    old_clip = (
        f"; PPO against old ({PLAIN}): clip fraction {pct(old['clip_fraction'].mean())}"
        if len(old) and old["clip_fraction"].notna().any()
        else ""
    )
    why = " (neither arm collapses: the world cannot show this collapse)" if v == UNTESTABLE else ""
    text = (
        f"M (M2PO, {_units(runs, k)}, ratio against the behaviour policy): "
        f"{_collapses(free.reset_index(), 'no trust region')}, peak J {sig(free['peak'].mean(), 3)} (gain "
        f"{sig(gain_free.mean(), 2)} vs {sig((clip['peak'] - clip['initial']).mean(), 2)} clipped), final "
        f"{sig(free['final'].mean(), 3)}; {_collapses(clip.reset_index(), 'clipped')}, clip fraction "
        f"{pct(clip['clip_fraction'].mean())}, final {sig(clip['final'].mean(), 3)}{old_clip}; {fisher}; prosperity "
        f"then collapse in {int(both.sum())}/{len(both)}: {v}{why}"
    )
    key = f"M: no-TR {int(free['collapsed'].sum())}/{len(free)} vs clip {int(clip['collapsed'].sum())}/{len(clip)} collapsed"
    return (
        v,
        text,
        {
            "verdict": v,
            "collapsed_free": c_free,
            "collapsed_clip": c_clip,
            "prosper_then_collapse": rate(both),
            "clip_fraction": float(clip["clip_fraction"].mean()),
            "key": key,
        },
    )


def _a1(runs, k: int):
    """A1: icepop (token-MIS alone) against plain PPO (none) at this k by Fisher's exact test (more_often):
    holds when icepop collapses significantly more often, does not hold when plain PPO does, untestable when
    neither collapses in any seed; else inconclusive."""
    mis, plain = _arm(runs, TOKEN_MIS, k), _arm(runs, PLAIN, k)
    v_more, fisher = more_often(*_count(mis), *_count(plain), TOKEN_MIS, "plain PPO")
    v = UNTESTABLE if _never_collapses(mis, plain) else v_more
    control = f"; {_collapses(plain, 'plain PPO')}; {fisher}" if len(plain) else ""
    why = " (neither collapses)" if v == UNTESTABLE else ""
    text = f"A1 token-MIS ({TOKEN_MIS}): {_collapses(mis, TOKEN_MIS)} [AReaL: ~250 steps]{control}: {v}{why}"
    return v, text, f"{TOKEN_MIS} {int(mis['collapsed'].sum())}/{len(mis)} collapsed"


def _a2(runs, k: int):
    """A2: geo-mask's grad norm explodes (max ≥ EXPLODE × its early median, or a collapse by the spike rule)
    AND that ratio is ≥ CONTROL_FACTOR × the shuffled control's of the same seed (which rejects as many
    sequences at random: what averaging over that few tokens alone does). Untestable when neither geo-mask nor
    plain PPO (none) at this k explodes in any seed (the world shows no explosion), or geo-mask's gradient is
    never non-zero (no ratio). The counts are read as the collapse parts' (more_often, Fisher's exact test):
    holds when geo-mask explodes beyond its control (both conditions) significantly more often than the
    control explodes; does not hold when plain PPO explodes significantly more often than geo-mask, or geo-mask's
    ratio is below its control's in significantly many seeds (the exact sign test, p < 0.05: every seed of at
    least 5); inconclusive without the control (the statistic alone is confounded by the rejected fraction) and
    otherwise."""
    geo = _arm(runs, GEO_RS, k).set_index("seed")
    ctrl = _arm(runs, GEO_CONTROL, k).set_index("seed")
    plain = _arm(runs, PLAIN, k)
    ratio = geo["explode"].astype(float)
    booms = (ratio >= EXPLODE) | (geo["collapse_kind"] == "spike")
    plain_booms = (plain["explode"].astype(float) >= EXPLODE) | (plain["collapse_kind"] == "spike")
    quiet = not booms.any() and not plain_booms.any()
    span = f"{sig(ratio.min(), 2)}–{sig(ratio.max(), 2)}×"
    plain_text = f"; plain PPO {sig(plain['explode'].min(), 2)}–{sig(plain['explode'].max(), 2)}×" if len(plain) else ""
    why = {
        "frozen": " (its gradient is never non-zero)",
        "quiet": " (neither geo-mask nor plain PPO explodes: the world shows no explosion)",
    }
    if ctrl.empty:
        v = UNTESTABLE if quiet or not np.isfinite(ratio).any() else UNSURE
        text = (
            f"A2 geo-RS ({GEO_RS}): max grad norm / early median {span} (explodes: ≥ {EXPLODE:g}×) in "
            f"{int(booms.sum())}/{len(geo)}{_zero_text(geo.reset_index())}{plain_text}; no shuffled control "
            f"({GEO_CONTROL}) to tell its selection from the few tokens it keeps: {v}"
        )
        return v, text, f"{GEO_RS} grad ×{sig(ratio.max(), 2)}"
    seeds = geo.index.intersection(ctrl.index)
    geo, ctrl, ratio, booms = geo.loc[seeds], ctrl.loc[seeds], ratio.loc[seeds], booms.loc[seeds]
    control = ctrl["explode"].astype(float)
    excess = ratio / control
    beyond = booms & (excess >= CONTROL_FACTOR)
    ctrl_booms = (control >= EXPLODE) | (ctrl["collapse_kind"] == "spike")
    n = len(seeds)
    v_beyond, fisher = more_often(
        int(beyond.sum()), n, int(ctrl_booms.sum()), n, GEO_RS, "its control", "explodes (beyond its control)"
    )
    v_plain, _ = more_often(int(plain_booms.sum()), len(plain), int(booms.sum()), n, "plain PPO", GEO_RS, "explodes")
    below = int((excess < 1).sum())
    p_below = sign_test(below, n) if n else math.nan
    reason = ""
    if not np.isfinite(ratio).any():
        v, reason = UNTESTABLE, why["frozen"]
    elif quiet:
        v, reason = UNTESTABLE, why["quiet"]
    elif v_beyond == HOLDS:
        v = HOLDS
    elif v_plain == HOLDS or p_below < ALPHA:
        v = FAILS
    else:
        v = UNSURE
    text = (
        f"A2 geo-RS ({GEO_RS}): max grad norm / early median {span} (explodes: ≥ {EXPLODE:g}×) in "
        f"{int(booms.sum())}/{len(geo)}, rejecting {pct(geo['rejected'].mean())} of tokens"
        f"{_zero_text(geo.reset_index())}; its shuffled control (as many rejected at random) "
        f"{sig(control.min(), 2)}–{sig(control.max(), 2)}×, rejecting {pct(ctrl['rejected'].mean())}"
        f"{_zero_text(ctrl.reset_index())}{plain_text}; geo-mask ≥ {CONTROL_FACTOR:g}× its control and exploding "
        f"in {int(beyond.sum())}/{len(geo)}, the control exploding in {int(ctrl_booms.sum())}/{n}: {fisher}; "
        f"below its control in {below}/{n} (sign test p = {sig(p_below, 2)}); "
        f"{_collapses(geo.reset_index(), GEO_RS)}: {v}{reason}"
    )
    return v, text, f"{GEO_RS} grad ×{sig(ratio.max(), 2)} vs control ×{sig(control.max(), 2)}"


def areal_part(runs, k: int) -> tuple[str, str, dict]:
    """A: at the largest k under PPO's clip against old, A1 (_a1) and A2 (_a2), over the arms present;
    A = combine([A1, A2])."""
    verdicts, texts, parts, keys = [], [], {}, []
    for part, arm, judge in (("A1", TOKEN_MIS, _a1), ("A2", GEO_RS, _a2)):
        if len(_arm(runs, arm, k)):
            v, text, key = judge(runs, k)
            verdicts.append(v)
            texts.append(text)
            parts[part] = v
            keys.append(key)
    if not verdicts:
        return "n/a", f"A (AReaL, k={k}): no {TOKEN_MIS} or {GEO_RS} runs: n/a", {"verdict": "n/a"}
    v = combine(verdicts)
    parts.update(verdict=v, key="A: " + ", ".join(keys))
    return v, f"A (AReaL, {_units(runs, k)}): " + "; ".join(texts) + f"; so A: {v}", parts


def staleness_verdict(runs) -> Verdict:
    """Claim 5 on runs (arm, staleness, seed, collapsed, collapse_step, collapse_kind, peak, initial, final,
    ess_early, ess_before, spike_before, explode, clip_fraction, rejected; staleness_runs): V at k = 2
    (vcpo_part), M and A at the largest k present (m2po_part, areal_part). Overall `combine` over the parts:
    a part without its arms (n/a) is left out; one that does not hold sinks the claim; untestable here when
    every part is (its world never collapses); holds when every part holds; else inconclusive. Every part's time-to-collapse is in the statement, with every
    banded arm's rejection at the measured mismatch."""
    ks = sorted(runs["staleness"].unique())
    if VCPO_LAG not in ks:
        raise UserError(f"staleness-breaks-tis: needs runs at k = {VCPO_LAG} (VCPO's lag), got k = {ks}")
    kmax = int(ks[-1])
    v_v, t_v, p_v = vcpo_part(runs)
    v_m, t_m, p_m = m2po_part(runs, kmax)
    v_a, t_a, p_a = areal_part(runs, kmax)
    verdict = combine([v_v, v_m, v_a])
    # every other arm's collapses, so nothing is hidden
    shown = {
        (SEQ_TIS, VCPO_LAG),
        (PLAIN, VCPO_LAG),
        (M2PO_FREE, kmax),
        (M2PO_CLIP, kmax),
        (TOKEN_MIS, kmax),
        (GEO_RS, kmax),
        (GEO_CONTROL, kmax),
        (PLAIN, kmax),
    }
    rest = []
    for (arm, k), f in runs.groupby(["arm", "staleness"], sort=True):
        if (arm, k) in shown:
            continue
        n = int(f["collapsed"].sum())
        rest.append(f"{arm} k={k} {n}/{len(f)}{steps_text(f.loc[f['collapsed'] > 0, 'collapse_step'])}")
    bands, degenerate = band_text(runs, ["staleness", "arm"])
    statement = f"{t_v}; {t_m}; {t_a}. Other arms (collapsed/seeds): {', '.join(rest) or 'none'}." + (
        f" {bands[0].upper()}{bands[1:]}." if bands else ""
    )
    key = "; ".join(p["key"] for p in (p_v, p_m, p_a) if "key" in p)
    return Verdict(
        verdict,
        statement,
        {"V": v_v, "M": v_m, "A": v_a, "vcpo": p_v, "m2po": p_m, "areal": p_a, "degenerate": degenerate, "kmax": kmax},
        key=key,
    )


# ----------------------------------------------------------------------------------------- the figure
# M2PO's arms and the shuffled control are not presets: their own looks, distinct from every preset's.
ARM_LOOKS = {M2PO_CLIP: ("#228833", "-"), M2PO_FREE: ("#EE6677", "--"), GEO_CONTROL: (None, (0, (1, 1.2)))}


def _look(arm: str) -> tuple[str, object]:
    color, ls = ARM_LOOKS.get(arm, (None, None))
    base = st.look(GEO_RS if arm == GEO_CONTROL else arm)
    return color or base.color, ls or base.linestyle


def _median_line(ax, cur, y: str, color, ls) -> None:
    """The median over seeds of y per update; ESS and the clip fraction only where the gradient is not exactly
    0 (they mean nothing for a θ that does not move), the grad norm only where positive (a log axis)."""
    vals = cur[y].astype(float)
    vals = vals.where(vals > 0) if y == "grad_norm" else vals.where(cur["grad_norm"].astype(float) != 0)
    med = cur.assign(v=vals).groupby("x")["v"].median()
    ax.plot(med.index, med.to_numpy(), color=color, linestyle=ls, linewidth=0.9)


def staleness_figure(ds: Dataset, runs, verdict: Verdict, style: str):
    """2 × 3: for V (k = 2), J and the ESS of seq-tis, tis and plain PPO; for M (largest k), J of M2PO's two arms
    and of PPO against old, and the clip fraction of the clipped arm at both k (and of PPO against old); for A
    (largest k), J and the grad norm of icepop, geo-mask and its shuffled control. Each collapse is marked; in
    the lower panels, stretches where every run of an arm has an exactly-zero gradient are shaded in its colour
    (there ESS and the clip fraction are left out: θ does not move)."""
    from matplotlib.lines import Line2D

    df = ds.metrics.assign(_t=update_index(ds.metrics))
    df["arm"], df["k"] = (
        df["job"].map(dict(zip(runs["job"], runs["arm"]))),
        df["job"].map(dict(zip(runs["job"], runs["staleness"]))),
    )
    per = int(df["update"].max()) + 1 if "update" in df.columns else 1
    df["x"] = df["_t"] / per
    kmax = int(runs["staleness"].max())
    other = (0, (3, 1, 1, 1))  # the clipped M2PO arm at the other k
    # per column: the part, its k, the arms whose J is drawn, the lower panel's metric and its (arm, k, line style)
    columns = [
        ("V", VCPO_LAG, [SEQ_TIS, "tis", PLAIN], "ess", [(a, VCPO_LAG, None) for a in (SEQ_TIS, "tis", PLAIN)]),
        (
            "M",
            kmax,
            [M2PO_CLIP, M2PO_FREE, PLAIN],
            "ppo_clip_fraction",
            [(M2PO_CLIP, kmax, None), (M2PO_CLIP, VCPO_LAG, other), (PLAIN, kmax, None)],
        ),
        (
            "A",
            kmax,
            [TOKEN_MIS, GEO_RS, GEO_CONTROL, PLAIN],
            "grad_norm",
            [(a, kmax, None) for a in (TOKEN_MIS, GEO_RS, GEO_CONTROL)],
        ),
    ]
    fig, axes = new_figure(3, 2, style, panel=(4.2, 2.7))
    handles, shaded = {}, False
    for col, (part, k, top, y, bottom) in enumerate(columns):
        ax_j, ax_y = axes[0][col], axes[1][col]
        for arm in top:
            cur = df[(df["arm"] == arm) & (df["k"] == k)]
            if cur.empty:
                continue
            color, ls = _look(arm)
            ev = [objective_series(g)["objective"] for _, g in cur.groupby("job")]
            j = np.nanmean(np.vstack([e.reindex(ev[0].index).to_numpy() for e in ev]), axis=0)
            ax_j.plot(ev[0].index, j, color=color, linestyle=ls, marker=".", markersize=3)
            for _, r in runs[(runs["arm"] == arm) & (runs["staleness"] == k) & (runs["collapsed"] > 0)].iterrows():
                ax_j.axvline(r["collapse_step"], color=color, linestyle=":", linewidth=0.9)
            handles.setdefault(ARM_TEXT.get(arm, arm), Line2D([], [], color=color, linestyle=ls))
        for arm, kk, ls_k in bottom:
            cur = df[(df["arm"] == arm) & (df["k"] == kk)]
            if cur.empty or y not in cur.columns:
                continue
            color, ls = _look(arm)
            _median_line(ax_y, cur, y, color, ls_k or ls)
            shaded |= zero_grad.shade(ax_y, cur, color, x="x")
            if ls_k is not None:
                handles.setdefault(
                    f"{ARM_TEXT.get(arm, arm)}, {_units(runs, kk)}", Line2D([], [], color=color, linestyle=ls_k)
                )
        ax_j.set_title(f"({'abc'[col]}) {part}, {_units(runs, k)}: J", fontsize="medium")
        ax_j.set_ylabel(r"objective $J(\theta)$ (mean over seeds)")
        ax_y.set_xlabel("training step")
        if y == "ess":
            ax_y.set_ylabel("ESS (median over seeds)")
            ax_y.set_title("(d) V: ESS, falling ahead of a collapse?", fontsize="medium")
        elif y == "ppo_clip_fraction":
            ax_y.set_ylabel("PPO clip fraction (median)")
            ax_y.set_title("(e) M: does the clip see the staleness?", fontsize="medium")
        else:
            ax_y.set_yscale("log")
            ax_y.set_ylabel(r"$\|\nabla L\|$ before clipping (median)")
            ax_y.set_title("(f) A2: geo-mask's grad norm vs its control", fontsize="medium")
    handles["a run's collapse step"] = Line2D([], [], color="0.4", linestyle=":")
    if shaded:
        handle, label = zero_grad.handle()
        handles[label] = handle
    legend_below(fig, list(handles.values()), list(handles), style)
    headline(fig, f"{TITLE} [{world_of(ds)} world]", SOURCE, verdict, style)
    return fig


def evaluate(ds: Dataset, style: str):
    runs = staleness_runs(ds)
    v = staleness_verdict(runs)
    return v, staleness_figure(ds, runs, v, style)
