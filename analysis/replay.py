"""A replay dir (`is-study replay`) as tables: replay.csv, tokens.csv, and each replayed preset's band.

No torch, no algebra: the bands are read from the presets' YAML files, the statistics recomputed from
tokens.csv's log-ratios with pandas, for the figures (analysis/figures/replay.py) and the report
(analysis/reports/replay.py).

A preset's band is on one level's log-ratio statistic:
    token      lr_t = old − roll per token
    sequence   L_i = Σ_t lr_t over a sequence's tokens
    geometric  G_i = L_i / |y_i|
The filter's band when the preset has a filter, else the clamp's when it clamps its weight; [low, high] in ratio
space is [log low, log high] on the statistic, and an inverted filter (verl's) keeps −stat inside the band.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from runner.errors import UserError
from runner.paths import conf_dir

LEVELS = ("token", "sequence", "geometric")


def is_replay_dir(path: Path) -> bool:
    return (Path(path) / "replay.csv").is_file()


@dataclass(frozen=True)
class Band:
    preset: str
    level: str  # token | sequence | geometric
    kind: str  # filter | clamp
    low: float | None  # on the log statistic: log(low) (−inf for low = 0), None for no bound
    high: float | None
    low_ratio: float | None  # as the preset writes it
    high_ratio: float | None
    inverted: bool = False  # verl's filter keeps −stat inside [log low, log high]; low/high above are on stat

    def text(self) -> str:
        def f(v):
            return "—" if v is None else f"{v:g}"

        return f"[{f(self.low_ratio)}, {f(self.high_ratio)}]"

    def rejects(self, stat: np.ndarray) -> np.ndarray:
        """Which values of the statistic fall outside the band (NaN: outside, as the algebra rejects it)."""
        inside = np.ones(stat.shape, dtype=bool)
        if self.low is not None:
            inside &= stat >= self.low
        if self.high is not None:
            inside &= stat <= self.high
        return ~inside


def _log(v: float | None) -> float | None:
    if v is None:
        return None
    return math.log(v) if v > 0 else -math.inf


def band_of(preset: str) -> Band | None:
    """The preset's band on its level, or None (no band: none, or a preset without a filter or clamp)."""
    path = conf_dir() / "correction" / f"{preset}.yaml"
    try:
        cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    low, high = cfg.get("low"), cfg.get("high")
    if low is None and high is None:
        return None
    if cfg.get("filter", "none") != "none":
        level, kind = cfg["filter"], "filter"
    elif cfg.get("weight_op", "raw") != "raw" and cfg.get("weight", "none") != "none":
        level, kind = cfg["weight"], "clamp"
        if cfg["weight_op"] == "clamp-high":
            low = None
    else:
        return None
    lo, hi = _log(low), _log(high)
    if cfg.get("filter_inverted") and kind == "filter":
        lo, hi = (None if hi is None else -hi), (None if lo is None else -lo)
    return Band(preset, level, kind, lo, hi, low, high, bool(cfg.get("filter_inverted")) and kind == "filter")


def read_replay(path: Path) -> pd.DataFrame:
    """replay.csv with one row per step × preset (a step's mini-batch rows joined by `by_step`)."""
    try:
        replay = pd.read_csv(Path(path) / "replay.csv", keep_default_na=False, na_values=[""])
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise UserError(f"{path}/replay.csv: not readable ({exc})") from None
    return by_step(replay)


TOKEN_MEANS = ("token_masked_fraction", "clamped_fraction", "kl_k1", "kl_k3", "chi2_token")
EVENT_COUNTS = ("nonfinite_grad", "nonfinite_inputs", "nonfinite_coef")


def by_step(replay: pd.DataFrame) -> pd.DataFrame:
    """A step's mini-batch rows (`update` 0, 1, ...) as one row of the whole step: counts summed, the per-token
    means weighted by the mini-batches' tokens and seq_masked_fraction by their sequences (both exact), the
    largest max_abs_prob_diff, nonfinite_loss 1 when any mini-batch's was; ess is the mini-batches' mean (an ESS
    fraction does not add up over batches). Rows of a one-mini-batch replay come back as they are."""
    if "update" not in replay.columns or not (replay["update"] > 0).any():
        return replay
    tokens = replay["tokens"].where(replay["tokens"] > 0, 0)
    weighted = replay.assign(
        **{c: replay[c] * tokens for c in TOKEN_MEANS if c in replay},
        seq_masked_fraction=replay["seq_masked_fraction"] * replay["sequences"],
    )
    groups = weighted.groupby(["step", "preset"], sort=False)
    out = groups.first()
    sums = groups[[c for c in ("tokens", "sequences", *EVENT_COUNTS) if c in replay]].sum(min_count=1)
    out[sums.columns] = sums
    for column in (c for c in TOKEN_MEANS if c in replay):
        out[column] = groups[column].sum(min_count=1) / out["tokens"].where(out["tokens"] > 0)
    out["seq_masked_fraction"] = groups["seq_masked_fraction"].sum(min_count=1) / out["sequences"].where(
        out["sequences"] > 0
    )
    out["ess"] = groups["ess"].mean()
    out["max_abs_prob_diff"] = groups["max_abs_prob_diff"].max()
    if "nonfinite_loss" in replay:
        out["nonfinite_loss"] = groups["nonfinite_loss"].max()
    return out.reset_index().drop(columns="update")


def read_tokens(path: Path) -> pd.DataFrame | None:
    file = Path(path) / "tokens.csv"
    if not file.is_file():
        return None
    try:
        return pd.read_csv(file)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise UserError(f"{file}: not readable ({exc})") from None


def statistics(tokens: pd.DataFrame) -> dict[str, np.ndarray]:
    """Each level's statistic over the logged units: token log-ratios, and per sequence L_i and G_i."""
    lr = tokens["log_ratio"].to_numpy(dtype=float)
    per_seq = tokens.assign(lr=lr).groupby(["step", "seq"], sort=False)["lr"].agg(["sum", "size"])
    return {
        "token": lr,
        "sequence": per_seq["sum"].to_numpy(dtype=float),
        "geometric": (per_seq["sum"] / per_seq["size"]).to_numpy(dtype=float),
    }


def symmetric_band_rejecting(stat: np.ndarray, fraction: float, two_sided: bool) -> tuple[float | None, float]:
    """The band, in ratio space, that rejects `fraction` of the finite units: [e^−c, e^c] with c the
    (1 − fraction) quantile of |stat| (two-sided), or [—, e^h] with h the (1 − fraction) quantile of stat."""
    finite = stat[np.isfinite(stat)]
    if not len(finite):
        return None, math.nan
    if two_sided:
        c = float(np.quantile(np.abs(finite), 1 - fraction))
        return math.exp(-c), math.exp(c)
    return None, math.exp(float(np.quantile(finite, 1 - fraction)))
