"""`is-study report PATH [OVERRIDES]`: Markdown for an issue or a lab notebook.

For a run dir, a sweep dir or a probe dir: the verdict per correction, the command that produced
the data (from `.hydra/overrides.yaml`, or the sweep's `multirun.yaml`), the config's differences
from the defaults (`runner.hydra_app.app.compose([])` against the run's `.hydra/config.yaml`), a results
table, for a train sweep over precision, staleness or correction the peak-to-final drop of J per
cell (mean over seeds, seed count, worst seed), and the key figures embedded by relative path (drawn
into PATH/figures/ when missing).
OVERRIDES filter the jobs of a sweep (`correction=tis mismatch.staleness=0,8`).

For a case file (`is-study report case.yaml correction=...`): the repro card. The inputs, the
expected against the actual results and which invariant broke: 1 a finite loss and gradient, 2
exactly zero gradient at every rejected unit. runner/audit/case_card.py computes all of it (the CLI calls
it and hands the card here); this module only formats it, and never imports torch, the algebra or
the audit.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from analysis.load import (DEGENERATE_RULE, QUIET_KEYS, Dataset, command, flatten, fmt_value, load_dataset, per_job,
                           probe_frame)
from runner.errors import UserError

CASE_SUFFIXES = (".yaml", ".yml", ".json")
MAX_TABLE_ROWS = 120
REPORT_FIGURES = ("training", "threshold-training", "stability", "survival", "length-heatmap", "presets", "threshold", "bias-split", "mismatch",
                  "mismatch-over-training", "grad-norm", "masking")


# ----------------------------------------------------------------------------------------- entry
def case_file(path: str) -> Path | None:
    """The case file PATH names (a file, or a shipped case's name); None when PATH is a run, sweep or
    probe dir, or a sweep.csv. Anything else is a one-line error."""
    target = Path(path)
    if target.is_dir() or (target.is_file() and target.suffix == ".csv"):
        return None
    case_path = _case_path(path)
    if case_path is None:
        raise UserError(f"no such file or directory: {path}")
    return case_path


def build(path: str, overrides: Sequence[str] = (), out: str | None = None) -> tuple[str, Path | None]:
    """The report of a run, sweep or probe dir (or a sweep.csv): (the Markdown, where it goes: a file
    path, or None for stdout)."""
    ds = load_dataset(Path(path)).select(list(overrides))
    dest = destination(out, ds.path / "report.md")
    return dataset_report(ds, overrides, dest), dest


def write(text: str, dest: Path | None) -> None:
    if dest is None:
        sys.stdout.write(text)
        return
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write --out {dest}: {exc.strerror or exc}") from None


def destination(out: str | None, default: Path | None) -> Path | None:
    """Where --out sends a report: a file, or None for stdout ('-', or no --out and no default)."""
    if out == "-":
        return None
    if out is None:
        return default
    dest = Path(out)
    if dest.is_dir():
        raise UserError(f"--out {out} is a directory; give a file name, e.g. {dest / 'report.md'}")
    return dest


def _case_path(path: str) -> Path | None:
    p = Path(path)
    if p.is_file():
        if p.suffix not in CASE_SUFFIXES:
            raise UserError(f"{p}: expected a run dir, a sweep dir or a case file (.yaml/.json)")
        return p
    if not p.exists() and "/" not in path and os.sep not in path:
        from runner import registry

        return registry.shipped_case(path)
    return None


# ----------------------------------------------------------------------------------------- markdown bits
def _fmt(v: Any, digits: int = 4) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        if v == int(v) and abs(v) < 1e6:
            return str(int(v))
        return f"{v:.{digits}g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_fmt(x, digits) for x in v) + "]"
    return str(v)


def _cell(v: Any) -> str:
    return _fmt(v).replace("|", "\\|").replace("\n", " ")


def _table(rows: list[dict], columns: Sequence[str] | None = None) -> str:
    """A GitHub Markdown table via pandas.to_markdown (tabulate)."""
    import pandas as pd

    if not rows:
        return "_(no rows)_"
    df = pd.DataFrame([{k: _cell(v) for k, v in r.items()} for r in rows], columns=columns)
    return df.to_markdown(index=False, disable_numparse=True)


def _mean_sd(values) -> str:
    import numpy as np

    vals = np.asarray([v for v in values if v is not None], dtype=float)
    vals = vals[np.isfinite(vals)]
    if len(vals) == 0:
        return "nan"
    if len(vals) == 1:
        return f"{vals[0]:.3f}"
    return f"{vals.mean():.3f} ± {vals.std(ddof=1):.3f}"


# ----------------------------------------------------------------------------------------- dataset report
def dataset_report(ds: Dataset, filters: Sequence[str] = (), dest: Path | None = None) -> str:
    parts: list[str] = []
    kind = _kind_words(ds)
    parts.append(f"# is-study report: {ds.name}\n")
    parts.append(f"{kind}. Data: `{ds.path}`" + (f", filtered to `{' '.join(filters)}`" if filters else "") + ".\n")

    is_probe = ds.metrics is None and ds.probe is not None
    verdicts = _probe_verdicts(ds) if is_probe else _train_verdicts(ds)
    parts.append("## Verdict\n")
    parts.extend(f"- {v}" for v in verdicts)
    parts.append("")

    cmd, source = command(ds)
    parts.append("## Command\n")
    parts.append(f"```bash\n{cmd}\n```\n")
    parts.append(f"_(source: {source})_\n")

    parts.append("## Config: differences from the defaults\n")
    parts.append(_config_diff(ds) + "\n")

    parts.append("## Results\n")
    parts.append((_probe_table(ds) if is_probe else _train_table(ds)) + "\n")

    drops = None if is_probe else drop_table(ds)
    if drops:
        parts.append("## Peak-to-final drop of J\n")
        parts.append(drops + "\n")

    figs = _figures(ds, filters, dest)
    if figs:
        parts.append("## Figures\n")
        parts.extend(figs)
    return "\n".join(parts).rstrip() + "\n"


def _kind_words(ds: Dataset) -> str:
    studies = sorted(ds.studies)
    study = studies[0] if len(studies) == 1 else "/".join(studies)
    if ds.kind == "run":
        job = ds.first
        status = "complete" if job.done else "NOT complete (no DONE marker)"
        return f"One `{study}` run, {status}"
    done = sum(j.done for j in ds.jobs)
    swept = " × ".join(f"`{k}`" for k in ds.swept) or "nothing"
    return f"A `{study}` sweep of {len(ds.jobs)} jobs ({done} complete) over {swept}"


def _facet_keys(ds: Dataset, frame) -> list[str]:
    return [k for k in ds.swept if k not in ("seed", "correction") and k in frame.columns]


def _replicates(ds: Dataset) -> str:
    """'seeds' when only the seed varies within a correction, else 'runs'."""
    others = [k for k in ds.swept if k not in ("seed", "correction")]
    return "runs" if others else "seeds"


def _cell_words(keys: Sequence[str], values) -> str:
    values = values if isinstance(values, tuple) else (values,)
    return ", ".join(f"{k}={fmt_value(v)}" for k, v in zip(keys, values))


def _learning(cur, word: str) -> str:
    """Whether the runs learned and whether they collapsed: a run whose J never rose above its
    start neither learned nor collapsed, and says so (a flat run is not a stable one)."""
    n = len(cur)
    learned = cur["learned"].dropna() if "learned" in cur.columns else cur["learned"].iloc[0:0]
    flat = int((learned == 0).sum())
    collapsed = cur["collapsed"].dropna()
    c = int(collapsed.sum())
    parts = []
    if flat:
        start = cur.loc[cur["learned"] == 0, "initial_objective"].astype(float)
        at = f" {start.iloc[0]:.3g}" if len(start) and start.notna().all() and start.nunique() == 1 else ""
        parts.append(f"**never learned** (J never rose above its start{at})" if flat == n else
                     f"**never learned in {flat} of {n} {word}** (J never rose above its start{at})")
    if len(collapsed):
        if c:
            parts.append(f"collapsed in {c} of {len(collapsed)} {word}")
        elif flat < n:
            parts.append("no collapse" if not flat else f"no collapse in the {n - flat} that learned")
    return "; ".join(parts)


def _train_verdicts(ds: Dataset) -> list[str]:
    from analysis.style import preset_rank

    per = per_job(ds)
    if per is None or per.empty:
        return ["no training metrics to judge"]
    word = _replicates(ds)
    facet_keys = _facet_keys(ds, per)
    out = []
    for name in sorted(per["correction"].unique(), key=preset_rank):
        cur = per[per["correction"] == name]
        n = len(cur)
        bad = cur[cur["nonfinite_events"] > 0]
        if bad.empty:
            line = f"finite in all {n} {word}" if n > 1 else "finite"
        else:
            events = int(bad["nonfinite_events"].sum())
            first = int(bad["first_bad"].min())
            line = (f"**{events} nonfinite event{'s' if events != 1 else ''}** "
                    f"({int((bad['nonfinite'] * bad['updates']).round().sum())} updates with a NaN/inf loss or "
                    f"gradient, {int(bad['skipped'].sum())} skipped) in {len(bad)} of {n} {word}, first at step {first}")
            by = cur.groupby(facet_keys)["nonfinite_events"].sum() if facet_keys else None
            if by is not None and by.nunique() > 1:
                line += f"; most at {_cell_words(facet_keys, by.idxmax())}"
        learning = _learning(cur, word)
        if learning:
            line += f"; {learning}"
        not_done = int((~cur["done"].astype(bool)).sum())
        if not_done:
            line += f"; {not_done} unfinished"
        line += f"; {_final_objective(cur, facet_keys)}"
        out.append(f"**{name}**: {line}")
    return out


def _final_objective(cur, facet_keys: Sequence[str]) -> str:
    """Final J(θ): over seeds when there is one cell; else the worst cell named (a pooled mean over
    cells would hide it), next to the range over cells."""
    if not facet_keys:
        return f"final J(θ) {_mean_sd(cur['final_objective'])}"
    cells = cur.groupby(facet_keys, dropna=False)["final_objective"]
    means = cells.mean().dropna()
    if means.empty:
        return "final J(θ) nan"
    if len(means) == 1:
        return f"final J(θ) {_mean_sd(cur['final_objective'])}"
    if means.max() - means.min() < 5e-4:
        return f"final J(θ) {_mean_sd(cur['final_objective'])} in every one of the {len(means)} cells"
    worst = means.idxmin()
    members = cur
    for k, v in zip(facet_keys, worst if isinstance(worst, tuple) else (worst,)):
        members = members[members[k].map(fmt_value) == fmt_value(v)]
    return (f"final J(θ) {means.min():.3f} to {means.max():.3f} across {len(means)} cells; worst at "
            f"{_cell_words(facet_keys, worst)}: {_mean_sd(members['final_objective'])}")


def _train_table(ds: Dataset) -> str:
    from analysis.style import preset_rank

    per = per_job(ds)
    if per is None:
        return "_(no metrics)_"
    facet_keys = _facet_keys(ds, per)
    rows = []
    groups = per.groupby(["correction", *facet_keys], sort=False, dropna=False)

    def order(kv):
        key = kv[0] if isinstance(kv[0], tuple) else (kv[0],)
        return (preset_rank(str(key[0])), [sort_key(x) for x in key[1:]])
    ordered = sorted(groups, key=order)
    word = "seeds" if _replicates(ds) == "seeds" or facet_keys else "runs"
    for key, g in ordered:
        key = key if isinstance(key, tuple) else (key,)
        row = {"correction": key[0]}
        row.update({k: fmt_value(v) for k, v in zip(facet_keys, key[1:])})
        if ds.kind == "run":
            j = ds.first
            row.update({"seed": fmt_value(j.value("seed")), "staleness": fmt_value(g["staleness"].iloc[0]),
                        "updates": int(g["updates"].iloc[0])})
        else:
            row[word] = int(g["seed"].nunique()) if word == "seeds" and "seed" in g.columns else len(g)
        row["final J(θ)"] = _mean_sd(g["final_objective"])
        row["best J(θ)"] = _mean_sd(g["best_objective"])
        row["final reward"] = _mean_sd(g["final_reward"])
        row["NaN/inf events"] = int(g["nonfinite_events"].sum())
        row["skipped updates"] = int(g["skipped"].sum())
        learned = g["learned"].dropna() if "learned" in g.columns else g["collapsed"].iloc[0:0]
        row["learned"] = f"{int(learned.sum())}/{len(learned)}" if len(learned) else "—"
        col = g["collapsed"].dropna()
        row["collapsed"] = f"{int(col.sum())}/{len(col)}" if len(col) else "—"
        rows.append(row)
    note = ""
    if len(rows) > MAX_TABLE_ROWS:
        note = f"\n\n_(first {MAX_TABLE_ROWS} of {len(rows)} rows)_"
        rows = rows[:MAX_TABLE_ROWS]
    legend = ("\n\nJ(θ) is the exact expected reward of the policy (0–1); mean ± s.d. over the " + word +
              " where there are several. final J(θ): J after the last update (summary.json's final_objective, the "
              "last J of metrics.csv and sweep.csv). NaN/inf events count NaN/inf losses and gradients (events.csv). "
              "learned: "
              "runs whose J rose above its start (a flat run neither learned nor collapsed).")
    return _table(rows) + note + legend


DROP_CELL = ("precision", "staleness", "correction")
# Keys whose value is already one of DROP_CELL's columns (per_job reads them from metrics.csv).
DROP_SAME = ("seed", "correction", "mismatch", "mismatch.precision", "mismatch.staleness")


def drop_table(ds: Dataset) -> str | None:
    """precision × staleness × correction (and any other swept key) → the peak-to-final drop of J,
    peak_objective − final_objective per run (summary.json), its mean ± s.d. over seeds, the seed
    count and the worst seed. None unless a train sweep varies at least one of the three."""
    import numpy as np

    from analysis.style import PRECISION_ORDER, preset_rank

    per = per_job(ds)
    if per is None or ds.kind != "sweep" or not set(DROP_CELL) <= set(per.columns):
        return None
    if not any(per[k].nunique() > 1 for k in DROP_CELL):
        return None
    others = [k for k in ds.swept if k not in DROP_SAME and k in per.columns]
    # A run that ended with NaN parameters has no final J: its drop is undefined, and counted apart.
    nan_params = per["nonfinite_params"].fillna(0) == 1 if "nonfinite_params" in per.columns else False
    per = per.assign(final=per["final_objective"].astype(float).where(~nan_params), nan_params=nan_params)
    per = per.assign(drop=per["best_objective"].astype(float) - per["final"])
    se = _objective_se(ds)
    if se is not None:
        per["se"] = per["job"].map(se)

    def order(kv):
        key = kv[0]
        p = str(key[0])
        return (PRECISION_ORDER.index(p) if p in PRECISION_ORDER else len(PRECISION_ORDER), p, sort_key(key[1]),
                preset_rank(str(key[2])), [sort_key(x) for x in key[3:]])
    rows, worst_mean = [], None
    seeds = "seed" if "seed" in per.columns else "job"
    for key, g in sorted(per.groupby([*DROP_CELL, *others], sort=False, dropna=False), key=order):
        row = {k: fmt_value(v) for k, v in zip((*DROP_CELL, *others), key)}
        row["seeds"] = int(g[seeds].nunique())
        finite = g[np.isfinite(g["drop"])]
        # Peak and final over the same runs, so that the drop is their difference; a cell where every run
        # ended with NaN parameters still shows how high J got before.
        row["peak J"] = (_mean_sd(finite["best_objective"]) if len(finite)
                         else _mean_sd(g["best_objective"]) + " (before NaN)")
        row["final J"] = _mean_sd(g["final"])
        row["peak − final"] = _mean_sd(finite["drop"])
        if len(finite):
            w = finite.loc[finite["drop"].idxmax()]
            row["worst seed"] = f"{seeds} {fmt_value(w[seeds])}: {w['drop']:.3f}"
            mean = float(finite["drop"].mean())
            if worst_mean is None or mean > worst_mean[0]:
                worst_mean = (mean, row, len(finite))
        else:
            row["worst seed"] = "—"
        if bool(per["nan_params"].any()):
            row["NaN parameters"] = f"{int(g['nan_params'].sum())}/{len(g)}"
        if se is not None:
            row["J s.e."] = _fmt(float(g["se"].mean()), 2)
        rows.append(row)
    note = ""
    if len(rows) > MAX_TABLE_ROWS:
        note = f"\n\n_(first {MAX_TABLE_ROWS} of {len(rows)} rows)_"
        rows = rows[:MAX_TABLE_ROWS]
    lead = ""
    if worst_mean is not None and worst_mean[0] <= 0:
        lead = "J ended at its peak in every run that has a final J (peak − final = 0).\n\n"
    elif worst_mean is not None and worst_mean[0] < 0.0005:  # "largest drop 0.000" reads as a typo
        lead = (f"J ended within 0.0005 of its peak in every run that has a final J (largest mean drop "
                f"{worst_mean[0]:.1e}).\n\n")
    elif worst_mean is not None:
        mean, row, n = worst_mean
        cell = ", ".join(f"{k}={row[k]}" for k in (*DROP_CELL, *others))
        lead = (f"Largest mean drop: **{mean:.3f}** at {cell} ({row['peak − final']} over {n} seed"
                f"{'s' if n != 1 else ''}; worst {row['worst seed']}).\n\n")
    legend = ("\n\npeak − final: J at the run's best evaluation minus J after its last update (summary.json's "
              "peak_objective − final_objective), mean ± s.d. over the seeds (peak J too: over the runs that have a "
              "final J); "
              "worst seed: the largest drop. ")
    if bool(per["nan_params"].any()):
        legend += ("A run that ended with NaN parameters has no final J: it is left out of the drop and counted under "
                   "NaN parameters. ")
    if se is not None:
        legend += ("J is a Monte Carlo estimate here (J s.e.: its standard error per evaluation): the peak of many noisy "
                   "evaluations sits above the truth by about 1–2 s.e., so a drop within ~2 s.e. is noise.")
    return lead + _table(rows) + note + legend.rstrip()


def _objective_se(ds: Dataset) -> dict | None:
    """{job: mean standard error of its Monte Carlo J evaluations}; None where J is exact."""
    df = ds.metrics
    if df is None or "objective_se" not in df.columns:
        return None
    se = df["objective_se"].astype(float)
    if not (se > 0).any():
        return None
    return df.assign(_se=se).dropna(subset=["_se"]).groupby("job")["_se"].mean().to_dict()


def sort_key(value: Any) -> tuple:
    """Numbers as numbers (2 before 10), then everything else as text."""
    if isinstance(value, bool):
        return (1, 0.0, str(value))
    try:
        number = float(value)
    except (TypeError, ValueError):
        return (1, 0.0, str(value))
    return (0, number, "") if not math.isnan(number) else (2, 0.0, "nan")


def _band(low: Any, high: Any) -> str:
    def one(v):
        return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else _fmt(v)
    return f"[{one(low)}, {one(high)}]"


def _probe_verdicts(ds: Dataset) -> list[str]:
    """Per preset: NaN/inf, its best band by relative MSE among the arms that learn, and its
    degenerate arms (never picked: an arm that barely updates can have the lowest MSE)."""
    from analysis.style import preset_rank

    pr = probe_frame(ds)
    mse = "rel_mse" if "rel_mse" in pr.columns and pr["rel_mse"].notna().any() else "mse"
    out = []
    if mse == "rel_mse" and "exact_grad_norm" in pr.columns:
        g = pr["exact_grad_norm"].astype(float)
        out.append(f"relative MSE = MSE / ‖∇J‖² (‖∇J‖² = {_fmt(float(g.iloc[0]) ** 2, 3)}"
                   + (" in the first cell" if g.nunique() > 1 else "") + "); 1 is the MSE of a zero update. "
                   + DEGENERATE_RULE[0].upper() + DEGENERATE_RULE[1:] + ": never picked as a preset's best.")
    ok = pr[(pr["degenerate"] == 0) & pr[mse].notna()]
    if len(ok):
        best = ok.loc[ok[mse].astype(float).idxmin()]
        out.append(f"lowest {'relative ' if mse == 'rel_mse' else ''}MSE of all arms that learn: **{best['preset']}** "
                   f"at {_band(best.get('low'), best.get('high'))}{_where(ds, best)}: {_fmt(float(best[mse]), 3)}")
    for name in sorted(pr["preset"].astype(str).unique(), key=preset_rank):
        cur = pr[pr["preset"].astype(str) == name]
        nb = len(cur)
        rate = cur["nonfinite_rate"].astype(float) if "nonfinite_rate" in cur.columns else None
        if rate is None or rate.fillna(0).max() == 0:
            line = f"finite in every batch at {'all ' + str(nb) + ' bands/cells' if nb > 1 else 'its band'}"
        else:
            worst = cur.loc[rate.idxmax()]
            line = (f"**NaN/inf in {100 * float(worst['nonfinite_rate']):.3g}% of batches** at band "
                    f"{_band(worst['low'], worst['high'])}; {int((rate > 0).sum())} of {nb} cells affected")
        good = cur[(cur["degenerate"] == 0) & cur[mse].notna()]
        if len(good):
            best = good.loc[good[mse].astype(float).idxmin()]
            line += (f"; {'lowest ' if nb > 1 else ''}{'relative ' if mse == 'rel_mse' else ''}MSE "
                     f"{_fmt(float(best[mse]), 3)} at "
                     f"{_band(best['low'], best['high'])}{_where(ds, best)} (bias {_fmt(float(best['bias_norm']), 3)}, "
                     f"variance {_fmt(float(best['variance']), 3)})")
        bad = cur[cur["degenerate"] == 1]
        if len(bad):
            what = _degenerate_words(bad.iloc[0])
            where = (f"at {_band(bad.iloc[0]['low'], bad.iloc[0]['high'])}{_where(ds, bad.iloc[0])}" if len(bad) == 1
                     else f"at {len(bad)} of {nb} bands/cells, e.g. {_band(bad.iloc[0]['low'], bad.iloc[0]['high'])}"
                          f"{_where(ds, bad.iloc[0])}")
            if len(good):
                line += f"; **degenerate {where}** ({what}: it barely updates)"
            elif nb == 1:
                line += f"; **degenerate {where}** ({what}: it barely updates, so its MSE is not a score)"
            else:
                line += f"; **degenerate in every band/cell** ({what}): no band of it learns"
        out.append(f"**{name}**: {line}")
    return out


def _degenerate_words(row) -> str:
    masked = float(row.get("mean_masked_fraction", float("nan")))
    ratio = float(row.get("norm_ratio", float("nan"))) if "norm_ratio" in row else float("nan")
    parts = []
    if masked >= 0.9:
        parts.append(f"{masked:.0%} of tokens masked")
    if ratio == ratio and ratio < 0.1:
        parts.append("‖E ĝ‖ ≈ 0" if ratio < 0.005 else f"‖E ĝ‖ = {ratio:.2g}·‖∇J‖")
    return ", ".join(parts) or "degenerate"


def _where(ds: Dataset, row) -> str:
    """', mismatch.staleness=8' for the swept keys of a probe sweep (the band aside)."""
    keys = [k for k in ds.swept if k in row.index and k not in ("probe.bands", "probe.presets")]
    return (" (" + ", ".join(f"{k}={fmt_value(row[k])}" for k in keys) + ")") if keys else ""


def _probe_table(ds: Dataset) -> str:
    from analysis.style import preset_rank

    pr = probe_frame(ds)
    facet_keys = [k for k in ds.swept if k in pr.columns]
    pr["_rank"] = pr["preset"].astype(str).map(lambda n: preset_rank(n))
    pr = pr.sort_values(["_rank", *facet_keys, "high"], kind="stable",
                        key=lambda col: col if col.name == "_rank" else col.map(sort_key))
    cols = [c for c in ("preset", *facet_keys, "low", "high", "bias_norm", "bias_norm_ci", "variance", "mse", "rel_mse",
                        "cosine", "nonfinite_rate", "mean_ess", "mean_masked_fraction", "clamped_fraction",
                        "degenerate") if c in pr.columns]
    rows = []
    for _, r in pr.iterrows():
        row = {c: (None if c in ("low", "high") and isinstance(r[c], float) and math.isnan(r[c]) else r[c])
               for c in cols}
        if "degenerate" in row:
            row["degenerate"] = "**yes**" if int(r["degenerate"]) else ""
        rows.append(row)
    note = ""
    if len(rows) > MAX_TABLE_ROWS:
        note = f"\n\n_(first {MAX_TABLE_ROWS} of {len(rows)} rows; all of them are in probe.csv)_"
        rows = rows[:MAX_TABLE_ROWS]
    legend = ("\n\nbias_norm = ‖mean estimate − ∇J‖ (± bias_norm_ci), variance = trace of the estimate's "
              "covariance, mse = bias² + variance, all against the exact on-policy gradient ∇J(θ); rel_mse = mse / "
              "‖∇J‖² (1: the MSE of a zero update). mean_masked_fraction and clamped_fraction: tokens the "
              "correction rejected, and kept tokens whose weight the clamp changed. " + DEGENERATE_RULE + ".")
    return _table(rows, cols) + note + legend


def _config_diff(ds: Dataset) -> str:
    """The config keys whose value differs from the defaults: `is-study show` for the train study,
    `is-study show study=NAME` for another study (its own section is then not all "new")."""
    if not ds.jobs:
        return "_(no .hydra/config.yaml beside this sweep.csv)_"
    flats = [j.flat_config for j in ds.jobs]
    if not any(flats):
        return "_(no .hydra/config.yaml in the run dir)_"
    studies = {f.get("study.name") for f in flats} - {None}
    base = [f"study={studies.pop()}"] if len(studies) == 1 else []
    try:
        from runner.hydra_app import app as hydra_app

        defaults = flatten(hydra_app.to_container(hydra_app.compose([])))
        if base and defaults.get("study.name") != base[0].split("=", 1)[1]:
            defaults = flatten(hydra_app.to_container(hydra_app.compose(base)))
        else:
            base = []
    except UserError as exc:
        return f"_(the defaults could not be composed: {exc})_"
    keys: dict[str, None] = {}
    for flat in flats:
        for k in flat:
            keys.setdefault(k, None)
    for k in defaults:
        keys.setdefault(k, None)
    rows = []
    many = len(ds.jobs) > 1
    # A swept config group (correction=a,b): its .name row says it all; the fields it implies are left out.
    groups = {k for k in ds.swept if "." not in k and f"{k}.name" in keys}
    for k in keys:
        if k.endswith(".description") or k in QUIET_KEYS:
            continue
        if k.split(".", 1)[0] in groups and k.split(".", 1)[1] != "name" and k not in ds.keys:
            continue
        values: dict[str, Any] = {}
        for flat in flats:
            v = flat.get(k, "(absent)")
            values.setdefault(fmt_value(v), v)
        values = list(values.values())
        default = defaults.get(k, "(absent)")
        if len(values) == 1 and fmt_value(values[0]) == fmt_value(default):
            continue
        shown = ", ".join(_fmt(v) for v in values[:8]) + (" …" if len(values) > 8 else "")
        if many:
            shown = f"{shown} (swept)" if len(values) > 1 else shown
        rows.append({"key": f"`{k}`", "default": _fmt(default), "this sweep" if many else "this run": shown})
    against = f"`is-study show {base[0]}`" if base else "`is-study show`"
    if not rows:
        return f"_(none: the defaults of {against})_"
    return f"Against the defaults ({against}):\n\n" + _table(rows)


# ----------------------------------------------------------------------------------------- figures
def _figures(ds: Dataset, filters: Sequence[str], dest: Path | None) -> list[str]:
    """Markdown image lines for the figures that apply, drawn into PATH/figures[/FILTER] if missing."""
    from analysis import figures, plots

    avail = figures.availability(ds)
    kinds = [k for k in REPORT_FIGURES if avail.get(k) is None]
    if not kinds:
        return []
    fig_dir = ds.path / "figures"
    if filters:
        fig_dir = fig_dir / re.sub(r"[^A-Za-z0-9._=,-]+", "_", "_".join(filters))
    # The default style's figures, never a paper-style PNG that an older `plot --style paper` left here.
    missing = [k for k in kinds if not (fig_dir / f"{k}.png").is_file()
               or plots.drawn_style(fig_dir / f"{k}.png") not in (None, "default")]
    note = []
    if missing:
        try:
            figures.render(ds, fig_dir, missing)
        except UserError as exc:
            note.append(f"_(figures not drawn: {exc})_\n")
    base = (dest.parent if dest is not None else Path.cwd()).resolve()
    lines = []
    for k in kinds:
        png = fig_dir / f"{k}.png"
        if not png.is_file():
            continue
        rel = Path(os.path.relpath(png.resolve(), base)).as_posix()
        lines.append(f"![{plots.TITLES[k]}]({rel})\n")
    return note + lines


# ----------------------------------------------------------------------------------------- case card
INVARIANTS = {1: "finite loss and gradient", 2: "zero gradient at rejected units"}


CASE_REPORTS = Path("runs") / "reports"  # under runs/, where `is-study run` writes and .gitignore ignores


def case_report_path(case_path: Path) -> Path:
    """Where a case file's report goes by default: runs/reports/NAME-report.md under the current
    directory, not next to the case file (which may be a shipped one, inside the package) nor loose
    in the current directory (a checkout's root, outside .gitignore)."""
    return Path.cwd() / CASE_REPORTS / f"{Path(case_path).stem}-report.md"


def _verdict(card) -> tuple[str, str]:
    """(word, sentence): BROKEN when an invariant fails, MISMATCH when the results differ from the
    file's expected ones, OK otherwise; the sentence says what was checked, and nothing more is
    claimed than was checked."""
    n = len(card.checks)
    broken_cases = {1: [c.name for c in card.checks if not c.finite],
                    2: [c.name for c in card.checks if c.rejection.status == "fail"]}
    broken = [f"invariant {k} ({INVARIANTS[k]}) fails in {', '.join(cases)}" for k, cases in broken_cases.items()
              if cases]
    checked_2 = sum(1 for c in card.checks if c.rejection.status != "n/a")
    why_na = sorted({c.rejection.reason for c in card.checks if c.rejection.status == "n/a"})
    if checked_2 == n:
        two = f"invariant 2 in all {n} cases"
    elif checked_2:
        two = f"invariant 2 in {checked_2} of {n} cases (n/a in the others: {'; '.join(why_na)})"
    else:
        two = f"invariant 2 n/a ({'; '.join(why_na)})"
    if card.expected is None:
        expected = f"not compared with expected results ({card.no_expected_reason})"
    elif card.mismatches:
        expected = f"{len(card.mismatches)} mismatch(es) with the file's expected results"
    else:
        expected = f"the file's expected results match in all {n} cases (tolerance 1e-5)"
    if broken:
        text = "; ".join(broken)
        return "BROKEN", text[0].upper() + text[1:] + f". Checked: invariant 1 in all {n} cases, {two}; {expected}."
    if card.expected is not None and card.mismatches:
        return "MISMATCH", f"Checked: invariant 1 in all {n} cases, {two}; {expected}."
    return "OK", f"Checked: invariant 1 in all {n} cases, {two}; {expected}."


def case_report(cards, overrides: list[str], shown: str | None = None) -> str:
    """The repro card's Markdown from runner.audit.case_card.CaseCard(s): one card, or a summary of every
    preset of the file's expect: list followed by each preset's card. `shown` is the path or name the
    user gave (default: the file's path)."""
    if not isinstance(cards, (list, tuple)):
        cards = [cards]
    if len(cards) == 1:
        return _one_card(cards[0], overrides, shown, level=1)
    name = Path(shown or cards[0].path).name
    parts = [f"# Repro cards: `{name}`, every preset of its `expect:` list\n",
             f"{len(cards)} presets, each under the overrides of its expect entry; a card per preset follows. "
             f"`is-study report {shown or cards[0].path} correction=PRESET` gives one.\n"]
    rows = []
    for card in cards:
        word, _ = _verdict(card)
        broken = [k for k in (1, 2) if any((not c.finite) if k == 1 else c.rejection.status == "fail"
                                           for c in card.checks)]
        rows.append({"preset": f"`{card.preset}`", "verdict": f"**{word}**",
                     "faithful": "yes" if card.correction.get("faithful") else "no",
                     "invariants broken": ", ".join(str(k) for k in broken) or "none",
                     "expected results": ("—" if card.expected is None else
                                          ("match" if not card.mismatches else f"{len(card.mismatches)} mismatch(es)"))})
    parts.append(_table(rows) + "\n")
    counts = Counter(_verdict(c)[0] for c in cards)
    parts.append("Summary: " + ", ".join(f"{n} {w}" for w, n in counts.items()) + ". BROKEN on a faithful preset "
                 "whose expected results match is the released code's behaviour, reproduced.\n")
    for card in cards:
        parts.append(_one_card(card, overrides, shown, level=2))
    return "\n".join(parts).rstrip() + "\n"


def _one_card(card, overrides: list[str], shown: str | None, level: int) -> str:
    h = "#" * level
    sub = "#" * (level + 1)
    corr_cfg, loss_cfg = card.correction, card.loss
    title = f"Repro card: `{Path(shown or card.path).name}` under correction={card.preset}"
    parts = [f"{h} {title if level == 1 else f'correction={card.preset}'}\n"]
    word, sentence = _verdict(card)
    parts.append(f"**Verdict: {word}.** {sentence}\n")
    if card.expected is not None and card.mismatches:
        parts.append(f"**{len(card.mismatches)} mismatch(es) with the file's expected results** (tolerance 1e-5): "
                     + "; ".join(str(m) for m in card.mismatches[:5]) + ".\n")
    elif card.expected is not None and word == "BROKEN":
        parts.append("The actual results match the file's expected results (tolerance 1e-5): the reported behaviour "
                     "is reproduced.\n")

    shown_path = shown or str(card.path)
    card_overrides = list(getattr(card, "overrides", None) or overrides)
    parts.append(f"{sub} Command\n")
    parts.append("```bash\n" + " ".join(["is-study", "case", shown_path, *card_overrides]) + "\n```\n")

    parts.append(f"{sub} Setup\n")
    band = f"[{_fmt(corr_cfg.get('low'))}, {_fmt(corr_cfg.get('high'))}]"
    setup = [
        {"": "correction", "value": f"`{card.preset}`" + (" (faithful reproduction)" if corr_cfg.get("faithful") else "")},
        {"": "what it computes", "value": corr_cfg.get("description", "")},
        {"": "band [low, high]", "value": band + (f", veto {_fmt(corr_cfg.get('veto'))}"
                                                  if corr_cfg.get("veto") is not None else "")},
        {"": "loss", "value": f"`{loss_cfg.get('name')}`, reduction {loss_cfg.get('reduction')}"},
    ]
    parts.append(_table(setup) + "\n")

    parts.append(f"{sub} Inputs\n")
    parts.append("Per token: the trainer's log-probs under θ (`log_probs`), at rollout time (`old_log_probs`), "
                 "the engine's (`rollout_log_probs`), the advantage and the action mask; log-ratio = old − roll.\n")
    for case in card.cases:
        parts.append(f"**{case.name}**\n")
        parts.append(_inputs_table(case) + "\n")

    parts.append(f"{sub} Expected vs actual\n")
    parts.append(_expect_table(card.results, card.expected, card.mismatches) + "\n")

    parts.append(f"{sub} Invariants\n")
    parts.append(_table([_invariant_row(c, r) for c, r in zip(card.checks, card.results)]) + "\n")
    parts.append("1: the loss and d loss / d log_probs are finite (NaN or ±inf is the bug). "
                 "2: a unit the correction rejects contributes exactly zero gradient (not 0·inf = NaN).\n")
    return "\n".join(parts).rstrip() + "\n"


def _invariant_row(check, result: dict) -> dict:
    if check.finite:
        one = "✓"
    else:
        one = f"✗ loss {_fmt(result['loss'])}" + ("" if check.inputs_finite else " (the inputs hold NaN/inf)")
    rejection = check.rejection
    if rejection.status == "n/a":
        two = f"n/a ({rejection.reason})"
    elif rejection.status == "fail":
        two = f"✗ {rejection.reason}"
    else:
        n = rejection.rejected
        two = f"✓ ({n} rejected token{'s' if n != 1 else ''}, gradient 0)"
    return {"case": check.name, f"1 {INVARIANTS[1]}": one, f"2 {INVARIANTS[2]}": two}


def _inputs_table(case) -> str:
    rows = []
    B = len(case.log_probs)
    for b in range(B):
        for t in range(len(case.log_probs[b])):
            row = {"seq": b} if B > 1 else {}
            old, roll = case.old_log_probs[b][t], case.rollout_log_probs[b][t]
            row.update({"t": t, "log_probs": case.log_probs[b][t], "old_log_probs": old, "rollout_log_probs": roll,
                        "advantages": case.advantages[b][t], "action_mask": case.action_mask[b][t],
                        "log-ratio": old - roll if math.isfinite(old) and math.isfinite(roll) else float("nan")})
            # Full precision (the shortest repr that round-trips): the card must reproduce the case.
            rows.append({k: _exact(v) if isinstance(v, float) else v for k, v in row.items()})
    return _table(rows)


def _exact(v: float) -> str:
    if not math.isfinite(v):
        return _fmt(v)
    return str(int(v)) if v == int(v) and abs(v) < 1e15 else repr(v)


def _expect_table(results: list[dict], expected: list | None, mismatches) -> str:
    bad = {(m.case, m.field.split("[")[0]) for m in mismatches}
    rows = []
    for i, res in enumerate(results):
        exp = expected[i] if expected is not None and i < len(expected) else {}
        for field in ("loss", "grad"):
            row = {"case": res["name"], "field": field if field == "loss" else "d loss / d log_probs",
                   "expected": _fmt(_num(exp[field]), 7) if field in exp else "—", "actual": _fmt(_num(res[field]), 7)}
            if field in exp:
                row["match"] = "✗" if (res["name"], field) in bad else "✓"
            else:
                row["match"] = "—"
            rows.append(row)
        rows.append({"case": res["name"], "field": "finite", "expected": "—",
                     "actual": "yes" if res["finite"] else "**NO**", "match": "—"})
    return _table(rows, ["case", "field", "expected", "actual", "match"])


def _num(v: Any) -> Any:
    """Case-file numbers may be the strings 'nan' / 'inf' / '-inf'."""
    if isinstance(v, list):
        return [_num(x) for x in v]
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return v
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v
