"""A sweep's small multiples: the swept keys other than the correction and the seed make one panel
(`Facet`) per combination; when a figure holds fewer panels than there are, it keeps those where the
arms differ most (`arm_spread`, `keep_differing`) or differ from each other (`keep_distinct`), drops
flat ones (`drop_flat`) and names the others in a note. Also the seed counts behind a line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from analysis.load import Dataset, fmt_value

MAX_FACETS = 12
SEED_KEYS = ("seed",)
CORRECTION_KEYS = ("correction",)


# ----------------------------------------------------------------------------------------- facets
@dataclass
class Facet:
    label: str  # "" for the single facet of a run
    jobs: list[int]
    items: list[tuple[str, object]] = field(default_factory=list)  # (key, value) pairs

    def title(self, style: str) -> str:
        """The panel title; the paper style names a key by its last part (staleness=8)."""
        if style != "paper":
            return self.label
        return ", ".join(f"{k.rsplit('.', 1)[-1]}={fmt_value(v)}" for k, v in self.items)


class Facets(list):
    """The facets drawn; `total` counts them all (at most `limit` are drawn). `left_out` and `why`:
    the facets a figure chose not to draw (see `keep_differing` and `drop_flat`), and why, in words."""

    total: int = 0
    left_out: list = []
    why: str = ""
    flat: list = []
    flat_why: str = ""

    @property
    def note(self) -> str:
        parts = []
        if self.flat:
            parts.append(f"{_count(len(self.flat), 'panel')} left out, {self.flat_why}: {_facet_list(self.flat)}")
        if self.left_out:
            parts.append(
                f"{len(self)} of {self.total} panels drawn, {self.why}; left out: {_facet_list(self.left_out)}"
            )
        elif self.total > len(self) + len(self.flat):
            parts.append(f"first {len(self)} of {self.total} panels")
        return " · ".join(parts)


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def _facet_list(fs: Sequence[Facet], most: int = 8) -> str:
    """'band=loose, staleness=0; band=mid, staleness=0' (keys by their last part), or 'the other 23'
    when there are more than `most`."""
    names = [f.title("paper") or "the only panel" for f in fs]
    return "; ".join(names) if len(names) <= most else f"the other {len(names)}"


def _copy_facets(fs: Facets, keep: Sequence[int]) -> Facets:
    out = Facets(fs[i] for i in keep)
    out.total, out.left_out, out.why, out.flat, out.flat_why = (
        fs.total,
        list(fs.left_out),
        fs.why,
        list(fs.flat),
        fs.flat_why,
    )
    return out


def arm_spread(
    frame, fs: Sequence[Facet], cols: Sequence[str], arm: str = "correction", x: str = "step"
) -> list[float]:
    """Per facet, how far apart its arms are: the largest gap, at any x, between two arms' means over
    seeds, as a fraction of that metric's range over the whole figure (the largest over `cols`).
    0 for a facet with one arm."""
    facet_of = {j: i for i, fc in enumerate(fs) for j in fc.jobs}
    framed = frame.assign(_facet=frame["job"].map(facet_of)).dropna(subset=["_facet"])
    means = framed.groupby(["_facet", arm, x], sort=False)[list(cols)].mean()
    gaps = means.groupby(level=["_facet", x]).agg(lambda s: s.max() - s.min()).groupby(level="_facet").max()
    out = np.zeros(len(fs))
    for col in cols:
        span = float(means[col].max() - means[col].min())
        if span > 0 and np.isfinite(span):
            for f, gap in gaps[col].items():
                if np.isfinite(gap):
                    out[int(f)] = max(out[int(f)], float(gap) / span)
    return out.tolist()


def keep_differing(
    fs: Facets, scores: Sequence[float], limit: int, arms: str = "corrections", what: str = ""
) -> Facets:
    """At most `limit` facets: the ones whose arms differ most (`scores`, from arm_spread), in their
    order; the note names the others and how close their arms are."""
    if len(fs) <= limit:
        return fs
    order = sorted(range(len(fs)), key=lambda i: (-scores[i], i))
    if any(scores):  # a cut never spends a panel on arms that coincide while others differ
        order = [i for i in order if scores[i] > 0] + [i for i in order if scores[i] <= 0]
        limit = min(limit, sum(1 for v in scores if v > 0))
    keep, drop = sorted(order[:limit]), sorted(order[limit:])
    out = _copy_facets(fs, keep)
    out.left_out = [fs[i] for i in drop]
    worst = max(scores[i] for i in drop)
    out.why = f"those where the {arms} differ most{' in ' + what if what else ''} (elsewhere their lines " + (
        "coincide)" if worst == 0 else f"are within {percent_text(worst)} of the axis of each other)"
    )
    return out


def keep_distinct(fs: Facets, profiles: Sequence[Sequence[float]], limit: int, what: str = "") -> Facets:
    """At most `limit` facets, for panels of one line each (nothing to compare within a panel): the
    ones most unlike each other. The first is the one with the largest first value (e.g. the largest
    KL), then each next the farthest from those kept (every value scaled by its range over the facets)."""
    if len(fs) <= limit:
        return fs
    p = np.asarray(profiles, dtype=float)
    span = np.ptp(p, axis=0)
    p = (p - p.min(axis=0)) / np.where(span > 0, span, 1.0)
    keep = [int(np.argmax(p[:, 0]))]
    while len(keep) < limit:
        dist = np.min(np.linalg.norm(p[:, None, :] - p[None, keep, :], axis=2), axis=1)
        dist[keep] = -1
        keep.append(int(np.argmax(dist)))
    keep = sorted(keep)
    out = _copy_facets(fs, keep)
    out.left_out = [fc for i, fc in enumerate(fs) if i not in keep]
    out.why = f"the ones most unlike each other{' ' + what if what else ''}"
    return out


def percent_text(fraction: float) -> str:
    pct = 100 * float(fraction)
    return "0" if pct == 0 else f"{pct:.2g}%" if pct < 10 else f"{pct:.0f}%"


def drop_flat(fs: Facets, flat: Sequence[bool], why: str) -> Facets:
    """The facets that show something: those marked `flat` are named in one line of the note
    instead of drawn (unless every facet is flat: then they stay, and say it themselves)."""
    if not any(flat) or all(flat):
        return fs
    out = _copy_facets(fs, [i for i, f in enumerate(flat) if not f])
    out.flat = [fc for fc, f in zip(fs, flat) if f]
    out.flat_why = why
    return out


def facets(
    ds: Dataset, frame, exclude: Sequence[str] = (), limit: int | None = MAX_FACETS, by_correction: bool = False
) -> Facets:
    """One facet per combination of the swept keys other than seed and `exclude`, and other than the
    correction unless `by_correction` (a figure whose lines are something else, e.g. precision)."""
    skip = set(SEED_KEYS) | set(exclude) | (set() if by_correction else set(CORRECTION_KEYS))
    keys = [k for k in ds.swept if k not in skip and k in frame.columns]
    out = Facets()
    if not keys:
        out.append(Facet("", sorted(frame["job"].unique().tolist())))
    else:
        per = frame.drop_duplicates("job")[["job", *keys]]
        for values, grp in per.groupby(keys, sort=True, dropna=False):
            values = values if isinstance(values, tuple) else (values,)
            label = ", ".join(f"{k}={fmt_value(v)}" for k, v in zip(keys, values))
            out.append(Facet(label, grp["job"].tolist(), list(zip(keys, values))))
    out.total = len(out)
    if limit is not None:
        del out[limit:]
    return out


def seed_counts(frame, fs: Sequence[Facet] = (), by: Sequence[str] = ()) -> tuple[int, int]:
    """(fewest, most) seeds behind one drawn line (or point): distinct seed values per facet,
    correction and `by`, not jobs (two jobs of one seed that differ in a key pooled into one line
    are one seed)."""
    if "job" not in frame.columns or "correction" not in frame.columns:
        return 0, 0
    facet_of = {j: i for i, fc in enumerate(fs) for j in fc.jobs}
    col = "seed" if "seed" in frame.columns else "job"
    per = (
        frame.assign(_facet=frame["job"].map(facet_of).fillna(-1)).groupby(["_facet", "correction", *by])[col].nunique()
    )
    if per.empty:
        return 0, 0
    return int(per.min()), int(per.max())


# ----------------------------------------------------------------------------------------- per-facet statistics
def facet_bands(per_job, fs: Sequence[Facet], x: str, ys: Sequence[str]) -> dict:
    """{(facet, correction): DataFrame x, <y>_mean, <y>_std, <y>_count} across the facet's jobs,
    in one groupby (a 100-job sweep has hundreds of (facet, correction) lines)."""
    facet_of = {j: i for i, fc in enumerate(fs) for j in fc.jobs}
    frame = per_job.assign(_facet=per_job["job"].map(facet_of))
    stats = frame.groupby(["_facet", "correction", x], sort=True)[list(ys)].agg(["mean", "std", "count"])
    stats.columns = [f"{a}_{b}" for a, b in stats.columns]
    stats = stats.reset_index()
    for y in ys:
        stats[f"{y}_std"] = stats[f"{y}_std"].fillna(0.0)
    return {(int(f), str(c)): g for (f, c), g in stats.groupby(["_facet", "correction"], sort=False)}


def seed_count(frame, by: Sequence[str]) -> tuple[int, int]:
    """(fewest, most) seeds behind one line: distinct seeds per `by` group (jobs where no seed column)."""
    col = "seed" if "seed" in frame.columns else "job"
    per = frame.groupby(list(by))[col].nunique()
    return (int(per.min()), int(per.max())) if len(per) else (0, 0)
