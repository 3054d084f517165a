"""The policy worlds, by `policy.name`. A world is one folder under runner/worlds/ (model, exact
solver, sampler); the studies reach it only through runner/worlds/protocol.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runner.lookup import LazyRegistry

WORLDS = LazyRegistry(
    "policy.name",
    {
        "bigram": "runner.worlds.bigram.world:BigramWorld",
        "mlp": "runner.worlds.mlp.world:MLPWorld",
        "transformer": "runner.worlds.transformer.world:TransformerWorld",
    },
)


def make_world(policy: Mapping[str, Any], rollout: Mapping[str, Any], task: Any):
    """Build (and validate) the world of a `policy:` section for `task`."""
    policy = dict(policy)
    return WORLDS.resolve(policy.get("name", "bigram")).from_config(policy, rollout, task)
