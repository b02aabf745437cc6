"""Logical axis names -> mesh axes, and the explicit FSDP weight gather.

Every parameter and activation dimension has a logical name (``embed``, ``heads``, ``batch``, ...);
one table maps the names onto the mesh axes ``pipeline``, ``data``, ``fsdp`` and ``tensor`` (the
idea of flax's ``logical_axis_rules`` and MaxText's ``logical_axis_rules``, without the framework).
The DCN factors need no rules of their own: the mesh axis ``fsdp`` is ``ici_fsdp x dcn_fsdp``
devices long, ``data`` is ``ici_data x dcn_data`` and ``pipeline`` is ``dcn_pipeline``.

FSDP gathers are explicit: each weight is all-gathered over ``fsdp`` right before its layer uses
it (`fsdp_gather`), inside a ``shard_map`` manual over ``fsdp`` only. JAX transposes that
``all_gather`` into a ``psum_scatter``, so the compiled step reduce-scatters every gradient back
to its shard on every backend. Left to the partitioner, XLA emits all-reduce + dynamic-slice and
only the GPU/TPU pipelines rewrite that into a reduce-scatter (``ReduceScatterCreator``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Logical dimension name -> mesh axis (or axes, major first); unnamed dims are replicated.
LOGICAL_RULES: dict[str, str | tuple[str, ...]] = {
    "batch": ("data", "fsdp"),  # activations: examples over every data-parallel device
    "layers": "pipeline",  # the layer stack: contiguous blocks of layers per pipeline stage
    "stage": "pipeline",  # the stage dimension of the pipeline's activation buffer
    "embed": "fsdp",  # weights: the model dimension is what FSDP shards
    "vocab": "tensor",
    "heads": "tensor",
    "mlp": "tensor",
    "act_heads": "tensor",
    "act_mlp": "tensor",
}

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


def constrain(x: Any, mesh: Any, names: Sequence[str | None]) -> Any:
    import jax

    return jax.lax.with_sharding_constraint(x, named(mesh, names))


def without(names: Sequence[str | None], dropped: str) -> Logical:
    """The logical names with every dimension that maps to mesh axis `dropped` unnamed."""

    def maps_to(name: str | None) -> bool:
        rule = LOGICAL_RULES.get(name) if name else None
        return rule == dropped or (isinstance(rule, tuple) and dropped in rule)

    return tuple(None if maps_to(n) else n for n in names)


def fsdp_gather(w: Any, mesh: Any, names: Sequence[str | None]) -> Any:
    """The full weight over ``fsdp`` (still sharded over ``tensor`` and ``pipeline``); its
    gradient is reduce-scattered back onto the ``fsdp`` shards."""
    import jax

    spec = logical_to_spec(names)
    if "fsdp" not in spec or mesh.shape["fsdp"] == 1:
        return w
    dim = list(spec).index("fsdp")
    # Manual over fsdp, and over pipeline when a stage dimension is present, so that the stage
    # dimension stays local by construction; tensor stays automatic.
    manual = {"fsdp", "pipeline"} & set(a for a in spec if isinstance(a, str))
    inner = _restrict(spec, manual)
    gathered = jax.shard_map(
        lambda shard: jax.lax.all_gather(shard, "fsdp", axis=dim, tiled=True),
        mesh=mesh,
        in_specs=inner,
        out_specs=_restrict(inner, manual - {"fsdp"}),
        axis_names=frozenset(manual),
        # all_gather's result is the same on every fsdp member; the replication check cannot
        # infer that through the tiled gather.
        check_vma=False,
    )(w)
    return constrain(gathered, mesh, without(names, "fsdp"))


def local_reshape(x: Any, mesh: Any, names: Sequence[str | None], shape: tuple[int, ...]) -> Any:
    """Reshape whose split of the leading ``pipeline``-sharded dimension is local to each stage
    (the partitioner would otherwise gather the dimension first)."""
    import jax

    spec = _restrict(logical_to_spec(names), {"pipeline"})
    stages = mesh.shape["pipeline"]
    local = (shape[0] // stages, *shape[1:])
    out_spec = _restrict(logical_to_spec(("stage",)), {"pipeline"})
    return jax.shard_map(
        lambda block: block.reshape(local),
        mesh=mesh,
        in_specs=spec,
        out_specs=out_spec,
        axis_names=frozenset({"pipeline"}),
    )(x)


def _restrict(spec: Any, axes: set[str]) -> Any:
    """The spec with every mesh axis outside `axes` removed (for a partially manual shard_map)."""
    from jax.sharding import PartitionSpec as P

    def keep(entry: Any) -> Any:
        if entry is None:
            return None
        entries = (entry,) if isinstance(entry, str) else tuple(entry)
        kept = tuple(a for a in entries if a in axes)
        return None if not kept else kept[0] if len(kept) == 1 else kept

    return P(*[keep(e) for e in spec])


def tree_shardings(mesh: Any, logical_tree: Any) -> Any:
    """NamedShardings for a pytree whose leaves are tuples of logical names."""
    import jax

    return jax.tree.map(lambda names: named(mesh, names), logical_tree, is_leaf=_is_names)


def _is_names(x: Any) -> bool:
    return isinstance(x, tuple) and all(n is None or isinstance(n, str) for n in x)


def bytes_per_device(tree: Any) -> dict[str, int]:
    """Bytes held by each addressable device for the arrays of a pytree (shards, not globals)."""
    import jax

    out: dict[str, int] = {}
    for leaf in jax.tree.leaves(tree):
        for shard in leaf.addressable_shards:
            key = str(shard.device.id)
            out[key] = out.get(key, 0) + int(shard.data.nbytes)
    return out
