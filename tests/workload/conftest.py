"""JAX settings for the workload tests, set before any test starts a backend.

In-process tests get 8 CPU devices. Every process (in-process, and the workload processes the
tests start, which inherit XLA_FLAGS) compiles with LLVM optimization level 0: the programs are
tiny, and compile time, not run time, dominates these tests (about 6x less for the parameter
initialization). Runs compared bit for bit always share the flag.
"""

from __future__ import annotations

import os

FAST_COMPILE = "--xla_backend_optimization_level=0"

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "").split()
if not any(f.startswith("--xla_force_host_platform_device_count") for f in _flags):
    _flags.append("--xla_force_host_platform_device_count=8")
if FAST_COMPILE not in _flags:
    _flags.append(FAST_COMPILE)
os.environ["XLA_FLAGS"] = " ".join(_flags)
