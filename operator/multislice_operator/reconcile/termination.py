"""The workload's termination message (docs/environment.md section 2), read in one place.

The workload writes one JSON object: `{"step", "checkpointStep", "reason", "checkpointRequest":
{"id", "step"}}`; anything else (FallbackToLogsOnError may put logs there) says nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from multislice_operator.reconcile.types import Termination

REASON_MAX = 32  # a short word (bounded: it becomes part of the status)


def _step(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def request(value: Any) -> tuple[str, int] | None:
    """{"id": ..., "step": ...} (docs/environment.md section 3) as (id, step); else None."""
    if not isinstance(value, Mapping):
        return None
    rid, step = value.get("id"), value.get("step")
    if not isinstance(rid, str) or not rid or isinstance(step, bool) or not isinstance(step, int):
        return None
    return rid, step


def parse(text: str | None) -> Termination | None:
    if not text or not text.lstrip().startswith("{"):
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, Mapping):
        return None
    reason = data.get("reason")
    return Termination(
        step=_step(data.get("step")),
        checkpoint_step=_step(data.get("checkpointStep")),
        reason=reason[:REASON_MAX] if isinstance(reason, str) and reason else None,
        checkpoint_request=request(data.get("checkpointRequest")),
    )
