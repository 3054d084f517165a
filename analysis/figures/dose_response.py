"""The dose-response figure: what a run's measured mismatch per sequence does to it, plain PPO against a
correction. A train sweep over the response length T (and any engine precisions): the dose is the measured
T·k3, the mean over updates of metrics.csv's per-token kl_k3 times T (nats per response, as the field quotes
it), and the responses are the final J and the collapse rate. One line per correction and precision joins its
means over seeds in the order of T, so the effect of a longer response is read along the line and the effect
of the correction between lines at the same dose. Tabulated by `dose_table`, drawn by `dose_response_figure`.
"""

from __future__ import annotations

import math

import numpy as np

from analysis import style as st
from analysis.figures.collapse import job_lengths
from analysis.figures.layout import finish_kind, join_notes, new_figure, ordered, seeds_text, style_label
from analysis.load import Dataset
from analysis.tables import per_job, update_rows

PRECISION_LINES = {"fp32": ":", "fp16": "-.", "bf16": "-", "fp8": "--"}


def dose_table(ds: Dataset):
    """One row per (correction, precision, T): seeds, dose (mean T·k3 over seeds), dose_lo / dose_hi (its range
    over seeds), final_J (mean over seeds of summary.json's final J) with final_J_sd, collapsed (seeds that
    collapsed) and collapse_rate."""
    import pandas as pd

    per = per_job(ds)
    lengths = job_lengths(ds)
    kl = update_rows(ds.metrics).groupby("job")["kl_k3"].mean()
    per = per.assign(T=per["job"].map(lengths), kl=per["job"].map(kl))
    if "precision" not in per.columns:
        per["precision"] = "bf16"
    per["dose"] = per["kl"] * per["T"]
    rows = []
    for (name, precision, t), cur in per.groupby(["correction", "precision", "T"], sort=True):
        j = cur["final_objective"].astype(float)
        rows.append(
            {
                "correction": name,
                "precision": precision,
                "T": int(t),
                "seeds": len(cur),
                "dose": float(cur["dose"].mean()),
                "dose_lo": float(cur["dose"].min()),
                "dose_hi": float(cur["dose"].max()),
                "final_J": float(j.mean()),
                "final_J_sd": float(j.std(ddof=1)) if len(j) > 1 else math.nan,
                "collapsed": int((cur["collapsed"] == 1).sum()),
            }
        )
    table = pd.DataFrame(rows)
    table["collapse_rate"] = table["collapsed"] / table["seeds"]
    return table


def dose_response_figure(ds: Dataset, style: str = "default"):
    with st.using(style):
        return _dose_response(ds, style)


def _dose_response(ds: Dataset, style: str):
    from matplotlib.lines import Line2D

    paper = style == "paper"
    table = dose_table(ds)
    fig = new_figure((3.3, 4.4) if paper else (10.0, 4.2), style)
    axes = fig.subplots(2, 1, sharex=True) if paper else fig.subplots(1, 2, sharex=True)
    names = ordered(table["correction"].unique())
    precisions = [p for p in PRECISION_LINES if p in set(table["precision"])]
    for name in names:
        look = st.look(name)
        for precision in precisions:
            cur = table[(table["correction"] == name) & (table["precision"] == precision)].sort_values("T")
            if cur.empty:
                continue
            ls = PRECISION_LINES[precision]
            xerr = np.vstack([cur["dose"] - cur["dose_lo"], cur["dose_hi"] - cur["dose"]])
            axes[0].errorbar(
                cur["dose"],
                cur["final_J"],
                yerr=cur["final_J_sd"].fillna(0),
                xerr=xerr,
                color=look.color,
                linestyle=ls,
                marker=look.marker or "o",
                markersize=4,
                capsize=2,
                linewidth=1.3,
                gid="series",
            )
            axes[1].plot(
                cur["dose"],
                cur["collapse_rate"],
                color=look.color,
                linestyle=ls,
                marker=look.marker or "o",
                gid="series",
            )
            if name == names[0]:
                for _, r in cur.iterrows():
                    axes[0].annotate(
                        f"T={r['T']}",
                        (r["dose"], r["final_J"]),
                        textcoords="offset points",
                        xytext=(4, -10),
                        fontsize=5.5 if paper else 7,
                        color="0.35",
                    )
    for ax in axes:
        ax.set_xscale("log")
    axes[0].set_ylabel(style_label(style, "final J (mean ± 1 s.d. over seeds)", "final J"))
    axes[1].set_ylabel(style_label(style, "collapse rate (fraction of seeds)", "collapsed (frac.)"))
    axes[1].set_ylim(-0.03, 1.05)
    for ax in axes[-1:] if paper else axes:
        ax.set_xlabel(style_label(style, r"measured $T\cdot k_3$ (nats per response)", r"$T\cdot k_3$ (nats)"))
    handles = [Line2D([], [], color=st.look(n).color, marker=st.look(n).marker or "o", linestyle="-") for n in names]
    labels = list(names)
    handles += [Line2D([], [], color="0.3", linestyle=PRECISION_LINES[p]) for p in precisions]
    labels += [f"{p} engine" for p in precisions]
    low, high = int(table["seeds"].min()), int(table["seeds"].max())
    notes = [
        f"a point per correction, precision and T: mean over {seeds_text(low, high)} (bars: J ± 1 s.d., the dose's "
        "range over seeds)",
        "the task's k scales with T, so J's scale changes along a line: compare corrections at the same T",
    ]
    if table["collapsed"].sum() == 0:
        notes.append(f"no run collapsed (0 of {int(table['seeds'].sum())})")
    return finish_kind(fig, "dose-response", ds, handles, labels, paper, join_notes(*notes))
