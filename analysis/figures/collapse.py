"""The figures of collapses: survival (the fraction of seeds not yet collapsed against step, with ESS
and grad norm aligned on each collapse below) and length-heatmap (final J and the collapse rate per
cell of a train sweep over T × correction).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from analysis import style as st
from analysis.figures.facets import facets, seed_count
from analysis.figures.layout import (
    TITLES,
    Grid,
    finish_kind,
    fit,
    floor_at_zero,
    join_notes,
    legend_for,
    line_kwargs,
    mark_events,
    never_learned_note,
    new_figure,
    ordered,
    seeds_text,
    step_label,
    style_label,
)
from analysis.load import Dataset, fmt_value
from analysis.tables import per_job, update_rows

LENGTH_KEYS = ("rollout.seq_len",)


def job_lengths(ds: Dataset) -> dict[int, float]:
    """{job: response length T}: the rollout.seq_len override, else the run's config."""
    out = {}
    for j in ds.jobs:
        v = j.value("rollout.seq_len")
        if v is not None:
            out[j.index] = float(v)
    if not out and ds.metrics is not None and "rollout.seq_len" in ds.metrics.columns:  # a bare sweep.csv
        firsts = ds.metrics.drop_duplicates("job")
        out = {int(j): float(t) for j, t in zip(firsts["job"], firsts["rollout.seq_len"]) if t == t}
    return out


# ----------------------------------------------------------------------------------------- survival
LEAD_STEPS = 20  # how far before a collapse the lead–lag panels look
LAG_STEPS = 5  # and how far after (a run stopped by NaN parameters has nothing after)
REASON_WORDS = (("non-finite parameters", "NaN parameters"), ("objective", "J drop"), ("grad_norm", "grad-norm spike"))


def collapse_kind(reason) -> str:
    """summary.json's collapse_reason in two words (its rule: runner/training/faults.py)."""
    text = str(reason or "")
    return next((word for key, word in REASON_WORDS if key in text), "other")


def survival_curve(event_steps, last_steps, horizon: float) -> tuple[list[float], list[float], list[float]]:
    """Kaplan–Meier: the fraction not yet collapsed after each step, as (x, y) for a steps-post line
    from (0, 1) to the horizon, and the steps where a run ended early without collapsing (censored:
    it counts as at risk up to its last step and not after). event_steps: the collapse step or NaN."""
    events = np.asarray(event_steps, dtype=float)
    last = np.asarray(last_steps, dtype=float)
    xs, ys, s = [0.0], [1.0], 1.0
    for t in sorted(set(events[np.isfinite(events)])):
        at_risk = int(((events >= t) | (~np.isfinite(events) & (last >= t))).sum())
        s *= 1 - int((events == t).sum()) / at_risk
        xs.append(t)
        ys.append(s)
    xs.append(max(horizon, xs[-1]))
    ys.append(s)
    censored = sorted(last[~np.isfinite(events) & (last < horizon)].tolist())
    return xs, ys, censored


def _horizon(ds: Dataset, last_steps) -> float:
    planned = [j.value("train.steps") for j in ds.jobs]
    planned = [float(p) - 1 for p in planned if isinstance(p, (int, float))]
    return max([*planned, *(float(x) for x in last_steps)])


def survival_figure(ds: Dataset, style: str = "default"):
    with st.using(style):
        return _survival(ds, style)


def _survival(ds: Dataset, style: str):
    from matplotlib.lines import Line2D

    paper = style == "paper"
    df = update_rows(ds.metrics)  # the final row (J only) is no update
    per = per_job(ds)
    per["last_step"] = per["job"].map(df.groupby("job")["step"].max())
    per["event"] = per["collapse_step"].astype(float).where(per["collapsed"] == 1)
    collapsed = per[per["event"].notna()]
    lead = not collapsed.empty
    n_metrics = 3 if lead else 1
    fs = facets(ds, df, limit=Grid.capacity(style, n_metrics))
    names = ordered(per["correction"].unique())
    grid = Grid(len(fs), n_metrics, style, sharex=False)
    horizon = _horizon(ds, per["last_step"])
    n_censored = 0
    for f, facet in enumerate(fs):
        sub = per[per["job"].isin(facet.jobs)]
        ax = grid.ax(f, 0)
        for name in names:
            cur = sub[sub["correction"] == name]
            if cur.empty:
                continue
            xs, ys, censored = survival_curve(cur["event"], cur["last_step"], horizon)
            ax.plot(xs, ys, drawstyle="steps-post", **line_kwargs(name))
            if censored:
                n_censored += len(censored)
                level = [ys[max(i for i, x in enumerate(xs) if x <= c)] for c in censored]
                ax.plot(
                    censored,
                    level,
                    linestyle="none",
                    marker="|",
                    markersize=7,
                    color=st.look(name).color,
                    gid="censored",
                )
        ax.set_ylim(-0.03, 1.05)
        ax.set_xlim(0, horizon)
        if f:
            ax.sharex(grid.ax(0, 0))
    for ax in grid.metric_axes(0):
        for line in ax.get_lines():
            line.set_clip_on(False)  # a line at 1 or 0 sits on the axis, not under it
    reasons: dict[str, int] = {}
    if lead:
        _lead_lag(ds, grid, fs, names, per, paper)
        for r in collapsed["collapse_reason"]:
            reasons[collapse_kind(r)] = reasons.get(collapse_kind(r), 0) + 1
    low, high = seed_count(
        per.assign(_facet=per["job"].map({j: i for i, fc in enumerate(fs) for j in fc.jobs})), ("_facet", "correction")
    )
    ylabels = [style_label(style, f"not yet collapsed (fraction of {seeds_text(low, high)})", "not collapsed (frac.)")]
    xlabels = [step_label(style)]
    if lead:
        ylabels += [
            style_label(style, "ESS (fraction of tokens)", "ESS (frac.)"),
            style_label(style, r"gradient norm $\|\nabla_\theta L\|_2$ (unclipped)", r"$\|\nabla_\theta L\|$"),
        ]
        xlabels += [style_label(style, "steps relative to the collapse step", "steps from collapse")] * 2
    grid.label(xlabels, ylabels, fs)
    extra = []
    if lead:
        extra.append((Line2D([], [], color="0.4", linestyle="--", linewidth=0.9), "collapse step (x = 0)"))
        if any(ln.get_gid() == "runs" for ax in grid.fig.axes for ln in ax.get_lines()):
            extra.append((Line2D([], [], color="0.5", linewidth=0.6, alpha=0.6), "one collapsed seed (thin)"))
        if any(ln.get_gid() == "events" for ax in grid.fig.axes for ln in ax.get_lines()):
            extra.append(
                (
                    Line2D([], [], linestyle="none", marker="|", color="0.25", markersize=6),
                    "NaN/inf gradient (top edge)",
                )
            )
    if n_censored:
        extra.append(
            (
                Line2D([], [], linestyle="none", marker="|", color="0.25", markersize=7),
                "run ended early without collapse (censored)",
            )
        )
    handles, labels = legend_for(names, extra=extra)
    # The count beside each name: a curve at 1 can hide under another, its label cannot.
    counts = per.groupby("correction")["event"].agg(["count", "size"])
    labels = [
        f"{lab}: {counts.loc[lab, 'count']}/{counts.loc[lab, 'size']} collapsed" if lab in names else lab
        for lab in labels
    ]
    what = (
        (
            "lead–lag: per correction, the median over its collapsed seeds; "
            f"{len(collapsed)} collapse{'s' if len(collapsed) != 1 else ''} ("
            + ", ".join(f"{w} {n}" for w, n in sorted(reasons.items()))
            + ")"
        )
        if lead
        else ("no run collapsed: no lead–lag panels")
    )
    return grid.finish(TITLES["survival"], ds, handles, labels, join_notes(what, never_learned_note(per), fs.note))


def _lead_lag(ds: Dataset, grid, fs, names, per, paper: bool) -> None:
    """ESS and grad norm against (step − collapse step), per correction: the median over its
    collapsed runs, each run thin beneath when there are several."""
    df = update_rows(ds.metrics)  # the final row (J only) is no update
    n_upd = int(df["update"].max()) + 1 if "update" in df.columns else 1
    event = dict(zip(per["job"], per["event"]))
    rows = df[df["job"].map(event).notna()]
    x = rows["step"] + (rows["update"] / n_upd if "update" in rows.columns else 0) - rows["job"].map(event)
    weights_ok = np.isfinite(rows["is_weight_mean"].astype(float)) if "is_weight_mean" in rows.columns else True
    gn = rows["grad_norm"].astype(float)
    frame = rows.assign(
        x=x.round(6),
        ess=rows["ess"].where(weights_ok) if "ess" in rows.columns else np.nan,
        gn=gn.where(np.isfinite(gn) & (gn > 0)),
        bad=~np.isfinite(gn),
    )
    frame = frame[(frame["x"] >= -LEAD_STEPS) & (frame["x"] < LAG_STEPS + 1)]
    for f, facet in enumerate(fs):
        sub = frame[frame["job"].isin(facet.jobs)]
        for m, metric in ((1, "ess"), (2, "gn")):
            ax = grid.ax(f, m)
            if f or m == 2:
                ax.sharex(grid.ax(0, 1))
            ax.axvline(0.0, color="0.4", linestyle="--", linewidth=0.9, gid="collapse-line", zorder=1)
            if sub.empty:
                ax.text(
                    0.5,
                    0.5,
                    "no collapse",
                    transform=ax.transAxes,
                    ha="center",
                    va="center",
                    fontsize="small",
                    color="0.35",
                    gid="note",
                )
            for row, name in enumerate(n for n in names if n in set(sub["correction"])):
                cur = sub[sub["correction"] == name]
                table = cur.pivot_table(index="x", columns="job", values=metric, aggfunc="mean", dropna=False)
                kw = line_kwargs(name)
                if table.shape[1] > 1:
                    for job in table.columns:
                        ax.plot(table.index, table[job], color=kw["color"], linewidth=0.5, alpha=0.45, gid="runs")
                values = table.to_numpy(dtype=float)
                median = np.full(len(table), np.nan)
                some = np.isfinite(values).any(axis=1)  # a step where every run's value is undefined: a gap
                median[some] = np.nanmedian(values[some], axis=1)
                ax.plot(
                    table.index,
                    median,
                    linewidth=1.0 if paper else 1.4,
                    marker="o",
                    markersize=1.8 if paper else 2.5,
                    **kw,
                )
                bad = np.sort(cur.loc[cur["bad"], "x"].unique())
                if metric == "gn" and len(bad):
                    mark_events(ax, bad, kw["color"], 0.965 - 0.04 * row)
        grid.ax(f, 2).set_yscale("log")
    if len(frame):  # the steps some collapse has data for, within the window
        grid.ax(0, 1).set_xlim(float(frame["x"].min()) - 0.5, max(float(frame["x"].max()), 0.0) + 0.5)
    ess_axes = grid.metric_axes(1)
    floor_at_zero(ess_axes, top_if_zero=1.0, ceiling=1.03)
    for ax in ess_axes:
        lo, hi = ax.get_ylim()
        ax.set_ylim(lo, max(hi, min(1.03, hi * 1.05)))


# ----------------------------------------------------------------------------------------- length heatmap
def length_heatmap_figure(ds: Dataset, style: str = "default"):
    with st.using(style):
        return _length_heatmap(ds, style)


def length_cells(ds: Dataset, facet_jobs: Sequence[int] | None = None, per=None):
    """One row per (correction, T): seeds, final_J (mean over the seeds whose J is defined), undefined
    (seeds that ended with NaN parameters), collapsed and never_learned (counts), from summary.json
    via per_job (`per`: its table, when the caller has it)."""
    per = per_job(ds) if per is None else per
    # A run that ended with NaN parameters has no final J (per_job's falls back to the last finite one)
    per = per.assign(
        T=per["job"].map(job_lengths(ds)), final_objective=per["final_objective"].where(per["nonfinite_params"] != 1)
    )
    if facet_jobs is not None:
        per = per[per["job"].isin(facet_jobs)]
    seeds = "seed" if "seed" in per.columns else "job"
    cells = (
        per.groupby(["correction", "T"])
        .agg(
            seeds=(seeds, "nunique"),
            final_J=("final_objective", "mean"),
            undefined=("final_objective", lambda s: int(s.isna().sum())),
            collapsed=("collapsed", lambda s: int((s == 1).sum())),
            never_learned=("learned", lambda s: int((s == 0).sum())),
        )
        .reset_index()
    )
    return cells


def _length_heatmap(ds: Dataset, style: str):
    from matplotlib import colormaps

    paper = style == "paper"
    per = per_job(ds)
    lengths = job_lengths(ds)
    fs = facets(ds, ds.metrics, exclude=LENGTH_KEYS, limit=st.PAPER_MAX_ROWS if paper else 4)
    names = ordered(per["correction"].unique())
    Ts = sorted(set(lengths.values()))
    n_c, n_t = len(names), len(Ts)
    row_h = max(n_c * (0.16 if paper else 0.3) + (0.45 if paper else 0.7), 1.1 if paper else 1.8)
    width = st.PAPER_DOUBLE_WIDTH if paper else 2 * max(0.62 * n_t + 0.8, 3.0) + 2.6
    fig = new_figure((width, row_h * len(fs)), style)
    axes = fig.subplots(len(fs), 2, squeeze=False)
    all_cells = [length_cells(ds, fc.jobs, per) for fc in fs]
    finals = np.concatenate([c["final_J"].to_numpy(dtype=float) for c in all_cells])
    finals = finals[np.isfinite(finals)]
    j_lo, j_hi = (float(finals.min()), float(finals.max())) if len(finals) else (0.0, 1.0)
    if j_hi - j_lo < 1e-9:
        j_lo, j_hi = j_lo - 0.05, j_hi + 0.05
    images = {}
    cell_in = (fig.get_figwidth() - (1.8 if paper else 4.4)) / 2 / n_t  # inches a cell is wide
    annotate = cell_in >= (0.26 if paper else 0.34)
    flat_marked = nan_marked = 0
    digits = max(2, 1 - math.floor(math.log10(max(j_hi - j_lo, 1e-9))))  # enough to tell the colours apart
    for f, cells in enumerate(all_cells):
        grid_j = np.full((n_c, n_t), np.nan)
        grid_c = np.full((n_c, n_t), np.nan)
        text_c: dict[tuple[int, int], str] = {}
        text_j: dict[tuple[int, int], str] = {}
        for _, r in cells.iterrows():
            i, t = names.index(str(r["correction"])), Ts.index(float(r["T"]))
            grid_j[i, t] = r["final_J"]
            grid_c[i, t] = r["collapsed"] / r["seeds"] if r["seeds"] else np.nan
            dagger = "†" if r["never_learned"] and not r["collapsed"] else ""
            flat_marked += bool(dagger)
            text_c[(i, t)] = f"{int(r['collapsed'])}/{int(r['seeds'])}{dagger}"
            some_nan = 0 < r["undefined"] < r["seeds"]
            nan_marked += bool(some_nan)
            text_j[(i, t)] = (
                "NaN" if r["undefined"] == r["seeds"] else f"{r['final_J']:.{digits}f}" + ("‡" if some_nan else "")
            )
        for p, (grid, cmap, lo, hi) in enumerate(((grid_j, "viridis", j_lo, j_hi), (grid_c, "OrRd", 0.0, 1.0))):
            ax = axes[f][p]
            # a cell without a value (no J: NaN parameters) is grey, not the axes' white
            im = ax.imshow(
                np.ma.masked_invalid(grid),
                cmap=colormaps[cmap].with_extremes(bad="0.85"),
                vmin=lo,
                vmax=hi,
                aspect="auto",
                interpolation="nearest",
            )
            im.set_gid("final-J" if p == 0 else "collapse")
            images.setdefault(p, []).append((im, ax))
            if annotate:
                for i in range(n_c):
                    for t in range(n_t):
                        v = grid[i, t]
                        words = (text_j if p == 0 else text_c).get((i, t), "—")
                        shade = im.cmap(im.norm(v)) if np.isfinite(v) else (0.85, 0.85, 0.85, 1)
                        dark = 0.299 * shade[0] + 0.587 * shade[1] + 0.114 * shade[2] < 0.5
                        ax.text(
                            t,
                            i,
                            words,
                            ha="center",
                            va="center",
                            fontsize=5.5 if paper else 7.5,
                            color="white" if dark else "black",
                            gid="cell",
                        )
            ax.set_xticks(range(n_t), [fmt_value(int(t) if float(t).is_integer() else t) for t in Ts])
            ax.set_yticks(range(n_c), names if p == 0 else [""] * n_c)
            ax.tick_params(axis="both", length=0)
            ax.grid(False)
            for spine in ax.spines.values():
                spine.set_visible(False)
            if p == 0:
                for tick, name in zip(ax.get_yticklabels(), names):
                    tick.set_color(st.look(name).color)
            if f == len(fs) - 1:
                ax.set_xlabel(style_label(style, r"response length $T$ (tokens)", r"response length $T$"))
            if fs[f].label:
                ax.set_title(fit(fs[f].title(style), cell_in * n_t, paper), fontsize="medium", loc="left")
    labels = (
        style_label(style, "final J (mean over seeds)", "final J"),
        style_label(style, "collapse rate (fraction of seeds)", "collapsed (frac.)"),
    )
    for p, entries in images.items():
        cbar = fig.colorbar(
            entries[0][0], ax=[ax for _, ax in entries], shrink=0.95, aspect=18 if paper else 14, pad=0.02
        )
        cbar.set_label(labels[p])
        cbar.ax.tick_params(labelsize=6 if paper else 8)
    per_T = per.assign(T=per["job"].map(lengths))
    low, high = seed_count(per_T, ("correction", "T"))
    notes = [f"cells: final J (mean over {seeds_text(low, high)}) and collapsed / seeds"]
    if flat_marked:
        notes.append("†: no collapse, but some seed never learned (J never rose above its start)")
    if nan_marked:
        notes.append("‡: mean over the seeds whose parameters stayed finite (NaN: none did)")
    if "objective_se" in ds.metrics.columns and ds.metrics["objective_se"].astype(float).gt(0).any():
        evaluated = ds.metrics.dropna(subset=["objective_se"])
        se = float(evaluated.groupby("job")["objective_se"].last().astype(float).median())
        notes.append(f"J by Monte Carlo (s.e. ≈ {se:.2g} per run)")
    notes.append("the task, and so J's scale, changes with T: compare corrections within a column")
    return finish_kind(fig, "length-heatmap", ds, [], [], paper, join_notes(*notes, fs.note), legend_below=True)
