"""The container termination message: one JSON object the operator reads from the pod status.

Written on every exit the program controls (docs/environment.md section 2): where the run stood
(last step, last durable checkpoint, last checkpoint request served) and why it ended, so the
operator can count the steps a restart lost without reading the checkpoint store.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from multislice_workload.exitcodes import REASONS

TERMINATION_LOG_ENV = "MULTISLICE_TERMINATION_LOG"
KUBELET_PATH = Path("/dev/termination-log")
MAX_BYTES = 4096  # the kubelet keeps at most this much of the file
VERSION = 1


@dataclasses.dataclass
class RunStatus:
    """What the termination message reports; the training loop keeps it current."""

    step: int | None = None  # last completed training step
    checkpoint_step: int | None = None  # last checkpoint known durable
    checkpoint_request: dict[str, Any] | None = None  # {"id": ..., "step": ...}
    result: dict[str, Any] | None = None  # a mode's own result keys (compile: fits, HBM, ...)


STATUS = RunStatus()


def message_path(environ: Mapping[str, str] | None = None) -> Path | None:
    environ = os.environ if environ is None else environ
    explicit = environ.get(TERMINATION_LOG_ENV, "").strip()
    if explicit:
        return Path(explicit)
    if KUBELET_PATH.exists() and os.access(KUBELET_PATH, os.W_OK):
        return KUBELET_PATH
    return None


def render(exit_code: int, message: str, status: RunStatus, reason: str | None = None) -> str:
    """The JSON text, `message` shortened so that the whole stays within MAX_BYTES."""
    record: dict[str, Any] = {
        "v": VERSION,
        "reason": reason or REASONS.get(exit_code, "crash"),
        "exitCode": exit_code,
        "step": status.step,
        "checkpointStep": status.checkpoint_step,
    }
    if status.checkpoint_request:
        record["checkpointRequest"] = dict(status.checkpoint_request)
    if status.result:
        record.update(status.result)

    def dumped(text: str) -> str:
        return _dump({**record, "message": text})

    if len(dumped(message).encode()) <= MAX_BYTES:
        return dumped(message)
    low, high = 0, len(message)  # the longest prefix that fits (escaping can grow the text)
    while low < high:
        mid = (low + high + 1) // 2
        if len(dumped(message[:mid]).encode()) <= MAX_BYTES:
            low = mid
        else:
            high = mid - 1
    return dumped(message[:low])


def _dump(record: dict[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"), default=str)


def write(
    exit_code: int,
    message: str = "",
    *,
    reason: str | None = None,
    status: RunStatus | None = None,
    environ: Mapping[str, str] | None = None,
) -> Path | None:
    """Write the message; never raises (an exit path must not fail on its report)."""
    path = message_path(environ)
    if path is None:
        return None
    # Written whole or not at all: a process stopped mid-write (its peers' exit stops it) must
    # not leave the kubelet an empty or cut message, so the text is renamed into place where it
    # can be. In a pod it cannot: the kubelet bind-mounts the file onto /dev/termination-log,
    # in a directory the program may not write (root's /dev, uid 10001), and nothing can be
    # renamed onto a mount point (EBUSY). There the file is rewritten in place, in one write of
    # at most MAX_BYTES (a regular file's write is not cut short by a signal).
    text = render(exit_code, message, status or STATUS, reason)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        return path if _write_in_place(path, text) else None
    try:
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if err.errno == errno.EBUSY and _write_in_place(path, text):
            return path
        return None
    return path


def _write_in_place(path: Path, text: str) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    except OSError:
        return False
    try:
        data = text.encode()
        return os.write(fd, data) == len(data)
    except OSError:
        return False
    finally:
        os.close(fd)
