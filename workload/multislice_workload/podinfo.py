"""Checkpoint on demand: the pod's annotations (downward API), agreement, acknowledgement.

The operator (or ``kubectl annotate msj NAME multislice.dev/checkpoint-request=ID``) puts
``multislice.dev/checkpoint-request: <id>`` on every pod; the kubelet mirrors the pod's
annotations into ``$MULTISLICE_PODINFO_DIR/annotations`` (lines ``key="value"``, Go %q quoting)
within about a minute, not at the same moment on every host. So each process polls its own file
(by mtime, at most every `poll_s`), and at fixed step boundaries all processes exchange what they
have seen (one small all-gather): when any of them holds an id not served yet, every process
saves at that same step. Process 0 then patches its pod's ``multislice.dev/checkpoint-saved``
annotation through the Kubernetes API (best effort, `kube.py`). See docs/environment.md section 3.
"""

from __future__ import annotations

import ast
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

REQUEST_ANNOTATION = "multislice.dev/checkpoint-request"
SAVED_ANNOTATION = "multislice.dev/checkpoint-saved"
PODINFO_DIR_ENV = "MULTISLICE_PODINFO_DIR"
ANNOTATIONS_FILE = "annotations"
MAX_ID_LENGTH = 63
DEFAULT_POLL_S = 2.0


def parse_annotations(text: str) -> dict[str, str]:
    """``key="value"`` lines as the kubelet writes them; malformed lines are skipped."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, quoted = line.strip().partition("=")
        if not sep or not key:
            continue
        value = _unquote(quoted.strip())
        if value is not None:
            out[key] = value
    return out


def _unquote(quoted: str) -> str | None:
    # Go's %q escapes (\" \\ \n \t \xNN \uNNNN \UNNNNNNNN) read the same as a Python literal.
    if len(quoted) < 2 or quoted[0] != '"' or quoted[-1] != '"':
        return None
    try:
        value = ast.literal_eval(quoted)
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, str) else None


def format_annotations(annotations: Mapping[str, str]) -> str:
    """The file the kubelet would write (for the local launcher and tests)."""
    import json

    # JSON string quoting is Go %q for the printable ASCII ids in use here.
    return "".join(f"{key}={json.dumps(value)}\n" for key, value in sorted(annotations.items()))


def valid_request_id(value: str) -> bool:
    return 0 < len(value) <= MAX_ID_LENGTH


class AnnotationWatcher:
    """This process's view of its pod's checkpoint-request annotation."""

    def __init__(
        self,
        directory: str | None,
        poll_s: float = DEFAULT_POLL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(directory) / ANNOTATIONS_FILE if directory else None
        self.poll_s = poll_s
        self._clock = clock
        self._next_poll = float("-inf")
        self._mtime: float | None = None
        self._request: str | None = None

    def requested_id(self) -> str | None:
        """The request id in the file, re-read only when due and the file changed."""
        if self.path is None:
            return None
        now = self._clock()
        if now < self._next_poll:
            return self._request
        self._next_poll = now + self.poll_s
        try:
            mtime = self.path.stat().st_mtime_ns / 1e9
            if mtime != self._mtime:
                self._mtime = mtime
                self._request = self._read()
        except OSError:
            self._mtime, self._request = None, None
        return self._request

    def _read(self) -> str | None:
        assert self.path is not None
        value = parse_annotations(self.path.read_text()).get(REQUEST_ANNOTATION, "").strip()
        return value if valid_request_id(value) else None


class CheckpointRequests:
    """Which request, if any, the whole job serves at this step boundary."""

    def __init__(
        self,
        watcher: AnnotationWatcher,
        every_steps: int,
        gather: Callable[[str], Sequence[str]] | None = None,
    ) -> None:
        self.watcher = watcher
        self.every_steps = every_steps
        self._gather = gather or (lambda own: [own])
        self.served: str | None = None  # the last id served (restored from the checkpoint)

    def due(self, step: int) -> bool:
        """The same answer on every process: the exchange is a collective."""
        return step % self.every_steps == 0

    def agree(self) -> str | None:
        """Collective: the id to serve now, the same on every process, or None."""
        seen = self.watcher.requested_id()
        own = seen if seen is not None and seen != self.served else ""
        pending = [i for i in self._gather(own) if i and i != self.served]
        # Process order decides when hosts saw different new ids; one save serves them all.
        return pending[0] if pending else None


def gather_ids(own: str) -> list[str]:
    """Every process's pending id (empty: none), in process order, via one all-gather."""
    import numpy as np
    from jax.experimental import multihost_utils

    encoded = np.zeros(MAX_ID_LENGTH + 1, np.uint8)
    raw = own.encode()[:MAX_ID_LENGTH]
    encoded[: len(raw)] = np.frombuffer(raw, np.uint8)
    rows = np.asarray(multihost_utils.process_allgather(encoded))
    return [
        bytes(row).rstrip(b"\0").decode(errors="replace") for row in rows.reshape(-1, encoded.size)
    ]


def podinfo_dir(environ: Mapping[str, str] | None = None) -> str | None:
    environ = os.environ if environ is None else environ
    return environ.get(PODINFO_DIR_ENV, "").strip() or None
