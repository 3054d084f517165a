"""Claim 1: token TIS recovers what the training–inference mismatch costs (Yao et al. 2025; FlashRL).

As the sources state it: rollouts from a lower-precision engine (INT8/FP8 in FlashRL, bf16 vLLM against an
fp32-ish trainer in Yao et al.) lose accuracy against the same run with a matched (fp32) engine, and token TIS
(C = 2) restores it. Whether TIS *prevents* a collapse or only *delays* it is disputed (Liu & Li; SkyRL PR
#1665), so the rule judges the gap, and time to collapse is reported beside it (survival curves, log-rank).

Every experiment therefore has three arms, paired over seeds: plain PPO with an fp32 engine and no noise (no
mismatch: the reference), plain PPO and token TIS under each mismatched setting (an engine precision, and the
logit noise where swept). The rule, fixed before the runs (`tis_verdict`), per mismatched setting:
  (control) the mismatch must cost something here: plain PPO under it is measurably worse than the fp32 run,
      by final J (effect(J_fp32 − J_PPO, 0.01): the two-sided 95% Student-t interval of the paired gap above 0
      and its mean ≥ 0.01) or by collapses (Fisher's exact test, one-sided p < 0.05, PPO collapsing more often
      than fp32). Where neither shows a cost the setting is "untestable here", with those numbers;
  (claim) where it does: effect(J_TIS − J_PPO, 0.01) (t interval) must hold and TIS's mean gain be at least half
      of the mean gap (it "recovers the gap"); does not hold when effect() rules out a gain of 0.01; else
      inconclusive.
The claim is existential over the settings ("an engine mismatch"): stats.any_of, which leaves untestable
settings out ("does not hold" only where every testable setting fails; "untestable here" where none was
testable). Final J is the mean over the last quarter of the evaluations. Read top to bottom: the reducer (one
row per run), the rule, the figure, `evaluate`.
"""

from __future__ import annotations

import math

import numpy as np

from analysis import style as st
from analysis.claims.figures import headline, legend_below, line_handle, new_figure, ordered_presets
from analysis.claims.frames import band_text, run_frame, setting_label, with_keys, world_of
from analysis.claims.stats import (
    FAILS,
    HOLDS,
    UNSURE,
    UNTESTABLE,
    Verdict,
    any_of,
    collapse_effect,
    count_text,
    effect,
    fisher_exact,
    interval_text,
    kaplan_meier,
    logrank,
    mean_se,
    sig,
    steps_text,
    t_interval,
)
from analysis.load import Dataset
from runner.errors import UserError

NAME = "tis-tames-mismatch"  # = conf/experiment/WORLD/NAME.yaml and the figure's file name
TITLE = "1. Token TIS recovers the training–inference mismatch's cost"
SOURCE = (
    "Yao et al. 2025, “Your efficient RL framework secretly brings you off-policy RL training”; "
    "FlashRL (Yao et al. 2025)"
)

# Thresholds of the rule (named in the module docstring and the experiments' headers).
J_MARGIN = 0.01  # final J (J ∈ [0, 1]): 0.01 is a practical difference, for the control's gap and TIS's gain
RECOVERED = 0.5  # TIS must win back at least half of the mean gap to the fp32 run
REFERENCE = "fp32"  # the engine precision with no mismatch (and no logit noise): the control arm

PRECISION_ORDER = ("fp32", "fp16", "bf16", "fp8")  # the settings' order: mismatch growing, noise-free first
SETTING_KEYS = {"precision": "mismatch.precision", "noise": "mismatch.logit_noise"}
_ARM_NAMES = {"none": "plain PPO", "tis": "token TIS"}


def tis_runs(ds: Dataset):
    """One row per run (frames.run_frame) with precision, noise, correction, seed and `setting`: the label of
    the mismatch keys the experiment varied (precision always)."""
    runs = run_frame(ds, correction="correction", seed="seed", **SETTING_KEYS)
    runs["noise"] = runs["noise"].astype(float)
    cols = setting_cols(runs)
    runs["setting"] = [setting_label(r, cols) for _, r in runs.iterrows()]
    rank = {p: i for i, p in enumerate(PRECISION_ORDER)}
    runs["_rank"] = runs["precision"].map(lambda p: rank.get(p, len(rank)))
    out = runs.sort_values(["noise", "_rank", "precision", "correction", "seed"]).drop(columns="_rank")
    return out.reset_index(drop=True)


def setting_cols(runs) -> list[str]:
    return ["precision"] + [c for c in ("noise",) if runs[c].nunique() > 1]


def is_reference(runs):
    """The fp32, noise-free runs: no mismatch."""
    return (runs["precision"] == REFERENCE) & (runs["noise"].astype(float) == 0)


def tis_verdict(runs, baseline: str = "none") -> Verdict:
    """Claim 1 on one row per run (setting, precision, noise, correction, seed, collapsed, collapse_step,
    collapse_kind, final, steps: tis_runs), by the rule in the module docstring: per mismatched setting the
    control (PPO worse than the fp32 PPO run of the same seed), then TIS's gain over PPO against that gap.
    The statement gives, per setting, each arm's final J, collapses (exact 95% interval, the steps: time to
    collapse) and the log-rank test of PPO's against TIS's time to collapse, every paired difference with its
    95% t interval and n, and every banded arm's rejection at the measured mismatch."""
    others = sorted(set(runs["correction"]) - {baseline})
    if baseline not in set(runs["correction"]) or len(others) != 1:
        raise UserError(
            f"tis-tames-mismatch: needs runs of {baseline!r} and exactly one correction to compare, "
            f"got {sorted(set(runs['correction']))}"
        )
    treat = others[0]
    ref_mask = is_reference(runs)
    ref = runs[ref_mask & (runs["correction"] == baseline)].set_index("seed")
    if ref.empty:
        raise UserError(
            f"tis-tames-mismatch: needs the control arm, plain PPO ({baseline}) with an fp32 engine "
            f"and no logit noise (mismatch.precision={REFERENCE} in the sweep)"
        )
    settings, texts, keys, parts = [], [], [], {}
    for setting, w in runs[~ref_mask].groupby("setting", sort=False):
        a = w[w["correction"] == baseline].set_index("seed")
        b = w[w["correction"] == treat].set_index("seed")
        seeds = a.index.intersection(b.index).intersection(ref.index)
        a, b, r = a.loc[seeds], b.loc[seeds], ref.loc[seeds]
        n = len(seeds)
        k_r, k_a, k_b = (int(f["collapsed"].sum()) for f in (r, a, b))
        gap = (r["final"] - a["final"]).to_numpy(float)  # what the mismatch costs PPO
        gain = (b["final"] - a["final"]).to_numpy(float)  # what TIS wins back
        v_gap = effect(gap, J_MARGIN)
        v_fell = collapse_effect(k_a, n, k_r, n)
        control = HOLDS if HOLDS in (v_gap, v_fell) else UNTESTABLE
        m_gap, m_gain = mean_se(gap)[0], mean_se(gain)[0]
        recovered = m_gain / m_gap if math.isfinite(m_gap) and m_gap > 0 else math.nan
        v_gain = effect(gain, J_MARGIN)
        if control == UNTESTABLE:
            v = UNTESTABLE
        elif v_gain == HOLDS and recovered >= RECOVERED:
            v = HOLDS
        elif v_gain == FAILS:
            v = FAILS
        else:
            v = UNSURE
        settings.append(v)
        chi2, p_lr = logrank(_times(a), a["collapsed"], _times(b), b["collapsed"])
        p_fell = fisher_exact(k_a, n, k_r, n) if n else math.nan
        parts[setting] = {
            "verdict": v,
            "control": control,
            "control_j": v_gap,
            "control_collapse": v_fell,
            "gain": v_gain,
            "n": n,
            "recovered": recovered,
            "gap": t_interval(gap),
            "gain_ci": t_interval(gain),
            "fisher_p": p_fell,
            "logrank": (chi2, p_lr),
            "collapsed": {"fp32": k_r, "ppo": k_a, "tis": k_b},
            "steps_ppo": a.loc[a["collapsed"] > 0, "collapse_step"].tolist(),
            "steps_tis": b.loc[b["collapsed"] > 0, "collapse_step"].tolist(),
            "j": {"fp32": float(r["final"].mean()), "ppo": float(a["final"].mean()), "tis": float(b["final"].mean())},
        }

        def arm(f, label):
            k = int(f["collapsed"].sum())
            kinds = sorted({x for x in f.loc[f["collapsed"] > 0, "collapse_kind"] if x})
            return (
                f"{label} final J {sig(f['final'].mean(), 4)}, {count_text(k, len(f))}"
                f"{steps_text(f.loc[f['collapsed'] > 0, 'collapse_step'])}"
                f"{' (' + ', '.join(kinds) + ')' if kinds else ''}"
            )

        why = (
            f"control: gap J_fp32 − J_PPO {interval_text(gap)} [{v_gap}], collapses PPO vs fp32 Fisher "
            f"p = {sig(p_fell, 2)} [{v_fell}]"
        )
        claim = (
            ""
            if control == UNTESTABLE
            else f"; TIS gain J_TIS − J_PPO {interval_text(gain)} [{v_gain}], {_recovered_text(recovered)} of the gap"
        )
        delay = f"; time to collapse PPO vs TIS: log-rank χ² {sig(chi2, 2)}, p = {sig(p_lr, 2)}" if k_a + k_b else ""
        texts.append(f"{setting}: {arm(r, 'fp32 PPO')}; {arm(a, 'PPO')}; {arm(b, 'TIS')}; {why}{claim}{delay} → {v}")
        keys.append(
            f"{setting}: gap {sig(m_gap, 2)}"
            + (f", TIS wins back {_recovered_text(recovered)}" if control != UNTESTABLE else " (no cost)")
        )
    verdict = any_of(settings)
    n = max((p["n"] for p in parts.values() if isinstance(p, dict)), default=0)
    bands, degenerate = band_text(runs[~ref_mask], ["setting"])
    statement = (
        f"{_ARM_NAMES.get(baseline, baseline)} with an {REFERENCE} engine (no mismatch) → "
        f"{_ARM_NAMES.get(baseline, baseline)} and {_ARM_NAMES.get(treat, treat)} under each mismatch "
        f"(paired over n = {n} seed{'s' if n != 1 else ''}; final J; intervals: 95% Student-t with n − 1 df, collapse counts: "
        f"exact Clopper–Pearson and Fisher; collapse = the runner's relative rules): "
        + "; ".join(texts)
        + "."
        + (f" {bands[0].upper()}{bands[1:]}." if bands else "")
    )
    parts["degenerate"] = degenerate
    untestable = [s for s in parts if isinstance(parts[s], dict) and parts[s]["control"] == UNTESTABLE]
    key = (
        "; ".join(keys)
        if len(keys) <= 3 or len(untestable) < len(keys)
        else (
            f"no setting costs plain PPO a measurable J against fp32 (gap J_fp32 − J_PPO "
            f"{sig(min(p['gap'][0] for p in _rows(parts)), 2)} to {sig(max(p['gap'][0] for p in _rows(parts)), 2)}); "
            f"collapsed PPO "
            f"{sum(p['collapsed']['ppo'] for p in _rows(parts))}/{n * len(keys)}, fp32 {int(ref['collapsed'].sum())}/{len(ref)}"
        )
    )
    return Verdict(verdict, statement, parts, key=key, n=n)


def _rows(parts):
    return [p for p in parts.values() if isinstance(p, dict)]


def _times(f):
    """Time to collapse, for the survival curves: the collapse step, or the run's last step (censored)."""
    return np.where(f["collapsed"] > 0, f["collapse_step"].astype(float), f["steps"].astype(float))


def _recovered_text(fraction: float) -> str:
    return "n/a" if not math.isfinite(fraction) else f"{100 * fraction:.0f}%"


def tis_figure(ds: Dataset, runs, verdict: Verdict, style: str):
    """Per mismatched setting, a column: J against step (mean over seeds, band min–max; crosses at each run's
    collapse) of plain PPO and TIS under the mismatch and of the fp32 PPO run (the reference, in every column),
    and below it the Kaplan–Meier survival curves (the fraction of seeds not yet collapsed): a TIS curve to the
    right of PPO's is a delayed collapse, one that stays at 1 a prevented one. Where no run collapsed (every arm
    and setting), every curve would be a flat line at 1: the row is left out and the headline says so."""
    from matplotlib.lines import Line2D

    df = with_keys(ds, ds.metrics, correction="correction", seed="seed", **SETTING_KEYS)
    df["noise"] = df["noise"].astype(float)
    cols = setting_cols(runs)
    df["setting"] = [setting_label(r, cols) for _, r in df[cols].iterrows()]
    ref_mask = is_reference(runs)
    ref_setting = runs.loc[ref_mask, "setting"].iloc[0] if ref_mask.any() else None
    settings = list(dict.fromkeys(runs.loc[~ref_mask, "setting"]))
    names = list(ordered_presets(df["correction"].unique()))
    mc = runs["j_se"].notna().any()
    last = float(runs["steps"].max())
    survival = bool((runs["collapsed"] > 0).any())
    fig, axes = new_figure(len(settings), 2 if survival else 1, style, sharey="row")
    ref_j = df[(df["setting"] == ref_setting) & (df["correction"] == "none")] if ref_setting else df.iloc[:0]
    ref_runs = runs[ref_mask & (runs["correction"] == "none")]
    for c, setting in enumerate(settings):
        ax_j, ax_s = axes[0][c], (axes[1][c] if survival else None)
        arms = [("fp32", ref_j, ref_runs)] + [
            (
                name,
                df[(df["setting"] == setting) & (df["correction"] == name)],
                runs[(runs["setting"] == setting) & (runs["correction"] == name)],
            )
            for name in names
        ]
        for name, cur, fr in arms:
            color, ls = (st.FP32_GREY, "--") if name == "fp32" else (st.look(name).color, st.look(name).linestyle)
            ev = cur.dropna(subset=["objective"]).groupby(["job", "step"])["objective"].first().reset_index()
            agg = ev.groupby("step")["objective"].agg(["mean", "min", "max"])
            ax_j.plot(agg.index, agg["mean"], color=color, linestyle=ls, marker=".", markersize=3)
            ax_j.fill_between(agg.index, agg["min"], agg["max"], color=color, alpha=0.15, linewidth=0)
            for _, r in fr[fr["collapsed"] > 0].iterrows():
                if math.isfinite(r["collapse_step"]):
                    ax_j.plot([r["collapse_step"]], [r["peak"] * 0.7], marker="x", color=color, markersize=7)
            if len(fr) and survival:
                xs, ss = kaplan_meier(_times(fr), fr["collapsed"])
                ax_s.step(xs + [last], ss + [ss[-1]], where="post", color=color, linestyle=ls, linewidth=1.4)
        p = verdict.parts.get(setting, {})
        if p and style != "paper":  # a paper's narrow panels leave the numbers to the caption (VERDICTS.md)
            m, lo, hi, n = p["gap"]
            ax_j.text(
                0.97,
                0.04,
                f"gap J_fp32 − J_PPO (final, n = {n}):\n{sig(m, 2)}, 95% t CI [{sig(lo, 2)}, {sig(hi, 2)}]",
                transform=ax_j.transAxes,
                ha="right",
                va="bottom",
                fontsize="x-small",
            )
        if p and style != "paper" and survival:
            fell, n = p["collapsed"], p["n"]
            ax_s.text(
                0.03,
                0.06,
                f"collapsed: fp32 {fell['fp32']}/{n}, PPO {fell['ppo']}/{n}, TIS {fell['tis']}/{n}"
                + (f"\nlog-rank p = {sig(p['logrank'][1], 2)}" if math.isfinite(p["logrank"][1]) else ""),
                transform=ax_s.transAxes,
                ha="left",
                va="bottom",
                fontsize="x-small",
            )
        ax_j.set_title(f"engine {setting}" + (f"\n[{p['verdict']}]" if p else ""), fontsize="medium")
        (ax_s if survival else ax_j).set_xlabel("training step")
        if c == 0:
            ax_j.set_ylabel(r"objective $J(\theta)$" + (" (Monte Carlo)" if mc else " (exact)"))
        if survival:
            ax_s.set_ylim(-0.05, 1.05)
            if c == 0:
                ax_s.set_ylabel("runs not yet collapsed\n(Kaplan–Meier)")
    handles = [Line2D([], [], color=st.FP32_GREY, linestyle="--")] + [line_handle(n) for n in names]
    labels = ["plain PPO, fp32 engine (no mismatch)"] + [
        ("token TIS, min(ρ, 2)" if n == "tis" else "plain PPO" if n == "none" else n) for n in names
    ]
    if survival:
        handles.append(Line2D([], [], linestyle="none", marker="x", color="0.3"))
        labels.append("a run's collapse (at 70% of its peak J)")
    handles.append(Line2D([], [], color="0.5", linewidth=6, alpha=0.3))
    labels.append("band: min–max over seeds")
    legend_below(fig, handles, labels, style)
    seeds = runs["seed"].nunique()
    calm = "" if survival else f"No run collapsed in {seeds} seed{'s' if seeds != 1 else ''} (any arm or engine)."
    headline(fig, f"{TITLE} [{world_of(ds)} world]", SOURCE, verdict, style, note=calm)
    return fig


def evaluate(ds: Dataset, style: str):
    runs = tis_runs(ds)
    v = tis_verdict(runs)
    return v, tis_figure(ds, runs, v, style)
