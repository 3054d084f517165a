"""Claim 2: the bias–variance trade-off by level, token against sequence IS (Liu, Li et al. 2025).

The probe's bias and variance of each estimator against the response length T: token-IS bias grows with T,
seq-IS variance grows exponentially, and the truncated sequence-level presets sit in between. The bias is
split into its direction (the cosine of E ĝ to the reference gradient) and its size (‖E ĝ‖ / ‖∇J‖): a
shrunken gradient is not the same failure as a wrong one. The reference is the exact ∇J where the world has
one and a Monte Carlo estimate where it does not (probe.csv's `reference`; its own noise is in every CI), and
the statement names which. Read top to bottom: the reducer (probe rows), the rule (`level_verdict`), the
figure, `evaluate`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from analysis import style as st
from analysis.claims.figures import headline, legend_below, new_figure, ordered_presets
from analysis.claims.frames import required, with_keys, world_of
from analysis.claims.stats import EPS, FAILS, HOLDS, UNSURE, Verdict, all_of, pct, sig
from analysis.load import Dataset, fmt_value
from runner.errors import UserError

NAME = "bias-variance-by-level"  # = conf/experiment/WORLD/NAME.yaml and the figure's file name
TITLE = "2. The bias–variance trade-off by level (token / sequence IS)"
SOURCE = "Liu, Li et al. 2025, “When speed kills stability”"

GROWTH_MIN = 10.0  # (b): the seq-IS / token-IS variance ratio must rise at least 10× over the T range
ALIGNED = 0.9  # a mean estimate at cosine ≥ 0.9 to ∇J points the right way: its bias is mostly one of size


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
    for c in (
        "bias_norm",
        "bias_norm_lo",
        "bias_norm_hi",
        "variance",
        "exact_grad_norm",
        "mean_ess",
        "cosine",
        "norm_ratio",
        "mean_masked_fraction",
        "engine_kl",
        "reference_noise",
    ):
        if c in pr.columns:
            pr[c] = pr[c].astype(float)
    if "degenerate" not in pr.columns:
        pr["degenerate"] = 0
    if "reference" not in pr.columns:
        pr["reference"] = "exact"
    pr["seq_len"] = pr["seq_len"].astype(int)
    rollouts = {j.index: j.value("probe.reference_rollouts") for j in ds.jobs}
    pr["reference_rollouts"] = pr["job"].map(rollouts) if "job" in pr.columns else None
    return pr


def reference_text(pr) -> str:
    """Which gradient the bias is measured against: exact, or Monte Carlo (never called exact)."""
    refs = set(pr["reference"].astype(str))
    if refs <= {"exact"}:
        return "reference: the exact ∇J"
    n = pr["reference_rollouts"].dropna()
    noise = (pr["reference_noise"] / pr["exact_grad_norm"]).replace([np.inf], np.nan)
    return (
        f"reference: a Monte Carlo ∇J_MC ({int(n.iloc[0]) if len(n) else '?'} on-policy rollouts; its own error "
        f"≈ {_range(noise.min(), noise.max())} of its norm, added to every CI), an estimate of ∇J, not ∇J itself"
    )


def _range(lo: float, hi: float) -> str:
    return sig(lo, 2) if sig(lo, 2) == sig(hi, 2) else f"{sig(lo, 2)}–{sig(hi, 2)}"


def _r2(x, y) -> float:
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 3 or np.ptp(x) == 0:
        return math.nan
    coef = np.polyfit(x, y, 1)
    res = y - np.polyval(coef, x)
    tot = np.sum((y - y.mean()) ** 2)
    return float(1 - np.sum(res**2) / tot) if tot > 0 else 1.0


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
          token-is (its CI low end ≤ token-is's CI high end) and has no more variance than seq-is. Judged on the
          live cells only: an (arm, T) that probe.csv flags degenerate (≥ 90% of tokens masked, or a mean
          estimate under 10% of ‖∇J‖) estimates almost nothing, and its small variance would count for it; such
          cells are left out and named. Holds when every live cell is in between, does not hold when one is not
          (the statement lists where, and whether the extra bias is one of size, cos ≥ 0.9, or of direction),
          inconclusive when no cell is live.
    The statement also gives the reference (exact or Monte Carlo), the engine's measured per-token mismatch,
    and the bias split into direction (cosine) and size (norm ratio) at the smallest and largest T."""
    pr = probe.copy()
    for col, default in (
        ("cosine", math.nan),
        ("norm_ratio", math.nan),
        ("degenerate", 0),
        ("mean_masked_fraction", 0.0),
        ("reference", "exact"),
        ("reference_noise", 0.0),
        ("reference_rollouts", None),
    ):
        if col not in pr.columns:
            pr[col] = default
    present = set(pr["preset"])
    if not {TOKEN_IS, SEQ_IS} <= present:
        raise UserError(f"bias-variance-by-level: needs the {TOKEN_IS} and {SEQ_IS} arms, got {sorted(present)}")
    Ts = sorted(pr["seq_len"].unique())
    by = {(r.preset, int(r.seq_len)): r for r in pr.itertuples()}
    t0, t1 = Ts[0], Ts[-1]
    parts: dict[str, Any] = {"T": Ts}

    def rel(p, T, col="bias_norm"):  # NaN where the reference gradient is 0: nothing to be biased against
        r = by[(p, T)]
        return getattr(r, col) / r.exact_grad_norm if r.exact_grad_norm > 0 else math.nan

    # (a)
    lo1, hi0 = rel(TOKEN_IS, t1, "bias_norm_lo"), rel(TOKEN_IS, t0, "bias_norm_hi")
    hi1, lo0 = rel(TOKEN_IS, t1, "bias_norm_hi"), rel(TOKEN_IS, t0, "bias_norm_lo")
    va = UNSURE if len(Ts) < 2 else HOLDS if lo1 > hi0 else FAILS if hi1 < lo0 else UNSURE
    parts["a"] = va
    text_a = (
        f"(a) token-IS relative bias {sig(rel(TOKEN_IS, t0))} [{sig(lo0)}, {sig(hi0)}] at T={t0} → "
        f"{sig(rel(TOKEN_IS, t1))} [{sig(lo1)}, {sig(hi1)}] at T={t1}: {va}"
    )
    # A token-IS estimate that has shrunk to almost nothing has a relative bias near 1 for that reason alone:
    # (a) can then "hold" on a vanished gradient, not a misdirected one. The verdict stays as the rule says;
    # the text and the key name it.
    token_dead = [T for T in (t0, t1) if int(getattr(by[(TOKEN_IS, T)], "degenerate", 0) or 0)]
    parts["token_is_degenerate"] = token_dead
    if token_dead:
        text_a += (
            " (token-IS itself degenerate at T="
            + ", ".join(str(T) for T in token_dead)
            + ": its mean estimate is "
            + ", ".join(f"{sig(by[(TOKEN_IS, T)].norm_ratio, 2)} of ‖∇J‖" for T in token_dead)
            + ", so its relative bias there is mostly shrinkage toward 0)"
        )
    # (b)
    q = np.array(
        [
            by[(SEQ_IS, T)].variance / by[(TOKEN_IS, T)].variance if by[(TOKEN_IS, T)].variance > EPS else math.nan
            for T in Ts
        ]
    )
    growth = float(q[-1] / q[0]) if q[0] > 0 else math.nan
    ok = np.isfinite(q) & (q > 0)
    r2_exp = _r2(np.asarray(Ts)[ok], np.log(q[ok])) if ok.all() else math.nan
    r2_pow = _r2(np.log(np.asarray(Ts)[ok]), np.log(q[ok])) if ok.all() else math.nan
    if not math.isfinite(growth):
        vb = UNSURE  # a zero variance (no signal at some T): no ratio to grow
    elif growth < GROWTH_MIN:
        vb = FAILS
    elif math.isfinite(r2_exp) and math.isfinite(r2_pow) and r2_exp >= r2_pow:
        vb = HOLDS
    else:
        vb = UNSURE
    parts["b"] = vb
    parts["variance_ratio"] = dict(zip(Ts, q.tolist()))
    shape = f"; log-ratio fit R² {sig(r2_exp, 2)} in T vs {sig(r2_pow, 2)} in log T" if math.isfinite(r2_exp) else ""
    text_b = (
        f"(b) variance seq-IS/token-IS {sig(q[0])} at T={t0} → {sig(q[-1])} at T={t1} ({sig(growth)}×{shape}): {vb}"
    )
    # (c), on the cells where the arm is not degenerate (a band that rejects almost everything estimates ~0:
    # its variance is small for that reason alone, so "between" would reward it)
    fails: list[str] = []
    degenerate: list[str] = []
    judged = 0
    mids = [m for m in MIDDLE if m in present]
    for m in mids:
        dead = [T for T in Ts if int(getattr(by[(m, T)], "degenerate", 0) or 0)]
        if dead:
            worst = max(dead, key=lambda T: by[(m, T)].mean_masked_fraction)
            degenerate.append(
                f"{m} at {len(dead)}/{len(Ts)} T (T={_span(dead)}; rejects up to "
                f"{pct(by[(m, worst)].mean_masked_fraction)})"
            )
        live = [T for T in Ts if T not in dead]
        judged += len(live)
        biased = [T for T in live if by[(m, T)].bias_norm_lo > by[(TOKEN_IS, T)].bias_norm_hi]
        noisy = [T for T in live if by[(m, T)].variance > by[(SEQ_IS, T)].variance]
        if biased:
            tb = biased[-1]
            fails.append(
                f"{m} more biased than token-IS at {len(biased)}/{len(live)} live T (T={_span(biased)}; "
                f"{sig(rel(m, tb))} vs {sig(rel(TOKEN_IS, tb))} at T={tb}, {_failure(by[(m, tb)])})"
            )
        if noisy:
            fails.append(f"{m} noisier than seq-IS at {len(noisy)}/{len(live)} live T")
    vc = (FAILS if fails else HOLDS) if judged else UNSURE
    parts["c"] = vc
    parts["degenerate"] = degenerate
    text_c = (
        "(c) "
        + (
            "; ".join(fails)
            if fails
            else (f"{', '.join(mids)} between at every live T" if judged else "no live arm to judge")
        )
        + f": {vc}"
    )
    if degenerate:
        text_c += (
            " (left out as degenerate, probe.csv's flag: ≥ 90% of tokens masked or a mean estimate under "
            "10% of ‖∇J‖: " + "; ".join(degenerate) + ")"
        )
    # the bias split: direction (cosine) and size (norm ratio) at both ends of the T range
    split = []
    for m in [TOKEN_IS, *mids]:
        a0, a1 = by[(m, t0)], by[(m, t1)]
        split.append(
            f"{m} cos {sig(a0.cosine, 3)}→{sig(a1.cosine, 3)}, size {sig(a0.norm_ratio, 2)}→{sig(a1.norm_ratio, 2)}"
        )
        parts.setdefault("split", {})[m] = {T: (float(by[(m, T)].cosine), float(by[(m, T)].norm_ratio)) for T in Ts}
    g = "∇J" if set(pr["reference"].astype(str)) <= {"exact"} else "∇J_MC"
    text_d = f"bias split T={t0}→{t1} (direction: cosine of E ĝ to {g}; size: ‖E ĝ‖/‖{g}‖): " + "; ".join(split)
    kl = pr.groupby("seq_len")["engine_kl"].mean() if "engine_kl" in pr.columns else None
    world = (
        f"{reference_text(pr)}; the engine's measured mismatch {_range(kl.min(), kl.max())} nats per token "
        f"(probe.csv engine_kl), T × KL {_range(t0 * kl[t0], t1 * kl[t1])}"
        if kl is not None and kl.notna().all()
        else reference_text(pr)
    )
    flat = [T for T in Ts if not by[(TOKEN_IS, T)].exact_grad_norm > 0]
    if flat:
        world += f"; ‖∇J‖ = 0 at T={_span(flat)} (no reward signal there: nothing to estimate)"
    verdict = all_of([va, vb, vc])
    key = (
        f"token-IS rel. bias {sig(rel(TOKEN_IS, t0), 2)}→{sig(rel(TOKEN_IS, t1), 2)} (a {va}); var ratio "
        f"{sig(growth, 2)}× (b {vb}); (c) {vc}"
        + (f", {len(degenerate)} degenerate" if degenerate else "")
        + (f"; token-IS degenerate at T={', '.join(str(T) for T in token_dead)}" if token_dead else "")
    )
    return Verdict(verdict, f"{world}. {text_a}; {text_b}; {text_c}; {text_d}.", parts, key=key)


def _failure(row) -> str:
    """A biased arm's failure in words: shrunken (right direction, too short) or misdirected."""
    if not (math.isfinite(row.cosine) and math.isfinite(row.norm_ratio)):
        return "direction n/a"
    kind = "shrunken" if row.cosine >= ALIGNED else "misdirected"
    return f"{kind}: cos {sig(row.cosine, 2)}, size {sig(row.norm_ratio, 2)}"


def _span(Ts: Sequence[int]) -> str:
    return f"{Ts[0]}" if len(Ts) == 1 else f"{Ts[0]}…{Ts[-1]}"


def level_figure(pr, verdict: Verdict, style: str, world: str = ""):
    """Four panels against T: the relative bias (with its CI), the bias split into direction (cosine) and size
    (norm ratio), and the relative variance; a degenerate (arm, T) is drawn hollow."""
    from matplotlib.lines import Line2D

    fig, axes = new_figure(4, 1, style, panel=(3.2, 3.0))
    ax_b, ax_c, ax_n, ax_v = axes[0]
    names = [n for n in (TOKEN_IS, SEQ_IS, *MIDDLE) if n in set(pr["preset"])]
    names += [n for n in ordered_presets(pr["preset"].unique()) if n not in names]
    labels = {TOKEN_IS: "token-level IS ρ_t", SEQ_IS: "sequence-level IS ρ_seq"}
    handles, texts = [], []
    Ts = sorted(pr["seq_len"].unique())
    any_dead = False
    for name in names:
        cur = pr[pr["preset"] == name].sort_values("seq_len")
        lk = LEVEL_LOOKS.get(name) or st.look(name)
        g = cur["exact_grad_norm"]
        T = cur["seq_len"]
        dead = cur["degenerate"].fillna(0).astype(int).to_numpy() > 0
        any_dead |= bool(dead.any())
        kw = dict(color=lk.color, linestyle=lk.linestyle)
        # a variance of exactly 0 (every estimate 0: no sampled reward at that T) has no place on a log axis
        variance = (cur["variance"] / g**2).where(cur["variance"] > 0)
        for ax, y in ((ax_b, cur["bias_norm"] / g), (ax_c, cur["cosine"]), (ax_n, cur["norm_ratio"]), (ax_v, variance)):
            ax.plot(T, y, **kw)
            ax.scatter(T[~dead], y[~dead], color=lk.color, marker=lk.marker, s=16, zorder=3)
            ax.scatter(T[dead], y[dead], facecolors="white", edgecolors=lk.color, marker=lk.marker, s=22, zorder=3)
        ax_b.fill_between(T, cur["bias_norm_lo"] / g, cur["bias_norm_hi"] / g, color=lk.color, alpha=0.15, linewidth=0)
        handles.append(Line2D([], [], marker=lk.marker, markersize=4, **kw))
        band = ""
        if name not in (TOKEN_IS, SEQ_IS) and "high" in cur.columns:
            lo, hi = cur["low"].iloc[0], cur["high"].iloc[0]
            band = f" [{'—' if not np.isfinite(float(lo)) else fmt_value(float(lo))}, {fmt_value(float(hi))}]"
        texts.append(labels.get(name, name) + band)
    if any_dead:
        handles.append(Line2D([], [], linestyle="none", marker="o", markerfacecolor="white", markeredgecolor="0.3"))
        texts.append("hollow: degenerate (≥ 90% masked or ‖E ĝ‖ < 0.1 ‖∇J‖)")
    for ax in (ax_b, ax_c, ax_n, ax_v):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("response length T (tokens)")
        ax.set_xticks(Ts, [str(t) for t in Ts])
    mc = not set(pr["reference"].astype(str)) <= {"exact"}
    ref = r"\nabla J_{\mathrm{MC}}" if mc else r"\nabla J"
    ax_b.set_ylabel(rf"relative bias $\|\mathbb{{E}}\hat g - {ref}\| / \|{ref}\|$")
    ax_b.set_title("(a) bias (band: 95% CI" + (", incl. the reference's noise)" if mc else ")"), fontsize="medium")
    ax_c.set_ylabel(rf"direction: $\cos(\mathbb{{E}}\hat g, {ref})$")
    ax_c.axhline(ALIGNED, color="0.6", linestyle="--", linewidth=0.8)
    ax_c.set_title("(b) direction" if style == "paper" else "(b) direction of the mean estimate", fontsize="medium")
    ax_n.set_ylabel(rf"size: $\|\mathbb{{E}}\hat g\| / \|{ref}\|$")
    ax_n.axhline(1.0, color="0.6", linestyle="--", linewidth=0.8)
    ax_n.set_title("(c) size" if style == "paper" else "(c) size of the mean estimate", fontsize="medium")
    ax_v.set_yscale("log")
    ax_v.set_ylabel(rf"relative variance $\mathrm{{tr\,Cov}}(\hat g) / \|{ref}\|^2$")
    ax_v.set_title("(d) variance", fontsize="medium")
    legend_below(fig, handles, texts, style)
    headline(fig, TITLE + (f" [{world} world]" if world else ""), SOURCE, verdict, style)
    return fig


def evaluate(ds: Dataset, style: str):
    pr = level_frame(ds)
    v = level_verdict(pr)
    return v, level_figure(pr, v, style, world_of(ds))
