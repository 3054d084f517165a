"""`is-study report DIR [OVERRIDES]`: the Markdown report of a run dir, a sweep dir or a probe dir.

The verdict per correction, the command that produced the data (from `.hydra/overrides.yaml`, or
the sweep's `multirun.yaml`), the config's differences from the defaults (the default config, which
the CLI composes and hands here as plain data, against the run's `.hydra/config.yaml`), a results
table, for a train sweep over precision, staleness or correction the peak-to-final drop of J per
cell (mean over seeds, seed count, worst seed), and the key figures embedded by relative path (drawn
into PATH/figures/ when missing).
OVERRIDES filter the jobs of a sweep (`correction=tis mismatch.staleness=0,8`).

~650 lines in one module on purpose: one report, read top to bottom in the order of its sections.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from analysis.load import Dataset, flatten, fmt_value, load_dataset
from analysis.provenance import QUIET_KEYS, command
from analysis.reports import destination, fmt, table
from analysis.tables import DEGENERATE_RULE, per_job, probe_frame
from runner.errors import UserError

MAX_TABLE_ROWS = 120
REPORT_FIGURES = (
    "training",
    "threshold-training",
    "stability",
    "survival",
    "length-heatmap",
    "presets",
    "threshold",
    "bias-split",
    "mismatch",
    "mismatch-over-training",
    "grad-norm",
    "masking",
)


# ----------------------------------------------------------------------------------------- entry
def load(path: str, overrides: Sequence[str] = ()) -> Dataset:
    """The run, sweep or probe dir (or sweep.csv) at `path`, its jobs filtered by `overrides`."""
    return load_dataset(Path(path)).select(list(overrides))


def studies(ds: Dataset) -> set[str]:
    """The studies the dataset's jobs ran (study.name in their saved config): whose default config
    its config diff compares against."""
    return {f.get("study.name") for f in (j.flat_config for j in ds.jobs) if f} - {None}


def build(
    ds: Dataset, overrides: Sequence[str] = (), out: str | None = None, defaults: dict[str, Any] | str | None = None
) -> tuple[str, Path | None]:
    """The report of a loaded run, sweep or probe dir: (the Markdown, where it goes: a file path, or
    None for stdout). `defaults` is the default config as plain data (runner.hydra_app.app.
    default_configs: "" → the default, NAME → study=NAME's, for the studies of `studies(ds)`), or
    the reason it could not be composed."""
    dest = destination(out, ds.path / "report.md")
    return dataset_report(ds, overrides, dest, defaults), dest


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
def dataset_report(
    ds: Dataset, filters: Sequence[str] = (), dest: Path | None = None, defaults: dict[str, Any] | str | None = None
) -> str:
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
    parts.append(_config_diff(ds, defaults) + "\n")

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
        parts.append(
            f"**never learned** (J never rose above its start{at})"
            if flat == n
            else f"**never learned in {flat} of {n} {word}** (J never rose above its start{at})"
        )
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
            line = (
                f"**{events} nonfinite event{'s' if events != 1 else ''}** "
                f"({int((bad['nonfinite'] * bad['updates']).round().sum())} updates with a NaN/inf loss or "
                f"gradient, {int(bad['skipped'].sum())} skipped) in {len(bad)} of {n} {word}, first at step {first}"
            )
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
    return (
        f"final J(θ) {means.min():.3f} to {means.max():.3f} across {len(means)} cells; worst at "
        f"{_cell_words(facet_keys, worst)}: {_mean_sd(members['final_objective'])}"
    )


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
            row.update(
                {
                    "seed": fmt_value(j.value("seed")),
                    "staleness": fmt_value(g["staleness"].iloc[0]),
                    "updates": int(g["updates"].iloc[0]),
                }
            )
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
    legend = (
        "\n\nJ(θ) is the exact expected reward of the policy (0–1); mean ± s.d. over the "
        + word
        + " where there are several. final J(θ): J after the last update (summary.json's final_objective, the "
        "last J of metrics.csv and sweep.csv). NaN/inf events count NaN/inf losses and gradients (events.csv). "
        "learned: "
        "runs whose J rose above its start (a flat run neither learned nor collapsed)."
    )
    return table(rows) + note + legend


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
        return (
            PRECISION_ORDER.index(p) if p in PRECISION_ORDER else len(PRECISION_ORDER),
            p,
            sort_key(key[1]),
            preset_rank(str(key[2])),
            [sort_key(x) for x in key[3:]],
        )

    rows, worst_mean = [], None
    seeds = "seed" if "seed" in per.columns else "job"
    for key, g in sorted(per.groupby([*DROP_CELL, *others], sort=False, dropna=False), key=order):
        row = {k: fmt_value(v) for k, v in zip((*DROP_CELL, *others), key)}
        row["seeds"] = int(g[seeds].nunique())
        finite = g[np.isfinite(g["drop"])]
        # Peak and final over the same runs, so that the drop is their difference; a cell where every run
        # ended with NaN parameters still shows how high J got before.
        row["peak J"] = (
            _mean_sd(finite["best_objective"]) if len(finite) else _mean_sd(g["best_objective"]) + " (before NaN)"
        )
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
            row["J s.e."] = fmt(float(g["se"].mean()), 2)
        rows.append(row)
    note = ""
    if len(rows) > MAX_TABLE_ROWS:
        note = f"\n\n_(first {MAX_TABLE_ROWS} of {len(rows)} rows)_"
        rows = rows[:MAX_TABLE_ROWS]
    lead = ""
    if worst_mean is not None and worst_mean[0] <= 0:
        lead = "J ended at its peak in every run that has a final J (peak − final = 0).\n\n"
    elif worst_mean is not None and worst_mean[0] < 0.0005:  # "largest drop 0.000" reads as a typo
        lead = (
            f"J ended within 0.0005 of its peak in every run that has a final J (largest mean drop "
            f"{worst_mean[0]:.1e}).\n\n"
        )
    elif worst_mean is not None:
        mean, row, n = worst_mean
        cell = ", ".join(f"{k}={row[k]}" for k in (*DROP_CELL, *others))
        lead = (
            f"Largest mean drop: **{mean:.3f}** at {cell} ({row['peak − final']} over {n} seed"
            f"{'s' if n != 1 else ''}; worst {row['worst seed']}).\n\n"
        )
    legend = (
        "\n\npeak − final: J at the run's best evaluation minus J after its last update (summary.json's "
        "peak_objective − final_objective), mean ± s.d. over the seeds (peak J too: over the runs that have a "
        "final J); "
        "worst seed: the largest drop. "
    )
    if bool(per["nan_params"].any()):
        legend += (
            "A run that ended with NaN parameters has no final J: it is left out of the drop and counted under "
            "NaN parameters. "
        )
    if se is not None:
        legend += (
            "J is a Monte Carlo estimate here (J s.e.: its standard error per evaluation): the peak of many noisy "
            "evaluations sits above the truth by about 1–2 s.e., so a drop within ~2 s.e. is noise."
        )
    return lead + table(rows) + note + legend.rstrip()


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
        return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt(v)

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
        out.append(
            f"relative MSE = MSE / ‖∇J‖² (‖∇J‖² = {fmt(float(g.iloc[0]) ** 2, 3)}"
            + (" in the first cell" if g.nunique() > 1 else "")
            + "); 1 is the MSE of a zero update. "
            + DEGENERATE_RULE[0].upper()
            + DEGENERATE_RULE[1:]
            + ": never picked as a preset's best."
        )
    ok = pr[(pr["degenerate"] == 0) & pr[mse].notna()]
    if len(ok):
        best = ok.loc[ok[mse].astype(float).idxmin()]
        out.append(
            f"lowest {'relative ' if mse == 'rel_mse' else ''}MSE of all arms that learn: **{best['preset']}** "
            f"at {_band(best.get('low'), best.get('high'))}{_where(ds, best)}: {fmt(float(best[mse]), 3)}"
        )
    for name in sorted(pr["preset"].astype(str).unique(), key=preset_rank):
        cur = pr[pr["preset"].astype(str) == name]
        nb = len(cur)
        rate = cur["nonfinite_rate"].astype(float) if "nonfinite_rate" in cur.columns else None
        if rate is None or rate.fillna(0).max() == 0:
            line = f"finite in every batch at {'all ' + str(nb) + ' bands/cells' if nb > 1 else 'its band'}"
        else:
            worst = cur.loc[rate.idxmax()]
            line = (
                f"**NaN/inf in {100 * float(worst['nonfinite_rate']):.3g}% of batches** at band "
                f"{_band(worst['low'], worst['high'])}; {int((rate > 0).sum())} of {nb} cells affected"
            )
        good = cur[(cur["degenerate"] == 0) & cur[mse].notna()]
        if len(good):
            best = good.loc[good[mse].astype(float).idxmin()]
            line += (
                f"; {'lowest ' if nb > 1 else ''}{'relative ' if mse == 'rel_mse' else ''}MSE "
                f"{fmt(float(best[mse]), 3)} at "
                f"{_band(best['low'], best['high'])}{_where(ds, best)} (bias {fmt(float(best['bias_norm']), 3)}, "
                f"variance {fmt(float(best['variance']), 3)})"
            )
        bad = cur[cur["degenerate"] == 1]
        if len(bad):
            what = _degenerate_words(bad.iloc[0])
            where = (
                f"at {_band(bad.iloc[0]['low'], bad.iloc[0]['high'])}{_where(ds, bad.iloc[0])}"
                if len(bad) == 1
                else f"at {len(bad)} of {nb} bands/cells, e.g. {_band(bad.iloc[0]['low'], bad.iloc[0]['high'])}"
                f"{_where(ds, bad.iloc[0])}"
            )
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
    pr = pr.sort_values(
        ["_rank", *facet_keys, "high"], kind="stable", key=lambda col: col if col.name == "_rank" else col.map(sort_key)
    )
    cols = [
        c
        for c in (
            "preset",
            *facet_keys,
            "low",
            "high",
            "bias_norm",
            "bias_norm_ci",
            "variance",
            "mse",
            "rel_mse",
            "cosine",
            "nonfinite_rate",
            "mean_ess",
            "mean_masked_fraction",
            "clamped_fraction",
            "degenerate",
        )
        if c in pr.columns
    ]
    rows = []
    for _, r in pr.iterrows():
        row = {
            c: (None if c in ("low", "high") and isinstance(r[c], float) and math.isnan(r[c]) else r[c]) for c in cols
        }
        if "degenerate" in row:
            row["degenerate"] = "**yes**" if int(r["degenerate"]) else ""
        rows.append(row)
    note = ""
    if len(rows) > MAX_TABLE_ROWS:
        note = f"\n\n_(first {MAX_TABLE_ROWS} of {len(rows)} rows; all of them are in probe.csv)_"
        rows = rows[:MAX_TABLE_ROWS]
    legend = (
        "\n\nbias_norm = ‖mean estimate − ∇J‖ (± bias_norm_ci), variance = trace of the estimate's "
        "covariance, mse = bias² + variance, all against the exact on-policy gradient ∇J(θ); rel_mse = mse / "
        "‖∇J‖² (1: the MSE of a zero update). mean_masked_fraction and clamped_fraction: tokens the "
        "correction rejected, and kept tokens whose weight the clamp changed. " + DEGENERATE_RULE + "."
    )
    return table(rows, cols) + note + legend


def _config_diff(ds: Dataset, configs: dict[str, Any] | str | None) -> str:
    """The config keys whose value differs from the defaults: `is-study show` for the train study,
    `is-study show study=NAME` for another study (its own section is then not all "new"). `configs`
    are the defaults as plain data (see `build`), or why they could not be composed."""
    if not ds.jobs:
        return "_(no .hydra/config.yaml beside this sweep.csv)_"
    flats = [j.flat_config for j in ds.jobs]
    if not any(flats):
        return "_(no .hydra/config.yaml in the run dir)_"
    studies = {f.get("study.name") for f in flats} - {None}
    base = [f"study={studies.pop()}"] if len(studies) == 1 else []
    if not isinstance(configs, dict):
        return f"_(the defaults could not be composed: {configs or 'none given'})_"
    defaults = flatten(configs[""])
    if base and defaults.get("study.name") != base[0].split("=", 1)[1]:
        study = base[0].split("=", 1)[1]
        if study not in configs:
            return f"_(the defaults could not be composed: no study {study!r} in conf/study/)_"
        defaults = flatten(configs[study])
    else:
        base = []
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
        shown = ", ".join(fmt(v) for v in values[:8]) + (" …" if len(values) > 8 else "")
        if many:
            shown = f"{shown} (swept)" if len(values) > 1 else shown
        rows.append({"key": f"`{k}`", "default": fmt(default), "this sweep" if many else "this run": shown})
    against = f"`is-study show {base[0]}`" if base else "`is-study show`"
    if not rows:
        return f"_(none: the defaults of {against})_"
    return f"Against the defaults ({against}):\n\n" + table(rows)


# ----------------------------------------------------------------------------------------- figures
def _figures(ds: Dataset, filters: Sequence[str], dest: Path | None) -> list[str]:
    """Markdown image lines for the figures that apply, drawn into PATH/figures[/FILTER] if missing."""
    from analysis import figures

    avail = figures.availability(ds)
    kinds = [k for k in REPORT_FIGURES if avail.get(k) is None]
    if not kinds:
        return []
    fig_dir = ds.path / "figures"
    if filters:
        fig_dir = fig_dir / re.sub(r"[^A-Za-z0-9._=,-]+", "_", "_".join(filters))
    # The default style's figures, never a paper-style PNG that an older `plot --style paper` left here.
    missing = [
        k
        for k in kinds
        if not (fig_dir / f"{k}.png").is_file()
        or figures.layout.drawn_style(fig_dir / f"{k}.png") not in (None, "default")
    ]
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
        lines.append(f"![{figures.TITLES[k]}]({rel})\n")
    return note + lines
