"""Values of a job's saved config (`<job dir>/.hydra/config.yaml`), resolved.

Hydra saves a job's config with its interpolations unresolved: an experiment's band preset leaves
`correction.low: ${bands.${band}.low}` there. Aggregation wants the number, so OmegaConf resolves
it; a plain value is read as it is, without OmegaConf. A value that cannot be resolved here (one
that needs Hydra's run-time resolvers) is None.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

try:  # the C loader is ~10× faster on the many small files of a sweep
    _Loader = yaml.CSafeLoader
except AttributeError:  # pragma: no cover
    _Loader = yaml.SafeLoader


def _select(data: Any, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


def resolved_values(config_file: Path | str, keys: list[str]) -> dict[str, Any]:
    """{key: value} for dotted `keys` of the saved config (None where missing or unresolvable)."""
    try:
        text = Path(config_file).read_text(encoding="utf-8")
        data = yaml.load(text, Loader=_Loader)
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return dict.fromkeys(keys)
    values = {k: _select(data, k) for k in keys}
    if not any(isinstance(v, str) and "${" in v for v in values.values()):
        return values
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    cfg = OmegaConf.create(data)
    for k, v in values.items():
        if isinstance(v, str) and "${" in v:
            try:
                values[k] = OmegaConf.select(cfg, k, throw_on_resolution_failure=True)
            except OmegaConfBaseException:
                values[k] = None
    return values
