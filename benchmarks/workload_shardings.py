"""Throughput and MFU of the workload's `shardings` mode on this machine's CPU, 1 and 2 slices.

Not a test. Each "slice" is one host process with --devices CPU devices, started by the local
launcher with the operator's environment; 2 slices talk over gloo/TCP (the DCN stand-in), with
data parallelism across slices (dcn_data=2) and FSDP inside each (ici_fsdp=devices).

All CPU devices of all processes share the same cores, so the honest denominator is the machine,
not a device: the peak is one process's best float32 matmul FLOP/s using every core, and the
ratio reported is aggregate FLOP/s of the benchmark / that peak. The workload is given
peak / total devices as its per-device peak, so its own MFU figure is that same ratio.

    .venv/bin/python benchmarks/workload_shardings.py [--devices 2] [--steps 10]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "workload_shardings.json"


def measure_peak(size: int) -> float:
    """Best-of float32 matmul FLOP/s of this process on its single default CPU device."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp

    from multislice_workload.hardware import measure_matmul_peak

    return max(
        measure_matmul_peak(jax.devices()[0], jnp.float32, size=size, repeats=10) for _ in range(3)
    )


def run_case(slices: int, devices: int, peak: float, args: argparse.Namespace) -> dict[str, Any]:
    from multislice_workload.local import launch

    total_devices = slices * devices
    workload_args = [
        "shardings",
        "--steps", str(args.steps),
        "--batch_size", str(args.batch_size),
        "--embedding_dimension", str(args.embedding),
        "--num_layers", str(args.layers),
        "--dtype", "float32",
        "--peak_flops", str(peak / total_devices),
    ]  # fmt: skip
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="workload-shardings-") as logs:
        result = launch(slices, 1, devices, args=workload_args, timeout_s=600, log_dir=logs)
    if not result.succeeded:
        print(result.format_timeline(), file=sys.stderr)
        raise SystemExit(f"{slices} slice(s): launcher exit {result.exit_code}")
    report = result.events_named("shardings_result")[0]
    aggregate = report["tflops_per_device"] * 1e12 * total_devices
    return {
        "slices": slices,
        "processes": slices,
        "devices_per_slice": devices,
        "global_devices": report["global_devices"],
        "step_seconds": report["step_seconds"],
        "tflops_per_device": report["tflops_per_device"],
        "aggregate_gflops": aggregate / 1e9,
        "ratio_to_single_process_peak": aggregate / peak,
        "workload_mfu": report["mfu"],
        "wall_seconds_including_startup": time.perf_counter() - started,
    }


def print_table(peak: float, rows: list[dict[str, Any]]) -> None:
    print(f"single-process float32 matmul peak: {peak / 1e9:.1f} GFLOP/s ({os.cpu_count()} CPUs)")
    header = f"{'slices':>6} {'devices':>7} {'step s':>8} {'GFLOP/s':>9} {'/peak':>7} {'wall s':>7}"
    print(header)
    for r in rows:
        print(
            f"{r['slices']:>6} {r['global_devices']:>7} {r['step_seconds']:>8.3f} "
            f"{r['aggregate_gflops']:>9.1f} {100 * r['ratio_to_single_process_peak']:>6.1f}% "
            f"{r['wall_seconds_including_startup']:>7.1f}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2, help="CPU devices per slice")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch_size", type=int, default=256, help="per device")
    parser.add_argument("--embedding", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--matmul_size", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3, help="runs per case, best kept")
    args = parser.parse_args()

    # The machine is shared (builds, other tests): keep the best of several tries for both the
    # peak and each case, the figure least disturbed by neighbours.
    peak = measure_peak(args.matmul_size)
    rows = [
        min(
            (run_case(slices, args.devices, peak, args) for _ in range(args.repeats)),
            key=lambda row: row["step_seconds"],
        )
        for slices in (1, 2)
    ]
    later_peak = measure_peak(args.matmul_size)
    if later_peak > peak:  # rescale the ratios to the better peak
        for row in rows:
            row["ratio_to_single_process_peak"] *= peak / later_peak
            row["workload_mfu"] *= peak / later_peak
        peak = later_peak
    print_table(peak, rows)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": "workload_shardings",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "config": vars(args),
        "single_process_matmul_peak_gflops": peak / 1e9,
        "load_average_1m_at_end": os.getloadavg()[0],
        "cases": rows,
    }
    RESULTS.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
