"""The workload's train step on 8 forced CPU devices: bytes per device per step of every
collective, read from the compiled step's optimized HLO, against the analytic minimum; and the
live bytes after a restore against one train state, next to the old restore path (a random init
built as the template, then the restore) in the same run.

Not a test (tests/workload/test_workload_traffic.py and test_workload_restore.py assert the same).

    .venv/bin/python -m benchmarks.workload_traffic [--layers 4] [--embed 32]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

RESULTS = Path(__file__).resolve().parent / "results" / "workload_traffic.json"
LAYOUTS = {
    "fsdp 8": (1, 1, 8, 1),
    "fsdp 4 x tensor 2": (1, 1, 4, 2),
    "data 2 x fsdp 4": (1, 2, 4, 1),
    "data 8": (1, 8, 1, 1),
    "pipeline 2 x fsdp 2 x tensor 2": (2, 1, 2, 2),
}


def trainer(shape: tuple[int, ...], cfg: Any) -> Any:
    import jax
    import numpy as np

    from multislice_workload import train
    from multislice_workload.mesh import MESH_AXES

    mesh = jax.sharding.Mesh(np.array(jax.devices()[: math.prod(shape)]).reshape(shape), MESH_AXES)
    return train.Trainer(cfg, mesh, train.check_shapes(cfg, mesh))


def traffic_rows(cfg: Any) -> list[dict[str, Any]]:
    from multislice_workload import hlo, traffic
    from multislice_workload.mesh import MESH_AXES

    rows = []
    for name, shape in LAYOUTS.items():
        t = trainer(shape, cfg)
        found = hlo.collectives(t.compiled.as_text(), t.mesh.size)
        got = hlo.summarize(found, t.mesh.devices.shape, MESH_AXES)
        want = traffic.expected_bytes(t.model, dict(t.mesh.shape), cfg.batch_size, t.microbatches)
        for key in sorted(set(got) | set(want)):
            rows.append(
                {
                    "layout": name,
                    "collective": key[0],
                    "axes": list(key[1]),
                    "executions": got.get(key, {}).get("executions", 0),
                    "hlo_bytes": got.get(key, {}).get("bytes", 0.0),
                    "minimum_bytes": want.get(key, 0.0),
                }
            )
    return rows


def device_bytes(arrays: list[Any]) -> int:
    return sum(
        math.prod(a.sharding.shard_shape(a.shape))
        * a.dtype.itemsize
        * len(a.sharding.addressable_devices)
        for a in arrays
    )


def restore_bytes(cfg: Any) -> dict[str, int]:
    import jax

    from multislice_workload import datasets
    from multislice_workload.checkpoint import Checkpointer

    shape = (1, 2, 4, 1)
    directory = tempfile.mkdtemp(prefix="traffic-restore-")
    t = trainer(shape, cfg)
    windows = datasets.stdlib_windows(cfg.seq_len + 1, "train")

    def feed_for(t: Any) -> datasets.GlobalBatches:
        return datasets.GlobalBatches(
            windows, cfg.batch_size, t.batch_sharding, cfg.seed, threads=0
        )

    feed = feed_for(t)
    state, _ = t.step(t.init_state(), next(feed))
    saver = Checkpointer(directory, 1, 1)
    saver.save(1, state, feed.get_state(), {})
    saver.wait()
    saver.close()
    one_state = device_bytes(jax.tree.leaves(state))
    del state, t
    gc.collect()
    out = {"one_state": one_state}
    for case in ("abstract (now)", "random init as template (before)"):
        before = {id(a) for a in jax.live_arrays()}
        t = trainer(shape, cfg)
        held = t.init_state() if case.startswith("random") else None  # the old template
        template = held if held is not None else t.abstract_state
        restored, _ = Checkpointer(directory, 1, 1).restore(1, template, feed_for(t))
        gc.collect()
        out[case] = device_bytes([a for a in jax.live_arrays() if id(a) not in before])
        del restored, held, template, t
        gc.collect()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--embed", type=int, default=32)
    args = parser.parse_args()
    from multislice_workload import train

    cfg = train.TrainConfig(
        batch_size=8, seq_len=16, embed=args.embed, heads=2, head_dim=args.embed // 2,
        mlp=2 * args.embed, num_layers=args.layers, dtype="float32", data_threads=0,
    )  # fmt: skip
    rows = traffic_rows(cfg)
    print(f"{'layout':<31} {'collective':<19} {'axes':<22} {'runs':>5} {'HLO B':>10} {'min B':>10}")
    for r in rows:
        print(
            f"{r['layout']:<31} {r['collective']:<19} {','.join(r['axes']):<22} "
            f"{r['executions']:>5.0f} {r['hlo_bytes']:>10.0f} {r['minimum_bytes']:>10.0f}"
        )
    restored = restore_bytes(cfg)
    print(f"one train state: {restored['one_state']:,} bytes on this process's devices")
    for case in ("abstract (now)", "random init as template (before)"):
        ratio = restored[case] / restored["one_state"]
        print(f"live after restore, {case}: {restored[case]:,} bytes ({ratio:.2f} states)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": "workload_traffic", "config": vars(args), "collectives": rows}
    RESULTS.write_text(json.dumps({**payload, "restore_live_bytes": restored}, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
