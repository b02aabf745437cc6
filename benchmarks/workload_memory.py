"""Memory per parameter of the workload's train step, for each memory option, on this CPU.

Not a test. One CPU device, the LM at a fixed size, each option compiled ahead of time (nothing
runs): the train state's bytes per parameter, counted from its arrays (parameters, master copy,
Adam's moments), and the compiled step's peak bytes per parameter from XLA's
``memory_analysis()``: arguments + outputs - donated (aliased) buffers + temporaries (gradients,
saved activations, scratch). The baseline is float32 parameters and moments, full remat, one
microbatch, in the same run.

The layers cast each weight to the compute dtype (float32 here) before gathering it, block by
block (`partitioning.gather`), so the bf16-parameter options' temporaries hold one block's float32
weights at a time; their state bytes are exact on every platform.

    .venv/bin/python -m benchmarks.workload_memory [--seq_len 256] [--batch_size 8]
    .venv/bin/python -m benchmarks.workload_memory --attention-only   # scratch bytes vs T
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from benchmarks.workload_common import load_average, machine

RESULTS = Path(__file__).resolve().parent / "results" / "workload_memory.json"
ATTENTION_RESULTS = RESULTS.with_name("workload_attention_memory.json")

# (name, TrainConfig overrides); the first is the baseline.
OPTIONS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("fp32 params + fp32 Adam (baseline)", {}),
    ("bf16 params + fp32 master + fp32 Adam", {"param_dtype": "bfloat16"}),
    ("fp32 params + bf16 Adam", {"opt_state_dtype": "bfloat16"}),
    ("bf16 params + fp32 master + bf16 Adam", {
        "param_dtype": "bfloat16", "opt_state_dtype": "bfloat16",
    }),
    ("grad_accum 4", {"grad_accum": 4}),
    ("remat none", {"remat": "none"}),
    ("remat minimal", {"remat": "minimal"}),
    ("remat save_qkv_proj", {"remat": "save_qkv_proj"}),
)  # fmt: skip


def measure(base: Any, overrides: dict[str, Any]) -> dict[str, Any]:
    import jax
    import numpy as np

    from multislice_workload import train
    from multislice_workload.mesh import MESH_AXES

    cfg = dataclasses.replace(base, **overrides)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1, 1), MESH_AXES)
    trainer = train.Trainer(cfg, mesh, train.check_shapes(cfg, mesh))
    params = trainer.model.parameter_count()
    state = sum(x.nbytes for x in jax.tree.leaves(trainer.initial_state))
    m = trainer.compiled.memory_analysis()
    peak = (
        m.argument_size_in_bytes
        + m.output_size_in_bytes
        - m.alias_size_in_bytes
        + m.temp_size_in_bytes
    )
    return {
        "parameters": params,
        "state_bytes_per_param": state / params,
        "temp_bytes_per_param": m.temp_size_in_bytes / params,
        "peak_bytes_per_param": peak / params,
        "peak_bytes": int(peak),
    }


def attention_temp_bytes(impl: str, length: int) -> int:
    """XLA's scratch bytes for attention's forward + backward at context `length` (batch 1, 4
    heads of 64, float32), compiled only."""
    import jax
    import jax.numpy as jnp

    from multislice_workload import attention

    def loss(q: Any) -> Any:
        return (attention.attend(q, q, q, impl=impl, block=256) ** 2).sum()

    q = jax.ShapeDtypeStruct((1, length, 4, 64), jnp.float32)
    return int(jax.jit(jax.grad(loss)).lower(q).compile().memory_analysis().temp_size_in_bytes)


def attention_table() -> list[dict[str, Any]]:
    rows = []
    for length in (512, 1024, 2048, 4096):
        row = {"seq_len": length}
        for impl in ("xla", "blockwise"):
            row[f"{impl}_temp_bytes"] = attention_temp_bytes(impl, length)
        rows.append(row)
        print(
            f"attention T={length:>5}: xla {row['xla_temp_bytes'] / 1e6:8.1f} MB, "
            f"blockwise {row['blockwise_temp_bytes'] / 1e6:6.1f} MB",
            flush=True,
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--seq_len", type=int, default=256)
    parser.add_argument("--embed", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--attention-only", action="store_true", help="only the T table")
    args = parser.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    # Nothing runs but the initialization: compile without LLVM's optimizations (buffer
    # assignment, what memory_analysis reports, happens before them).
    os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")

    from multislice_workload import train

    if args.attention_only:
        rows = attention_table()
        ATTENTION_RESULTS.write_text(json.dumps({"attention_temp_bytes": rows}, indent=2) + "\n")
        print(f"wrote {ATTENTION_RESULTS}")
        return 0
    base = train.TrainConfig(
        steps=10,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        embed=args.embed,
        heads=args.embed // 64,
        head_dim=64,
        mlp=4 * args.embed,
        num_layers=args.layers,
        dtype="float32",
        data_threads=0,
        vocab=args.vocab,
    )
    rows = []
    for name, overrides in OPTIONS:
        rows.append({"option": name, **measure(base, overrides)})
        print(f"measured {name}", flush=True)
    baseline = rows[0]
    print(f"model: {baseline['parameters']:,} parameters; batch {args.batch_size} x {args.seq_len}")
    print(f"{'option':<40} {'state B/param':>13} {'peak B/param':>12} {'peak vs base':>12}")
    for r in rows:
        r["peak_vs_baseline"] = r["peak_bytes"] / baseline["peak_bytes"]
        print(
            f"{r['option']:<40} {r['state_bytes_per_param']:>13.2f} "
            f"{r['peak_bytes_per_param']:>12.2f} {r['peak_vs_baseline']:>12.2f}"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": "workload_memory",
        "machine": machine(),
        "config": vars(args),
        "options": rows,
        "load_average_1m_at_end": load_average(),
    }
    RESULTS.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
