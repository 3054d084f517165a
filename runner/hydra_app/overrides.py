"""Override strings (`correction.high=2`), written and read by Hydra's own grammar, so a value we
write is read back exactly and a job's overrides parse as Hydra parsed them."""

from __future__ import annotations

from runner.hydra_app.app import translated_errors


def quote_override_value(value: str) -> str:
    """A string as a Hydra override value: single-quoted, with ' and \\ escaped."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def parse_job_overrides(overrides: list[str]) -> list[tuple[str, str]]:
    """(key, value) for each override string of a job's `.hydra/overrides.yaml`, parsed by Hydra's
    override grammar: `+`/`++` prefixes dropped, quotes removed; deletions (`~key`) left out."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    with translated_errors():
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    out = []
    for o in parsed:
        if o.is_delete():
            continue
        value = o.value()
        key = o.key_or_group + (f"@{o.package}" if o.package else "")
        out.append((key, value if isinstance(value, str) else o.get_value_element_as_str()))
    return out
