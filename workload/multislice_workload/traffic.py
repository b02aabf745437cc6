"""The analytic minimum of what one train step of `model.py` sends, per device, per collective.

Keys are (HLO op, mesh axes the collective spans), values bytes per device per step in the ring
model of `hlo.py` (all-gather and reduce-scatter (n - 1) / n of the full array, all-reduce
2 (n - 1) / n, a permute its array). This is what the design of `sharding.py` and `pipeline.py`
needs and nothing more:

- FSDP (``fsdp``, n = F): each weight all-gathered in the compute dtype once per use (twice per
  step with rematerialization: forward and recomputed forward; once in the pipeline, which
  gathers a stage's weights before its loop) and its gradient reduce-scattered once;
- data parallelism (``data``, and ``pipeline`` for the embedding and output layers, which are
  data-parallel over stages): one all-reduce of each float32 gradient shard;
- tensor parallelism (``tensor``, Megatron): per block 2 all-reduces of the activations
  forward, 2 backward, and with rematerialization 1 more (the recomputed forward needs the
  attention half's sum, not the block's output); the vocabulary-parallel embedding (1) and
  logits (1 backward, plus 3 per-token float32 reductions for the log-sum-exp and the target);
- pipeline (``pipeline``, S stages, M microbatches): 2 collective-permutes of one microbatch's
  local activations per iteration forward, 2 backward, over M + S - 1 iterations;
- the norm scales (replicated) and the loss: one all-reduce each over the axes they span.

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
    heads, mlp = cfg.heads // t, cfg.mlp // t
    rows = batch // (s * d * f)
    return Sizes(
        layer_gathered=4 * cfg.embed * heads * cfg.head_dim + 2 * cfg.embed * mlp,
        vocab_gathered=cfg.vocab // t * cfg.embed,
        rows=rows,
        microbatch_rows=rows // (microbatches // s) if s > 1 else rows,
    )


def _ring(op: str, n: int, size_bytes: float) -> float:
    if n <= 1:
        return 0.0
    return size_bytes * (2 * (n - 1) / n if op == "all-reduce" else (n - 1) / n)


def expected_bytes(
    cfg: ModelConfig, mesh: Mapping[str, int], batch: int, microbatches: int = 1
) -> dict[Key, float]:
    """Analytic bytes per device per step of every collective the step needs (keys as
    `hlo.summarize`; collectives over axes of size 1 move nothing and are left out)."""
    import numpy as np

    s, f = mesh["pipeline"], mesh["fsdp"]
    c = np.dtype(cfg.dtype).itemsize if cfg.dtype != "bfloat16" else 2
    z = sizes(cfg, mesh, batch, microbatches)
    layers = cfg.layers // s  # this stage's blocks
    remat = cfg.remat != "none"
    out: dict[Key, float] = {}

    def add(op: str, axes: tuple[str, ...], size_bytes: float) -> None:
        spanned = tuple(a for a in axes if mesh[a] > 1)
        n = int(np.prod([mesh[a] for a in spanned])) if spanned else 1
        moved = size_bytes if op == "collective-permute" else _ring(op, n, size_bytes)
        if spanned and moved:
            out[(op, spanned)] = out.get((op, spanned), 0.0) + moved

    gathers = 2 if remat and s == 1 else 1  # the pipeline gathers once, outside its remat
    weights = layers * z.layer_gathered
    add("all-gather", ("fsdp",), c * (gathers * weights + 2 * z.vocab_gathered))
    add("reduce-scatter", ("fsdp",), c * (weights + 2 * z.vocab_gathered))
    # Float32 gradient shards, all-reduced over the axes each parameter is replicated on.
    add("all-reduce", ("data",), 4 * weights / f)
    add("all-reduce", ("pipeline", "data"), 4 * 2 * z.vocab_gathered / f)
    norms = 2 * layers * cfg.embed
    add("all-reduce", ("data", "fsdp"), 4 * norms)
    add("all-reduce", ("pipeline", "data", "fsdp"), 4 * (cfg.embed + 1))  # final norm, loss
    # Megatron activations: [rows, seq, embed] in the compute dtype.
    per_block = 5 if remat else 4
    iterations = microbatches + s - 1 if s > 1 else 1
    activation = c * z.microbatch_rows * cfg.seq_len * cfg.embed
    add(
        "all-reduce",
        ("tensor",),
        activation * per_block * layers * iterations
        + 2 * c * z.rows * cfg.seq_len * cfg.embed
        + 3 * 4 * z.rows * cfg.seq_len,
    )
    if s > 1:
        add("collective-permute", ("pipeline",), 4 * iterations * activation)
    return out
