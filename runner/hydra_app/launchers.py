"""The launcher presets' base configs.

Our presets (conf/hydra/launcher/NAME.yaml) carry the names `--launcher` takes and `is-study list`
shows, one vocabulary: basic, joblib, ray, submitit-local, submitit-slurm. Three of those are also
the names of the configs Hydra and its plugins register in Hydra's ConfigStore, and Hydra looks in
conf/ first: `hydra/launcher=joblib` finds our file, whose defaults list could not name the
plugin's `joblib` (it would name itself). So each of those plugin configs is registered a second
time, as `plugin-NAME`, and our preset extends that: the plugin's typed schema and defaults, our
changes on top. The same-named original is then dropped from the store: left there, Hydra 1.3
would also merge it into our file by name ("automatic schema matching", deprecated, with a warning).
Called once Hydra is initialised (the plugins are discovered then); a launcher's worker processes
get the registration with the ConfigStore Hydra hands them.
"""

from __future__ import annotations

SAME_NAMED = ("basic", "joblib", "ray")


def register_plugin_configs() -> None:
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    group = store.repo.get("hydra", {}).get("launcher", {})
    for name in SAME_NAMED:
        node = group.pop(f"{name}.yaml", None)
        if node is not None and f"plugin-{name}.yaml" not in group:
            store.store(group="hydra/launcher", name=f"plugin-{name}", node=node.node, provider=node.provider)
