"""What exists, read from the conf/ tree: presets, losses, studies and every other config group.

A preset is a YAML file, so the registry is the directory listing plus each file's `description`
(or its first comment line). No torch, no Hydra: `is-study list` stays instant.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from runner.paths import conf_dir

# Groups a user picks on the command line, in the order `list` shows them.
GROUPS = ("correction", "loss", "study", "policy", "task", "mismatch", "experiment", "hydra/launcher", "cases")


# a full stop that ends a sentence, not "et al." or "e.g."
SENTENCE_END = re.compile(r"(?<!\bal)(?<!e\.g)(?<!i\.e)\.\s")


@dataclass(frozen=True)
class Entry:
    group: str
    name: str
    description: str
    faithful: bool = False
    band: str = ""  # the default [low, high] of a preset


def group_options(group: str) -> list[str]:
    root = conf_dir() / group
    if not root.is_dir():
        return []
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml"))


def _band(data: dict) -> str:
    if "low" not in data and "high" not in data:
        return ""

    def fmt(v):
        return "—" if v is None else f"{v:g}"

    return f"[{fmt(data.get('low'))}, {fmt(data.get('high'))}]"


def _describe(path: Path, group: str = "") -> tuple[str, bool, str]:
    text = path.read_text()
    try:
        # libyaml's loader where PyYAML has it: `is-study list` reads every option's file (150), and the
        # pure-Python loader spent 0.35 s of a 0.6 s cold `list` on them
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError:
        data = None
    if isinstance(data, dict) and isinstance(data.get(group), dict) and "description" not in data:
        data = data[group]  # a `# @package _global_` option (a world's policy file): its own section
    if isinstance(data, dict) and isinstance(data.get("description"), str):
        band = _band(data) if data.get("weight_op", "raw") != "raw" or data.get("filter", "none") != "none" else ""
        return data["description"], bool(data.get("faithful", False)), band
    # Otherwise the first sentence of the header comment, after the command line.
    words: list[str] = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        body = line.lstrip("#").strip()
        if body.startswith(("is-study", "@package", "bash ")):
            continue
        if not body:
            if words:
                break
            continue
        words.append(body)
    header = " ".join(words)
    end = SENTENCE_END.search(header)
    return (header[: end.start() + 1] if end else header), False, ""


def entries(group: str) -> list[Entry]:
    root = conf_dir() / group
    return [Entry(group, name, *_describe(root / f"{name}.yaml", group)) for name in group_options(group)]


def presets() -> list[Entry]:
    """Our own presets first (in the spec's order), then the faithful reproductions by framework."""
    spec_order = ["none", "tis", "icepop", "seq-mask-tis", "seq-tis", "seq-mis", "geo-mask"]
    found = entries("correction")
    rank = {name: i for i, name in enumerate(spec_order)}
    return sorted(found, key=lambda e: (e.faithful, rank.get(e.name, len(rank)), e.name))


# How a preset folder names its framework: the folder is the framework, with a version or commit suffix for
# frameworks reproduced at more than one (openrlhf-0.11, openrlhf-bc71bb1).
FRAMEWORK_NAMES = {
    "openrlhf": "OpenRLHF",
    "verl": "verl",
    "trl": "TRL",
    "nemo-rl": "NeMo-RL",
    "areal": "AReaL",
    "skyrl": "SkyRL",
    "slime": "slime",
    "roll": "ROLL",
    "prime-rl": "prime-rl",
}
_VERSION_SUFFIX = re.compile(r"-(\d[\w.]*|[0-9a-f]{7,40})$")
OWN = "is-study"  # the framework of our own presets


def framework(entry: Entry) -> str:
    """The framework a preset reproduces (its folder, version suffix dropped), or OWN for ours."""
    if not entry.faithful or "/" not in entry.name:
        return OWN
    folder = _VERSION_SUFFIX.sub("", entry.name.split("/", 1)[0])
    return FRAMEWORK_NAMES.get(folder, folder)


def presets_by_framework() -> list[tuple[str, list[Entry]]]:
    """presets() grouped by framework: ours first, then the frameworks in presets()' (alphabetical) order."""
    groups: dict[str, list[Entry]] = {}
    for entry in presets():
        groups.setdefault(framework(entry), []).append(entry)
    return list(groups.items())


def own_presets() -> list[str]:
    return [e.name for e in presets() if not e.faithful]


def faithful_presets() -> list[str]:
    return [e.name for e in presets() if e.faithful]


def shipped_case(name: str) -> Path | None:
    path = conf_dir() / "cases" / f"{name}.yaml"
    return path if path.is_file() else None
