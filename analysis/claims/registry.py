"""The claims by name, and the worlds they run in. A claim's name is its experiment's and its figure's file
name: conf/experiment/WORLD/NAME.yaml in each world (`experiment=mlp/NAME`), and figures/WORLD/NAME.png. The
worlds are runner.worlds.registry's (the one list, which scripts/figures.sh reads too). VERDICTS.md lists
the claims in this order and the worlds in WORLDS' order. Adding a claim is one module and
one line here (and one experiment file per world)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from analysis import style as st
from analysis.claims import (
    bias_variance_by_level,
    mismatch_low_prob_tokens,
    precision_vs_algorithm,
    seed_bug_end_to_end,
    staleness_breaks_tis,
    tis_tames_mismatch,
)
from analysis.claims.stats import Verdict
from analysis.load import load_dataset
from runner.errors import UserError
from runner.worlds.registry import WORLDS as WORLD_REGISTRY

CLAIMS: dict[str, ModuleType] = {
    m.NAME: m
    for m in (
        tis_tames_mismatch,
        bias_variance_by_level,
        mismatch_low_prob_tokens,
        precision_vs_algorithm,
        staleness_breaks_tis,
        seed_bug_end_to_end,
    )
}
WORLDS = tuple(WORLD_REGISTRY)  # its names, in its order: bigram, mlp, transformer


def claim(name: str) -> ModuleType:
    """The claim's module (NAME, TITLE, SOURCE, evaluate); a one-line error naming the valid ones."""
    if name not in CLAIMS:
        raise UserError(f"unknown claim {name!r}; valid: {', '.join(CLAIMS)}")
    return CLAIMS[name]


def world(name: str) -> str:
    """A world's name, checked; a one-line error naming the valid ones."""
    if name not in WORLDS:
        raise UserError(f"unknown world {name!r}; valid: {', '.join(WORLDS)}")
    return name


# Where a setting's experiments sit: a world's own (conf/experiment/WORLD/NAME.yaml), or the world rebuilt to
# the field's regime (conf/experiment/WORLD/regime/NAME.yaml, each including experiment=WORLD/field-regime).
REGIME_FOLDER = "regime"


def experiment(name: str, in_world: str, regime: bool = False) -> str:
    """The experiment= value of claim `name` in a world: WORLD/NAME, or in the field regime WORLD/regime/NAME."""
    return f"{world(in_world)}/{REGIME_FOLDER + '/' if regime else ''}{name}"


def evaluate(name: str, path: str | Path, style: str = "default") -> tuple[Verdict, Any]:
    """(Verdict, Figure) of claim `name` on the experiment output at `path` (a sweep dir, in any world)."""
    module = claim(name)
    st.rc(style)
    ds = load_dataset(path)
    with st.using(style):
        v, fig = module.evaluate(ds, style)
    if v.n is None:  # every cell states n: by default the seeds the experiment ran (a probe: its repeats)
        v.n, v.n_unit = replicates(ds)
    return v, fig


def replicates(ds) -> tuple[int, str]:
    """(n, unit) of an experiment: its probe's repeats per arm, or the distinct seeds of its training jobs."""
    if ds.metrics is None and ds.probe is not None:
        repeats = {j.value("probe.repeats") for j in ds.jobs} - {None}
        if len(repeats) == 1:
            return int(repeats.pop()), "repeats"
    return len({j.value("seed") for j in ds.jobs} - {None}), "seeds"
