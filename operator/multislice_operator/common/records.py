"""Records as the JSON the operator prints and writes (`plan`, status, the CLI): one home for the
spelling, the CRD's camelCase (pydantic's `to_camel`, as api/models.py's aliases)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from pydantic.alias_generators import to_camel


def as_camel(record: Any, **keys: str) -> dict[str, Any]:
    """A dataclass's fields in order under camelCase keys; `keys`: field -> the key where it says
    more than the field's name (e.g. max_run_duration_s -> maxRunDurationSeconds). A dict value
    is copied: the record stays frozen whatever the caller does with the result."""
    out: dict[str, Any] = {}
    for f in fields(record):
        value = getattr(record, f.name)
        out[keys.get(f.name) or to_camel(f.name)] = (
            dict(value) if isinstance(value, dict) else value
        )
    return out
