"""Logical axis names -> mesh axes, and the collectives of the explicitly partitioned model.

Every parameter and activation dimension has a logical name (``embed``, ``heads``, ``batch``, ...);
one table maps the names onto the mesh axes ``pipeline``, ``data``, ``fsdp`` and ``tensor`` (the
idea of flax's ``logical_axis_rules`` and MaxText's ``logical_axis_rules``, without the framework).
The DCN factors need no rules of their own: the mesh axis ``fsdp`` is ``ici_fsdp x dcn_fsdp``
devices long, ``data`` is ``ici_data x dcn_data`` and ``pipeline`` is ``dcn_pipeline``.

The loss runs inside one ``shard_map`` manual over every mesh axis (`model.loss`), so each
collective of the step is one written here, where it is needed, and nothing is left to the
partitioner (which, in a partially manual region, re-gathered weights over ``tensor`` and made
each FSDP weight's cotangent replicated before reduce-scattering it: 3x the gradient bytes).
This is the pattern of JAX's shard_map FSDP example (the matmul inside the ``shard_map`` next to
its ``all_gather``; https://docs.jax.dev/en/latest/notebooks/shard_map.html, "FSDP"):

- a weight is cast to the compute dtype, then all-gathered over ``fsdp`` (`gather`), where it
  is used; its custom VJP is one ``psum_scatter``: one reduce-scatter per weight gradient, in
  the gradient-reduction dtype (``--grad_reduce_dtype``, float32 by default, as MaxText's
  ``grad_dtype``; JAX's own transpose of the gather would reduce in the compute dtype);
- a parameter replicated over batch axes is marked varying over them once, at the top of the
  loss (`vary`): the transpose of that ``pcast`` is the gradient's one all-reduce over those
  axes (``data``, and ``pipeline`` for the embedding), on the fsdp shard; the train
  step differentiates after the mark and writes that ``psum`` itself, once per step after the
  gradient-accumulation microbatches are summed, in the gradient-reduction dtype
  (`model.local_loss_and_grads`);
- tensor parallelism is Megatron's: column-parallel matmuls on activations marked varying over
  ``tensor`` (`to_tensor`; its transpose is the backward all-reduce) and row-parallel matmuls
  followed by a ``psum`` (`tensor_sum`; its transpose moves nothing).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

# Logical dimension name -> mesh axis (or axes, major first); unnamed dims are replicated.
LOGICAL_RULES: dict[str, str | tuple[str, ...]] = {
    # Activations: examples over every device that is not tensor-parallel. The pipeline axis is
    # a batch axis outside the staged layers: embedding, logits and loss run once per example,
    # on the stage that holds it (`pipeline.py`), not on every stage.
    "batch": ("pipeline", "data", "fsdp"),
    "layers": "pipeline",  # the layer stack: contiguous blocks of layers per pipeline stage
    "embed": "fsdp",  # weights: the model dimension is what FSDP shards
    "vocab": "tensor",
    "heads": "tensor",
    "mlp": "tensor",
    # An activation's heads (`attention.splash` called under a mesh, outside `model.loss`).
    "act_heads": "tensor",
}
BATCH_AXES: tuple[str, ...] = ("pipeline", "data", "fsdp")

Logical = tuple[str | None, ...]


def logical_to_spec(names: Sequence[str | None]) -> Any:
    """PartitionSpec for a tuple of logical names; a mesh axis is used at most once per array."""
    from jax.sharding import PartitionSpec as P

    used: set[str] = set()
    out: list[str | tuple[str, ...] | None] = []
    for name in names:
        rule = LOGICAL_RULES.get(name) if name else None
        axes = (rule,) if isinstance(rule, str) else tuple(rule or ())
        free = tuple(a for a in axes if a not in used)
        used.update(free)
        out.append(None if not free else free[0] if len(free) == 1 else free)
    return P(*out)


def named(mesh: Any, names: Sequence[str | None]) -> Any:
    from jax.sharding import NamedSharding

    return NamedSharding(mesh, logical_to_spec(names))


def tree_specs(logical_tree: Any) -> Any:
    """PartitionSpecs for a pytree whose leaves are tuples of logical names."""
    import jax

    return jax.tree.map(logical_to_spec, logical_tree, is_leaf=_is_names)


def tree_shardings(mesh: Any, logical_tree: Any) -> Any:
    """NamedShardings for a pytree whose leaves are tuples of logical names."""
    import jax

    return jax.tree.map(lambda names: named(mesh, names), logical_tree, is_leaf=_is_names)


def _is_names(x: Any) -> bool:
    return isinstance(x, tuple) and all(n is None or isinstance(n, str) for n in x)


# --- Inside the manual region (every function below runs under `shard_map`). ----------------


def axis_size(axis: str) -> int:
    import jax

    return int(jax.lax.axis_size(axis))


def vary(x: Any, axes: Sequence[str]) -> Any:
    """`x` marked device-varying over `axes`: no data moves; the gradient of `x` is all-reduced
    over those of `axes` it was replicated on, once, where this is called."""
    import jax

    missing = tuple(a for a in axes if a not in varying_axes(x))
    return jax.lax.pcast(x, missing, to="varying") if missing else x


def varying_axes(*xs: Any) -> tuple[str, ...]:
    """The manual mesh axes over which any of `xs` varies (none outside `shard_map`): a loop
    carry started from constants must be marked with them to keep its type."""
    import jax

    found: set[str] = set()
    for x in xs:
        aval = jax.typeof(x)
        # JAX 0.10 names it ``mat.varying`` (earlier releases: ``vma``).
        mat = getattr(aval, "mat", None)
        found |= set(mat.varying if mat is not None else getattr(aval, "vma", ()))
    return tuple(sorted(found))


def gather(w: Any, names: Sequence[str | None], dtype: Any, reduce_dtype: Any = None) -> Any:
    """This device's shard of a weight, cast to `dtype` and then all-gathered over ``fsdp`` (so
    the gather moves compute-dtype bytes); its gradient is reduce-scattered back to the shard
    in `reduce_dtype` (default `dtype`, what JAX's transpose of the gather would use)."""
    import jax

    spec = logical_to_spec(names)
    if "fsdp" not in spec or axis_size("fsdp") == 1:
        return w.astype(dtype)
    axis = list(spec).index("fsdp")
    reduce = jax.numpy.dtype(reduce_dtype or dtype)
    gathered: Any = _fsdp_gather()(w, axis, jax.numpy.dtype(dtype), reduce, w.dtype)
    return gathered


@functools.cache
def _fsdp_gather() -> Any:
    """cast + all_gather over ``fsdp`` whose backward casts the cotangent to the reduce dtype,
    reduce-scatters it, and casts the shard back to the weight's dtype (`own`)."""
    import jax

    def forward(w: Any, axis: int, dtype: Any, reduce: Any, own: Any) -> Any:
        return jax.lax.all_gather(w.astype(dtype), "fsdp", axis=axis, tiled=True)

    def forward_with_residual(
        w: Any, axis: int, dtype: Any, reduce: Any, own: Any
    ) -> tuple[Any, None]:
        return forward(w, axis, dtype, reduce, own), None

    def backward(axis: int, dtype: Any, reduce: Any, own: Any, _: None, ct: Any) -> tuple[Any]:
        shard = jax.lax.psum_scatter(ct.astype(reduce), "fsdp", scatter_dimension=axis, tiled=True)
        return (shard.astype(own),)

    gather = jax.custom_vjp(forward, nondiff_argnums=(1, 2, 3, 4))
    gather.defvjp(forward_with_residual, backward)
    return gather


def to_tensor(x: Any) -> Any:
    """An activation replicated over ``tensor`` entering column-parallel matmuls: no data moves
    forward; its gradient is summed over ``tensor`` (one all-reduce) in the backward pass."""
    return vary(x, ("tensor",))


def tensor_sum(x: Any) -> Any:
    """Sum of the partial results of a row-parallel matmul over ``tensor`` (one all-reduce)."""
    import jax

    return jax.lax.psum(x, "tensor")


def tensor_offset(local_size: int) -> Any:
    """First global index of this device's slice of a dimension sharded over ``tensor``."""
    import jax

    return jax.lax.axis_index("tensor") * local_size if axis_size("tensor") > 1 else 0


def bytes_per_device(tree: Any) -> dict[str, int]:
    """Bytes held by each addressable device for the arrays of a pytree (shards, not globals)."""
    import jax

    out: dict[str, int] = {}
    for leaf in jax.tree.leaves(tree):
        for shard in leaf.addressable_shards:
            key = str(shard.device.id)
            out[key] = out.get(key, 0) + int(shard.data.nbytes)
    return out
