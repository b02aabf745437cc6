"""Peak FLOP/s per device, the denominator of MFU."""

from __future__ import annotations

import time
from typing import Any

from multislice_workload.env import accelerator_generation

# Dense bf16 peak per chip, from the Cloud TPU system architecture pages.
TPU_PEAK_BF16_FLOPS: dict[str, float] = {
    "v4": 275e12,
    "v5e": 197e12,
    "v5p": 459e12,
    "v6e": 918e12,
}

# device.device_kind as the TPU runtime reports it, longest match first.
_DEVICE_KIND_GENERATION: tuple[tuple[str, str], ...] = (
    ("tpu v5 lite", "v5e"),
    ("tpu v5e", "v5e"),
    ("tpu v6 lite", "v6e"),
    ("tpu v6e", "v6e"),
    ("tpu v5p", "v5p"),
    ("tpu v5", "v5p"),
    ("tpu v4", "v4"),
)


def tpu_generation(device_kind: str, accelerator: str = "") -> str | None:
    kind = device_kind.strip().lower()
    for prefix, generation in _DEVICE_KIND_GENERATION:
        if kind.startswith(prefix):
            return generation
    return accelerator_generation(accelerator) if kind.startswith("tpu") else None


def catalog_peak(device_kind: str, accelerator: str = "") -> float | None:
    """Catalogued peak for a TPU device, None off TPU or for an unknown generation."""
    generation = tpu_generation(device_kind, accelerator)
    return TPU_PEAK_BF16_FLOPS.get(generation) if generation else None


def measure_matmul_peak(device: Any, dtype: Any, size: int = 1024, repeats: int = 5) -> float:
    """Best observed FLOP/s of one square matmul on one device (CPU/GPU have no catalog figure).

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
