"""The analytic minimum of what one train step of `model.py` sends, per device, per collective.

Keys are (HLO op, mesh axes the collective spans), values bytes per device per step in the ring
model of `hlo.py` (all-gather and reduce-scatter (n - 1) / n of the full array, all-reduce
2 (n - 1) / n, a permute its array). This is what the design of `partitioning.py` and `pipeline.py`
needs and nothing more:

- FSDP (``fsdp``, n = F): each weight all-gathered in the compute dtype once per use (twice per
  step with rematerialization: forward and recomputed forward; once in the pipeline, which
  gathers a stage's weights before its loop) and its gradient reduce-scattered once, in the
  gradient-reduction dtype (``--grad_reduce_dtype``, float32 by default);
- data parallelism (``data``, and ``pipeline`` for the embedding and output layers, which are
  data-parallel over stages): one all-reduce of each gradient shard, in the gradient-reduction
  dtype;
- tensor parallelism (``tensor``, Megatron): per block 2 all-reduces of the activations
  forward, 2 backward, and with rematerialization 1 more (the recomputed forward needs the
  attention half's sum, not the block's output); the vocabulary-parallel embedding (1) and
  logits (1 backward, plus 3 per-token float32 reductions for the log-sum-exp and the target);
- pipeline (``pipeline``, S stages, M microbatches): 2 collective-permutes of one microbatch's
  local activations per iteration forward, 2 backward, over M + S - 1 iterations, and one
  all-gather of every stage's packed segments (ids and positions, int32) per step;
- the norm scales (replicated) and the loss: one all-reduce each over the axes they span;
- clipping by global norm: one float32 partial sum of squares per sharded parameter, all-reduced
  over the axes that parameter is sharded on.

The last two, and the per-token reductions of the loss, are a few floats per token or per
layer (`expected_parts` keeps them apart). XLA may move them between groups: it folds an
all-reduce over ``tensor`` into a later one over ``fsdp`` when the ops between are linear (one
all-reduce over both, of fewer bytes), which changes the keys, not the order of magnitude.

`tests/workload/test_workload_traffic.py` checks the compiled step against this, and the
operator's DCN advisor against both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from multislice_workload.model import ModelConfig

Key = tuple[str, tuple[str, ...]]
AXES = ("pipeline", "data", "fsdp", "tensor")


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Element counts per device that the traffic is made of."""

    layer_gathered: int  # one block's matmul weights, gathered over fsdp (still / tensor)
    vocab_gathered: int  # the embedding table (or the output layer), gathered over fsdp
    rows: int  # this device's batch rows
    microbatch_rows: int  # this device's rows of one microbatch (= rows without a pipeline)


def sizes(cfg: ModelConfig, mesh: Mapping[str, int], batch: int, microbatches: int) -> Sizes:
    s, d, f, t = (mesh[a] for a in AXES)
    heads, kv, mlp = cfg.heads // t, cfg.groups_kv // t, cfg.mlp // t
    mlp_matrices = 3 if cfg.mlp_activation == "swiglu" else 2
    rows = batch // (s * d * f)
    return Sizes(
        layer_gathered=2 * cfg.embed * (heads + kv) * cfg.head_dim + mlp_matrices * cfg.embed * mlp,
        vocab_gathered=cfg.padded_vocab // t * cfg.embed,
        rows=rows,
        microbatch_rows=rows // (microbatches // s) if s > 1 else rows,
    )


def _ring(op: str, n: int, size_bytes: float) -> float:
    if n <= 1:
        return 0.0
    return size_bytes * (2 * (n - 1) / n if op == "all-reduce" else (n - 1) / n)


def expected_bytes(
    cfg: ModelConfig,
    mesh: Mapping[str, int],
    batch: int,
    microbatches: int = 1,
    clip_norm: bool = True,
) -> dict[Key, float]:
    """Analytic bytes per device per step of every collective the step needs (keys as
    `hlo.summarize`; collectives over axes of size 1 move nothing and are left out).
    Gradient collectives are in `cfg.grad_reduce_dtype`. With ``--grad_accum N`` each
    microbatch sends its own gathers, reduce-scatters and activations (N times these figures,
    for a microbatch of batch / N), and the gradient all-reduces over the batch axes run once,
    after the microbatches' sum."""
    big, tiny = expected_parts(cfg, mesh, batch, microbatches, clip_norm)
    return {k: big.get(k, 0.0) + tiny.get(k, 0.0) for k in {*big, *tiny}}


def expected_parts(
    cfg: ModelConfig,
    mesh: Mapping[str, int],
    batch: int,
    microbatches: int = 1,
    clip_norm: bool = True,
) -> tuple[dict[Key, float], dict[Key, float]]:
    """`expected_bytes` split in two: the weights, gradients and activations, and the small
    reductions (module docstring), which XLA may regroup."""
    import numpy as np

    s, f = mesh["pipeline"], mesh["fsdp"]
    c = np.dtype(cfg.dtype).itemsize if cfg.dtype != "bfloat16" else 2
    z = sizes(cfg, mesh, batch, microbatches)
    layers = cfg.layers // s  # this stage's blocks
    remat = cfg.remat != "none"
    big: dict[Key, float] = {}
    tiny: dict[Key, float] = {}

    def add(op: str, axes: tuple[str, ...], size_bytes: float, small: bool = False) -> None:
        spanned = tuple(a for a in axes if mesh[a] > 1)
        n = int(np.prod([mesh[a] for a in spanned])) if spanned else 1
        moved = size_bytes if op == "collective-permute" else _ring(op, n, size_bytes)
        out = tiny if small else big
        if spanned and moved:
            out[(op, spanned)] = out.get((op, spanned), 0.0) + moved

    gathers = 2 if remat and s == 1 else 1  # the pipeline gathers once, outside its remat
    weights = layers * z.layer_gathered
    add("all-gather", ("fsdp",), c * (gathers * weights + 2 * z.vocab_gathered))
    g = 2 if cfg.grad_reduce_dtype == "bfloat16" else 4  # float32 or bfloat16
    add("reduce-scatter", ("fsdp",), g * (weights + 2 * z.vocab_gathered))
    # Gradient shards (reduction dtype), all-reduced over the axes each parameter is replicated
    # on; the loss is one float32.
    add("all-reduce", ("data",), g * weights / f)
    add("all-reduce", ("pipeline", "data"), g * 2 * z.vocab_gathered / f)
    norms = 2 * layers * cfg.embed
    add("all-reduce", ("data", "fsdp"), g * norms, small=True)
    add("all-reduce", ("pipeline", "data", "fsdp"), g * cfg.embed + 4, small=True)
    # Megatron activations: [rows, seq, embed] in the compute dtype.
    per_block = 5 if remat else 4
    iterations = microbatches + s - 1 if s > 1 else 1
    activation = c * z.microbatch_rows * cfg.seq_len * cfg.embed
    add(
        "all-reduce",
        ("tensor",),
        activation * per_block * layers * iterations + 2 * c * z.rows * cfg.seq_len * cfg.embed,
    )
    add("all-reduce", ("tensor",), 3 * 4 * z.rows * cfg.seq_len, small=True)  # per token
    if s > 1:
        add("collective-permute", ("pipeline",), 4 * iterations * activation)
        if cfg.eos_id is not None:  # every stage's segment ids and positions, int32, once
            add("all-gather", ("pipeline",), 4 * 2 * s * z.rows * cfg.seq_len)
    if clip_norm:
        for axes in sharded_axes(cfg, mesh):
            add("all-reduce", axes, 4, small=True)
    return big, tiny


def sharded_axes(cfg: ModelConfig, mesh: Mapping[str, int]) -> list[tuple[str, ...]]:
    """For each parameter sharded over some axis, the mesh axes (longer than 1) it is sharded
    on, in mesh order."""
    import jax

    from multislice_workload.model import param_axes
    from multislice_workload.partitioning import logical_to_spec

    out = []
    for names in jax.tree.leaves(param_axes(cfg), is_leaf=lambda x: isinstance(x, tuple)):
        used = {a for entry in logical_to_spec(names) if entry for a in _entries(entry)}
        axes = tuple(a for a in AXES if a in used and mesh[a] > 1)
        if axes:
            out.append(axes)
    return out


def _entries(entry: str | tuple[str, ...]) -> tuple[str, ...]:
    return (entry,) if isinstance(entry, str) else tuple(entry)
