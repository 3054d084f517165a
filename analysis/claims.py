"""The literature's claims, checked on the shipped experiments (conf/experiment/<name>.yaml): a verdict and a
figure per claim. `scripts/figures.sh` runs the experiments and then this module.

    python -m analysis.claims multirun/figures/tis-tames-mismatch --claim tis-tames-mismatch --out figures
    python -m analysis.claims --all multirun/figures --out figures     # every claim, and figures/VERDICTS.md

Each claim is three pieces:
  - a *rule*: a pure function of a small tidy DataFrame (one row per run, per probe arm or per token) that returns
    a `Verdict` ("holds" | "does not hold" | "inconclusive", a one-line statement with the numbers, and the numbers
    themselves in `parts`). The rules were fixed before the experiments ran; each is written out in its docstring
    and in the experiment's header, and the tests pin each one on hand-made frames.
  - a *reducer* from the experiment's output dir (via `analysis.load_dataset`) to that frame;
  - a *figure* (a matplotlib Figure, no pyplot), in the colours of `analysis.style`.
`<claim>(path, style)` — e.g. `tis_tames_mismatch(path)` — does all three and returns (verdict, statement, figure).

Shared statistics: the unit of replication is the seed, and runs that share a seed are paired (same prompts, same
random stream). mean ± SE with SE = sd / √n (sd with n − 1); `effect(d, margin)` is the test every training claim
uses on paired differences d: "holds" when mean − 2 SE > 0 and mean ≥ margin (significant and large enough to
matter), "does not hold" when mean + 2 SE < margin (an effect of the claimed size is ruled out), else
"inconclusive". Parts of a claim combine with `all_of` (every part must hold; any part that does not hold sinks
the claim) or `any_of` (for claims that are existential, e.g. "under a bf16 OR a noise mismatch").

Nothing here tunes a world: a claim the synthetic world does not reproduce is reported as such.
"""

from __future__ import annotations

import argparse
import math
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from analysis import style as st
from analysis.load import Dataset, fmt_value, load_dataset
from runner.errors import UserError

HOLDS, FAILS, UNSURE = "holds", "does not hold", "inconclusive"
VERDICTS = (HOLDS, FAILS, UNSURE)
SIGMAS = 2.0  # "significant" = beyond 2 standard errors

# Thresholds of the rules (each named in the rule's docstring and the experiment header).
SPIKE_FACTOR = 5.0  # a grad-norm spike: above 5× the median of the trailing window (as analysis.plots)
SPIKE_WINDOW = 20
SPIKE_MARGIN = 1.0  # spikes per run: a smaller reduction is no reduction
J_MARGIN = 0.01  # of the exact objective J ∈ [0, 1]
FINAL_FRACTION = 0.25  # the "final objective" is the mean J over the last quarter of the updates
GROWTH_MIN = 10.0  # claim 2(b): seq-IS / token-IS variance ratio must rise at least 10× over the T range
QUANTILES = 5  # claim 3: quintiles of p_train
OUTLIER_NATS = 50.0  # claim 3: |Δ log p| beyond this is an injected fault, not precision
CLOSER_MARGIN = math.log(2.0)  # claim 4(a): fp16 at least 2× closer to fp32 than bf16
SHRINK_MARGIN = math.log(1.25)  # claim 4(b): the spread across corrections at least 1.25× smaller
BROKEN_RATE = 0.5  # claim 5: broken at k when at least half of the seeds collapsed or had a NaN/inf update
ESS_DROP = 0.05  # claim 5(b): ESS one rung before the break at least 0.05 below its k = 0 value
SHORTFALL = 0.05  # claim 6: the fixed preset's final J at most 0.05 below plain PPO's
EPS = 1e-12


# ----------------------------------------------------------------------------------------- verdicts
@dataclass
class Verdict:
    verdict: str
    statement: str
    parts: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        assert self.verdict in VERDICTS, self.verdict


@dataclass(frozen=True)
class Claim:
    name: str  # = the experiment's name (conf/experiment/NAME.yaml) and the figure's file name
    title: str
    source: str
    evaluate: Callable[[Dataset, str], tuple[Verdict, Any]]


def mean_se(values) -> tuple[float, float, int]:
    """(mean, standard error, n) of the finite values; SE is NaN with fewer than 2."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    n = len(x)
    if n == 0:
        return math.nan, math.nan, 0
    se = float(np.std(x, ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    return float(np.mean(x)), se, n


def effect(diffs, margin: float) -> str:
    """Paired differences (positive = the claimed direction) against a practical margin; see the module doc."""
    m, se, n = mean_se(diffs)
    if n < 2 or not math.isfinite(se):
        return UNSURE
    if m - SIGMAS * se > 0 and m >= margin:
        return HOLDS
    if m + SIGMAS * se < margin:
        return FAILS
    return UNSURE


def all_of(verdicts: Sequence[str]) -> str:
    if any(v == FAILS for v in verdicts):
        return FAILS
    return HOLDS if verdicts and all(v == HOLDS for v in verdicts) else UNSURE


def any_of(verdicts: Sequence[str]) -> str:
    if any(v == HOLDS for v in verdicts):
        return HOLDS
    return FAILS if verdicts and all(v == FAILS for v in verdicts) else UNSURE


def _g(v: float, digits: int = 3) -> str:
    """A number for a statement: 3 significant digits, no exponent noise for ordinary sizes."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "∞" if v == math.inf else ("nan" if v is None or math.isnan(v) else "−∞")
    v = float(v)
    if v == 0:
        return "0"
    if 1e-3 <= abs(v) < 1e4:
        return f"{v:.{digits}g}"
    return f"{v:.{max(digits - 1, 1)}e}".replace("e-0", "e-").replace("e+0", "e")


def _num(v: Any) -> float:
    """A number from summary.json / a CSV cell: None, "" and unparsable values are NaN."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _pm(m: float, se: float) -> str:
    return f"{_g(m)} ± {_g(se, 2)}" if math.isfinite(se) else _g(m)


# ----------------------------------------------------------------------------------------- loading helpers
def _job_map(ds: Dataset, key: str) -> dict[int, Any]:
    """job -> the value of an override key or dotted config key (a group gives its name)."""
    return {j.index: j.value(key) for j in ds.jobs}


def _with_keys(ds: Dataset, df, **keys: str):
    """Add columns (name=key) from each job's override/config value, replacing any column of that name."""
    df = df.copy()
    for col, key in keys.items():
        df[col] = df["job"].map(_job_map(ds, key))
    return df


def _need(frame, what: str, path: Any):
    if frame is None or len(frame) == 0:
        raise UserError(f"{path}: no {what} here; run the experiment first (scripts/figures.sh)")
    return frame


def _t_index(df):
    """A global update index per job: step × updates_per_step + update."""
    per = int(df["update"].max()) + 1 if "update" in df.columns else 1
    return df["step"].astype(int) * per + (df["update"].astype(int) if "update" in df.columns else 0)


def spikes_of(grad_norm) -> int:
    """Grad-norm spikes of one run, in update order: updates above SPIKE_FACTOR × the median of the previous
    SPIKE_WINDOW positive finite norms (at least 3 of them), plus every NaN/inf norm."""
    import pandas as pd

    g = pd.Series(np.asarray(grad_norm, dtype=float))
    bad = ~np.isfinite(g)
    gn = g.where(np.isfinite(g) & (g > 0))
    ref = gn.shift(1).rolling(SPIKE_WINDOW, min_periods=3).median()
    spike = (gn > SPIKE_FACTOR * ref) & (ref > 0)
    return int(spike.sum() + bad.sum())


def drawdown_of(objective) -> float:
    """The worst fall of J below its running best (0 for a run that never goes down)."""
    j = np.asarray(objective, dtype=float)
    j = j[np.isfinite(j)]
    if len(j) == 0:
        return math.nan
    return float(np.max(np.maximum.accumulate(j) - j))


def final_of(objective) -> float:
    j = np.asarray(objective, dtype=float)
    j = j[np.isfinite(j)]
    if len(j) == 0:
        return math.nan
    k = max(1, int(math.ceil(len(j) * FINAL_FRACTION)))
    return float(np.mean(j[-k:]))


# ----------------------------------------------------------------------------------------- figure helpers


def _figure(ncols: int, nrows: int = 1, style: str = "default", panel: tuple[float, float] | None = None,
            sharey: bool | str = False):
    """Panels plus room for the headline (top) and the legend (bottom)."""
    from matplotlib.figure import Figure

    if style == "paper":  # two columns of a two-column paper; the verdict's numbers belong in the caption
        width = st.PAPER_WIDTH * (2 if ncols > 1 else 1) + 0.2
        fig = Figure(figsize=(width, 2.0 * nrows + 0.9), layout="constrained")
    else:
        w, h = panel or (3.9, 3.0)
        fig = Figure(figsize=(w * ncols + 0.4, h * nrows + 1.7), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=sharey)
    return fig, axes


def _headline(fig, claim: Claim, verdict: Verdict, style: str) -> None:
    """Title: the claim and its source; then the verdict with its numbers, wrapped to the figure's width."""
    paper = style == "paper"
    width = fig.get_figwidth()
    if paper:  # one line: the claim and the verdict; the numbers go in the caption (VERDICTS.md)
        fig.suptitle(f"{claim.title}: {verdict.verdict}", x=0.01, ha="left", fontsize=8)
        for ax in fig.axes:
            ax.title.set_fontsize(7)
            ax.xaxis.label.set_fontsize(7)
            ax.yaxis.label.set_fontsize(7)
        return
    chars = max(int(width * 13.5), 50)
    head = textwrap.fill(f"{claim.title} ({claim.source})", chars, break_on_hyphens=False)
    body = textwrap.fill(f"Verdict: {verdict.verdict.upper()}. {verdict.statement}", chars, break_on_hyphens=False)
    fig.suptitle(f"{head}\n{body}", x=0.01, ha="left", fontsize=9.5)


def _legend(fig, handles, labels, style: str, ncol: int | None = None) -> None:
    """One legend under the panels, so the headline above can use the figure's whole width."""
    if not handles:
        return
    most = 3 if style == "paper" else 5
    fig.legend(handles, labels, loc="outside lower center", ncol=ncol or min(len(labels), most),
               handlelength=2.6, columnspacing=1.6)


def _line_handle(name: str, marker: bool = False):
    from matplotlib.lines import Line2D

    lk = st.look(name)
    return Line2D([], [], color=lk.color, linestyle=lk.linestyle, marker=lk.marker if marker else None,
                  markersize=4 if marker else None)


def _ordered(names) -> list[str]:
    return sorted({str(n) for n in names}, key=st.preset_rank)


# ======================================================================================== 1. TIS tames mismatch
_ARM_NAMES = {"none": "plain PPO", "tis": "token TIS"}


def tis_runs(ds: Dataset):
    """One row per run: world (the logit noise σ, and the precision when several), correction, seed, spikes,
    j_final, drawdown, max_grad_norm."""
    import pandas as pd

    df = _need(ds.metrics, "training metrics (sweep.csv)", ds.path)
    df = _with_keys(ds, df, noise="mismatch.logit_noise", prec="mismatch.precision", correction="correction",
                    seed="seed")
    df = df.assign(_t=_t_index(df)).sort_values(["job", "_t"])
    rows = []
    several_prec = df["prec"].nunique() > 1
    for job, g in df.groupby("job", sort=True):
        noise, prec = g["noise"].iloc[0], g["prec"].iloc[0]
        world = f"σ={fmt_value(float(noise))}" + (f" {prec}" if several_prec else "")
        rows.append({"job": job, "world": world, "noise": float(noise), "precision": prec,
                     "correction": str(g["correction"].iloc[0]), "seed": int(g["seed"].iloc[0]),
                     "spikes": spikes_of(g["grad_norm"]), "j_final": final_of(g["objective"]),
                     "drawdown": drawdown_of(g["objective"]),
                     "max_grad_norm": float(np.nanmax(g["grad_norm"].where(np.isfinite(g["grad_norm"]))))})
    return pd.DataFrame(rows).sort_values(["noise", "precision", "correction", "seed"]).reset_index(drop=True)


def tis_verdict(runs, baseline: str = "none") -> Verdict:
    """Claim 1 (Yao et al. 2025), per world (a mismatch setting), paired over seeds between plain PPO
    (`baseline`) and token TIS (the one other correction):
      spikes:    d = spikes_PPO − spikes_TIS per run; effect(d, margin 1 spike per run)
      objective: effect(J_final,TIS − J_final,PPO, 0.01) or effect(drawdown_PPO − drawdown_TIS, 0.01), combined
                 with any_of ("a worse OR unstable objective")
    A world's verdict is all_of(spikes, objective): TIS must reduce both. The claim is existential over the
    worlds ("a bf16 OR a noise mismatch"): any_of over worlds.
    `runs`: world, correction, seed, spikes, j_final, drawdown (tis_runs)."""
    others = sorted(set(runs["correction"]) - {baseline})
    if baseline not in set(runs["correction"]) or len(others) != 1:
        raise UserError(f"tis-tames-mismatch: needs runs of {baseline!r} and exactly one correction to compare, "
                        f"got {sorted(set(runs['correction']))}")
    treat = others[0]
    worlds, texts, parts = [], [], {}
    for world, w in runs.groupby("world", sort=False):
        a = w[w["correction"] == baseline].set_index("seed")
        b = w[w["correction"] == treat].set_index("seed")
        seeds = a.index.intersection(b.index)
        a, b = a.loc[seeds], b.loc[seeds]
        d_spk = (a["spikes"] - b["spikes"]).to_numpy(float)
        d_j = (b["j_final"] - a["j_final"]).to_numpy(float)
        d_dd = (a["drawdown"] - b["drawdown"]).to_numpy(float)
        v_spk = effect(d_spk, SPIKE_MARGIN)
        v_obj = any_of([effect(d_j, J_MARGIN), effect(d_dd, J_MARGIN)])
        v = all_of([v_spk, v_obj])
        worlds.append(v)
        m_j, se_j, n = mean_se(d_j)
        parts[world] = {"verdict": v, "spikes": v_spk, "objective": v_obj, "n": n,
                        "spikes_ppo": float(a["spikes"].mean()), "spikes_tis": float(b["spikes"].mean()),
                        "j_ppo": float(a["j_final"].mean()), "j_tis": float(b["j_final"].mean()),
                        "d_j": (m_j, se_j), "d_spikes": mean_se(d_spk)[:2], "d_drawdown": mean_se(d_dd)[:2]}
        texts.append(f"{world}: spikes/run {_g(a['spikes'].mean(), 2)} → {_g(b['spikes'].mean(), 2)}, "
                     f"final J {_g(a['j_final'].mean(), 4)} → {_g(b['j_final'].mean(), 4)} "
                     f"(ΔJ {_pm(m_j, se_j)}) [{v}]")
    verdict = any_of(worlds)
    n = max((p["n"] for p in parts.values()), default=0)
    statement = (f"{_ARM_NAMES.get(baseline, baseline)} → {_ARM_NAMES.get(treat, treat)} (paired over {n} seeds, "
                 f"mean ± SE): " + "; ".join(texts) + ".")
    return Verdict(verdict, statement, parts)


def _tis_figure(ds: Dataset, runs, verdict: Verdict, claim: Claim, style: str):
    df = _with_keys(ds, ds.metrics, noise="mismatch.logit_noise", correction="correction", seed="seed")
    df = df.assign(_t=_t_index(df))
    per = int(df["update"].max()) + 1 if "update" in df.columns else 1
    worlds = sorted(df["noise"].astype(float).unique())
    names = _ordered(df["correction"].unique())
    fig, axes = _figure(len(worlds), 2, style, sharey="row")
    for c, noise in enumerate(worlds):
        sub = df[df["noise"].astype(float) == noise]
        ax_j, ax_g = axes[0][c], axes[1][c]
        for name in names:
            cur = sub[sub["correction"] == name]
            lk = st.look(name)
            x = cur["_t"] / per
            short = (1.0 - cur["objective"]).clip(lower=1e-6)
            stats = cur.assign(short=short, x=x).groupby("x")["short"].agg(["mean", "min", "max"])
            ax_j.plot(stats.index, stats["mean"], color=lk.color, linestyle=lk.linestyle, label=name)
            ax_j.fill_between(stats.index, stats["min"], stats["max"], color=lk.color, alpha=0.15, linewidth=0)
            gn = cur.assign(x=x, gn=cur["grad_norm"].where(cur["grad_norm"] > 0)).groupby("x")["gn"].median()
            ax_g.plot(gn.index, gn.to_numpy(), color=lk.color, linestyle=lk.linestyle, linewidth=0.9)
            # spikes, per run
            for _, run in cur.sort_values("_t").groupby("job"):
                g = run["grad_norm"].astype(float)
                ref = g.where(g > 0).shift(1).rolling(SPIKE_WINDOW, min_periods=3).median()
                sp = run[(g > SPIKE_FACTOR * ref) & (ref > 0)]
                if len(sp):
                    ax_g.plot(sp["_t"] / per, sp["grad_norm"], linestyle="none", marker="o", markersize=5,
                              markerfacecolor="none", markeredgecolor=lk.color)
        ax_j.set_yscale("log")
        ax_g.set_yscale("log")
        p = verdict.parts.get(f"σ={fmt_value(float(noise))}", {})
        ax_j.set_title(f"bf16 engine, logit noise σ = {fmt_value(float(noise))}"
                       + (f"\n[{p['verdict']}]" if p else ""), fontsize="medium")
        ax_g.set_xlabel("training step")
        if c == 0:
            ax_j.set_ylabel(r"shortfall $1 - J(\theta)$ (log)")
            ax_g.set_ylabel(r"$\|\nabla L\|$ before clipping (median)")
    from matplotlib.lines import Line2D

    handles = [_line_handle(n) for n in names]
    labels = [("token TIS, min(ρ, 2)" if n == "tis" else "plain PPO" if n == "none" else n) for n in names]
    handles.append(Line2D([], [], linestyle="none", marker="o", markerfacecolor="none", markeredgecolor="0.3"))
    labels.append(f"spike (> {SPIKE_FACTOR:g}× trailing median)")
    handles.append(Line2D([], [], color="0.5", linewidth=6, alpha=0.3))
    labels.append("band: min–max over seeds")
    _legend(fig, handles, labels, style)
    _headline(fig, claim, verdict, style)
    return fig


def _eval_tis(ds: Dataset, style: str):
    runs = tis_runs(ds)
    v = tis_verdict(runs)
    return v, _tis_figure(ds, runs, v, CLAIMS["tis-tames-mismatch"], style)


# ======================================================================================== 2. bias–variance by level
TOKEN_IS, SEQ_IS = "token-is", "seq-is"
MIDDLE = ("seq-tis", "seq-mis", "geo-mask")
# The two untruncated arms ship as no preset: black (the token level) and wine (the sequence level), clear of
# the shipped presets' colours in this figure (seq-tis blue, seq-mis vermillion, geo-mask purple).
LEVEL_LOOKS = {TOKEN_IS: st.Look("#000000", "-", "o"), SEQ_IS: st.Look("#882255", "-", "s")}


def level_frame(ds: Dataset):
    """probe rows with seq_len (from probe.csv's world columns, else the job's config)."""
    pr = _need(ds.probe, "probe results (probe.csv)", ds.path).copy()
    if "seq_len" not in pr.columns:
        pr = _with_keys(ds, pr, seq_len="rollout.seq_len")
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
    text_a = (f"(a) token-IS relative bias {_g(rel(TOKEN_IS, t0))} [{_g(lo0)}, {_g(hi0)}] at T={t0} → "
              f"{_g(rel(TOKEN_IS, t1))} [{_g(lo1)}, {_g(hi1)}] at T={t1}: {va}")
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
    shape = (f"; log-ratio fit R² {_g(r2_exp, 2)} in T vs {_g(r2_pow, 2)} in log T"
             if math.isfinite(r2_exp) else "")
    text_b = (f"(b) variance seq-IS/token-IS {_g(q[0])} at T={t0} → {_g(q[-1])} at T={t1} "
              f"({_g(growth)}×{shape}): {vb}")
    # (c)
    fails: list[str] = []
    mids = [m for m in MIDDLE if m in present]
    for m in mids:
        biased = [T for T in Ts if by[(m, T)].bias_norm_lo > by[(TOKEN_IS, T)].bias_norm_hi]
        noisy = [T for T in Ts if by[(m, T)].variance > by[(SEQ_IS, T)].variance]
        if biased:
            fails.append(f"{m} more biased than token-IS at {len(biased)}/{len(Ts)} T (T={_span(biased)}, "
                         f"{_g(rel(m, t1))} vs {_g(rel(TOKEN_IS, t1))} at T={t1})")
        if noisy:
            fails.append(f"{m} noisier than seq-IS at {len(noisy)}/{len(Ts)} T")
    vc = (FAILS if fails else HOLDS) if mids else UNSURE
    parts["c"] = vc
    text_c = "(c) " + ("; ".join(fails) if fails else f"{', '.join(mids)} between at every T") + f": {vc}"
    verdict = all_of([va, vb, vc])
    return Verdict(verdict, f"{text_a}; {text_b}; {text_c}.", parts)


def _span(Ts: Sequence[int]) -> str:
    return f"{Ts[0]}" if len(Ts) == 1 else f"{Ts[0]}…{Ts[-1]}"


def _level_figure(pr, verdict: Verdict, claim: Claim, style: str):
    fig, axes = _figure(3, 1, style, panel=(3.6, 3.1))
    ax_b, ax_v, ax_p = axes[0]
    names = [n for n in (TOKEN_IS, SEQ_IS, *MIDDLE) if n in set(pr["preset"])]
    names += [n for n in _ordered(pr["preset"].unique()) if n not in names]
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
    _legend(fig, handles, texts, style)
    _headline(fig, claim, verdict, style)
    return fig


def _eval_level(ds: Dataset, style: str):
    pr = level_frame(ds)
    v = level_verdict(pr)
    return v, _level_figure(pr, v, CLAIMS["bias-variance-by-level"], style)


# ======================================================================================== 3. low-probability tokens
def token_frame(ds: Dataset):
    """Every logged token: precision, seed, p_train, abs_dlogp (|old − roll|), faults and exact zeros kept."""
    tok = _need(ds.tokens, "tokens.csv", ds.path)
    tok = _with_keys(ds, tok, precision="mismatch.precision", seed="seed")
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
        texts.append(f"{prec}: mean |Δ log p| {_pm(low['mean'], low['se'])} in the lowest quintile "
                     f"(p_train < {_g(low['p_hi'], 2)}) vs {_pm(top['mean'], top['se'])} in the highest "
                     f"(p_train > {_g(top['p_lo'], 2)}), {_g(ratio, 2)}× [{v}]")
    n = len(tok)
    return Verdict(all_of(verdicts), f"{n:,} sampled tokens; " + "; ".join(texts) + ".", parts)


def _lowprob_figure(tok, verdict: Verdict, claim: Claim, style: str):
    from matplotlib.lines import Line2D

    fig, axes = _figure(2, 1, style, panel=(4.4, 3.2))
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
    for i, prec in enumerate(precs):
        color = st.group_color(i)
        b = bins[bins["precision"].astype(str) == prec].sort_values("bin")
        xs = b["bin"].to_numpy(float) + (i - (len(precs) - 1) / 2) * width * 0.5
        ax_b.errorbar(xs, b["mean"], yerr=SIGMAS * b["se"], color=color, marker="o", markersize=4.5, capsize=2.5)
        for x, (_, r) in zip(xs, b.iterrows()):
            ax_b.annotate(f"{_g(r['p_lo'], 2)}–{_g(r['p_hi'], 2)}", (x, r["mean"]), textcoords="offset points",
                          xytext=(0, 7 if i == 0 else -12), ha="center", fontsize="x-small", color=color)
        g = mism[mism["precision"].astype(str) == prec]
        idx = rng.choice(len(g), size=min(len(g), 4000), replace=False)
        smp = g.iloc[idx]
        zeros += int((smp["abs_dlogp"] == 0).sum())
        ax_s.scatter(smp["p_train"], smp["abs_dlogp"].clip(lower=floor), s=3, alpha=0.3, color=color, linewidths=0,
                     rasterized=True)
        handles.append(Line2D([], [], color=color, marker="o", markersize=4))
        labels.append(f"{prec} engine vs fp32 trainer ({len(g):,} tokens)")
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
    _legend(fig, handles, labels, style)
    _headline(fig, claim, verdict, style)
    return fig


def _eval_lowprob(ds: Dataset, style: str):
    tok = token_frame(ds)
    v = lowprob_verdict(tok)
    return v, _lowprob_figure(tok, v, CLAIMS["mismatch-low-prob-tokens"], style)


# ======================================================================================== 4. precision vs algorithm
def precision_frame(ds: Dataset):
    """One row per update: precision, correction, seed, t (global update index), objective."""
    df = _need(ds.metrics, "training metrics (sweep.csv)", ds.path)
    df = _with_keys(ds, df, precision="mismatch.precision", correction="correction", seed="seed")
    return df.assign(t=_t_index(df))[["precision", "correction", "seed", "t", "step", "objective"]]


def precision_stats(traj, baseline: str = "none", reference: str = "fp32"):
    """Per (precision, seed): gap = mean_t |J_baseline,prec − J_baseline,reference| and spread = mean_t of
    max − min of J across the corrections."""
    import pandas as pd

    piv = traj.pivot_table(index=["seed", "t"], columns=["precision", "correction"], values="objective",
                           aggfunc="first")
    rows = []
    precs = sorted({p for p, _ in piv.columns})
    for prec in precs:
        cols = [c for c in piv.columns if c[0] == prec]
        spread = (piv[cols].max(axis=1) - piv[cols].min(axis=1)).groupby(level="seed").mean()
        if (prec, baseline) in piv.columns and (reference, baseline) in piv.columns:
            gap = (piv[(prec, baseline)] - piv[(reference, baseline)]).abs().groupby(level="seed").mean()
        else:
            gap = spread * np.nan
        for seed in spread.index:
            rows.append({"precision": prec, "seed": seed, "gap": float(gap.get(seed, np.nan)),
                         "spread": float(spread[seed]), "corrections": len(cols)})
    return pd.DataFrame(rows)


def precision_verdict(traj, baseline: str = "none", reference: str = "fp32", low: str = "bf16",
                      high: str = "fp16") -> Verdict:
    """Claim 4 (Qi et al. 2025) on per-update objectives (precision, correction, seed, t, objective), paired per
    seed (precision_stats gives gap and spread per precision and seed):
      (a) L = log(gap_bf16 / gap_fp16) per seed; effect(L, log 2): fp16 tracks fp32 at least 2× more closely.
      (b) L = log(spread_bf16 / spread_fp16) per seed; effect(L, log 1.25): the spread across corrections shrinks
          by at least 1.25×.
    all_of(a, b). (A tiny 1e-12 keeps a zero gap, identical runs, from dividing by zero.)"""
    s = precision_stats(traj, baseline, reference)
    need = {low, high, reference}
    if not need <= set(s["precision"]):
        raise UserError(f"precision-vs-algorithm: needs precisions {sorted(need)}, got {sorted(set(s['precision']))}")
    a = s[s["precision"] == low].set_index("seed")
    b = s[s["precision"] == high].set_index("seed")
    seeds = a.index.intersection(b.index)
    a, b = a.loc[seeds], b.loc[seeds]
    la = np.log((a["gap"] + EPS) / (b["gap"] + EPS)).to_numpy(float)
    lb = np.log((a["spread"] + EPS) / (b["spread"] + EPS)).to_numpy(float)
    va, vb = effect(la, CLOSER_MARGIN), effect(lb, SHRINK_MARGIN)
    ref = s[s["precision"] == reference]
    ma, sa, n = mean_se(la)
    mb, sb, _ = mean_se(lb)
    k = int(a["corrections"].max())
    piv = traj[traj["precision"] == low].pivot_table(index=["seed", "t"], columns="correction", values="objective",
                                                    aggfunc="first")
    far = ""
    if baseline in piv.columns and len(piv.columns) > 1:
        dev = piv.drop(columns=[baseline]).sub(piv[baseline], axis=0).abs().mean()
        far = f", most of it {dev.idxmax()} (mean |J − J_{baseline}| {_g(dev.max())} at {low})"
    statement = (f"(a) gap to fp32 of plain PPO's J (mean over updates, {n} seeds): {high} {_g(b['gap'].mean())} vs "
                 f"{low} {_g(a['gap'].mean())}, ratio e^({_pm(ma, sa)}) = {_g(math.exp(ma), 2)}×: {va}; "
                 f"(b) spread of J across {k} corrections: {reference} {_g(ref['spread'].mean())}, "
                 f"{high} {_g(b['spread'].mean())}, {low} {_g(a['spread'].mean())}, "
                 f"ratio e^({_pm(mb, sb)}) = {_g(math.exp(mb), 2)}×{far}: {vb}.")
    return Verdict(all_of([va, vb]), statement, {"a": va, "b": vb, "log_gap_ratio": (ma, sa),
                                                 "log_spread_ratio": (mb, sb)})


PRECISION_COLORS = {"bf16": st.group_color(0), "fp16": st.group_color(1), "fp8": st.group_color(2), "fp32": "#555555"}


def _precision_figure(traj, verdict: Verdict, claim: Claim, style: str, baseline: str = "none"):
    from matplotlib.lines import Line2D

    fig, axes = _figure(3, 1, style, panel=(3.7, 3.1))
    ax_g, ax_s, ax_c = axes[0]
    per = max(int(traj["t"].max()) // max(int(traj["step"].max()), 1), 1) if traj["step"].max() > 0 else 1
    piv = traj.pivot_table(index=["seed", "t"], columns=["precision", "correction"], values="objective",
                           aggfunc="first")
    present = {c[0] for c in piv.columns}
    precs = [p for p in ("fp32", "fp16", "bf16", "fp8") if p in present]
    handles, labels = [], []
    for prec in precs:
        color = PRECISION_COLORS[prec]
        cols = [c for c in piv.columns if c[0] == prec]
        if prec != "fp32":
            if (prec, baseline) in piv.columns and ("fp32", baseline) in piv.columns:
                gap = (piv[(prec, baseline)] - piv[("fp32", baseline)]).abs().groupby(level="t").mean()
                ax_g.plot(gap.index / per, gap.where(gap > 0), color=color, linewidth=1.1)
            spread = (piv[cols].max(axis=1) - piv[cols].min(axis=1)).groupby(level="t").mean()
            ax_s.plot(spread.index / per, spread.where(spread > 0), color=color, linewidth=1.1)
        handles.append(Line2D([], [], color=color, marker="o", markersize=4))
        labels.append(f"{prec} engine" + (" (no mismatch: the reference)" if prec == "fp32" else ""))
    for ax in (ax_g, ax_s):
        ax.set_yscale("log")
        ax.set_xlabel("training step")
    ax_g.set_ylabel(r"$|J_{\mathrm{prec}} - J_{\mathrm{fp32}}|$ of plain PPO")
    ax_g.set_title("(a) distance to the fp32 run (mean over seeds)", fontsize="medium")
    ax_s.set_ylabel(r"$\max_c J_c - \min_c J_c$ over the corrections")
    ax_s.set_title("(b) spread across corrections", fontsize="medium")
    if "fp32" in present:
        ax_s.text(0.98, 0.02, "fp32: every correction is plain PPO (spread 0)", transform=ax_s.transAxes,
                  ha="right", va="bottom", fontsize="x-small", color="0.35")
    # (c) final J by correction and precision, relative to fp32 plain PPO of the same seed
    last = traj[traj["t"] >= traj["t"].max() * (1 - FINAL_FRACTION)]
    fin = last.groupby(["precision", "correction", "seed"])["objective"].mean().reset_index()
    ref = fin[(fin["precision"] == "fp32") & (fin["correction"] == baseline)].set_index("seed")["objective"]
    fin["delta"] = fin["objective"] - fin["seed"].map(ref)
    names = _ordered(fin["correction"].unique())
    width = 0.8 / max(len(precs), 1)
    for i, prec in enumerate(precs):
        cur = fin[fin["precision"] == prec].groupby("correction")["delta"].agg(["mean", "sem"])
        xs = np.arange(len(names)) + (i - (len(precs) - 1) / 2) * width
        ys = [cur["mean"].get(n, np.nan) for n in names]
        es = [SIGMAS * cur["sem"].get(n, np.nan) for n in names]
        ax_c.errorbar(xs, ys, yerr=np.nan_to_num(es), color=PRECISION_COLORS[prec], marker="o", markersize=4,
                      linestyle="none", capsize=2)
    ax_c.axhline(0, color="0.4", linewidth=0.8)
    ax_c.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax_c.set_ylabel(r"final $J$ − final $J$ of fp32 plain PPO")
    ax_c.set_title(f"(c) final J (last {FINAL_FRACTION:.0%} of updates, ± 2 SE)", fontsize="medium")
    _legend(fig, handles, labels, style)
    _headline(fig, claim, verdict, style)
    return fig


def _eval_precision(ds: Dataset, style: str):
    traj = precision_frame(ds)
    v = precision_verdict(traj)
    return v, _precision_figure(traj, v, CLAIMS["precision-vs-algorithm"], style)


# ======================================================================================== 5. staleness
TOKEN_TIS = "tis"
SEQ_MASKS = ("seq-mask-tis", "seq-mis", "geo-mask")


def staleness_runs(ds: Dataset):
    """One row per run: correction, staleness, seed, collapsed (0/1), nonfinite (updates with a NaN/inf loss or
    gradient), nan_params, ess (mean over updates), final_objective."""
    import pandas as pd

    df = _need(ds.metrics, "training metrics (sweep.csv)", ds.path)
    df = _with_keys(ds, df, correction="correction", k="mismatch.staleness", seed="seed")
    summ = {j.index: (j.summary or {}) for j in ds.jobs}
    rows = []
    for job, g in df.groupby("job", sort=True):
        s = summ.get(job, {})
        bad = (g["nonfinite_loss"].fillna(0) + g["nonfinite_grad"].fillna(0)) > 0
        rows.append({"job": job, "correction": str(g["correction"].iloc[0]), "staleness": int(g["k"].iloc[0]),
                     "seed": int(g["seed"].iloc[0]), "collapsed": float(bool(s.get("collapsed", False))),
                     "nonfinite": int(bad.sum()), "nan_params": float(bool(s.get("nonfinite_params", False))),
                     "ess": float(g["ess"].mean()),
                     "final_objective": _num(s.get("final_objective", g["objective"].iloc[-1]))})
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
    names = _ordered(r["correction"].unique())

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
    ess_txt = ", ".join(f"{c} {_g(ess[(c, ks[0])], 2)}→{_g(ess[(c, kmax)], 2)}" for c in names)
    fin_txt = ", ".join(f"{c} {_g(fin[(c, kmax)], 3)}" for c in names)
    statement = (f"broken (≥{BROKEN_RATE:g} of {seeds} seeds collapsed or NaN/inf) over k={ks[0]}…{kmax}: {broke}: "
                 f"(a) {va}; ESS k={ks[0]}→{kmax}: {ess_txt}: (b) {vb}; final J at k={kmax}: {fin_txt}.")
    return Verdict(verdict, statement, {"a": va, "b": vb, "kstar": kst})


def _staleness_figure(runs, verdict: Verdict, claim: Claim, style: str):
    fig, axes = _figure(3, 1, style, panel=(3.6, 3.0))
    ax_r, ax_e, ax_j = axes[0]
    r = runs.assign(broken=((runs["collapsed"] > 0) | (runs["nonfinite"] > 0)).astype(float))
    ks = sorted(r["staleness"].unique())
    pos = {k: i for i, k in enumerate(ks)}
    names = _ordered(r["correction"].unique())
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
    _legend(fig, [_line_handle(n, True) for n in names], names, style)
    _headline(fig, claim, verdict, style)
    return fig


def _eval_staleness(ds: Dataset, style: str):
    runs = staleness_runs(ds)
    v = staleness_verdict(runs)
    return v, _staleness_figure(runs, v, CLAIMS["staleness-breaks-tis"], style)


# ======================================================================================== 6. the seed bug
SHIPPED_PREFIX = "openrlhf-bc71bb1/"
FIXED = "seq-mask-tis"


def seedbug_runs(ds: Dataset):
    """One row per run: correction, mode (train.on_nonfinite), seed, nan_params, skipped (updates),
    nonfinite_events (NaN/inf loss + gradient events), collapsed, initial/final_objective, updates."""
    import pandas as pd

    summ = _need(ds.summary, "summary.json files", ds.path)
    summ = _with_keys(ds, summ, correction="correction", mode="train.on_nonfinite", seed="seed")
    rows = []
    for _, s in summ.iterrows():
        ev = float(s.get("events.nonfinite_loss", 0) or 0) + float(s.get("events.nonfinite_grad", 0) or 0)
        rows.append({"job": int(s["job"]), "correction": str(s["correction"]), "mode": str(s["mode"]),
                     "seed": int(s["seed"]), "nan_params": float(bool(s.get("nonfinite_params", False))),
                     "skipped": int(s.get("updates_skipped", 0) or 0), "updates": int(s.get("updates_run", 0) or 0),
                     "nonfinite_events": ev, "collapsed": float(bool(s.get("collapsed", False))),
                     "initial_objective": _num(s.get("initial_objective")),
                     "final_objective": _num(s.get("final_objective"))})
    return pd.DataFrame(rows)


def seedbug_verdict(runs) -> Verdict:
    """Claim 6 (the seed bug) on runs (correction, mode, seed, nan_params, skipped, nonfinite_events, collapsed,
    final_objective):
      (i)   the as-shipped openrlhf-bc71bb1/seq-mask-tis under on_nonfinite=apply: NaN parameters (fraction of seeds)
      (ii)  the same under skip: skipped updates > 0 and finite parameters (fraction of seeds)
      (iii) the fixed seq-mask-tis, both modes: no NaN/inf event, no NaN parameters, no collapse in any seed, and
            final J − plain PPO's final J (paired by mode and seed) non-inferior by SHORTFALL: mean − 2 SE > −0.05
            (mean + 2 SE < −0.05: does not hold).
    Holds when (i) and (ii) hold in every seed and (iii) holds. Does not hold when (i) or (ii) holds in no seed,
    the fixed preset has any fault, or it is significantly more than 0.05 below PPO. Else inconclusive."""
    shipped = sorted(c for c in set(runs["correction"]) if c.startswith(SHIPPED_PREFIX))
    if len(shipped) != 1 or FIXED not in set(runs["correction"]):
        raise UserError(f"seed-bug-end-to-end: needs one {SHIPPED_PREFIX}* preset and {FIXED}, "
                        f"got {sorted(set(runs['correction']))}")
    bug = shipped[0]
    ap = runs[(runs["correction"] == bug) & (runs["mode"] == "apply")]
    sk = runs[(runs["correction"] == bug) & (runs["mode"] == "skip")]
    fx = runs[runs["correction"] == FIXED]
    if ap.empty or sk.empty:
        raise UserError("seed-bug-end-to-end: needs train.on_nonfinite=apply and skip runs of the as-shipped preset")
    f_i = float(ap["nan_params"].mean())
    sk_ok = (sk["skipped"] > 0) & (sk["nan_params"] == 0)
    f_ii = float(sk_ok.mean())
    faults = int(((fx["nonfinite_events"] > 0) | (fx["nan_params"] > 0) | (fx["collapsed"] > 0)).sum())
    d = []
    if "none" in set(runs["correction"]):
        base = runs[runs["correction"] == "none"].set_index(["mode", "seed"])["final_objective"]
        for _, row in fx.iterrows():
            key = (row["mode"], row["seed"])
            if key in base.index:
                d.append(row["final_objective"] - base[key])
    m, se, n = mean_se(d)
    if n >= 2 and math.isfinite(se):
        v_j = HOLDS if m - SIGMAS * se > -SHORTFALL else FAILS if m + SIGMAS * se < -SHORTFALL else UNSURE
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
    statement = (f"{bug}: NaN parameters under apply in {int(ap['nan_params'].sum())}/{len(ap)} seeds (i); under "
                 f"skip {int(sk_ok.sum())}/{len(sk)} seeds skip updates ({_g(100 * frac_skipped, 3)}% of them) with "
                 f"finite parameters (ii); fixed {FIXED}: {faults} faulty runs of {len(fx)}, final J "
                 f"{_g(fx['final_objective'].mean(), 3)} vs plain PPO "
                 f"{_g(runs[runs['correction'] == 'none']['final_objective'].mean(), 3)} "
                 f"(paired Δ {_pm(m, se)}) (iii) {v_iii}.")
    return Verdict(verdict, statement, {"i": f_i, "ii": f_ii, "iii": v_iii, "bug": bug})


def _seedbug_figure(ds: Dataset, runs, verdict: Verdict, claim: Claim, style: str):
    from matplotlib.lines import Line2D

    df = _with_keys(ds, _need(ds.metrics, "training metrics", ds.path), correction="correction",
                    mode="train.on_nonfinite", seed="seed")
    df = df.assign(_t=_t_index(df))
    per = int(df["update"].max()) + 1 if "update" in df.columns else 1
    fig, axes = _figure(3, 1, style, panel=(3.7, 3.1))
    names = _ordered(df["correction"].unique())
    for c, mode in enumerate(("apply", "skip")):
        ax = axes[0][c]
        sub = df[df["mode"] == mode]
        for name in names:
            cur = sub[sub["correction"] == name]
            if cur.empty:
                continue
            lk = st.look(name)
            stats = cur.groupby("_t")["objective"].agg(["mean", "min", "max"])
            x = stats.index / per
            ax.plot(x, stats["mean"], color=lk.color, linestyle=lk.linestyle, linewidth=1.3)
            ax.fill_between(x, stats["min"], stats["max"], color=lk.color, alpha=0.12, linewidth=0)
            nanp = runs[(runs["correction"] == name) & (runs["mode"] == mode) & (runs["nan_params"] > 0)]
            if len(nanp):
                last = cur[cur["job"].isin(nanp["job"])].groupby("job")["_t"].max() / per
                ax.plot(last, np.full(len(last), stats["mean"].iloc[-1] if len(stats) else 0), linestyle="none",
                        marker="X", markersize=9, color=lk.color, markeredgecolor="black", markeredgewidth=0.6,
                        zorder=5)
        ax.set_xlabel("training step")
        ax.set_ylim(-0.03, 1.03)
        ax.set_title(f"train.on_nonfinite={mode}", fontsize="medium")
    axes[0][0].set_ylabel(r"objective $J(\theta)$ (mean, band: min–max)")
    ax = axes[0][2]
    order = [n for n in names]
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
    handles = [_line_handle(n) for n in names]
    labels = [n + (" (as shipped)" if n.startswith(SHIPPED_PREFIX) else " (fixed)" if n == FIXED else
                   " (plain PPO)" if n == "none" else "") for n in names]
    handles.append(Line2D([], [], linestyle="none", marker="X", markersize=8, color="0.5", markeredgecolor="black"))
    labels.append("NaN parameters: the run stops")
    _legend(fig, handles, labels, style)
    _headline(fig, claim, verdict, style)
    return fig


def _eval_seedbug(ds: Dataset, style: str):
    runs = seedbug_runs(ds)
    v = seedbug_verdict(runs)
    return v, _seedbug_figure(ds, runs, v, CLAIMS["seed-bug-end-to-end"], style)


# ======================================================================================== registry and entry points
CLAIMS: dict[str, Claim] = {c.name: c for c in (
    Claim("tis-tames-mismatch", "1. Token TIS tames the training–inference mismatch",
          "Yao et al. 2025, “Your efficient RL framework secretly brings you off-policy RL training”", _eval_tis),
    Claim("bias-variance-by-level", "2. The bias–variance trade-off by level (token / sequence IS)",
          "Liu, Li et al. 2025, “When speed kills stability”", _eval_level),
    Claim("mismatch-low-prob-tokens", "3. The mismatch lives on low-probability tokens",
          "Liu, Li et al. 2025, “When speed kills stability”", _eval_lowprob),
    Claim("precision-vs-algorithm", "4. Precision matters more than the algorithm",
          "Qi et al. 2025, “Defeating the training-inference mismatch via FP16”", _eval_precision),
    Claim("staleness-breaks-tis", "5. Staleness breaks token TIS before sequence masking",
          "the async-RL setting", _eval_staleness),
    Claim("seed-bug-end-to-end", "6. The seed bug, end to end",
          "the OpenRLHF seq-mask-tis bug report, commit bc71bb1", _eval_seedbug),
)}


def evaluate(name: str, path: str | Path, style: str = "default") -> tuple[Verdict, Any]:
    """(Verdict, Figure) of claim `name` on the experiment output at `path` (a sweep dir)."""
    if name not in CLAIMS:
        raise UserError(f"unknown claim {name!r}; valid: {', '.join(CLAIMS)}")
    st.rc(style)
    ds = load_dataset(path)
    with st.using(style):
        return CLAIMS[name].evaluate(ds, style)


def _public(name: str) -> Callable[..., tuple[str, str, Any]]:
    def run(path: str | Path, style: str = "default") -> tuple[str, str, Any]:
        v, fig = evaluate(name, path, style)
        return v.verdict, v.statement, fig
    run.__name__ = name.replace("-", "_")
    run.__doc__ = f"Claim {name!r}: (verdict, statement, Figure) from the experiment's output dir."
    return run


tis_tames_mismatch = _public("tis-tames-mismatch")
bias_variance_by_level = _public("bias-variance-by-level")
mismatch_low_prob_tokens = _public("mismatch-low-prob-tokens")
precision_vs_algorithm = _public("precision-vs-algorithm")
staleness_breaks_tis = _public("staleness-breaks-tis")
seed_bug_end_to_end = _public("seed-bug-end-to-end")


def shrink_png(path: Path) -> None:
    """Re-save a PNG with a 256-colour palette (as scripts/make_gallery.sh does): line figures look the same at
    about a third of the size, which matters for files kept in the repository. Left as is without Pillow."""
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - Pillow comes with matplotlib
        return
    with Image.open(path) as im:
        q = im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    q.save(path, optimize=True)


def line(name: str, v: Verdict) -> str:
    return f"{name}: {v.verdict} — {v.statement}"


def verdicts_markdown(results: list[tuple[str, Verdict]], size: str = "default") -> str:
    out = ["# Verdicts: the literature's claims in the synthetic world", "",
           f"Written by `bash scripts/figures.sh{' --full' if size == 'full' else ''}` ({size} size). One line per "
           "claim: the experiment (`conf/experiment/NAME.yaml`: its command, source, world and what the world can "
           "and cannot show), the verdict, and the numbers behind it. The rules were fixed before the runs and are "
           "stated in `analysis/claims.py`; a claim the synthetic world does not reproduce is reported as such.", ""]
    for name, v in results:
        c = CLAIMS[name]
        out.append(f"- **{c.title}** ({c.source}; `is-study sweep experiment={name}`, [figure]({name}.png)): "
                   f"**{v.verdict}**. {v.statement}")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.claims", description=(
        "Verdicts and figures of the literature's claims. DIR is an experiment's output dir (--claim NAME), or "
        "with --all a folder holding one dir per experiment, named after it (scripts/figures.sh)."))
    p.add_argument("dir", help="experiment output dir, or with --all the folder of them")
    p.add_argument("--claim", choices=list(CLAIMS), help="the claim (= experiment name)")
    p.add_argument("--all", action="store_true", help="every claim under DIR/<name>; writes OUT/VERDICTS.md")
    p.add_argument("--only", default="", help="with --all: space-separated claim names (default: all)")
    p.add_argument("--out", default=None, help="write <name>.png and .pdf here (and VERDICTS.md with --all)")
    p.add_argument("--style", default="default", choices=list(st.STYLES))
    p.add_argument("--size", default="default", help="the size named in VERDICTS.md (default | full)")
    args = p.parse_args(argv)
    from analysis import plots

    try:
        if args.all == bool(args.claim):
            raise UserError("give either --claim NAME or --all")
        names = [args.claim] if args.claim else (args.only.split() or list(CLAIMS))
        for n in names:
            if n not in CLAIMS:
                raise UserError(f"unknown claim {n!r}; valid: {', '.join(CLAIMS)}")
        out = plots.ensure_dir(Path(args.out)) if args.out else None
        results = []
        for n in names:
            path = Path(args.dir) / n if args.all else Path(args.dir)
            v, fig = evaluate(n, path, args.style)
            if out is not None:
                for written in plots.save(fig, out, n, args.style):
                    if written.suffix == ".png":
                        shrink_png(written)
            results.append((n, v))
            print(line(n, v), flush=True)
        if args.all and out is not None:
            order = [n for n in CLAIMS if n in names]
            (out / "VERDICTS.md").write_text(verdicts_markdown([r for n in order for r in results if r[0] == n],
                                                               args.size), encoding="utf-8")
    except UserError as exc:
        print(f"analysis.claims: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
