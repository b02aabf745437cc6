"""Memory a burst leaves behind comes back, whatever allocator the operator was started on.

The image preloads jemalloc and puts every Python object in it (the Dockerfile's ENV). Started
on the interpreter's defaults instead (a pip-installed operator, `python -m`), CPython keeps
objects in its own 1 MiB arenas, which go back to the OS only once every object in them is gone:
a 200-job burst left +40 MiB for good (docs/benchmarks.md). So `multislice-operator run`, on
glibc with no allocator chosen, starts itself again, once, with every Python object in glibc's
malloc (PYTHONMALLOC=malloc) on one arena (GLIBC_TUNABLES glibc.malloc.arena_max=1), where the
housekeeping loop's malloc_trim(0) (handlers.py) hands the pages a burst freed back to the OS.

An allocator the operator was started with (PYTHONMALLOC, an LD_PRELOAD such as the image's) is
kept, and so is everything where glibc is not the C library. MULTISLICE_MEMORY=as-started keeps
the process as it was started.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Mapping

CHOICE_ENV = "MULTISLICE_MEMORY"
AS_STARTED = "as-started"
ARENA_TUNABLE = "glibc.malloc.arena_max"
ARENAS = 1
# What says an allocator was chosen: the interpreter's, or a library preloaded (jemalloc,
# tcmalloc, mimalloc) whose name the operator need not know.
CHOSEN = ("PYTHONMALLOC", "LD_PRELOAD")


def on_glibc() -> bool:
    """Whether this process's C library is glibc (musl and macOS have no gnu_get_libc_version)."""
    try:
        return bool(ctypes.CDLL(None).gnu_get_libc_version)
    except (OSError, AttributeError):
        return False


def restart_env(environ: Mapping[str, str], glibc: bool) -> dict[str, str] | None:
    """The environment to start the operator again with, or None to keep this process."""
    if not glibc or environ.get(CHOICE_ENV) == AS_STARTED:
        return None
    if any(environ.get(k) for k in CHOSEN):
        return None
    env = {**environ, "PYTHONMALLOC": "malloc"}
    tunables = environ.get("GLIBC_TUNABLES", "")
    if ARENA_TUNABLE not in tunables and not environ.get("MALLOC_ARENA_MAX"):
        env["GLIBC_TUNABLES"] = ":".join(t for t in (tunables, f"{ARENA_TUNABLE}={ARENAS}") if t)
    return env


def configure() -> None:
    """Start this process again (same pid, same command line) with the environment above;
    returns where nothing is to change. Call it before anything else runs: a thread or an open
    connection does not survive an exec."""
    env = restart_env(os.environ, on_glibc())
    if env is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, sys.orig_argv, env)
