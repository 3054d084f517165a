"""Claim 3: the training–inference mismatch lives on low-probability tokens (Liu, Li et al. 2025).

Every logged token's |log p_train − log p_rollout|, in quintiles of p_train, per engine precision: the lowest
quintile must exceed every other. Read top to bottom: the reducer (one row per token), the bins, the rule
(`lowprob_verdict`), the figure, `evaluate`.
"""

from __future__ import annotations

import math

import numpy as np

from analysis import style as st
from analysis.claims.figures import headline, legend_below, new_figure
from analysis.claims.frames import required, with_keys, world_of
from analysis.claims.stats import EPS, FAILS, HOLDS, SIGMAS, UNSURE, Verdict, all_of, mean_se, plus_minus, sig
from analysis.load import Dataset
from runner.errors import UserError

NAME = "mismatch-low-prob-tokens"  # = conf/experiment/NAME.yaml and the figure's file name
TITLE = "3. The mismatch lives on low-probability tokens"
SOURCE = "Liu, Li et al. 2025, “When speed kills stability”"

QUANTILES = 5  # quintiles of p_train
OUTLIER_NATS = 50.0  # |Δ log p| beyond this is an injected fault, not precision


def token_frame(ds: Dataset):
    """Every logged token: precision, seed, p_train, abs_dlogp (|old − roll|), faults and exact zeros kept."""
    tok = required(ds.tokens, "tokens.csv", ds.path)
    tok = with_keys(ds, tok, precision="mismatch.precision", seed="seed")
    old, roll = tok["old"].astype(float), tok["roll"].astype(float)
    ok = np.isfinite(old) & np.isfinite(roll)
    tok = tok[ok].assign(p_train=np.exp(old[ok]), abs_dlogp=(old[ok] - roll[ok]).abs())
    return tok[tok["abs_dlogp"] <= OUTLIER_NATS][["precision", "seed", "p_train", "abs_dlogp"]]


def lowprob_bins(tok):
    """Per precision and quintile of p_train: bin, p_lo, p_hi, p_mid, mean, se, n."""
    import pandas as pd

    rows = []
    for prec, g in tok.groupby("precision", sort=False):
        bins = pd.qcut(g["p_train"], QUANTILES, labels=False, duplicates="drop")
        for b, cur in g.groupby(bins, sort=True):
            m, se, n = mean_se(cur["abs_dlogp"])
            rows.append({"precision": prec, "bin": int(b), "p_lo": float(cur["p_train"].min()),
                         "p_hi": float(cur["p_train"].max()), "p_mid": float(cur["p_train"].median()),
                         "mean": m, "se": se, "n": n})
    return pd.DataFrame(rows)


def lowprob_verdict(tok) -> Verdict:
    """Claim 3 (Liu, Li et al. 2025) on tokens (precision, p_train, abs_dlogp = |log p_train − log p_rollout|):
    per precision (fp32 left out: no mismatch), tokens in quintiles of p_train; m_b ± se_b the mean |Δ log p| of
    bin b. Holds when the lowest bin exceeds every other: m_1 − m_b > 2·√(se_1² + se_b²) for all b > 1; does not
    hold when some bin exceeds it by that much; else inconclusive. Over precisions: all_of."""
    tok = tok[tok["precision"].astype(str) != "fp32"]
    if tok.empty:
        raise UserError("mismatch-low-prob-tokens: no tokens from a mismatched engine (only fp32?)")
    bins = lowprob_bins(tok)
    verdicts, texts, parts = [], [], {}
    for prec, b in bins.groupby("precision", sort=False):
        b = b.sort_values("bin")
        low = b.iloc[0]
        rest = b.iloc[1:]
        z = (low["mean"] - rest["mean"]) / np.sqrt(low["se"] ** 2 + rest["se"] ** 2).clip(lower=EPS)
        if len(rest) == 0:
            v = UNSURE
        elif (z > SIGMAS).all():
            v = HOLDS
        elif (z < -SIGMAS).any():
            v = FAILS
        else:
            v = UNSURE
        verdicts.append(v)
        top = b.iloc[-1]
        ratio = low["mean"] / top["mean"] if top["mean"] > 0 else math.inf
        parts[str(prec)] = {"verdict": v, "means": b["mean"].tolist(), "ratio": ratio}
        texts.append(f"{prec}: mean |Δ log p| {plus_minus(low['mean'], low['se'])} in the lowest quintile "
                     f"(p_train < {_edge(low['p_hi'])}) vs {plus_minus(top['mean'], top['se'])} in the highest "
                     f"(p_train > {_edge(top['p_lo'])}), {sig(ratio, 2)}× [{v}]")
    n = len(tok)
    key = ", ".join(f"{prec} {sig(p['ratio'], 2)}×" for prec, p in parts.items()) + " (lowest/highest quintile)"
    return Verdict(all_of(verdicts), f"{n:,} sampled tokens; " + "; ".join(texts) + ".", parts, key=key)


def _edge(p: float) -> str:
    """A quintile's edge in p; near 1 as 1 − ε, since two digits would round a sharp policy's 0.99997 to 1."""
    return f"1 − {sig(1.0 - p, 2)}" if 0.99 < p < 1.0 else sig(p, 2)


def lowprob_figure(tok, verdict: Verdict, style: str, world: str = ""):
    from matplotlib.lines import Line2D

    fig, axes = new_figure(2, 1, style, panel=(4.4, 3.2))
    ax_b, ax_s = axes[0]
    mism = tok[tok["precision"].astype(str) != "fp32"]
    bins = lowprob_bins(mism)
    handles, labels = [], []
    rng = np.random.default_rng(0)
    floor = 1e-7
    found = list(dict.fromkeys(mism["precision"].astype(str)))
    precs = [p for p in ("bf16", "fp16", "fp8") if p in found] + [p for p in found if p not in ("bf16", "fp16", "fp8")]
    zeros = 0
    width = 0.8 / max(len(precs), 1)
    colors = st.dimension_colors("mismatch.precision", precs)  # each precision's colour in every figure
    for i, prec in enumerate(precs):
        color = colors[prec]
        b = bins[bins["precision"].astype(str) == prec].sort_values("bin")
        xs = b["bin"].to_numpy(float) + (i - (len(precs) - 1) / 2) * width * 0.5
        ax_b.errorbar(xs, b["mean"], yerr=SIGMAS * b["se"], color=color, marker="o", markersize=4.5, capsize=2.5)
        for x, (_, r) in zip(xs, b.iterrows()):
            ax_b.annotate(f"{sig(r['p_lo'], 2)}–{sig(r['p_hi'], 2)}", (x, r["mean"]), textcoords="offset points",
                          xytext=(0, 7 if i == 0 else -12), ha="center", fontsize="x-small", color=color)
        g = mism[mism["precision"].astype(str) == prec]
        idx = rng.choice(len(g), size=min(len(g), 4000), replace=False)
        smp = g.iloc[idx]
        zeros += int((smp["abs_dlogp"] == 0).sum())
        ax_s.scatter(smp["p_train"], smp["abs_dlogp"].clip(lower=floor), s=3, alpha=0.3, color=color, linewidths=0,
                     rasterized=True)
        handles.append(Line2D([], [], color=color, marker="o", markersize=4))
        # said once: three "vs fp32 trainer" labels overflowed the figure's width
        labels.append(f"{prec} engine ({len(g):,} tokens" + ("; the trainer is fp32)" if not labels else ")"))
    nb = int(bins["bin"].max()) + 1 if len(bins) else QUANTILES
    names = {0: "lowest", nb - 1: "highest"}
    ax_b.set_xticks(range(nb), [f"{b + 1}\n{names.get(b, '')}".rstrip() for b in range(nb)])
    ax_b.set_xlabel(r"quintile of the token's probability $p_{\mathrm{train}}$ (labels: its range of p)")
    ax_b.set_yscale("log")
    ax_b.set_ylabel(r"mean $|\log p_{\mathrm{train}} - \log p_{\mathrm{rollout}}|$ (nats)")
    ax_b.set_title("(a) mean per quintile of $p_{\\mathrm{train}}$ (± 2 SE)", fontsize="medium")
    ax_s.set_xscale("log")
    ax_s.set_yscale("log")
    ax_s.set_xlabel(r"token probability $p_{\mathrm{train}}$ (trainer, fp32)")
    ax_s.set_ylabel(r"$|\Delta \log p|$ of the token (nats)")
    if zeros:
        ax_s.text(0.02, 0.02, f"{zeros:,} exact match{'es' if zeros != 1 else ''} drawn at $10^{{-7}}$",
                  transform=ax_s.transAxes, fontsize="x-small", color="0.35")
    ax_s.set_title("(b) every token (4,000 sampled per precision)", fontsize="medium")
    lo, hi = ax_b.get_ylim()
    ax_b.set_ylim(lo / 1.35, hi * 1.35)  # room for the range labels
    ax_b.set_xlim(-0.5, nb - 0.5)
    legend_below(fig, handles, labels, style)
    headline(fig, TITLE + (f" [{world} world]" if world else ""), SOURCE, verdict, style)
    return fig


def evaluate(ds: Dataset, style: str):
    tok = token_frame(ds)
    v = lowprob_verdict(tok)
    return v, lowprob_figure(tok, v, style, world_of(ds))
