"""Claim 2: the bias–variance trade-off by level, token against sequence IS (Liu, Li et al. 2025).

The probe's exact bias and variance of each estimator against the response length T: token-IS bias grows
with T, seq-IS variance grows exponentially, and the truncated sequence-level presets sit in between. Read
top to bottom: the reducer (probe rows), the rule (`level_verdict`), the figure, `evaluate`.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from analysis import style as st
from analysis.claims.figures import headline, legend_below, new_figure, ordered_presets
from analysis.claims.frames import required, with_keys
from analysis.claims.stats import EPS, FAILS, HOLDS, UNSURE, Verdict, all_of, sig
from analysis.load import Dataset, fmt_value
from runner.errors import UserError

NAME = "bias-variance-by-level"  # = conf/experiment/NAME.yaml and the figure's file name
TITLE = "2. The bias–variance trade-off by level (token / sequence IS)"
SOURCE = "Liu, Li et al. 2025, “When speed kills stability”"

GROWTH_MIN = 10.0  # (b): the seq-IS / token-IS variance ratio must rise at least 10× over the T range


TOKEN_IS, SEQ_IS = "token-is", "seq-is"
MIDDLE = ("seq-tis", "seq-mis", "geo-mask")
# The two untruncated arms ship as no preset: black (the token level) and wine (the sequence level), clear of
# the shipped presets' colours in this figure (seq-tis blue, seq-mis vermillion, geo-mask purple).
LEVEL_LOOKS = {TOKEN_IS: st.Look("#000000", "-", "o"), SEQ_IS: st.Look("#882255", "-", "s")}


def level_frame(ds: Dataset):
    """probe rows with seq_len (from probe.csv's world columns, else the job's config)."""
    pr = required(ds.probe, "probe results (probe.csv)", ds.path).copy()
    if "seq_len" not in pr.columns:
        pr = with_keys(ds, pr, seq_len="rollout.seq_len")
    for c in ("bias_norm", "bias_norm_lo", "bias_norm_hi", "variance", "exact_grad_norm", "mean_ess"):
        if c in pr.columns:
            pr[c] = pr[c].astype(float)
    pr["seq_len"] = pr["seq_len"].astype(int)
    return pr


def _r2(x, y) -> float:
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 3 or np.ptp(x) == 0:
        return math.nan
    coef = np.polyfit(x, y, 1)
    res = y - np.polyval(coef, x)
    tot = np.sum((y - y.mean()) ** 2)
    return float(1 - np.sum(res ** 2) / tot) if tot > 0 else 1.0


def level_verdict(probe) -> Verdict:
    """Claim 2 (Liu, Li et al. 2025) on probe rows (preset, seq_len, bias_norm, bias_norm_lo, bias_norm_hi,
    variance, exact_grad_norm), all parts combined with all_of:
      (a) token-IS bias grows with T: relative bias = bias / ‖∇J‖ with the probe's CI; holds when the CI at the
          largest T lies above the CI at the smallest T; does not hold when it lies below; else inconclusive.
      (b) seq-IS variance grows exponentially in T: q(T) = variance(seq-is) / variance(token-is) (dividing out the
          polynomial growth both share). Does not hold when q(T_max) / q(T_min) < 10; holds when it is ≥ 10 and
          log q is fit at least as well (R²) by a line in T as by a line in log T; else inconclusive (fewer than
          3 lengths, or a power-law shape).
      (c) Seq-TIS / Seq-MIS / geometric masking sit in between: at every T each present one is no more biased than
          token-is (its CI low end ≤ token-is's CI high end) and has no more variance than seq-is. Holds when all
          do, else does not hold (the statement lists where it fails)."""
    pr = probe.copy()
    present = set(pr["preset"])
    if not {TOKEN_IS, SEQ_IS} <= present:
        raise UserError(f"bias-variance-by-level: needs the {TOKEN_IS} and {SEQ_IS} arms, got {sorted(present)}")
    Ts = sorted(pr["seq_len"].unique())
    by = {(r.preset, int(r.seq_len)): r for r in pr.itertuples()}
    t0, t1 = Ts[0], Ts[-1]
    parts: dict[str, Any] = {"T": Ts}

    def rel(p, T, col="bias_norm"):
        r = by[(p, T)]
        return getattr(r, col) / r.exact_grad_norm

    # (a)
    lo1, hi0 = rel(TOKEN_IS, t1, "bias_norm_lo"), rel(TOKEN_IS, t0, "bias_norm_hi")
    hi1, lo0 = rel(TOKEN_IS, t1, "bias_norm_hi"), rel(TOKEN_IS, t0, "bias_norm_lo")
    va = UNSURE if len(Ts) < 2 else HOLDS if lo1 > hi0 else FAILS if hi1 < lo0 else UNSURE
    parts["a"] = va
    text_a = (f"(a) token-IS relative bias {sig(rel(TOKEN_IS, t0))} [{sig(lo0)}, {sig(hi0)}] at T={t0} → "
              f"{sig(rel(TOKEN_IS, t1))} [{sig(lo1)}, {sig(hi1)}] at T={t1}: {va}")
    # (b)
    q = np.array([by[(SEQ_IS, T)].variance / max(by[(TOKEN_IS, T)].variance, EPS) for T in Ts])
    growth = float(q[-1] / max(q[0], EPS))
    r2_exp, r2_pow = _r2(Ts, np.log(q)), _r2(np.log(Ts), np.log(q))
    if growth < GROWTH_MIN:
        vb = FAILS
    elif math.isfinite(r2_exp) and math.isfinite(r2_pow) and r2_exp >= r2_pow:
        vb = HOLDS
    else:
        vb = UNSURE
    parts["b"] = vb
    parts["variance_ratio"] = dict(zip(Ts, q.tolist()))
    shape = (f"; log-ratio fit R² {sig(r2_exp, 2)} in T vs {sig(r2_pow, 2)} in log T"
             if math.isfinite(r2_exp) else "")
    text_b = (f"(b) variance seq-IS/token-IS {sig(q[0])} at T={t0} → {sig(q[-1])} at T={t1} "
              f"({sig(growth)}×{shape}): {vb}")
    # (c)
    fails: list[str] = []
    mids = [m for m in MIDDLE if m in present]
    for m in mids:
        biased = [T for T in Ts if by[(m, T)].bias_norm_lo > by[(TOKEN_IS, T)].bias_norm_hi]
        noisy = [T for T in Ts if by[(m, T)].variance > by[(SEQ_IS, T)].variance]
        if biased:
            fails.append(f"{m} more biased than token-IS at {len(biased)}/{len(Ts)} T (T={_span(biased)}, "
                         f"{sig(rel(m, t1))} vs {sig(rel(TOKEN_IS, t1))} at T={t1})")
        if noisy:
            fails.append(f"{m} noisier than seq-IS at {len(noisy)}/{len(Ts)} T")
    vc = (FAILS if fails else HOLDS) if mids else UNSURE
    parts["c"] = vc
    text_c = "(c) " + ("; ".join(fails) if fails else f"{', '.join(mids)} between at every T") + f": {vc}"
    verdict = all_of([va, vb, vc])
    return Verdict(verdict, f"{text_a}; {text_b}; {text_c}.", parts)


def _span(Ts: Sequence[int]) -> str:
    return f"{Ts[0]}" if len(Ts) == 1 else f"{Ts[0]}…{Ts[-1]}"


def level_figure(pr, verdict: Verdict, style: str):
    fig, axes = new_figure(3, 1, style, panel=(3.6, 3.1))
    ax_b, ax_v, ax_p = axes[0]
    names = [n for n in (TOKEN_IS, SEQ_IS, *MIDDLE) if n in set(pr["preset"])]
    names += [n for n in ordered_presets(pr["preset"].unique()) if n not in names]
    labels = {TOKEN_IS: "token-level IS ρ_t", SEQ_IS: "sequence-level IS ρ_seq"}
    handles, texts = [], []
    for name in names:
        cur = pr[pr["preset"] == name].sort_values("seq_len")
        lk = LEVEL_LOOKS.get(name) or st.look(name)
        g = cur["exact_grad_norm"]
        T = cur["seq_len"]
        kw = dict(color=lk.color, linestyle=lk.linestyle, marker=lk.marker, markersize=4)
        ax_b.plot(T, cur["bias_norm"] / g, **kw)
        ax_b.fill_between(T, cur["bias_norm_lo"] / g, cur["bias_norm_hi"] / g, color=lk.color, alpha=0.15,
                          linewidth=0)
        ax_v.plot(T, cur["variance"] / g ** 2, **kw)
        ax_p.plot(cur["bias_norm"] / g, cur["variance"] / g ** 2, **{**kw, "marker": None}, alpha=0.8)
        sizes = 8 + 40 * (np.log2(T) - np.log2(T.min()) + 1) / (np.log2(T.max()) - np.log2(T.min()) + 1)
        ax_p.scatter(cur["bias_norm"] / g, cur["variance"] / g ** 2, s=sizes, color=lk.color, marker=lk.marker,
                     zorder=3)
        from matplotlib.lines import Line2D

        handles.append(Line2D([], [], **kw))
        band = ""
        if name not in (TOKEN_IS, SEQ_IS) and "high" in cur.columns:
            lo, hi = cur["low"].iloc[0], cur["high"].iloc[0]
            band = f" [{'—' if not np.isfinite(float(lo)) else fmt_value(float(lo))}, {fmt_value(float(hi))}]"
        texts.append(labels.get(name, name) + band)
    for ax in (ax_b, ax_v):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("response length T (tokens)")
        Ts = sorted(pr["seq_len"].unique())
        ax.set_xticks(Ts, [str(t) for t in Ts])
    ax_b.set_ylabel(r"relative bias $\|\mathbb{E}\hat g - \nabla J\| / \|\nabla J\|$")
    ax_b.set_title("(a) bias (band: 95% CI)", fontsize="medium")
    ax_v.set_yscale("log")
    ax_v.set_ylabel(r"relative variance $\mathrm{tr\,Cov}(\hat g) / \|\nabla J\|^2$")
    ax_v.set_title("(b) variance", fontsize="medium")
    ax_p.set_xscale("log")
    ax_p.set_yscale("log")
    ax_p.set_xlabel("relative bias")
    ax_p.set_ylabel("relative variance")
    ax_p.set_title("(c) the trade-off plane (marker size: T)", fontsize="medium")
    legend_below(fig, handles, texts, style)
    headline(fig, TITLE, SOURCE, verdict, style)
    return fig


def evaluate(ds: Dataset, style: str):
    pr = level_frame(ds)
    v = level_verdict(pr)
    return v, level_figure(pr, v, style)
