"""Peak FLOP/s per device, the denominator of MFU.

TPUs and GPUs get their catalogued dense bf16 peak; an accelerator this table does not know gets
none (MFU is then not reported) rather than a guess. Timing a matmul would measure what the chip
achieves, not what it could, and inflate MFU. Only the CPU, which has no catalogue figure, is
measured: it is the denominator of the CPU benchmarks here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from multislice_workload.env import accelerator_generation

# Dense bf16 peak per chip, from the Cloud TPU system architecture pages. TPU7x (Ironwood): the
# table of https://cloud.google.com/tpu/docs/tpu7x ("Peak compute per chip (BF16) (TFLOPs)
# 2307", FP8 4614, "HBM capacity per chip (GiB) 192").
TPU_PEAK_BF16_FLOPS: dict[str, float] = {
    "v4": 275e12,
    "v5e": 197e12,
    "v5p": 459e12,
    "v6e": 918e12,
    "tpu7x": 2307e12,
}

# HBM per chip (the same pages; GiB where they say GiB, GB where they say GB).
TPU_HBM_BYTES: dict[str, int] = {
    "v4": 32 * 2**30,
    "v5e": 16 * 10**9,
    "v5p": 95 * 2**30,
    "v6e": 32 * 10**9,
    "tpu7x": 192 * 2**30,
}

MIB = 2**20
# HBM one device's program may use, as the TPU compiler counts it (libtpu 0.0.42.1): what libtpu
# models per device less what it reserves, both from its own out-of-HBM report for a program
# that does not fit ("available HBM (15.75G)"; "Total hbm usage >= 16.00G: reserved 258.00M,
# program ..., arguments ..."), to the MiB by the largest program it accepts: it refuses one
# whose peak (`memory_analysis().peak_memory_in_bytes`) plus code exceeds this, and accepts up to
# it (tests/unit/test_catalog_libtpu.py). The compile gate measures against it. Not the spec
# sheets' HBM: below it on v4 (1.25 GiB reserved) and TPU7x (95 GiB a TensorCore to libtpu, not
# 96), above it on v5e and v6e (their "16 GB" and "32 GB" are 16 and 31.5 GiB to libtpu) and v5p.
TPU_COMPILER_HBM_BYTES: dict[str, int] = {
    "v4": 32 * 1024 * MIB - 1283 * MIB,  # 30.75 GiB
    "v5e": 16 * 1024 * MIB - 258 * MIB,  # 15.75 GiB
    "v5p": 96 * 1024 * MIB - 263 * MIB,  # 95.74 GiB
    "v6e": 32256 * MIB - 260 * MIB,  # 31.5 GiB - 260 MiB = 31.25 GiB
    "tpu7x": 95 * 1024 * MIB - 260 * MIB,  # 94.75 GiB per device (TensorCore), 2 per chip
}

# HBM bandwidth per chip, bytes/s, as JAX's Pallas TPU table has it (jax 0.10.2
# jax/_src/pallas/mosaic/tpu_info.py, mem_bw_bytes_per_second x TensorCores per chip; Cloud TPU's
# v5e page: 819 GBps). The memory side of `compile.roofline`.
TPU_HBM_BANDWIDTH: dict[str, float] = {
    "v4": 1.23e12,
    "v5e": 8.2e11,
    "v5p": 2.46e12,
    "v6e": 1.64e12,
    "tpu7x": 7.4e12,
}

# JAX devices per chip. v4 and v5p run their 2 TensorCores as one device ("megacore"); a TPU7x
# chip's 2 TensorCores are 2 devices (``core_on_chip`` 0 and 1; JAX's mesh_utils lays TPU7x out
# as [x, y, z, core]), so a 4-chip tpu7x-standard-4t VM shows 8 devices.
DEVICES_PER_CHIP: dict[str, int] = {"tpu7x": 2}

# device.device_kind as the TPU runtime reports it, longest match first.
_DEVICE_KIND_GENERATION: tuple[tuple[str, str], ...] = (
    ("tpu7x", "tpu7x"),  # "TPU7x" (JAX's mesh_utils and Pallas TPU info)
    ("tpu v5 lite", "v5e"),
    ("tpu v5e", "v5e"),
    ("tpu v6 lite", "v6e"),
    ("tpu v6e", "v6e"),
    ("tpu v5p", "v5p"),
    ("tpu v5", "v5p"),
    ("tpu v4", "v4"),
)

# Dense (no sparsity) bf16 tensor-core peak, from NVIDIA's data sheets (SXM parts).
GPU_PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("h200", 989e12),
    ("h100", 989e12),
    ("a100", 312e12),
)


def tpu_generation(device_kind: str, accelerator: str = "") -> str | None:
    kind = device_kind.strip().lower()
    for prefix, generation in _DEVICE_KIND_GENERATION:
        if kind.startswith(prefix):
            return generation
    return accelerator_generation(accelerator) if kind.startswith("tpu") else None


def catalog_peak(device_kind: str, accelerator: str = "") -> float | None:
    """Catalogued peak of one JAX device (a chip's share on TPU7x, whose chips are 2 devices),
    None off TPU or for an unknown generation."""
    generation = tpu_generation(device_kind, accelerator)
    peak = TPU_PEAK_BF16_FLOPS.get(generation) if generation else None
    return None if peak is None else peak / DEVICES_PER_CHIP.get(generation or "", 1)


def catalog_hbm(device_kind: str, accelerator: str = "") -> int | None:
    """HBM of one JAX device (per chip / devices per chip), None when unknown."""
    generation = tpu_generation(device_kind, accelerator)
    hbm = TPU_HBM_BYTES.get(generation) if generation else None
    return None if hbm is None else hbm // DEVICES_PER_CHIP.get(generation or "", 1)


def devices_per_chip(devices: Sequence[Any]) -> int:
    """JAX devices per chip among `devices`: distinct (slice, chip coordinates) on TPU (chip
    coordinates repeat across slices), 1 elsewhere."""
    tpu = [d for d in devices if getattr(d, "platform", "") == "tpu" and hasattr(d, "coords")]
    if not tpu or len(tpu) != len(devices):
        return 1
    chips = {(getattr(d, "slice_index", 0), tuple(d.coords)) for d in tpu}
    return max(1, len(tpu) // len(chips))


def gpu_peak(device_kind: str) -> float | None:
    kind = device_kind.lower()
    return next((peak for name, peak in GPU_PEAK_BF16_FLOPS if name in kind), None)


def measure_matmul_peak(device: Any, dtype: Any, size: int = 1024, repeats: int = 5) -> float:
    """Best observed FLOP/s of one square matmul on one device (CPU: no catalogue figure).

    Best-of rather than mean: the peak is the capacity the benchmark is measured against, and
    the slow samples are the noise (other processes, frequency ramps).
    """
    import jax
    import jax.numpy as jnp

    a = jax.device_put(jnp.ones((size, size), dtype), device)
    b = jax.device_put(jnp.ones((size, size), dtype), device)
    matmul = jax.jit(jnp.matmul)
    matmul(a, b).block_until_ready()  # compile and warm up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a, b).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2.0 * size**3 / best


def device_peak(override: float | None, accelerator: str, dtype: str) -> tuple[float | None, str]:
    """(peak FLOP/s per device or None, where it came from)."""
    import jax

    if override:
        return override, "flag"
    device = jax.local_devices()[0]
    if device.platform == "tpu":
        peak = catalog_peak(device.device_kind, accelerator)
        if peak is None:
            return None, f"unknown TPU generation {device.device_kind!r}: no MFU (--peak_flops)"
        return peak, f"catalog:{tpu_generation(device.device_kind, accelerator)}"
    if device.platform == "gpu":
        peak = gpu_peak(device.device_kind)
        if peak is None:
            return None, f"unknown GPU {device.device_kind!r}: no MFU (--peak_flops)"
        return peak, f"catalog:{device.device_kind}"
    # Forced host-platform CPU devices share one thread pool: a matmul on one of them already
    # uses every core, so each device's share of the peak is the measured figure / local devices.
    measured = measure_matmul_peak(device, dtype)
    shared = jax.local_device_count()
    return measured / shared, f"measured:{device.platform}:{dtype}/{shared}"
