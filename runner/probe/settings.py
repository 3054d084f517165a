"""The `probe:` config section (conf/study/probe.yaml), validated, and the arms it selects.

An *arm* is one preset with one band: the unit the probe reports on (one CSV row). Every check
here raises a one-line `UserError`, and the study runs them all before it writes any file.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import yaml

from runner.config_checks import as_choice, as_float, as_int, check_keys
from runner.core.corrections import Correction
from runner.core.losses import REDUCTIONS
from runner.errors import UserError

KEYS = (
    "reference_rollouts",
    "pretrain_steps",
    "repeats",
    "batch_size",
    "presets",
    "bands",
    "baseline",
    "reduction",
    "ci",
    "ci_level",
    "n_boot",
    "drift_lr",
    "threads",
)
BASELINES = ("rloo", "group-mean", "none")
CIS = ("bootstrap", "clt")
LOSSES = ("ppo", "reinforce")  # at lp = old both give the gradient −coef·A·∇lp per token


@dataclass(frozen=True)
class Arm:
    """One preset × band: the correction with the band applied, and what the CSV row says."""

    preset: str
    correction: Correction
    low: float | None
    high: float | None

    @property
    def faithful(self) -> bool:
        return self.correction.faithful


@dataclass(frozen=True)
class ProbeSettings:
    pretrain_steps: int
    repeats: int
    batch_size: int | None  # rollouts per batch; None = rollout.batch_size × rollout.group_size
    presets: tuple[Correction, ...]
    bands: tuple[tuple[float | None, float | None], ...] | None  # None = each preset's own band
    baseline: str
    reduction: str
    ci: str
    ci_level: float
    n_boot: int
    drift_lr: float | None  # None = train.lr
    reference_rollouts: int  # rollouts of the Monte Carlo reference gradient, where the world has no exact one
    threads: int | None  # torch intra-op threads while probing; None leaves torch's setting

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | None) -> ProbeSettings:
        s = "probe"
        if not isinstance(cfg, Mapping):
            raise UserError("probe: the section is missing (use study=probe)")
        check_keys(s, cfg, KEYS)
        batch = cfg.get("batch_size")
        drift_lr = cfg.get("drift_lr")
        threads = cfg.get("threads")
        return cls(
            pretrain_steps=as_int(s, cfg, "pretrain_steps", low=0, default=0),
            repeats=as_int(s, cfg, "repeats", low=2),
            batch_size=None if batch is None else as_int(s, cfg, "batch_size", low=2),
            presets=_presets(cfg.get("presets")),
            bands=_bands(cfg.get("bands")),
            baseline=as_choice(s, cfg, "baseline", BASELINES, default="rloo"),
            reduction=as_choice(s, cfg, "reduction", REDUCTIONS, default="seq-mean-token-sum"),
            ci=as_choice(s, cfg, "ci", CIS, default="bootstrap"),
            ci_level=_ci_level(cfg),
            n_boot=as_int(s, cfg, "n_boot", low=100, default=1000),
            drift_lr=None if drift_lr is None else as_float(s, cfg, "drift_lr", low=0.0, low_open=True),
            threads=None if threads is None else as_int(s, cfg, "threads", low=1),
            reference_rollouts=as_int(s, cfg, "reference_rollouts", low=4, default=4096),
        )

    def arms(self) -> list[Arm]:
        """Presets in order, each with every band (or its own band when `bands` is null)."""
        out = []
        for corr in self.presets:
            bands = self.bands if self.bands is not None else ((corr.low, corr.high),)
            for low, high in bands:
                out.append(Arm(corr.name, corr.with_band(low, high), low, high))
        return out


def _ci_level(cfg: Mapping[str, Any]) -> float:
    level = as_float("probe", cfg, "ci_level", low=0.0, low_open=True, default=0.95)
    if level >= 1:
        raise UserError(f"probe.ci_level must be in (0, 1), got {level:g}")
    return level


def default_preset_names() -> list[str]:
    """Every preset: ours, then the faithful reproductions of every framework (registry order).
    The fast path evaluates each preset once for all its bands, so all 22 cost about what 13 did."""
    from runner import registry

    return registry.own_presets() + registry.faithful_presets()


def load_preset(name: str) -> Correction:
    """A preset by name, read from conf/correction/NAME.yaml (what `correction=NAME` composes)."""
    from runner import registry

    valid = registry.group_options("correction")
    if name not in valid:
        raise UserError(f"probe.presets: unknown preset {name!r}; valid: {', '.join(valid)}")
    data = yaml.safe_load((registry.conf_dir() / "correction" / f"{name}.yaml").read_text(encoding="utf-8"))
    return Correction.from_config(data)


def _inline_preset(entry: Mapping[str, Any]) -> Correction:
    """{preset: BASE (optional), name: LABEL, <any Correction field>: value}: a point of the algebra
    that ships as no preset, e.g. untruncated sequence IS {name: seq-is, weight: sequence}."""
    entry = dict(entry)
    base = entry.pop("preset", None)
    if "name" not in entry or not isinstance(entry["name"], str) or not entry["name"]:
        raise UserError("probe.presets: an inline correction needs a `name` (its label in probe.csv)")
    fields = {}
    if base is not None:
        if not isinstance(base, str):
            raise UserError(f"probe.presets: `preset` must be a preset name, got {base!r}")
        fields = asdict(load_preset(base))
    fields.update(entry)
    return Correction.from_config(fields)


def _presets(value: Any) -> tuple[Correction, ...]:
    if value is None:
        return tuple(load_preset(n) for n in default_preset_names())
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        raise UserError(f"probe.presets must be a non-empty list of preset names (or null), got {value!r}")
    out = []
    for entry in value:
        if isinstance(entry, str):
            out.append(load_preset(entry))
        elif isinstance(entry, Mapping):
            out.append(_inline_preset(entry))
        else:
            raise UserError(f"probe.presets: {entry!r} is neither a preset name nor an inline correction")
    names = [c.name for c in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise UserError(f"probe.presets: {', '.join(dupes)} listed more than once")
    return tuple(out)


def _bound(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise UserError(f"probe.bands: {where} must be a number or null, got {value!r}")
    if value < 0:
        raise UserError(f"probe.bands: {where} must be non-negative, got {value:g}")
    return float(value)


def _bands(value: Any) -> tuple[tuple[float | None, float | None], ...] | None:
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not value:
        raise UserError(f"probe.bands must be a non-empty list of [low, high] pairs (or null), got {value!r}")
    out = []
    for band in value:
        if not isinstance(band, (list, tuple)) or len(band) != 2:
            raise UserError(f"probe.bands: {band!r} is not a [low, high] pair")
        low, high = _bound(band[0], f"low of {list(band)}"), _bound(band[1], f"high of {list(band)}")
        if low is not None and high is not None and low > high:
            raise UserError(f"probe.bands: low > high in [{low:g}, {high:g}]")
        out.append((low, high))
    return tuple(out)
