"""GPipe over the ``pipeline`` mesh axis: stage-stacked layers, microbatches, collective permutes.

The layer stack [layers, ...] is sharded over ``pipeline`` on its first dimension, so stage s
holds the contiguous layers s x L/S .. (s + 1) x L/S - 1; viewed as [stages, L/S, ...] that split
is free (no data moves). Every iteration each stage runs its layers on the activation it holds
(a ``vmap`` over stages per layer, partitioned by ``spmd_axis_name='pipeline'``, the weights
gathered over ``fsdp`` outside it), then the activations
move one stage on: ``jnp.roll`` over the stage dimension, which the partitioner lowers to a
collective-permute between neighbouring stages (over DCN when stages are slices). Stage 0 takes
microbatch t at iteration t; the last stage finishes microbatch t - (S - 1). M microbatches
take M + S - 1 iterations, so each stage idles for (S - 1) / (M + S - 1) of them: the bubble.
The backward pass is the transpose of this loop (activation gradients permute the other way).

Microbatch m holds rows m, m + M, m + 2M, ... of the batch, so each microbatch stays spread over
every data-parallel device (a contiguous split would put whole microbatches on single devices).
"""

from __future__ import annotations

from typing import Any

from multislice_workload.model import WEIGHT_AXES, ModelConfig, decoder_layer, gather_layer, remat
from multislice_workload.sharding import constrain, local_reshape


def bubble_fraction(stages: int, microbatches: int) -> float:
    """Share of stage-iterations that do no useful work in a GPipe schedule."""
    return (stages - 1) / (microbatches + stages - 1)


def default_microbatches(stages: int, batch: int, batch_shards: int) -> int:
    """The most microbatches up to 4 per stage that split the batch evenly over its shards."""
    for m in range(4 * stages, 0, -1):
        if batch % m == 0 and (batch // m) % batch_shards == 0:
            return m
    return 1


def stage_view(layers: dict[str, Any], stages: int, mesh: Any) -> dict[str, Any]:
    """[layers, ...] -> [stages, layers per stage, ...]; local because the stack is sharded over
    ``pipeline`` in contiguous blocks."""

    def split(name: str, w: Any) -> Any:
        shape = (stages, w.shape[0] // stages, *w.shape[1:])
        return local_reshape(w, mesh, ("layers", *WEIGHT_AXES[name]), shape)

    return {name: split(name, w) for name, w in layers.items()}


def run_pipeline(
    layers: dict[str, Any], x: Any, cfg: ModelConfig, mesh: Any, stages: int, microbatches: int
) -> Any:
    """`run_layers` on x [batch, seq, embed], as a GPipe schedule over `stages` stages."""
    import jax
    import jax.numpy as jnp

    batch, seq, width = x.shape
    mb = batch // microbatches
    staged = stage_view(layers, stages, mesh)
    # [batch] -> [microbatch, rows of it]: row r goes to microbatch r % M.
    xs = constrain(
        x.reshape(mb, microbatches, seq, width).swapaxes(0, 1), mesh, (None, "batch", None, None)
    )
    stage_index = jnp.arange(stages)[:, None, None, None]
    buffer_axes = ("stage", "batch", None, None)

    # [stages, per stage, ...] -> [per stage, stages, ...] (local): scan over a stage's layers,
    # every stage at once. The FSDP gather runs outside the vmap, on all stages' weights.
    by_layer = jax.tree.map(lambda w: w.swapaxes(0, 1), staged)
    compute = jax.vmap(lambda w, h: decoder_layer(h, w, cfg, mesh), spmd_axis_name="pipeline")

    def block(h: Any, layer: dict[str, Any]) -> tuple[Any, None]:
        return compute(gather_layer(layer, cfg, mesh, lead=("stage",)), h), None

    def per_stage(h: Any) -> Any:
        out, _ = jax.lax.scan(remat(block, cfg), h, by_layer)
        return out

    def iteration(carry: tuple[Any, Any], t: Any) -> tuple[tuple[Any, Any], None]:
        held, outputs = carry
        fresh = jax.lax.dynamic_index_in_dim(xs, jnp.minimum(t, microbatches - 1), keepdims=True)
        inputs = constrain(jnp.where(stage_index == 0, fresh, held), mesh, buffer_axes)
        out = constrain(per_stage(inputs), mesh, buffer_axes)
        finished = t - (stages - 1)  # the microbatch leaving the last stage, if any
        slot = jnp.clip(finished, 0, microbatches - 1)
        current = jax.lax.dynamic_index_in_dim(outputs, slot, keepdims=False)
        done = jnp.where(finished >= 0, out[stages - 1], current)
        outputs = jax.lax.dynamic_update_index_in_dim(outputs, done, slot, axis=0)
        # Stage s hands its result to stage s + 1: a collective-permute over `pipeline`.
        return (constrain(jnp.roll(out, 1, axis=0), mesh, buffer_axes), outputs), None

    held = constrain(jnp.zeros((stages, mb, seq, width), x.dtype), mesh, buffer_axes)
    outputs = jnp.zeros_like(xs)
    # No checkpoint around an iteration: its layers already rematerialize, and a second level
    # would run every forward a third time (and gather every FSDP weight a third time).
    (_, outputs), _ = jax.lax.scan(
        iteration, (held, outputs), jnp.arange(microbatches + stages - 1)
    )
    return outputs.swapaxes(0, 1).reshape(batch, seq, width)
