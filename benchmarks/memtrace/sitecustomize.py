"""Loaded by the operator's interpreter only when `benchmarks.lifecycle_memory --trace` puts this
directory on its PYTHONPATH (`site` imports `sitecustomize` at start-up; not part of the
operator). PYTHONTRACEMALLOC has started tracing; each SIGUSR1 then writes a tracemalloc
snapshot, after a full collection, to MULTISLICE_TRACE_DIR as `<pid>-<n>.snapshot` (n from 0), so
the benchmark can name what a load left alive. The operator's exec into glibc's malloc
(controller/memory.py) keeps the environment: the new image loads this again."""

from __future__ import annotations

import gc
import itertools
import os
import signal
import tracemalloc
from pathlib import Path
from types import FrameType

DIR_ENV = "MULTISLICE_TRACE_DIR"
_numbers = itertools.count()


def _dump(signum: int, frame: FrameType | None) -> None:
    gc.collect()
    target = Path(os.environ[DIR_ENV]) / f"{os.getpid()}-{next(_numbers)}.snapshot"
    partial = target.with_suffix(".partial")
    tracemalloc.take_snapshot().dump(str(partial))
    partial.rename(target)  # whole or absent: the benchmark waits for this name


if os.environ.get(DIR_ENV) and tracemalloc.is_tracing():
    signal.signal(signal.SIGUSR1, _dump)
