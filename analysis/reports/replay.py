"""`is-study report REPLAY_DIR`: what the replay found, as Markdown (REPLAY_DIR/report.md).

    where the mismatch lives  the steps with the largest kl_k3, and the token log-ratios by p_train: which
                              probabilities hold the gap
    non-finite                which presets would have given a NaN/inf loss, gradient or coefficient, and where
    threshold advice          for each banded preset, the band that would reject (or clamp) 1%, 5% and 20% of
                              this run's tokens or sequences, beside what its shipped band does

From replay.csv and tokens.csv only (no torch); the bands from the presets' files (analysis/replay.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from analysis.replay import band_of, read_replay, read_tokens, statistics, symmetric_band_rejecting
from analysis.reports import fmt, table

FRACTIONS = (0.01, 0.05, 0.20)
P_BINS = (0.0, 1e-4, 1e-3, 1e-2, 0.1, 0.5, 1.0)
TOP_STEPS = 5


def _pct(x: float) -> str:
    return "—" if x is None or not np.isfinite(x) else f"{100 * x:.3g}%"


def _band_text(low: float | None, high: float | None) -> str:
    return f"[{fmt(low)}, {fmt(high)}]"


def _mismatch(replay, tokens) -> list[str]:
    lines = ["## Where the mismatch lives", ""]
    applied = replay[replay["applies"] == 1]
    if applied.empty:
        return lines + ["The dump holds no trainer log-probs: there is no log-ratio to locate.", ""]
    # kl_k3, chi², max|Δp| do not depend on the preset: one row a step (the first preset that applied)
    per_step = applied.groupby("step", sort=True).first().reset_index()
    top = per_step.sort_values("kl_k3", ascending=False).head(TOP_STEPS)
    lines += [
        f"Steps with the largest mismatch (kl_k3 per token), {min(TOP_STEPS, len(per_step))} of {len(per_step)}:",
        "",
        table(
            [
                {
                    "step": int(r.step),
                    "tokens": int(r.tokens),
                    "kl_k3": r.kl_k3,
                    "chi2_token": r.chi2_token,
                    "max_abs_prob_diff": r.max_abs_prob_diff,
                }
                for r in top.itertuples()
            ]
        ),
        "",
    ]
    if tokens is None or not np.isfinite(tokens["log_ratio"]).any():
        return lines
    lr = tokens["log_ratio"].to_numpy(dtype=float)
    train = (tokens["old"] if tokens["old"].notna().any() else tokens["lp"]).to_numpy(dtype=float)
    ok = np.isfinite(lr) & np.isfinite(train)
    gap, p = np.abs(lr[ok]), np.exp(train[ok])
    total = gap.sum() or 1.0
    rows = []
    for lo, hi in zip(P_BINS[:-1], P_BINS[1:]):
        sel = (p > lo) & (p <= hi) if lo > 0 else p <= hi
        if sel.any():
            rows.append(
                {
                    "p_train": f"({fmt(lo)}, {fmt(hi)}]",
                    "tokens": int(sel.sum()),
                    "share of tokens": _pct(sel.mean()),
                    "mean abs log-ratio": float(gap[sel].mean()),
                    "share of the total abs log-ratio": _pct(gap[sel].sum() / total),
                }
            )
    q = np.quantile(gap, [0.5, 0.99, 0.999]) if len(gap) else [np.nan] * 3
    lines += [
        f"Token log-ratios old − roll: |lr| median {fmt(float(q[0]))}, 99th percentile {fmt(float(q[1]))}, "
        f"99.9th {fmt(float(q[2]))}, max {fmt(float(gap.max()) if len(gap) else np.nan)} nats; "
        f"{int((~np.isfinite(lr)).sum())} non-finite. By the trainer's probability of the token:",
        "",
        table(rows),
        "",
    ]
    return lines


def _nonfinite(replay) -> list[str]:
    lines = ["## Non-finite losses", ""]
    cols = [c for c in ("nonfinite_loss", "nonfinite_grad", "nonfinite_coef") if c in replay.columns]
    bad = replay[(replay[cols].fillna(0) > 0).any(axis=1)] if cols else replay.iloc[0:0]
    if bad.empty:
        applied = int((replay["applies"] == 1).sum())
        return lines + [
            f"No preset would have produced a NaN/inf loss, gradient or coefficient ({applied} step × preset rows).",
            "",
        ]
    rows = []
    for preset, group in bad.groupby("preset", sort=False):
        steps = sorted(int(s) for s in group["step"])
        rows.append(
            {
                "preset": preset,
                "steps": len(steps),
                "first": steps[0],
                "at steps": ", ".join(map(str, steps[:12])) + (" …" if len(steps) > 12 else ""),
                "loss": int(group.get("nonfinite_loss", 0).fillna(0).sum()),
                "gradient entries": int(group.get("nonfinite_grad", 0).fillna(0).sum()),
                "coefficients": int(group.get("nonfinite_coef", 0).fillna(0).sum()),
            }
        )
    inputs = int(replay.groupby("step")["nonfinite_inputs"].first().sum()) if "nonfinite_inputs" in replay else 0
    lines += [
        "Presets that would have produced a NaN/inf (loss: steps; gradient entries and coefficients: counts at masked-in tokens):",
        "",
        table(rows),
        "",
        f"The dump itself holds {inputs} NaN/inf values at masked-in tokens over all steps.",
        "",
    ]
    return lines


def _advice(replay, tokens) -> list[str]:
    lines = ["## Threshold advice", ""]
    if tokens is None or not np.isfinite(tokens["log_ratio"]).any():
        return lines + ["No log-ratios in this replay (no tokens.csv, or no trainer log-probs): no advice.", ""]
    stats = statistics(tokens)
    rows = []
    for preset in dict.fromkeys(replay["preset"]):
        band = band_of(preset)
        if band is None or band.level not in stats:
            continue
        stat = -stats[band.level] if band.inverted else stats[band.level]
        shipped_stat = stats[band.level]
        two_sided = band.low_ratio is not None and band.high_ratio is not None
        row = {
            "preset": preset,
            "level": band.level,
            "band acts by": "rejecting" if band.kind == "filter" else "clamping",
            "shipped band": band.text(),
            "shipped band: units outside": _pct(float(band.rejects(shipped_stat).mean())),
        }
        for fraction in FRACTIONS:
            low, high = symmetric_band_rejecting(stat, fraction, two_sided)
            row[f"band for {_pct(fraction)}"] = _band_text(low, high)
        rows.append(row)
    if not rows:
        return lines + ["No banded preset was replayed.", ""]
    lines += [
        "For each banded preset, the band at which it would have rejected (a filter) or clamped (a weight clamp) "
        "1%, 5% and 20% of this run's units (`band for 1%` ...): tokens for a token-level preset, sequences for a "
        "sequence or geometric one; `units outside` is what its shipped band does here. Two-sided presets get [1/c, c] symmetric in log space; one-sided ones keep their "
        "open side. The band is on the ratio, as the preset files write it.",
        "",
        table(rows),
        "",
    ]
    return lines


def build(path: Path) -> str:
    path = Path(path)
    replay, tokens = read_replay(path), read_tokens(path)
    presets = list(dict.fromkeys(replay["preset"]))
    steps = replay["step"].nunique()
    applied = replay[replay["applies"] == 1]["preset"].nunique()
    notes = sorted({n for n in replay["note"].dropna() if n})
    lines = [
        f"# Replay: {path}",
        "",
        f"{steps} steps, {int(replay.groupby('step')['tokens'].first().sum()):,} tokens, {len(presets)} presets "
        f"({applied} applied to the dump). Files: replay.csv (a row per step × preset), replay_summary.csv, "
        "tokens.csv.",
        "",
    ]
    if notes:
        lines += ["Notes from the replay: " + "; ".join(notes) + ".", ""]
    lines += _mismatch(replay, tokens) + _nonfinite(replay) + _advice(replay, tokens)
    figures = sorted((path / "figures").glob("replay-*.png"))
    if figures:
        lines += ["## Figures", ""] + [f"![{f.stem}](figures/{f.name})" for f in figures] + [""]
    return "\n".join(lines)
