"""What the workload benchmarks share: the machine's matmul peak and a launcher run.

All CPU devices of all processes share this machine's cores, so the honest denominator is the
machine, not a device: the peak is the best float32 matmul FLOP/s one process reaches with every
core, over several square sizes, and each figure is aggregate FLOP/s / that peak. The workload is
given peak / total devices as its per-device peak (``--peak_flops``), so its own MFU figure is
that same ratio. The machine is shared (other builds and tests), so every figure is a best of
several tries, and the peak is measured before and after the cases.
"""

from __future__ import annotations

import os
import platform
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

PEAK_SIZES = (512, 1024, 2048)


def measure_peak(repeats: int = 10) -> float:
    """Best float32 matmul FLOP/s of this process on its one default CPU device."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp

    from multislice_workload.hardware import measure_matmul_peak

    device = jax.devices()[0]
    return max(
        measure_matmul_peak(device, jnp.float32, size=size, repeats=repeats)
        for size in PEAK_SIZES
        for _ in range(2)
    )


def launch_case(
    slices: int,
    devices: int,
    args: Sequence[str],
    *,
    parallelism: Any = None,
    timeout_s: float = 900,
) -> Any:
    """One local-launcher run (1 host per slice); exits the benchmark if it fails."""
    from multislice_workload.local import launch

    with tempfile.TemporaryDirectory(prefix="workload-bench-") as logs:
        result = launch(
            slices,
            1,
            devices,
            args=list(args),
            parallelism=parallelism,
            timeout_s=timeout_s,
            log_dir=logs,
        )
    if not result.succeeded:
        print(result.format_timeline(), file=sys.stderr)
        raise SystemExit(f"{slices} slice(s) x {devices} devices: launcher exit {result.exit_code}")
    return result


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "platform": platform.platform()}


def load_average() -> float:
    return os.getloadavg()[0]
