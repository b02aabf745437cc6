"""GPipe over the ``pipeline`` mesh axis, written per device (inside `model.loss`'s shard_map).

The layer stack [layers, ...] is sharded over ``pipeline`` on its first dimension, so stage s
holds the contiguous layers s x L/S .. (s + 1) x L/S - 1 as its local block. Outside the staged
layers ``pipeline`` is a batch axis: each stage embeds, and later scores, only its own rows of
the batch, viewed as M/S microbatch slots ("state_io", as MaxText's `layers/pipeline.py`).

Every iteration t each stage runs its layers on the activation it holds, then two
collective-permutes move one microbatch's local activations across each stage boundary:

- ``shift``: stage s hands its result to stage s + 1 (the pipeline itself);
- ``state_io``: slot t mod M/S of every stage moves to the stage below, and the last stage puts
  the microbatch it just finished there. Stage 0 so reads microbatch t at iteration t for t < M,
  and each finished microbatch ends, after the last iteration, on the stage whose rows it is
  (microbatch j of a stage in slot (j + S - 1) mod M/S, undone by a roll).

Neither permute has a wrap-around pair: the last stage sends nothing on ``shift`` and stage 0
nothing on ``state_io``. The backward pass is the transpose: two permutes per iteration the other
way. M microbatches take M + S - 1 iterations, so each stage idles (S - 1) / (M + S - 1) of them
(the schedule's bound; `measure_bubble` measures it from per-stage timings).

FSDP: a stage's weights are gathered once, before the loop, and their gradients reduce-scattered
once after it (MaxText's ``pipeline_fsdp_ag_once``), not on each of the M + S - 1 iterations;
the price is the stage's full weights (compute dtype) held during the step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from multislice_workload.model import ModelConfig, Segments, decoder_layer, gather_layer, remat


def bubble_fraction(stages: int, microbatches: int) -> float:
    """Share of stage-iterations that do no useful work in a GPipe schedule (its bound)."""
    return (stages - 1) / (microbatches + stages - 1)


def default_microbatches(stages: int, batch: int, batch_shards: int) -> int:
    """The most microbatches up to 4 per stage, a multiple of the stages, whose rows split
    evenly over the data-parallel devices of a stage (`batch_shards`)."""
    for m in range(4 * stages, 0, -stages):
        if batch % m == 0 and (batch // m) % batch_shards == 0:
            return m
    return stages


def run_stage(
    weights: dict[str, Any], h: Any, cfg: ModelConfig, packed: Segments | None = None
) -> Any:
    """A stage's blocks (gathered `weights` [L/S, ...]) on one microbatch, each rematerialized;
    `packed`: the microbatch's segments."""
    import jax

    def block(x: Any, w: dict[str, Any]) -> tuple[Any, None]:
        return decoder_layer(x, w, cfg, packed), None

    out, _ = jax.lax.scan(remat(block, cfg), h, weights)
    return out


def run_pipeline(
    layers: dict[str, Any],
    x: Any,
    cfg: ModelConfig,
    stages: int,
    microbatches: int,
    packed: Segments | None = None,
) -> Any:
    """This stage's `layers` [L/S, ...] applied, as a GPipe schedule, to every row of the batch;
    x: this device's rows [local batch, seq, embed] (this stage's M/S microbatches); `packed`:
    the segments of those rows. A stage runs every microbatch, so it needs every stage's
    segments: they are all-gathered over ``pipeline`` once per step (2 int32 per token), and at
    iteration t stage s takes microbatch t - s's (microbatch m is slot m mod M/S of stage
    m div M/S, the order `state_io` feeds stage 0)."""
    import jax
    import jax.numpy as jnp

    slots = microbatches // stages
    rows, seq, width = x.shape
    state_io = x.reshape(slots, rows // slots, seq, width)
    weights = gather_layer(layers, cfg, stacked=True)  # once per step, not per iteration
    stage = jax.lax.axis_index("pipeline")
    down = [(s, s + 1) for s in range(stages - 1)]
    up = [(s + 1, s) for s in range(stages - 1)]
    every = None
    if packed is not None:
        # [S, M/S, microbatch rows, 2, seq]: every stage's segments, by stage and slot.
        mine = jnp.stack(packed, axis=1).reshape(slots, rows // slots, 2, seq)
        every = jax.lax.all_gather(mine, "pipeline")

    def segments_at(t: Any) -> Segments | None:
        if every is None:
            return None
        m = jnp.clip(t - stage, 0, microbatches - 1)  # outside 0..M-1: a bubble, any will do
        both = every[m // slots, m % slots]
        return Segments(both[:, 0], both[:, 1])

    def iteration(carry: tuple[Any, Any], t: Any) -> tuple[tuple[Any, Any], None]:
        shift, state_io = carry
        slot = t % slots
        held = jax.lax.dynamic_index_in_dim(state_io, slot, keepdims=False)
        out = run_stage(weights, jnp.where(stage == 0, held, shift), cfg, segments_at(t))
        shift = jax.lax.ppermute(out, "pipeline", down)
        moved = jax.lax.ppermute(held, "pipeline", up)
        landed = jnp.where(stage == stages - 1, out, moved)
        return (shift, jax.lax.dynamic_update_index_in_dim(state_io, landed, slot, 0)), None

    # No checkpoint around an iteration: its layers already rematerialize, and a second level
    # would run every forward a third time.
    carry = (jnp.zeros_like(state_io[0]), state_io)
    (_, state_io), _ = jax.lax.scan(iteration, carry, jnp.arange(microbatches + stages - 1))
    return jnp.roll(state_io, -(stages - 1), axis=0).reshape(rows, seq, width)


def measure_bubble(
    cfg: ModelConfig, mesh: Any, microbatches: int, batch: int, tries: int = 3
) -> dict[str, float]:
    """The bubble from timings of this process's stage: its busy time is that of its own work
    for one step (its blocks, forward and backward, on all M microbatches, on its devices alone,
    weights gathered once as in the pipeline); the pipelined blocks take longer by the idle
    iterations and the transfers: ``bubble = 1 - stage / pipelined``.

    Collective (every process calls it). On CPU the forced devices share the cores, so a stage
    alone runs faster than inside the full pipeline and the figure reads high; on TPU each stage
    has chips of its own."""
    import jax
    import numpy as np

    stages = int(mesh.shape["pipeline"])
    width = (cfg.seq_len, cfg.embed)
    pipelined = _probe(cfg, mesh, (batch, *width), microbatches, stages)
    mine = [s for s in range(stages) if any(
        d.process_index == jax.process_index() for d in mesh.devices[s].flat
    )]  # fmt: skip
    stage = mine[0]
    stage_mesh = jax.sharding.Mesh(mesh.devices[stage : stage + 1], mesh.axis_names)
    alone = _probe(cfg, stage_mesh, (microbatches, batch // microbatches, *width), 1, stages)
    pipelined_s = _median_seconds(pipelined, tries)
    stage_s = _median_seconds(alone, tries)
    return {
        "stage": float(stage),
        "pipelined_seconds": pipelined_s,
        "stage_seconds": stage_s,
        "bubble_measured": float(np.clip(1.0 - stage_s / pipelined_s, 0.0, 1.0)),
        "bubble_bound": bubble_fraction(stages, microbatches),
    }


def _probe(
    cfg: ModelConfig, mesh: Any, shape: tuple[int, ...], microbatches: int, stages: int
) -> Callable[[], Any]:
    """A thunk running forward + backward of the blocks of one step: pipelined over `mesh`
    (x [batch, seq, embed]), or, with `microbatches` 1, one stage's blocks on its own mesh over
    x [M, batch / M, seq, embed], microbatch after microbatch."""
    import functools

    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from multislice_workload.model import param_axes
    from multislice_workload.partitioning import BATCH_AXES, logical_to_spec, tree_specs, vary

    layer_specs = tree_specs(param_axes(cfg)["layers"])
    lead: tuple[None, ...] = (None,) * (len(shape) - 3)
    act = logical_to_spec((*lead, "batch", None, None))
    per_stage = cfg.layers // stages
    shapes = {
        k: (per_stage * int(mesh.shape["pipeline"]), *v[1:])
        for k, v in cfg.shapes()["layers"].items()
    }

    def local(layers: dict[str, Any], x: Any) -> Any:
        layers = jax.tree.map(lambda w: vary(w, BATCH_AXES), layers)
        if microbatches > 1:
            out = run_pipeline(layers, x, cfg, stages, microbatches)
        else:
            weights = gather_layer(layers, cfg, stacked=True)
            out = jax.lax.map(lambda h: run_stage(weights, h, cfg), x)
        return jax.lax.psum(out.astype(jnp.float32).sum(), BATCH_AXES)

    mapped = jax.shard_map(local, mesh=mesh, in_specs=(layer_specs, act), out_specs=P())
    step = jax.jit(jax.grad(mapped, argnums=(0, 1)))
    made = jax.jit(
        functools.partial(_inputs, shapes, shape, jnp.dtype(cfg.dtype)),
        out_shardings=(
            {k: NamedSharding(mesh, spec) for k, spec in layer_specs.items()},
            NamedSharding(mesh, act),
        ),
    )()
    return lambda: step(*made)


def _inputs(shapes: dict[str, tuple[int, ...]], x: tuple[int, ...], dtype: Any) -> Any:
    import jax.numpy as jnp

    layers = {k: jnp.full(s, 0.02, jnp.float32) for k, s in shapes.items()}
    return layers, jnp.full(x, 0.1, dtype)


def _median_seconds(fn: Callable[[], Any], tries: int) -> float:
    import statistics

    import jax

    jax.block_until_ready(fn())  # compile, warm up
    timings = []
    for _ in range(tries):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        timings.append(time.perf_counter() - start)
    return statistics.median(timings)
