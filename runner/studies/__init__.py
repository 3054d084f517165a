"""Studies: what `is-study run study=NAME` does inside its run dir.

A study is a function `run(cfg, run_dir) -> dict` (the summary) in its own module, named in STUDIES
as "module:function" and imported only when chosen, so importing this package stays cheap (no
torch). A study module may also define `validate(cfg)`, run before anything is written. Adding a
study is one line in STUDIES and one file.
"""

from __future__ import annotations

import pathlib
import sys
from typing import Any

from runner.lookup import LazyRegistry

STUDIES = LazyRegistry(
    "study.name",
    {
        "train": "runner.studies.train:run",
        "probe": "runner.studies.probe:run",
    },
)


def plain_config(cfg: Any) -> dict:
    """A composed config's sections as plain values, each resolved on its own (Hydra's own node, whose
    run-time values are not set inside a study, is left out): what the studies' loaders take."""
    from omegaconf import OmegaConf

    return {
        key: OmegaConf.to_container(cfg[key], resolve=True) if OmegaConf.is_config(cfg[key]) else cfg[key]
        for key in cfg
        if key != "hydra"
    }


def validate_study(cfg: Any) -> None:
    """Check the config without writing anything: the study module's `validate(cfg)`, if it has
    one. A caller can run it before Hydra creates the run dir, so a bad value leaves no trace."""
    run = STUDIES.resolve(cfg.study.name)
    check = getattr(sys.modules[run.__module__], "validate", None)
    if check is not None:
        check(cfg)


def run_study(cfg: Any, run_dir: pathlib.Path) -> dict:
    """Dispatch on cfg.study.name; returns the study's summary dict."""
    return STUDIES.resolve(cfg.study.name)(cfg, pathlib.Path(run_dir))
