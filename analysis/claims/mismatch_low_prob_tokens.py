"""Claim 3: the training–inference mismatch lives on low-probability tokens (Liu, Li et al. 2025).

Every logged token's |log p_train − log p_rollout|, in absolute bins of p_train (log-spaced towards both
ends), late in training, per engine precision: the lowest populated bin must carry clearly more mismatch
than the tokens the policy favours (p ≥ 0.5). The bins are fixed, not quantiles pooled over the run: the mismatch grows with training
(the per-step mean |Δ log p| rises tens of times from step 0, where θ₀ is near-uniform), so pooled quantiles
would fill the low bins with early, small-mismatch tokens. Read top to bottom: the reducer (one row per
token), the bins, the rule (`lowprob_verdict`), the figure, `evaluate`.
"""

from __future__ import annotations

import math

import numpy as np

from analysis import style as st
from analysis.claims.figures import headline, legend_below, new_figure
from analysis.claims.frames import required, with_keys, world_of
from analysis.claims.stats import EPS, FAILS, HOLDS, SIGMAS, UNSURE, UNTESTABLE, Verdict, all_of, mean_se, pct, sig
from analysis.load import Dataset
from runner.errors import UserError

NAME = "mismatch-low-prob-tokens"  # = conf/experiment/WORLD/NAME.yaml and the figure's file name
TITLE = "3. The mismatch lives on low-probability tokens"
SOURCE = "Liu, Li et al. 2025, “When speed kills stability”"

# The bins of p_train: decades towards 0, and towards 1 in 1 − p (a logit scale), the same in every step.
EDGES = (0.0, 1e-3, 1e-2, 0.1, 0.5, 0.9, 0.99, 0.999, 1.0)
BIN_NAMES = ("< 0.001", "0.001–0.01", "0.01–0.1", "0.1–0.5", "0.5–0.9", "0.9–0.99", "0.99–0.999", "≥ 0.999")
LATE_FROM = 0.5  # the verdict reads the logged steps from half the last logged step on
MIN_TOKENS = 30  # a bin with fewer tokens in that window is drawn (hollow) but not judged
HIGH_FROM = 0.5  # the high-probability tokens the low end is compared with: the bins from p = 0.5 on
CONCENTRATION = 2.0  # "lives on": the lowest bin's mean at least 2× every high-probability bin's
OUTLIER_NATS = 50.0  # |Δ log p| beyond this is an injected fault, not precision


def token_frame(ds: Dataset):
    """Every logged token: precision, seed, step, p_train, abs_dlogp (|old − roll|), exact zeros kept."""
    tok = required(ds.tokens, "tokens.csv", ds.path)
    tok = with_keys(ds, tok, precision="mismatch.precision", seed="seed")
    old, roll = tok["old"].astype(float), tok["roll"].astype(float)
    ok = np.isfinite(old) & np.isfinite(roll)
    tok = tok[ok].assign(p_train=np.exp(old[ok]), abs_dlogp=(old[ok] - roll[ok]).abs())
    return tok[tok["abs_dlogp"] <= OUTLIER_NATS][["precision", "seed", "step", "p_train", "abs_dlogp"]]


def bin_of(p):
    """The EDGES bin of each p_train: [EDGES[i], EDGES[i+1]), with p = 1 in the last bin."""
    idx = np.searchsorted(np.asarray(EDGES), np.asarray(p, dtype=float), side="right") - 1
    return np.clip(idx, 0, len(EDGES) - 2)


def late_window(tok):
    """The tokens of the logged steps from LATE_FROM × the last logged step on (the whole run if one step)."""
    return tok[tok["step"] >= LATE_FROM * tok["step"].max()]


def lowprob_bins(tok, by=("precision",)):
    """Per group (`by`) and bin of p_train: bin, name, mean, se (token-level), n, share (n over the group's
    tokens) and judged (n ≥ MIN_TOKENS)."""
    import pandas as pd

    tok = tok.assign(bin=bin_of(tok["p_train"]))
    rows = []
    for key, g in tok.groupby(list(by), sort=False):
        key = key if isinstance(key, tuple) else (key,)
        total = len(g)
        for b, cur in g.groupby("bin", sort=True):
            m, se, n = mean_se(cur["abs_dlogp"])
            rows.append(
                {
                    **dict(zip(by, key)),
                    "bin": int(b),
                    "name": BIN_NAMES[int(b)],
                    "mean": m,
                    "se": se,
                    "n": n,
                    "share": n / total,
                    "judged": n >= MIN_TOKENS,
                }
            )
    return pd.DataFrame(rows, columns=[*by, "bin", "name", "mean", "se", "n", "share", "judged"])


def _log_ratio(m1, s1, m2, s2) -> tuple[float, float]:
    """log(m1 / m2) and its SE by the delta method (a zero mean is taken as EPS)."""
    m1, m2 = max(m1, EPS), max(m2, EPS)
    return math.log(m1 / m2), math.sqrt((s1 / m1) ** 2 + (s2 / m2) ** 2)


def shape_of(b) -> str:
    """The curve's shape in words, over the judged bins in p order: falling, rising, U (a minimum inside that
    the bins on both sides exceed by more than 2 SE), or flat / mixed."""
    b = b[b["judged"]].sort_values("bin")
    if len(b) < 2:
        return "no shape (under 2 bins with 30 tokens)"
    m, se = b["mean"].to_numpy(float), np.nan_to_num(b["se"].to_numpy(float))
    i = int(np.argmin(m))

    def above(j: int) -> bool:
        return m[j] - m[i] > SIGMAS * math.hypot(se[j], se[i])

    left, right = any(above(j) for j in range(i)), any(above(j) for j in range(i + 1, len(m)))
    lo_name, names = b["name"].iloc[i], b["name"].tolist()
    if left and right:
        return f"U-shaped (lowest at p {lo_name}, rising again to {sig(m[-1], 2)} at p {names[-1]})"
    if left:
        return "falling with p"
    if right:
        return "rising with p"
    return "flat within 2 SE"


def lowprob_verdict(tok) -> Verdict:
    """Claim 3 (Liu, Li et al. 2025) on tokens (precision, step, p_train, abs_dlogp = |log p_train −
    log p_rollout|): per precision (fp32 left out: no mismatch), the tokens of the late window (logged steps
    from half the last logged step on) in the fixed bins EDGES of p_train; m_b ± se_b the mean |Δ log p| of bin
    b (token-level SE), judged where the bin has ≥ 30 tokens. L = the lowest judged bin, H = the judged bins
    from p = 0.5 on (the tokens the policy favours); for every b in H, r_b = log(m_L / m_b) ± its delta-method
    SE s_b. Holds when r_b − 2 s_b > 0 and r_b ≥ log 2 for every b in H (the low end carries significantly
    more, and at least 2×); does not hold when r_b + 2 s_b < log 2 for some b in H (2× concentration ruled out
    against that bin); else inconclusive. "Untestable here" where no judged bin lies below p = 0.5 (the world
    samples too few low-probability tokens) or none from 0.5 on. The bins between L and H are drawn and
    stated, not judged: a smooth fall over neighbouring low bins is the claim, not against it. A U shape (the
    curve rises again towards p = 1: bf16's error grows with the logit) is judged by the same comparison: it
    holds only if its high end stays below half the low end's mismatch, and the statement names the shape.
    Over precisions: "does not hold" if any precision does not hold, else "untestable here" if any is, else
    all_of."""
    tok = tok[tok["precision"].astype(str) != "fp32"]
    if tok.empty:
        raise UserError("mismatch-low-prob-tokens: no tokens from a mismatched engine (only fp32?)")
    late = late_window(tok)
    bins = lowprob_bins(late)
    margin = math.log(CONCENTRATION)
    verdicts, texts, parts = [], [], {}
    for prec, b in bins.groupby("precision", sort=False):
        b = b.sort_values("bin")
        judged = b[b["judged"]]
        high = judged[judged["bin"] >= EDGES.index(HIGH_FROM)]
        if len(judged) == len(high) or high.empty:
            v, ratios = UNTESTABLE, []
        else:
            low = judged.iloc[0]
            ratios = [(r["name"], *_log_ratio(low["mean"], low["se"], r["mean"], r["se"])) for _, r in high.iterrows()]
            if all(r - SIGMAS * s > 0 and r >= margin for _, r, s in ratios):
                v = HOLDS
            elif any(r + SIGMAS * s < margin for _, r, s in ratios):
                v = FAILS
            else:
                v = UNSURE
        verdicts.append(v)
        shape = shape_of(b)
        closest = min(ratios, key=lambda x: x[1]) if ratios else None
        parts[str(prec)] = {
            "verdict": v,
            "bins": b[["name", "mean", "se", "n", "share"]].to_dict("records"),
            "shape": shape,
            "closest": closest,
        }
        mass = (b["mean"] * b["n"]).to_numpy(float)
        curve = ", ".join(f"{r['name']}: {sig(r['mean'], 2)} ({pct(r['share'])})" for _, r in b.iterrows())
        if closest is not None:
            low = judged.iloc[0]
            held = pct(mass[b["bin"] == low["bin"]].sum() / mass.sum())
            lead = (
                f"lowest judged bin p {low['name']} {sig(low['mean'], 2)} ± {sig(low['se'], 2)}, "
                f"{sig(math.exp(closest[1]), 2)}× the closest bin from p = {HIGH_FROM:g} on (p {closest[0]}); "
                f"it holds {pct(low['share'])} of the tokens and {held} of the summed |Δ log p|"
            )
        else:
            lead = (
                f"no judged bin (≥ {MIN_TOKENS} tokens) below p = {HIGH_FROM:g}"
                if len(judged) == len(high)
                else f"no judged bin from p = {HIGH_FROM:g} on"
            )
        texts.append(
            f"{prec}: {shape}; {lead + '; ' if lead else ''}mean |Δ log p| (share of tokens) per bin: {curve} [{v}]"
        )
    steps = sorted(late["step"].unique())
    rise = ""
    per_step = tok.groupby(["precision", "step"])["abs_dlogp"].mean()
    for prec in dict.fromkeys(tok["precision"]):
        s = per_step.loc[prec]
        if len(s) > 1 and s.iloc[0] > 0:
            rise += f"{'; ' if rise else ''}{prec} {sig(s.iloc[-1] / s.iloc[0])}×"
    window = f"logged steps {steps[0]}–{steps[-1]}" if len(steps) > 1 else f"logged step {steps[0]}"
    statement = (
        f"{len(late):,} sampled tokens in the late window ({window}, of {len(tok):,} logged)"
        + (f"; the per-step mean |Δ log p| from the first to the last logged step: {rise}" if rise else "")
        + "; "
        + "; ".join(texts)
        + "."
    )
    key = "; ".join(
        f"{prec} {p['shape'].split(' (')[0]}, lowest bin {sig(math.exp(p['closest'][1]), 2)}× the "
        f"closest bin at p ≥ {HIGH_FROM:g}"
        if p["closest"]
        else f"{prec} untestable (too few bins)"
        for prec, p in parts.items()
    )
    verdict = FAILS if FAILS in verdicts else UNTESTABLE if UNTESTABLE in verdicts else all_of(verdicts)
    return Verdict(verdict, statement, parts, key=key + " (late window, fixed bins of p)")


def lowprob_figure(tok, verdict: Verdict, style: str, world: str = ""):
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    fig, axes = new_figure(3, 1, style, panel=(4.0, 3.2))
    ax_b, ax_n, ax_t = axes[0]
    mism = tok[tok["precision"].astype(str) != "fp32"]
    late = late_window(mism)
    bins = lowprob_bins(late)
    found = list(dict.fromkeys(mism["precision"].astype(str)))
    precs = [p for p in ("bf16", "fp16", "fp8") if p in found] + [p for p in found if p not in ("bf16", "fp16", "fp8")]
    colors = st.dimension_colors("mismatch.precision", precs)  # each precision's colour in every figure
    nb = len(BIN_NAMES)
    width = 0.8 / max(len(precs), 1)
    handles, labels = [], []
    for i, prec in enumerate(precs):
        color = colors[prec]
        b = bins[bins["precision"].astype(str) == prec].sort_values("bin")
        off = (i - (len(precs) - 1) / 2) * width
        xs = b["bin"].to_numpy(float) + off * 0.5
        ax_b.plot(xs, b["mean"].where(b["mean"] > 0), color=color, linewidth=1.0)
        for x, (_, r) in zip(xs, b.iterrows()):
            if r["mean"] <= 0:
                continue
            ax_b.errorbar(
                [x],
                [r["mean"]],
                yerr=[[min(SIGMAS * np.nan_to_num(r["se"]), 0.9 * r["mean"])], [SIGMAS * np.nan_to_num(r["se"])]],
                color=color,
                marker="o",
                markersize=4.5,
                capsize=2.5,
                markerfacecolor=color if r["judged"] else "white",
            )
        ax_n.bar(b["bin"].to_numpy(float) + off, b["share"], width=width, color=color)
        handles.append(Line2D([], [], color=color, marker="o", markersize=4))
        n = int((late["precision"].astype(str) == prec).sum())
        labels.append(f"{prec} engine ({n:,} late tokens" + ("; the trainer is fp32)" if not labels else ")"))
    handles.append(Line2D([], [], color="0.3", marker="o", markersize=4.5, markerfacecolor="white", linestyle="none"))
    labels.append(f"bin with < {MIN_TOKENS} tokens (not judged)")
    steps = sorted(late["step"].unique())
    window = f"steps {steps[0]}–{steps[-1]}" if len(steps) > 1 else f"step {steps[0]}"
    for ax in (ax_b, ax_n, ax_t):
        ax.set_xticks(range(nb), BIN_NAMES, rotation=45, ha="right", rotation_mode="anchor")
        ax.set_xlim(-0.5, nb - 0.5)
        ax.set_xlabel(r"token probability $p_{\mathrm{train}}$ (trainer, fp32)")
    # the bins the lowest one is compared with, named in the legend: a label inside the band sat on the points
    ax_b.axvspan(EDGES.index(HIGH_FROM) - 0.5, nb - 0.5, color="0.93", zorder=0, linewidth=0)
    handles.append(Patch(facecolor="0.93", edgecolor="0.75", linewidth=0.5))
    labels.append(f"(a) bins compared with the lowest judged bin (p ≥ {HIGH_FROM:g})")
    ax_b.set_yscale("log")
    ax_b.set_ylabel(r"mean $|\log p_{\mathrm{train}} - \log p_{\mathrm{rollout}}|$ (nats)")
    # two lines: a window of long steps (150–275) ran this title into its neighbour's in the paper style
    ax_b.set_title(f"(a) mean per bin, late window\n({window}; ± 2 SE)", fontsize="medium")
    ax_n.set_ylabel("share of the sampled tokens")
    ax_n.set_title("(b) where the sampled tokens are (late window)", fontsize="medium")
    # (c) the first precision's curve at every logged step: the level rises with training, so bins must be
    # compared within a step (or a late window), never pooled over the run
    main = precs[0] if precs else None
    if main is not None:
        per = lowprob_bins(mism[mism["precision"].astype(str) == main], by=("step",))
        all_steps = sorted(per["step"].unique())
        norm = Normalize(vmin=min(all_steps), vmax=max(max(all_steps), min(all_steps) + 1))
        cmap = colormaps["viridis"]
        for step in all_steps:
            cur = per[(per["step"] == step) & (per["mean"] > 0)].sort_values("bin")
            ax_t.plot(
                cur["bin"], cur["mean"], color=cmap(norm(step)), marker="o", markersize=3, linewidth=1.0, alpha=0.9
            )
        bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax_t, pad=0.02)
        bar.set_label("training step")
        bar.locator = MaxNLocator(integer=True)
        bar.update_ticks()
        ax_t.set_yscale("log")
        ax_t.set_ylabel(r"mean $|\Delta \log p|$ (nats)")
        ax_t.set_title(f"(c) {main}: the same bins at every logged step", fontsize="medium")
    legend_below(fig, handles, labels, style)
    headline(fig, TITLE + (f" [{world} world]" if world else ""), SOURCE, verdict, style)
    return fig


def evaluate(ds: Dataset, style: str):
    tok = token_frame(ds)
    v = lowprob_verdict(tok)
    return v, lowprob_figure(tok, v, style, world_of(ds))
