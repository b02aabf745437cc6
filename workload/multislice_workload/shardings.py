"""`shardings` mode: the pedagogical sharding benchmark of the Multislice overview.

MaxText's ``pedagogical_examples/shardings.py`` (now ``src/maxtext/examples/shardings.py``), same
computation: a stack of layers, each ``sigmoid(x @ EMB2FF.T)`` then ``sigmoid(. @ FF2EMB)``, every
result constrained to the activation sharding ``P(batch axes, tensor)``, weights ``P(tensor,
fsdp)``, loss ``sum``, one SGD step; the same FLOP formula (6 x parameters x batch / devices). It
times the step and reports TFLOP/s per device and MFU, which is how the overview compares ICI and
DCN layouts (e.g. ~260 TFLOP/s, >90% MFU, on a v4-8 with 4-way FSDP). The batch axes are
``(pipeline, data, fsdp)``: this benchmark has no pipeline schedule, a DCN pipeline factor just
splits the batch further.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable
from typing import Any

from multislice_workload import hardware, logs, runtime
from multislice_workload.common import add_parallelism_flags, divisible, make_mesh, parallelism_from
from multislice_workload.env import ConfigError, WorkloadEnv
from multislice_workload.exitcodes import EXIT_OK

# MaxText's data_sharding is P(("data", "fsdp"), "tensor"); the operator's extra DCN axis joins.
BATCH_AXES: tuple[str, ...] = ("pipeline", "data", "fsdp")


@dataclasses.dataclass(frozen=True)
class ShardingsConfig:
    batch_per_device: int
    embedding: int
    num_layers: int
    steps: int
    dtype: str

    @property
    def d_ff(self) -> int:
        return 4 * self.embedding

    def parameters(self) -> int:
        return 2 * self.d_ff * self.embedding * self.num_layers

    def flops_per_step(self, devices: int) -> float:
        # 6 x parameters x tokens: forward 2, backward 4 (as in the seed).
        return 6.0 * self.parameters() * self.batch_per_device * devices


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # None = pick per platform: the seed's sizes fill a TPU's HBM and would take hours on a CPU.
    parser.add_argument("--batch_size", "-b", type=int, default=None, help="per device")
    parser.add_argument("--embedding_dimension", "-d", type=int, default=None)
    parser.add_argument("--num_layers", "-n", type=int, default=None)
    parser.add_argument("--steps", type=int, default=5, help="timed steps after one warm-up")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default=None)
    parser.add_argument("--peak_flops", type=float, default=None, help="per device; overrides")
    add_parallelism_flags(parser)


def config_from(args: argparse.Namespace, tpu: bool) -> ShardingsConfig:
    seed_sizes = (131072, 2048, 4, "bfloat16")  # the overview's command line
    cpu_sizes = (128, 256, 4, "float32")  # bf16 matmuls are emulated, slowly, on CPU
    batch, emb, layers, dtype = seed_sizes if tpu else cpu_sizes
    return ShardingsConfig(
        batch_per_device=args.batch_size or batch,
        embedding=args.embedding_dimension or emb,
        num_layers=args.num_layers or layers,
        steps=args.steps,
        dtype=args.dtype or dtype,
    )


def _check_shapes(cfg: ShardingsConfig, mesh: Any) -> None:
    shape = dict(mesh.shape)
    batch_shards = shape["pipeline"] * shape["data"] * shape["fsdp"]
    problems = divisible("global batch", cfg.batch_per_device * mesh.size, batch_shards)
    problems += divisible("embedding_dimension", cfg.embedding, shape["tensor"])
    problems += divisible("embedding_dimension", cfg.embedding, shape["fsdp"])
    if problems:
        raise ConfigError("; ".join(problems))


def _build_step(cfg: ShardingsConfig, mesh: Any) -> tuple[Callable[[], Any], float]:
    """Jitted (data, layers) -> layers, called on pre-sharded inputs; returns a thunk to time."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    dtype = jnp.dtype(cfg.dtype)
    batch = cfg.batch_per_device * mesh.size
    data_sharding = NamedSharding(mesh, P(BATCH_AXES, "tensor"))
    param_sharding = NamedSharding(mesh, P("tensor", "fsdp"))

    def constrain(x: Any) -> Any:
        return jax.lax.with_sharding_constraint(x, data_sharding)

    def gen_layers(key: Any) -> Any:
        layers = []
        for k in jax.random.split(key, cfg.num_layers):
            k1, k2 = jax.random.split(k)
            shape = (cfg.d_ff, cfg.embedding)
            layers.append(
                {
                    "EMB2FF": 1e-4 * jax.random.normal(k1, shape, dtype),
                    "FF2EMB": 1e-4 * jax.random.normal(k2, shape, dtype),
                }
            )
        return tuple(layers)

    def multiply_layer(x: Any, layer: Any) -> Any:
        m1 = constrain(jax.nn.sigmoid(x @ layer["EMB2FF"].T))
        return constrain(jax.nn.sigmoid(m1 @ layer["FF2EMB"]))

    def loss(x: Any, layers: Any) -> Any:
        for layer in layers:
            x = constrain(multiply_layer(x, layer))
        return jnp.sum(x)

    def step(x: Any, layers: Any) -> Any:
        grads = jax.grad(loss, argnums=1)(x, layers)
        return jax.tree.map(lambda p, g: p - 1e-4 * g, layers, grads)

    key = jax.random.key(0)
    x = jax.jit(
        lambda k: jax.random.uniform(k, (batch, cfg.embedding), dtype), out_shardings=data_sharding
    )(key)
    layers = jax.jit(gen_layers, out_shardings=param_sharding)(key)
    jit_step = jax.jit(step, out_shardings=param_sharding)
    return (lambda: jax.block_until_ready(jit_step(x, layers))), _memory_gb(cfg, batch)


def _memory_gb(cfg: ShardingsConfig, batch: int) -> float:
    itemsize = 2 if cfg.dtype == "bfloat16" else 4
    parameter_bytes = itemsize * cfg.parameters()
    activation_bytes = itemsize * batch * (cfg.d_ff + cfg.embedding) * cfg.num_layers
    return (parameter_bytes + activation_bytes) / 1e9


def time_step(step: Callable[[], Any], tries: int) -> list[float]:
    """Seconds per call after one warm-up call (which compiles)."""
    step()
    timings = []
    for _ in range(tries):
        start = time.perf_counter()
        step()
        timings.append(time.perf_counter() - start)
    return timings


def run(env: WorkloadEnv, args: argparse.Namespace) -> int:
    import jax

    cfg = config_from(args, runtime.on_tpu())
    mesh = make_mesh(env, parallelism_from(args, env), args.allow_split_physical_axes)
    _check_shapes(cfg, mesh)
    peak, peak_source = hardware.device_peak(args.peak_flops, env.accelerator, cfg.dtype)
    step, memory_gb = _build_step(cfg, mesh)
    logs.emit("shardings_config", **dataclasses.asdict(cfg), memory_gb=round(memory_gb, 4))
    timings = time_step(step, cfg.steps)
    seconds = sum(timings) / len(timings)
    flop_per_device = cfg.flops_per_step(mesh.size) / mesh.size
    achieved = flop_per_device / seconds
    logs.emit(
        "shardings_result",
        global_devices=jax.device_count(),
        step_seconds=seconds,
        timings=timings,
        tflop_per_device_per_step=flop_per_device / 1e12,
        tflops_per_device=achieved / 1e12,
        peak_tflops_per_device=None if peak is None else peak / 1e12,
        peak_source=peak_source,
        mfu=None if peak is None else achieved / peak,
    )
    return EXIT_OK
