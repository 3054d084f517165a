"""Colours, line styles and the two figure styles (`default`, `paper`) shared by every figure.

The same correction always looks the same, in every figure and every run: the map is fixed over all
preset names in `runner.registry` order (not over whatever a given sweep happens to contain).

- our own presets: the Okabe–Ito palette (colour-blind safe), solid lines, round markers;
- the faithful reproductions: Paul Tol's "muted" palette (fixed by hand in FAITHFUL_COLORS, so a
  variant never looks like the preset of ours it is compared with), with one line style and one
  marker per framework (OpenRLHF bc71bb1 dashed, OpenRLHF 0.11 dash-dot, TRL dotted, verl
  dash-dot-dot), so two presets that share a colour never share a line style;
- any other name (an inline probe arm, an external loss): a colour picked by a stable hash from
  Tol's "bright" palette, with a loosely dotted line.

Every other dimension has its own palette, never a correction's: its values are ordered
(staleness k, precision by mantissa bits, a noise level), so each takes a sequential colour ramp,
staleness cividis (navy to khaki) and anything else magma (black-purple to red). Green is never
both "k = 8" in one figure and "seq-mask-tis" in the next.

matplotlib is imported only inside the functions that need it.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

# Okabe & Ito (2008), without yellow (too light on white).
OKABE_ITO = {
    "black": "#000000",
    "orange": "#E69F00",
    "sky": "#56B4E9",
    "green": "#009E73",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "purple": "#CC79A7",
}
OURS_ORDER = ("black", "orange", "sky", "green", "blue", "vermillion", "purple")
# Paul Tol's muted scheme (https://personal.sron.nl/~pault/), without the pale grey.
TOL_MUTED = ("#CC6677", "#332288", "#117733", "#882255", "#44AA99", "#999933", "#AA4499", "#88CCEE", "#DDCC77")
TOL_BRIGHT = ("#4477AA", "#EE6677", "#228833", "#CCBB44", "#66CCEE", "#AA3377", "#BBBBBB")

FRAMEWORK_STYLE = {  # prefix of a faithful preset's name -> (line style, marker)
    "openrlhf-bc71bb1": ("--", "s"),
    "openrlhf-0.11": ("-.", "D"),
    "trl": (":", "^"),
    "verl": ((0, (5, 1.5, 1, 1.5, 1, 1.5)), "v"),
}

# The sequential ramps of the non-correction dimensions: matplotlib colormaps sampled over a range
# that stays dark enough for a line on white.
DIMENSION_RAMPS = {"staleness": ("cividis", 0.0, 0.72), "other": ("magma", 0.12, 0.5)}
PRECISION_ORDER = ("fp32", "fp16", "bf16", "fp8")  # most to fewest mantissa bits
FP32_GREY = "#7f7f7f"

EVENT_COLOR = "#D55E00"

# The faithful presets of today, by hand: a variant never shares a hue family with the preset of
# ours it is compared with most (openrlhf-bc71bb1/seq-mask-tis is rose, the fixed seq-mask-tis
# green). Faithful presets added later take the muted palette in registry order.
FAITHFUL_COLORS = {
    "openrlhf-bc71bb1/tis": "#332288",  # indigo (tis: orange)
    "openrlhf-bc71bb1/icepop": "#882255",  # wine (icepop: sky blue)
    "openrlhf-bc71bb1/seq-mask-tis": "#CC6677",  # rose (seq-mask-tis: green)
    "openrlhf-0.11/token-clip": "#999933",  # olive
    "openrlhf-0.11/token-mask": "#332288",  # indigo
    "openrlhf-0.11/seq-mask": "#AA4499",  # purple
    "trl/token-truncate": "#882255",
    "trl/token-mask": "#999933",
    "trl/sequence-truncate": "#CC6677",
    "trl/sequence-mask": "#44AA99",  # teal
    "verl/token-tis": "#44AA99",
    "verl/icepop": "#AA4499",
    "verl/seq-tis": "#882255",
    "verl/seq-mis": "#332288",
    "verl/geo-rs": "#999933",
}


@dataclass(frozen=True)
class Look:
    color: str
    linestyle: object
    marker: str


@lru_cache(maxsize=1)
def _registry_looks() -> dict[str, Look]:
    try:
        from runner import registry

        entries = [(e.name, e.faithful) for e in registry.presets()]
    except Exception:  # noqa: BLE001 - a figure must not fail because conf/ is unreadable
        entries = []
    looks: dict[str, Look] = {}
    ours = [n for n, f in entries if not f]
    faithful = [n for n, f in entries if f]
    for i, name in enumerate(ours):
        looks[name] = Look(OKABE_ITO[OURS_ORDER[i % len(OURS_ORDER)]], "-", "o")
    for i, name in enumerate(faithful):
        ls, marker = next((v for k, v in FRAMEWORK_STYLE.items() if name.startswith(k + "/")), (":", "P"))
        looks[name] = Look(FAITHFUL_COLORS.get(name, TOL_MUTED[i % len(TOL_MUTED)]), ls, marker)
    return looks


def look(name: str) -> Look:
    """The colour, line style and marker of a correction preset (any name gives a stable answer)."""
    name = str(name)
    known = _registry_looks().get(name)
    if known is not None:
        return known
    h = zlib.crc32(name.encode("utf-8"))
    return Look(TOL_BRIGHT[h % len(TOL_BRIGHT)], (0, (1, 1)), "X")


def preset_rank(name: str) -> tuple[int, str]:
    """Sort key: registry order first, unknown names after, alphabetically."""
    order = list(_registry_looks())
    return (order.index(name), "") if name in order else (len(order), str(name))


def _ramp(name: str, n: int) -> list[str]:
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    cmap, lo, hi = DIMENSION_RAMPS[name]
    if n <= 1:
        return [to_hex(colormaps[cmap](lo))]
    return [to_hex(colormaps[cmap](lo + (hi - lo) * i / (n - 1))) for i in range(n)]


def dimension_family(key: str) -> str:
    return "staleness" if "staleness" in str(key) else "other"


def dimension_colors(key: str, values) -> dict:
    """{value: colour} for the values of a swept key that is not the correction, from the key's own
    ramp, in the values' order (precision: by mantissa bits)."""
    values = list(dict.fromkeys(values))
    if "precision" in str(key) and all(str(v) in PRECISION_ORDER for v in values):
        # A precision keeps its colour from figure to figure (bf16 in an mlp sweep of three precisions is
        # the bf16 of a transformer sweep of two): one ramp over every precision, picked by its place.
        # The engine's low precisions span the ramp (adjacent steps of a 4-step ramp are too alike);
        # an fp32 engine, the no-mismatch reference, is grey.
        low = PRECISION_ORDER[1:]
        ramp = dict(zip(low, _ramp(dimension_family(key), len(low))))
        order = sorted(values, key=lambda v: PRECISION_ORDER.index(str(v)))
        return {v: ramp.get(str(v), FP32_GREY) for v in order}
    return dict(zip(values, _ramp(dimension_family(key), len(values))))


def group_color(i: int, n: int = 4, key: str = "") -> str:
    """The i-th of n colours of a non-correction grouping (by default the generic ramp)."""
    return _ramp(dimension_family(key), max(n, i + 1))[i]


def correction_colors() -> set[str]:
    """Every colour a correction can take (known presets and the fallback for other names)."""
    return {lk.color.upper() for lk in _registry_looks().values()} | {c.upper() for c in TOL_BRIGHT}


# ----------------------------------------------------------------------------------------- styles
STYLES = ("default", "paper")

_BASE = {
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.6,
    "legend.frameon": False,
    # No bbox="tight": constrained layout already fits the titles and the outside legend, and
    # "tight" would draw every figure twice.
    "pdf.fonttype": 42,  # TrueType in the PDF: editable text, accepted by every LaTeX toolchain
    "ps.fonttype": 42,
    "svg.fonttype": "none",
    "figure.dpi": 100,
    "savefig.dpi": 150,
}

_DEFAULT = {
    **_BASE,
    "font.size": 9.5,
    "axes.titlesize": 10,
    "axes.labelsize": 9.5,
    "legend.fontsize": 8.5,
    "xtick.labelsize": 8.5,
    "ytick.labelsize": 8.5,
    "figure.titlesize": 11,
    "lines.linewidth": 1.5,
}

# Single-column figures for a two-column paper (≈3.3 in wide), 8 pt text like a LaTeX caption.
# STIX (shipped with matplotlib) is a Times face, as in the NeurIPS / ICML / IEEE / ACM templates,
# with matching maths and every glyph the labels use (×, ±, ρ, ‖); no TeX installation (no usetex).
_PAPER = {
    **_BASE,
    "font.family": "STIXGeneral",
    "mathtext.fontset": "stix",
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "legend.fontsize": 6.5,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "figure.titlesize": 8,
    "lines.linewidth": 1.1,
    "lines.markersize": 4,
    "axes.linewidth": 0.6,
    "xtick.major.width": 0.6,
    "ytick.major.width": 0.6,
    "xtick.major.size": 2.5,
    "ytick.major.size": 2.5,
}

PAPER_WIDTH = 3.3  # inches: one column of a two-column paper
PAPER_DOUBLE_WIDTH = 7.0  # inches: both columns (a figure* in LaTeX)
PAPER_WIDTHS = (PAPER_WIDTH, PAPER_DOUBLE_WIDTH)
PAPER_MAX_ROWS = 3  # rows of panels in a paper figure
PAPER_MAX_COLS = 4  # panels side by side at the double-column width
DEFAULT_PANEL = (3.6, 2.6)  # inches per panel in the default style (one facet: a little larger)


def rc(style: str) -> dict:
    if style not in STYLES:
        from runner.errors import UserError

        raise UserError(f"unknown --style {style!r}; valid: {', '.join(STYLES)}")
    return dict(_PAPER if style == "paper" else _DEFAULT)


@contextlib.contextmanager
def using(style: str) -> Iterator[None]:
    """rcParams for `style`, for both building and saving a figure (fonts are resolved at draw)."""
    import logging

    import matplotlib

    # cmr10 lacks a few glyphs that DejaVu has; matplotlib falls back per glyph and says so loudly.
    logger = logging.getLogger("matplotlib.font_manager")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with matplotlib.rc_context(rc(style)):
            yield
    finally:
        logger.setLevel(level)
