"""Every config under conf/ composes, and every preset named in the spec exists."""

from __future__ import annotations

import re

import pytest

from runner import registry
from runner.corrections import Correction
from runner.hydra_app import app as hydra_app
from runner.losses import LossSpec
from runner.paths import conf_dir
from tests.conftest import REPO

CONF = REPO / "conf"
# Launchers need their optional extras; experiments are composed by the experiment tests.
SKIP_GROUPS = {"cases", "hydra"}

SPEC_PRESETS = [
    "none", "tis", "icepop", "seq-mask-tis", "seq-tis", "seq-mis", "geo-mask",
    "openrlhf-bc71bb1/tis", "openrlhf-bc71bb1/icepop", "openrlhf-bc71bb1/seq-mask-tis",
    "openrlhf-0.11/token-clip", "openrlhf-0.11/token-mask", "openrlhf-0.11/seq-mask",
    "trl/token-truncate", "trl/token-mask", "trl/sequence-truncate", "trl/sequence-mask",
    "verl/token-tis", "verl/seq-tis", "verl/icepop", "verl/geo-rs", "verl/seq-mis",
]


def _group_options():
    for group_dir in sorted(p for p in CONF.iterdir() if p.is_dir() and p.name not in SKIP_GROUPS):
        for name in registry.group_options(group_dir.name):
            yield pytest.param(group_dir.name, name, id=f"{group_dir.name}={name}")


@pytest.mark.parametrize("group,name", list(_group_options()))
def test_every_config_composes(group, name):
    cfg = hydra_app.compose([f"{group}={name}"])
    container = hydra_app.to_container(cfg)
    assert container["seed"] is not None
    Correction.from_config(container["correction"])
    LossSpec.from_config(container["loss"])


def test_spec_table_presets_all_exist():
    spec = REPO.parent / "shared" / "spec" / "corrections.md"
    names = SPEC_PRESETS
    if spec.is_file():
        table_names = re.findall(r"^\| `([^`]+)`", spec.read_text(), flags=re.M)
        presets_in_tables = [n for n in table_names if n not in ("ppo", "gspo", "reinforce", "token-mean",
                                                                  "seq-mean-token-mean", "seq-mean-token-sum")]
        assert sorted(presets_in_tables) == sorted(SPEC_PRESETS)
    assert sorted(registry.group_options("correction")) == sorted(names)
    assert len(names) == 22


def test_preset_name_matches_file_and_carries_a_command_comment():
    for name in SPEC_PRESETS:
        path = CONF / "correction" / f"{name}.yaml"
        text = path.read_text()
        assert text.startswith("# is-study "), path
        cfg = hydra_app.compose([f"correction={name}"])
        assert cfg.correction.name == name


def test_every_yaml_starts_with_its_command():
    for path in CONF.rglob("*.yaml"):
        lines = path.read_text().splitlines()
        # experiment configs open with `# @package _global_`, then the command
        command = lines[1] if lines[0].startswith("# @package") else lines[0]
        assert command.startswith(("# is-study ", "# bash ")), path


def test_thresholds_are_always_low_high_veto():
    for name in SPEC_PRESETS:
        cfg = hydra_app.compose([f"correction={name}", "correction.low=0.25", "correction.high=4", "correction.veto=0.001"])
        corr = Correction.from_config(hydra_app.to_container(cfg.correction))
        assert (corr.low, corr.high, corr.veto) == (0.25, 4, 0.001)


def test_conf_ships_inside_the_wheel(tmp_path):
    """conf/ is force-included as runner/conf; the package looks it up relative to itself."""
    import tomllib

    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert meta["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]["conf"] == "runner/conf"
    assert conf_dir().is_dir()
