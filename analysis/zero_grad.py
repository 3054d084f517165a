"""Updates whose gradient is exactly 0, for every figure that plots a run over time.

Where every advantage of a batch is 0 (one reward for the whole group), or a correction rejects every token,
the gradient is exactly 0 and θ does not move: the ESS is then 1 and the grad norm 0, which look like health
but say nothing about stability. The figures shade those stretches (`shade`), and the aggregate figures name
the fraction of such updates (`note`). No torch; matplotlib only through the axes passed in.
"""

from __future__ import annotations

import numpy as np

LABEL = "every run's gradient exactly 0 (θ not moving)"
ALPHA = 0.10
HATCH = "////"  # hatched, so a stretch never reads as a line's shaded seed band


def stretches(x, zero) -> list[tuple[float, float]]:
    """Contiguous stretches of True in `zero` (ordered by x) as [start, end) spans: each point covers up to the
    next one (the last, the median spacing)."""
    x = np.asarray(x, dtype=float)
    zero = np.asarray(zero, dtype=bool)
    order = np.argsort(x, kind="stable")
    x, zero = x[order], zero[order]
    if not zero.any():
        return []
    step = float(np.median(np.diff(x))) if len(x) > 1 else 1.0
    ends = np.append(x[1:], x[-1] + step)
    spans, start = [], None
    for i, z in enumerate(zero):
        if z and start is None:
            start = x[i]
        if start is not None and (not z or i == len(zero) - 1):
            spans.append((float(start), float(ends[i] if z else x[i])))
            start = None
    return spans


def frozen(frame, x: str = "x"):
    """Per value of x, whether every run (job) in `frame` has an exactly-zero gradient there (a NaN norm is
    not a zero gradient)."""
    zero = frame["grad_norm"].astype(float) == 0
    return zero.groupby(frame[x]).all()


def shade(ax, frame, color, x: str = "x") -> bool:
    """Shade, in `color`, the stretches of x where every run of `frame` (job, grad_norm, x) has an exactly-zero
    gradient; True when something was shaded (for a legend entry)."""
    if frame is None or len(frame) == 0 or "grad_norm" not in frame.columns:
        return False
    flags = frozen(frame, x)
    spans = stretches(flags.index.to_numpy(), flags.to_numpy())
    for lo, hi in spans:
        ax.axvspan(
            lo,
            hi,
            facecolor=_rgba(color, ALPHA),
            edgecolor=_rgba(color, 3 * ALPHA),
            hatch=HATCH,
            linewidth=0,
            zorder=0,
            gid="zero-grad",
        )
    return bool(spans)


def note(frame, by=("correction",), at_least: float = 0.0) -> str:
    """'gradient exactly 0 in: geo-mask k=16 96%, …' over the groups `by` of a metrics frame whose fraction of
    exactly-zero updates is above `at_least`; '' when there is none."""
    cols = [c for c in by if c in frame.columns]
    if "grad_norm" not in frame.columns or not cols:
        return ""
    zero = (frame["grad_norm"].astype(float) == 0).groupby([frame[c] for c in cols]).mean()
    parts = []
    for key, share in zero.items():
        if share > at_least:
            key = key if isinstance(key, tuple) else (key,)
            label = " ".join(("k=" if c == "staleness" else "") + str(v) for c, v in zip(cols, key))
            parts.append(f"{label} {100 * share:.0f}%" if share >= 0.095 else f"{label} {100 * share:.1g}%")
    return ("gradient exactly 0 (θ not moving) in: " + ", ".join(parts) + " of updates") if parts else ""


def handle():
    """(legend handle, label) for the shading, in a neutral grey."""
    from matplotlib.patches import Patch

    return Patch(facecolor=_rgba("0.5", ALPHA), edgecolor=_rgba("0.5", 3 * ALPHA), hatch=HATCH, linewidth=0), LABEL


def _rgba(color, alpha: float):
    """The colour with this alpha (the hatch takes the edge colour's, so it is set on the colours, not the patch)."""
    from matplotlib.colors import to_rgba

    return to_rgba(color, alpha)
