"""HBM per device and roofline step time of the train step compiled for each TPU generation.

Not a test. For each generation, one slice of 16 chips (v4/v5p 2x2x4, v5e/v6e 4x4, tpu7x 2x2x4:
32 devices), FSDP over the slice, bf16 matmuls, float32 parameters and Adam moments, full remat;
`multislice_workload compile --json` per (generation, model), in a subprocess each (the TPU
compiler runs on this CPU; nothing runs on a TPU). Models: the demo's (the train defaults, byte
vocabulary), a Llama-3.2-1B-shaped and a Llama-3-8B-shaped one (SwiGLU, grouped-query attention,
a 128,256-token vocabulary), 32 sequences of 2,048 tokens per step (2 per chip, 1 per tpu7x
device); the demo model with a batch of 32 (one sequence per device divides every mesh).

    .venv/bin/python -m benchmarks.workload_compile [--only v5e] [--models demo,1b]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "workload_compile.json"
TOPOLOGIES = {
    "v4": "v4:2x2x4",
    "v5e": "v5e:4x4",
    "v5p": "v5p:2x2x4",
    "v6e": "v6e:4x4",
    "tpu7x": "tpu7x:2x2x4",
}
LLAMA = [
    "--mlp_activation",
    "swiglu",
    "--vocab",
    "128256",
    "--seq_len",
    "2048",
    "--batch_size",
    "32",
]
MODELS = {
    "demo": ["--batch_size", "32"],
    "1b": ["--embed", "2048", "--heads", "32", "--kv_heads", "8", "--head_dim", "64",
           "--mlp", "8192", "--num_layers", "16", *LLAMA],
    "8b": ["--embed", "4096", "--heads", "32", "--kv_heads", "8", "--head_dim", "128",
           "--mlp", "14336", "--num_layers", "32", *LLAMA],
}  # fmt: skip


def compile_one(topology: str, flags: list[str]) -> dict[str, object]:
    argv = [sys.executable, "-m", "multislice_workload", "compile", "--topology", topology]
    argv += ["--slices", "1", "--json", "--dtype", "bfloat16", *flags]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    lines = [x for x in done.stdout.splitlines() if x.startswith('{"fits"')]
    if not lines:
        raise RuntimeError(f"{topology} {flags}: exit {done.returncode}\n{done.stderr[-2000:]}")
    result: dict[str, object] = json.loads(lines[-1])
    result["exit_code"] = done.returncode
    result["wall_s"] = round(time.perf_counter() - start, 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(TOPOLOGIES))
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    rows = []
    for model in args.models.split(","):
        for generation in args.only.split(","):
            result = compile_one(TOPOLOGIES[generation], MODELS[model])
            rows.append({"model": model, "generation": generation, **result})
            gib = 2**30
            print(
                f"{model:5} {generation:6} {TOPOLOGIES[generation]:12} "
                f"HBM {int(result['hbm_bytes_per_device']) / gib:8.3f} / "  # type: ignore[call-overload]
                f"{int(result['hbm_capacity_bytes']) / gib:7.2f} GiB fits={result['fits']} "  # type: ignore[call-overload]
                f"step {float(result['step_time_s']) * 1e3:9.3f} ms ({result['bound']}) "  # type: ignore[arg-type]
                f"exit {result['exit_code']} compile {result['wall_s']} s",
                flush=True,
            )
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
