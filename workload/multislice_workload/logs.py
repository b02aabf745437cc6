"""Structured log lines: one JSON object per line on stdout, one event each.

Cloud Logging parses JSON lines from GKE containers into structured entries, and the local
launcher and the tests parse the same lines, so there is a single format for both.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

EVENT_PREFIX = "{"
_context: dict[str, Any] = {}


def set_context(**fields: Any) -> None:
    """Fields added to every following line (process id, slice, restart attempt)."""
    _context.update(fields)


def emit(event: str, **fields: Any) -> None:
    record = {"event": event, "time": round(time.time(), 3), **_context, **fields}
    sys.stdout.write(json.dumps(record, default=str, sort_keys=False) + "\n")
    sys.stdout.flush()


def parse_line(line: str) -> dict[str, Any] | None:
    """The event on a log line, or None for anything else (JAX/XLA chatter, tracebacks)."""
    line = line.strip()
    if not line.startswith(EVENT_PREFIX):
        return None
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) and "event" in record else None
