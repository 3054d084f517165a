"""Geometry checks of a drawn matplotlib Figure: what a reader of a paper would see as broken.

`problems(fig)` draws the figure (Agg, constrained layout solved) and lists, in words:
- text outside the figure (clipped titles, labels, legend entries);
- panel titles that overlap each other or the figure's title, axis labels that overlap each other;
- x tick labels of one panel that touch each other, and y tick labels likewise;
- tick labels below 0 on a panel whose data cannot be negative (`nonnegative` axes);
- more than `max_rows` rows of panels, or a width other than `widths` (inches).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def _bbox(artist, renderer):
    if not artist.get_visible() or not artist.get_text().strip():
        return None
    return artist.get_window_extent(renderer)


def ticklabels(ax, axis: str) -> list:
    """The tick labels matplotlib draws: those of ticks inside the view (the locator also makes
    labels for ticks beyond the limits, which are never drawn)."""
    import numpy as np

    # Compared on the axis's own scale: on a log axis spanning 16 decades a linear tolerance of
    # 1e-9 × the span would count 1e-11 as inside [5e-9, 8e7].
    scale = (ax.xaxis if axis == "x" else ax.yaxis).get_transform().transform
    lo, hi = sorted(float(x) for x in scale(np.asarray(ax.get_xlim() if axis == "x" else ax.get_ylim(), dtype=float)))
    labels = ax.get_xticklabels() if axis == "x" else ax.get_yticklabels()
    out = []
    span = (hi - lo) or 1.0
    for t in labels:
        raw = t.get_position()[0 if axis == "x" else 1]
        with np.errstate(all="ignore"):
            v = float(scale(np.asarray([raw], dtype=float))[0])
        if np.isfinite(v) and lo - 1e-9 * span <= v <= hi + 1e-9 * span:
            out.append(t)
    return out


def _overlap(a, b, slack: float = 0.5) -> bool:
    return a.x0 < b.x1 - slack and b.x0 < a.x1 - slack and a.y0 < b.y1 - slack and b.y0 < a.y1 - slack


def _overlapping(named_texts, renderer) -> list[tuple[str, str]]:
    """The pairs of (name, text) whose drawn boxes overlap."""
    boxes = [(n, b) for n, b in ((n, _bbox(t, renderer)) for n, t in named_texts) if b is not None]
    return [(na, nb) for i, (na, a) in enumerate(boxes) for nb, b in boxes[i + 1 :] if _overlap(a, b)]


def visible_axes(fig) -> list:
    return [ax for ax in fig.axes if ax.get_visible()]


def panel_rows(fig) -> int:
    """Rows of panels: distinct vertical positions of the visible axes."""
    return len({round(ax.get_position().y0, 3) for ax in visible_axes(fig)})


def draw(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def problems(fig, widths: Sequence[float] | None = None, max_rows: int | None = None) -> list[str]:
    renderer = draw(fig)
    out = []
    W, H = fig.bbox.width, fig.bbox.height
    if widths is not None and not any(abs(fig.get_figwidth() - w) < 1e-6 for w in widths):
        out.append(f"width {fig.get_figwidth():.2f} in, not one of {list(widths)}")
    if max_rows is not None and panel_rows(fig) > max_rows:
        out.append(f"{panel_rows(fig)} rows of panels (at most {max_rows})")
    texts = []
    if fig._suptitle is not None:
        texts.append(("figure title", fig._suptitle))
    for i, ax in enumerate(visible_axes(fig)):
        texts += [
            (f"panel {i} title", ax.title),
            (f"panel {i} x label", ax.xaxis.label),
            (f"panel {i} y label", ax.yaxis.label),
        ]
        texts += [(f"panel {i} x tick {t.get_text()!r}", t) for t in ticklabels(ax, "x")]
        texts += [(f"panel {i} y tick {t.get_text()!r}", t) for t in ticklabels(ax, "y")]
        texts += [(f"panel {i} note", t) for t in ax.texts]
    for leg in fig.legends:
        texts += [(f"legend {t.get_text()!r}", t) for t in leg.get_texts()]
    for name, t in texts:
        b = _bbox(t, renderer)
        if b is not None and (b.x0 < -1 or b.y0 < -1 or b.x1 > W + 1 or b.y1 > H + 1):
            out.append(f"{name} is clipped by the figure's edge")
    labels = [
        (f"panel {i} {w} label", a.label)
        for i, ax in enumerate(visible_axes(fig))
        for w, a in (("x", ax.xaxis), ("y", ax.yaxis))
    ]
    out += [f"the {a} and the {b} overlap" for a, b in _overlapping(labels, renderer)]
    titles = [(f"panel {i}", ax.title) for i, ax in enumerate(visible_axes(fig))]
    if fig._suptitle is not None:
        titles.append(("figure title", fig._suptitle))
    out += [f"the titles of {a} and {b} overlap" for a, b in _overlapping(titles, renderer)]
    for i, ax in enumerate(visible_axes(fig)):
        for axis, labels in (("x", ticklabels(ax, "x")), ("y", ticklabels(ax, "y"))):
            boxes = [b for b in (_bbox(t, renderer) for t in labels) if b is not None]
            for j in range(len(boxes)):
                for k in range(j + 1, len(boxes)):
                    if _overlap(boxes[j], boxes[k], slack=0.0 if axis == "x" else 0.5):
                        out.append(
                            f"panel {i}: {axis} tick labels "
                            f"{labels[j].get_text()!r} and {labels[k].get_text()!r} overlap"
                        )
    return out


def negative_ticks(fig, axes: Iterable) -> list[str]:
    """Tick labels below 0 on these axes (their quantity cannot be negative)."""
    draw(fig)
    out = []
    for ax in axes:
        for t in ticklabels(ax, "y"):
            text = t.get_text().replace("\u2212", "-").strip()
            if t.get_visible() and text.startswith("-") and text.lstrip("-").replace(".", "").isdigit():
                out.append(f"{ax.get_ylabel()!r}: tick {text}")
    return out
