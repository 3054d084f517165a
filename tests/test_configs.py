"""Every config under conf/ composes, and every preset named in the spec exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from runner import registry
from runner.core.corrections import Correction
from runner.core.losses import LossSpec
from runner.hydra_app import app as hydra_app
from runner.paths import conf_dir
from tests.helpers.repo import REPO

CONF = REPO / "conf"
# Launchers need their optional extras; experiments are composed by the experiment tests.
SKIP_GROUPS = {"cases", "hydra"}

SPEC_PRESETS = [
    "none",
    "tis",
    "icepop",
    "seq-mask-tis",
    "seq-tis",
    "seq-mis",
    "geo-mask",
    "openrlhf-bc71bb1/tis",
    "openrlhf-bc71bb1/icepop",
    "openrlhf-bc71bb1/seq-mask-tis",
    "openrlhf-0.11/token-clip",
    "openrlhf-0.11/token-mask",
    "openrlhf-0.11/seq-mask",
    "trl/token-truncate",
    "trl/token-mask",
    "trl/sequence-truncate",
    "trl/sequence-mask",
    "trl/off-policy-mask",
    "verl/token-tis",
    "verl/seq-tis",
    "verl/icepop",
    "verl/geo-rs",
    "verl/seq-mis",
    "verl/token-tis-batch-norm",
    "verl/seq-tis-batch-norm",
    "verl/seq-max-k2",
    "verl/seq-max-k3",
    "nemo-rl/tis",
    "nemo-rl/icepop",
    "nemo-rl/seq-mask-tis",
    "areal/token-mask",
    "areal/token-clamp",
    "areal/sequence-mask",
    "areal/sequence-clamp",
    "areal/sequence-mask-sum",
    "skyrl/tis-token",
    "skyrl/tis-sequence",
    "skyrl/token-mask-is",
    "areal/token-mask-kl_k1",
    "areal/token-mask-kl_k2",
    "areal/token-mask-kl_k3",
    "areal/sequence-mask-kl_k3",
    "areal/sequence-mask-max",
    "areal/m2po",
    "skyrl/geometric",
    "skyrl/product",
    "skyrl/outlier-token-is",
    "skyrl/tis-sequence-token-mask-is",
    "skyrl/geometric-token-mask-is",
    "roll/is-token",
    "roll/is-segment",
    "roll/is-geometric",
    "roll/is-sequence",
    "roll/filter-token",
    "roll/filter-segment",
    "roll/filter-geometric",
    "roll/filter-sequence",
    "roll/diff-token",
    "roll/ratio-diff-segment",
    "prime-rl/default",
    "slime/tis",
    "slime/icepop",
    "slime/mis-truncate-token",
    "slime/mis-truncate-sequence",
    "slime/mis-truncate-geometric",
    "slime/mis-clip-token",
    "slime/mis-clip-sequence",
    "slime/mis-clip-geometric",
    "slime/mis-mask-token",
    "slime/mis-mask-sequence",
    "slime/mis-mask-geometric",
    "slime/mis-rs-veto",
    "slime/mis-batch-normalize",
    "slime/opsm",
]


def _group_options():
    for group_dir in sorted(p for p in CONF.iterdir() if p.is_dir() and p.name not in SKIP_GROUPS):
        for name in registry.group_options(group_dir.name):
            yield pytest.param(group_dir.name, name, id=f"{group_dir.name}={name}")


@pytest.mark.slow
@pytest.mark.parametrize("group,name", list(_group_options()))
def test_every_config_composes(group, name):
    cfg = hydra_app.compose([f"{group}={name}"])
    container = hydra_app.to_container(cfg)
    assert container["seed"] is not None
    corr = Correction.from_config(container["correction"])
    LossSpec.from_config(container["loss"])
    if group == "correction":  # the YAML read alone (the probe, the metrics tests) is what composes
        from runner.probe.settings import load_preset

        assert load_preset(name) == corr


def _spec_copy() -> Path | None:
    """The spec's preset tables: the repo's own copy (docs/corrections.md), else the shared spec
    beside the checkout (../shared/spec/corrections.md), else None."""
    for path in (REPO / "docs" / "corrections.md", REPO.parent / "shared" / "spec" / "corrections.md"):
        if path.is_file():
            return path
    return None


# a row whose first cell is `name`, its band [low, high] either right after the name (the spec's form) or
# alone in the next cell (docs/corrections.md's table)
PRESET_ROW = re.compile(
    r"^\|\s*`(?P<name>[^`]+)`\s*(?:\[(?P<band>[^\]]*)\])?\s*\|"
    r"(?:\s*\[(?P<band_cell>[^\]]*)\]\s*\|)?",
    flags=re.M,
)


def preset_table(markdown: str) -> dict[str, tuple[float | None, float | None] | None]:
    """The presets of the spec's presets section (`## Presets`, or a numbered `## 3. The presets`, up to the
    next `## ` heading): every table row whose first cell is a `name`, with its default band [low, high]
    after the name or in the next cell (— or None for no bound). name → (low, high), or None where the row
    gives no band."""
    section = re.search(r"^## (?:\d+\. )?(?:The )?[Pp]resets[ \t]*\n(.*?)(?=^## |\Z)", markdown, flags=re.M | re.S)
    if section is None:
        raise ValueError("no `## Presets` section")

    def bound(text: str) -> float | None:
        text = text.strip()
        return None if text in ("—", "-", "None", "null") else float(text)

    table = {}
    for row in PRESET_ROW.finditer(section.group(1)):
        band = row.group("band") or row.group("band_cell")
        if band is None:
            table[row.group("name")] = None
        else:
            low, high = band.split(",")
            table[row.group("name")] = (bound(low), bound(high))
    return table


def test_the_preset_table_parser_reads_names_and_bands():
    sample = """# Title

| loss | term |
|---|---|
| `ppo` | not a preset |

## Presets

| preset | weight |
|---|---|
| `none` | 1 |
| `tis` [0.5, 5.0] | clamp |
| `seq-tis` [—, 5.0] | min |
| `trl/token-mask` [None, 3.0] | mask |

Prose with `code` in it.

## After

| `later` | not a preset either |
"""
    assert preset_table(sample) == {
        "none": None,
        "tis": (0.5, 5.0),
        "seq-tis": (None, 5.0),
        "trl/token-mask": (None, 3.0),
    }
    with pytest.raises(ValueError, match="Presets"):
        preset_table("| `tis` [0.5, 5.0] | no section |")


@pytest.mark.slow
def test_spec_table_presets_all_exist():
    """The presets the spec's tables name are exactly conf/correction/, and each default band the
    spec gives in brackets is the preset's own low/high."""
    spec = _spec_copy()
    if spec is None:
        pytest.skip("no copy of the spec's preset tables: docs/corrections.md is missing and ../shared is absent")
    table = preset_table(spec.read_text())
    assert len(table) == len(SPEC_PRESETS), spec
    assert sorted(table) == sorted(registry.group_options("correction")) == sorted(SPEC_PRESETS)
    for name, band in table.items():
        if band is None:
            continue
        cfg = hydra_app.compose([f"correction={name}"]).correction
        assert (cfg.low, cfg.high) == band, f"{name}: conf has [{cfg.low}, {cfg.high}], {spec.name} says {band}"


@pytest.mark.slow
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


@pytest.mark.slow
def test_thresholds_are_always_low_high_veto():
    for name in SPEC_PRESETS:
        cfg = hydra_app.compose(
            [f"correction={name}", "correction.low=0.25", "correction.high=4", "correction.veto=0.001"]
        )
        corr = Correction.from_config(hydra_app.to_container(cfg.correction))
        assert (corr.low, corr.high, corr.veto) == (0.25, 4, 0.001)


def test_conf_ships_inside_the_wheel(tmp_path):
    """conf/ is force-included as runner/conf; the package looks it up relative to itself."""
    import tomllib

    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert meta["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]["conf"] == "runner/conf"
    assert conf_dir().is_dir()


@pytest.mark.parametrize("group", [g for g in registry.GROUPS if g != "cases"])
def test_every_group_refuses_an_unknown_option(group):
    """A mistyped choice is refused in every group the CLI takes, the experiment too: it was an
    `optional` default in conf/config.yaml, and Hydra skips an optional option it cannot find, so
    `experiment=threshold-tradeof` ran the defaults and exited 0 (issue 31)."""
    from runner.errors import UserError

    typo = registry.group_options(group)[0] + "x"
    with pytest.raises(UserError) as caught:
        hydra_app.compose([f"{group}={typo}"])
    assert str(caught.value).startswith(f"config: unknown {group} '{typo}'; did you mean "), caught.value


def test_a_group_set_to_null_is_one_line():
    from runner.errors import UserError

    with pytest.raises(UserError, match=r"^config: a config group takes an option's name, not null"):
        hydra_app.compose(["experiment=null"])
