"""Override strings (`correction.high=2`), written and read by Hydra's own grammar, so a value we
write is read back exactly and a job's overrides parse as Hydra parsed them."""

from __future__ import annotations

import functools

from runner.hydra_app.app import translated_errors


def quote_override_value(value: str) -> str:
    """A string as a Hydra override value: single-quoted, with ' and \\ escaped."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def parse_job_overrides(overrides: list[str]) -> list[tuple[str, str]]:
    """(key, value) for each override string of a job's `.hydra/overrides.yaml`, parsed by Hydra's
    override grammar: `+`/`++` prefixes dropped, quotes removed; deletions (`~key`) left out."""
    with translated_errors():
        parsed = [_parse_one(s) for s in overrides]
    return [kv for kv in parsed if kv is not None]


@functools.lru_cache(maxsize=4096)
def _parse_one(override: str) -> tuple[str, str] | None:
    # a sweep's jobs share most of their strings (`train.steps=20` in every job): each is parsed once
    (o,) = _parser().parse_overrides([override])
    if o.is_delete():
        return None
    value = o.value()
    key = o.key_or_group + (f"@{o.package}" if o.package else "")
    return key, value if isinstance(value, str) else o.get_value_element_as_str()


@functools.cache
def _parser():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()
