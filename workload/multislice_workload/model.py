"""A decoder-only transformer LM in plain JAX: parameters are a dict of arrays, each leaf with
logical axis names (`PARAM_AXES`, `param_axes`) that `sharding.LOGICAL_RULES` maps onto the mesh.

Token embedding, then `layers` pre-norm blocks (RMSNorm, causal attention with rotary positions,
multi-head or grouped-query (`kv_heads`), through `attention.attend`; RMSNorm, a GELU or SwiGLU
MLP), a final RMSNorm and an untied output projection. The vocabulary is the tokenizer's, padded
to a multiple of 128 (`padded_vocab`). The blocks are one stacked array per weight (leading
``layers`` dimension), run by ``lax.scan`` with each block rematerialized (`remat_policy`: the
names `decoder_layer` tags its projections with); under pipeline parallelism the same stack is
split into contiguous stages (`pipeline.py`). Parameters are float32 (or bfloat16 with a float32
master copy, `train.py`); the matmuls run in `ModelConfig.dtype`.

The forward pass below works on this device's shards (it runs inside the ``shard_map`` of
`loss`; `partitioning.py` says which collective each helper adds): activations are
[local batch, sequence, embed], replicated over ``tensor``; a weight arrives as its shard and is
gathered over ``fsdp`` (after the cast to the compute dtype) in the computation that uses it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

from multislice_workload import attention as attn
from multislice_workload.partitioning import (
    BATCH_AXES,
    Logical,
    gather,
    logical_to_spec,
    tensor_offset,
    tensor_sum,
    to_tensor,
    tree_specs,
    vary,
    varying_axes,
)

# Per-layer weights (the stacked arrays add a leading "layers" dimension).
LAYER_AXES: dict[str, Logical] = {
    "attn_norm": ("norm",),
    "wq": ("embed", "heads", "head_dim"),
    "wk": ("embed", "heads", "head_dim"),
    "wv": ("embed", "heads", "head_dim"),
    "wo": ("heads", "head_dim", "embed"),
    "mlp_norm": ("norm",),
    "wi": ("embed", "mlp"),
    "wo_mlp": ("mlp", "embed"),
}
# SwiGLU's gate projection (only in a model with mlp_activation="swiglu").
GATE_AXES: dict[str, Logical] = {"wi_gate": ("embed", "mlp")}
WEIGHT_AXES: dict[str, Logical] = {**LAYER_AXES, **GATE_AXES}
# The default model's (GELU) parameter axes; `param_axes(cfg)` for any model.
PARAM_AXES: dict[str, Any] = {
    "embedding": ("vocab", "embed"),
    "layers": {name: ("layers", *axes) for name, axes in LAYER_AXES.items()},
    "final_norm": ("norm",),
    "unembed": ("embed", "vocab"),
}
# What each remat policy saves of a block's forward pass, by the names `decoder_layer` gives its
# projections (MaxText's `remat_policy` names and sets, layers/decoders.py get_remat_policy);
# "full" saves nothing, "none" does not rematerialize, "dots"/"minimal" save every matmul
# without batch dimensions.
_SAVED_NAMES: dict[str, tuple[str, ...]] = {
    "save_dot_with_context_except_mlp": (
        "query_proj", "value_proj", "key_proj", "qkv_proj", "context", "out_proj",
    ),
    "save_dot_except_mlpwi": (
        "query_proj", "value_proj", "key_proj", "qkv_proj", "out_proj", "mlpwo",
    ),
    "save_dot_except_mlp": ("query_proj", "value_proj", "key_proj", "qkv_proj", "out_proj"),
    "save_qkv_proj": ("query_proj", "value_proj", "key_proj", "qkv_proj"),
    "save_out_proj": ("out_proj",),
}  # fmt: skip
REMAT_POLICIES = ("full", "dots", "minimal", *_SAVED_NAMES, "none")
MLP_ACTIVATIONS = ("gelu", "swiglu")
VOCAB_MULTIPLE = 128


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab: int = 257  # the tokenizer's (bytes + end-of-text by default)
    embed: int = 256
    heads: int = 4
    head_dim: int = 64
    mlp: int = 1024
    layers: int = 4
    seq_len: int = 256
    dtype: str = "float32"  # of the matmuls; parameters and the loss stay float32
    remat: str = "full"
    kv_heads: int = 0  # grouped-query attention: key/value heads; 0 = heads (multi-head)
    mlp_activation: str = "gelu"
    attention: str = "auto"  # attn.IMPLEMENTATIONS
    attention_block: int = attn.DEFAULT_BLOCK
    # Of every gradient collective: FSDP's reduce-scatter and the all-reduce over batch axes.
    grad_reduce_dtype: str = "float32"
    # The tokenizer's end-of-text: it starts a new segment of a packed row (`segments`); None:
    # every row is one sequence.
    eos_id: int | None = 256

    @property
    def padded_vocab(self) -> int:
        """The embedding and logits width: the vocabulary rounded up to a multiple of 128 (the
        ids past the tokenizer's never occur as targets)."""
        return -(-self.vocab // VOCAB_MULTIPLE) * VOCAB_MULTIPLE

    @property
    def groups_kv(self) -> int:
        return self.kv_heads or self.heads

    def shapes(self) -> dict[str, Any]:
        e, n, h, m, v, layers = (
            self.embed,
            self.heads,
            self.head_dim,
            self.mlp,
            self.padded_vocab,
            self.layers,
        )
        kv = self.groups_kv
        per_layer = {
            "attn_norm": (e,),
            "wq": (e, n, h),
            "wk": (e, kv, h),
            "wv": (e, kv, h),
            "wo": (n, h, e),
            "mlp_norm": (e,),
            "wi": (e, m),
            **({"wi_gate": (e, m)} if self.mlp_activation == "swiglu" else {}),
            "wo_mlp": (m, e),
        }
        return {
            "embedding": (v, e),
            "layers": {k: (layers, *s) for k, s in per_layer.items()},
            "final_norm": (e,),
            "unembed": (e, v),
        }

    def parameter_count(self) -> int:
        import math

        import jax

        return sum(math.prod(s) for s in jax.tree.leaves(self.shapes(), is_leaf=_is_shape))

    def matmul_parameters(self) -> int:
        """Parameters that take part in a matmul: all but the embedding table and the norms."""
        e, n, h, m, kv = self.embed, self.heads, self.head_dim, self.mlp, self.groups_kv
        mlp_matrices = 3 if self.mlp_activation == "swiglu" else 2
        attention = 2 * e * n * h + 2 * e * kv * h
        return self.layers * (attention + mlp_matrices * e * m) + e * self.padded_vocab

    def attention_flops_per_token(self) -> float:
        """Training FLOPs per token of the scores and the weighted sum, counted causally: a
        query sees on average half the sequence, so 6 x layers x heads x head_dim x seq_len,
        half of PaLM's 12 x L x H x Q x T (appendix B), which counts the masked half too (as
        MaxText's `causal_attention_flops` halves it)."""
        return 6.0 * self.layers * self.heads * self.head_dim * self.seq_len

    def flops_per_token(self) -> float:
        """Model FLOPs per trained token: 6 x matmul parameters (forward 2, backward 4) plus the
        causal attention count; rematerialization is not counted (model, not hardware, FLOPs)."""
        return 6.0 * self.matmul_parameters() + self.attention_flops_per_token()


def _is_shape(x: Any) -> bool:
    return isinstance(x, tuple) and all(isinstance(d, int) for d in x)


def init_params(cfg: ModelConfig, seed: int) -> dict[str, Any]:
    """Float32 parameters, a pure function of (cfg, seed): the same for every layout."""
    import jax
    import jax.numpy as jnp

    shapes = cfg.shapes()
    flat, treedef = jax.tree_util.tree_flatten_with_path(shapes, is_leaf=_is_shape)
    key = jax.random.key(seed)
    leaves = []
    for index, (path, shape) in enumerate(flat):
        name = str(getattr(path[-1], "key", path[-1]))
        if name.endswith("norm"):
            leaves.append(jnp.ones(shape, jnp.float32))
            continue
        fan_in = _fan_in(name, shape, cfg)
        k = jax.random.fold_in(key, index)
        leaves.append(jax.random.normal(k, shape, jnp.float32) / jnp.sqrt(fan_in))
    params: dict[str, Any] = jax.tree_util.tree_unflatten(treedef, leaves)
    return params


def _fan_in(name: str, shape: tuple[int, ...], cfg: ModelConfig) -> int:
    if name == "embedding":
        return 1  # unit-variance embeddings, as usual
    if name == "wo":
        return cfg.heads * cfg.head_dim
    return shape[-2] if name in ("wi", "wi_gate", "wo_mlp", "unembed") else cfg.embed


def param_axes(cfg: ModelConfig) -> dict[str, Any]:
    """The logical axes of `cfg`'s parameters (PARAM_AXES plus the options' weights)."""
    layers = cfg.shapes()["layers"]
    return {
        **PARAM_AXES,
        "layers": {name: ("layers", *WEIGHT_AXES[name]) for name in layers},
    }


# --- Forward, on this device's shards. -------------------------------------------------------


def rms_norm(x: Any, scale: Any, eps: float = 1e-6) -> Any:
    import jax.numpy as jnp

    x32 = x.astype(jnp.float32)
    normed = x32 * jnp.reciprocal(jnp.sqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps))
    return (normed * scale).astype(x.dtype)


class Segments(NamedTuple):
    """The documents of packed rows: segment id and position in its document, [batch, T]."""

    ids: Any
    positions: Any


def segments(inputs: Any, eos_id: int) -> Segments:
    """Segments of input rows [batch, T] from their end-of-text tokens: an end-of-text opens the
    next document (as its first token, so the target it predicts, that document's first token,
    is predicted from the document alone), and positions restart at 0 there (MaxText's packed
    ``inputs_segmentation`` / ``inputs_position``, derived on the device from the tokens)."""
    import jax
    import jax.numpy as jnp

    starts = inputs == eos_id
    index = jnp.broadcast_to(jnp.arange(inputs.shape[1], dtype=jnp.int32), inputs.shape)
    ids = jnp.cumsum(starts, axis=1, dtype=jnp.int32)
    first = jax.lax.cummax(jnp.where(starts, index, 0), axis=1)
    return Segments(ids, index - first)


def rotary(x: Any, positions: Any = None) -> Any:
    """Rotary position embedding over [batch, sequence, heads, head_dim] (rotate-half form), at
    `positions` [batch, sequence] (default 0, 1, ...)."""
    import jax.numpy as jnp

    half = x.shape[-1] // 2
    freq = 1.0 / (10000.0 ** (jnp.arange(half, dtype=jnp.float32) / half))
    if positions is None:
        positions = jnp.arange(x.shape[1])[None, :]
    angle = positions.astype(jnp.float32)[..., None] * freq
    sin, cos = jnp.sin(angle)[:, :, None, :], jnp.cos(angle)[:, :, None, :]
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def gather_layer(layer: dict[str, Any], cfg: ModelConfig, stacked: bool = False) -> dict[str, Any]:
    """One block's weights (`stacked`: several, with the leading ``layers`` dimension), cast to
    the compute dtype and gathered over ``fsdp``; the norm scales stay float32 (`rms_norm`
    applies them in float32)."""
    import jax.numpy as jnp

    dtype = jnp.dtype(cfg.dtype)
    lead: Logical = ("layers",) if stacked else ()
    return {
        name: w
        if name.endswith("norm")
        else gather(w, (*lead, *WEIGHT_AXES[name]), dtype, cfg.grad_reduce_dtype)
        for name, w in layer.items()
    }


def decoder_layer(
    x: Any, w: dict[str, Any], cfg: ModelConfig, packed: Segments | None = None
) -> Any:
    """One block on activations [local batch, sequence, embed], with gathered weights `w`:
    2 all-reduces over ``tensor`` forward (after the row-parallel ``wo`` and ``wo_mlp``), 2 in the
    backward pass (the inputs of the column-parallel ``wq/wk/wv`` and ``wi``/``wi_gate``). The
    query and key/value heads are this device's (tensor-parallel), so attention needs no
    collective; `attend` runs per device (``mesh=None``: its splash kernel is called directly,
    already inside the manual region). `packed`: each token attends within its document, at
    its position in the document."""
    import jax
    import jax.numpy as jnp
    from jax.ad_checkpoint import checkpoint_name

    h = to_tensor(rms_norm(x, w["attn_norm"]))
    q, k, v = (
        checkpoint_name(jnp.einsum("bte,ehd->bthd", h, w[n]), tag)
        for n, tag in (("wq", "query_proj"), ("wk", "key_proj"), ("wv", "value_proj"))
    )
    ids, positions = (None, None) if packed is None else packed
    attended = attn.attend(
        rotary(q, positions),
        rotary(k, positions),
        v,
        impl=cfg.attention,
        block=cfg.attention_block,
        segment_ids=ids,
    )
    attended = checkpoint_name(attended, "context")
    out = checkpoint_name(jnp.einsum("bthd,hde->bte", attended, w["wo"]), "out_proj")
    x = x + tensor_sum(out)
    h = to_tensor(rms_norm(x, w["mlp_norm"]))
    up = checkpoint_name(jnp.einsum("bte,em->btm", h, w["wi"]), "mlpwi")
    if "wi_gate" in w:  # SwiGLU (Shazeer 2020): silu(x W_gate) * (x W_in)
        gate = checkpoint_name(jnp.einsum("bte,em->btm", h, w["wi_gate"]), "mlpwi")
        hidden = jax.nn.silu(gate) * up
    else:
        hidden = jax.nn.gelu(up)
    down = checkpoint_name(jnp.einsum("btm,me->bte", hidden, w["wo_mlp"]), "mlpwo")
    return x + tensor_sum(down)


def remat_policy(name: str) -> Callable[..., Any] | None:
    import jax

    policies: dict[str, Callable[..., Any]] = {
        "full": jax.checkpoint_policies.nothing_saveable,
        "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
        "minimal": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
        **{
            name: jax.checkpoint_policies.save_only_these_names(*saved)
            for name, saved in _SAVED_NAMES.items()
        },
    }
    return policies.get(name)


def remat(fn: Callable[..., Any], cfg: ModelConfig) -> Callable[..., Any]:
    import jax

    return fn if cfg.remat == "none" else jax.checkpoint(fn, policy=remat_policy(cfg.remat))


def run_layers(
    layers: dict[str, Any], x: Any, cfg: ModelConfig, packed: Segments | None = None
) -> Any:
    """The stacked blocks in `layers` (leading dimension = blocks), in order, under lax.scan.
    Each block gathers its own weights inside its rematerialized body: the gathered weights of
    one block live at a time, and the recomputation in the backward pass gathers them again."""
    import jax

    def block(h: Any, layer: dict[str, Any]) -> tuple[Any, None]:
        return decoder_layer(h, gather_layer(layer, cfg), cfg, packed), None

    out, _ = jax.lax.scan(remat(block, cfg), x, layers)
    return out


def embed(table: Any, inputs: Any, cfg: ModelConfig) -> Any:
    """Vocabulary-parallel lookup (Megatron): each tensor shard looks up the tokens in its rows of
    the table, and one all-reduce over ``tensor`` adds the shards' rows (zero elsewhere)."""
    import jax.numpy as jnp

    # [vocab / tensor, embed]
    rows = gather(table, PARAM_AXES["embedding"], jnp.dtype(cfg.dtype), cfg.grad_reduce_dtype)
    local = inputs - tensor_offset(rows.shape[0])
    inside = (local >= 0) & (local < rows.shape[0])
    looked_up = jnp.take(rows, jnp.clip(local, 0, rows.shape[0] - 1), axis=0)
    return tensor_sum(jnp.where(inside[..., None], looked_up, jnp.zeros((), rows.dtype)))


def token_losses(params: dict[str, Any], x: Any, targets: Any, cfg: ModelConfig) -> Any:
    """Cross-entropy per token [local batch, sequence] of the vocabulary-parallel logits: the
    logits stay sharded over ``tensor``; the log-sum-exp and the target's logit are reduced over
    it ([batch, sequence] floats, not [batch, sequence, vocab])."""
    import jax
    import jax.numpy as jnp

    unembed = gather(
        params["unembed"], PARAM_AXES["unembed"], jnp.dtype(cfg.dtype), cfg.grad_reduce_dtype
    )
    h = to_tensor(rms_norm(x, params["final_norm"]))
    out = jnp.einsum("bte,ev->btv", h, unembed, preferred_element_type=jnp.float32)
    peak = jax.lax.pmax(jax.lax.stop_gradient(out.max(axis=-1)), "tensor")
    lse = jnp.log(tensor_sum(jnp.exp(out - peak[..., None]).sum(axis=-1))) + peak
    local = targets - tensor_offset(out.shape[-1])
    inside = (local >= 0) & (local < out.shape[-1])
    picked = jnp.take_along_axis(out, jnp.clip(local, 0, out.shape[-1] - 1)[..., None], -1)
    return lse - tensor_sum(jnp.where(inside, picked[..., 0], 0.0))


def local_loss(
    params: dict[str, Any], tokens: Any, cfg: ModelConfig, stages: int, microbatches: int
) -> Any:
    """Mean next-token loss of the global batch, from this device's rows [local batch, seq + 1]."""
    import jax

    # Each parameter's gradient is all-reduced once over the batch axes it is replicated on.
    params = jax.tree.map(lambda p: vary(p, BATCH_AXES), params)
    return _varied_loss(params, tokens, cfg, stages, microbatches)


def _varied_loss(
    params: dict[str, Any], tokens: Any, cfg: ModelConfig, stages: int, microbatches: int
) -> Any:
    """`local_loss` of parameters already marked varying over every batch axis: its gradient
    is this device's contribution, not yet summed over them."""
    import jax

    inputs = tokens[:, :-1]
    x = embed(params["embedding"], inputs, cfg)
    packed = None if cfg.eos_id is None else segments(inputs, cfg.eos_id)
    if stages == 1:
        x = run_layers(params["layers"], x, cfg, packed)
    else:
        from multislice_workload.pipeline import run_pipeline

        x = run_pipeline(params["layers"], x, cfg, stages, microbatches, packed)
    losses = token_losses(params, x, tokens[:, 1:], cfg)
    count = losses.size * _batch_shards()
    return jax.lax.psum(losses.sum(), BATCH_AXES) / count


def _batch_shards() -> int:
    import math

    import jax

    return math.prod(int(jax.lax.axis_size(a)) for a in BATCH_AXES)


def loss(
    params: dict[str, Any],
    tokens: Any,
    cfg: ModelConfig,
    mesh: Any,
    stages: int = 1,
    microbatches: int = 1,
) -> Any:
    """The model's loss on tokens [batch, seq + 1] sharded as ("batch", None), every mesh axis
    manual (`partitioning.py`)."""
    import functools

    import jax
    from jax.sharding import PartitionSpec as P

    body = functools.partial(local_loss, cfg=cfg, stages=stages, microbatches=microbatches)
    mapped = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(tree_specs(param_axes(cfg)), logical_to_spec(("batch", None))),
        out_specs=P(),
    )
    return mapped(params, tokens)


def local_loss_and_grads(
    params: dict[str, Any],
    tokens: Any,
    cfg: ModelConfig,
    stages: int,
    microbatches: int,
    accum: int,
) -> tuple[Any, Any]:
    """(mean loss, mean gradients) of the global batch from this device's rows, in `accum`
    microbatches (local row j in microbatch j % accum; the local rows are a multiple of accum,
    so that is global row r in microbatch r % accum). Each microbatch's gradients stay this
    device's own: they are summed on the device in float32, and the sum is all-reduced over
    the batch axes each parameter is replicated on once per step, not once per microbatch
    (FSDP's reduce-scatter, inside the loss, still runs per microbatch: the accumulator is the
    parameter's shard)."""
    import jax
    import jax.numpy as jnp

    replicated = jax.tree.map(
        lambda p: tuple(a for a in BATCH_AXES if a not in varying_axes(p)), params
    )
    varied = jax.tree.map(lambda p: vary(p, BATCH_AXES), params)
    value_and_grad = jax.value_and_grad(_varied_loss)
    rows, width = tokens.shape
    micro = tokens.reshape(rows // accum, accum, width).swapaxes(0, 1)

    def add(carry: tuple[Any, Any], batch: Any) -> tuple[tuple[Any, Any], None]:
        total, summed = carry
        loss, grads = value_and_grad(varied, batch, cfg, stages, microbatches)
        summed = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), summed, grads)
        return (total + loss, summed), None

    if accum == 1:
        loss, grads = value_and_grad(varied, tokens, cfg, stages, microbatches)
    else:
        zeros = jax.tree.map(
            lambda v: vary(jnp.zeros(v.shape, jnp.float32), varying_axes(v)), varied
        )
        (total, summed), _ = jax.lax.scan(add, (jnp.zeros((), jnp.float32), zeros), micro)
        loss, grads = total / accum, jax.tree.map(lambda g: g / accum, summed)
    reduce = jnp.dtype(cfg.grad_reduce_dtype)
    grads = jax.tree.map(
        lambda g, axes: jax.lax.psum(g.astype(reduce), axes) if axes else g.astype(reduce),
        grads,
        replicated,
    )
    return loss, grads


def loss_and_grads(
    params: dict[str, Any],
    tokens: Any,
    cfg: ModelConfig,
    mesh: Any,
    stages: int = 1,
    microbatches: int = 1,
    accum: int = 1,
) -> tuple[Any, Any]:
    """`local_loss_and_grads` over the mesh: tokens [batch, seq + 1] sharded as ("batch",
    None); the gradients come out sharded as the parameters."""
    import functools

    import jax
    from jax.sharding import PartitionSpec as P

    body = functools.partial(
        local_loss_and_grads, cfg=cfg, stages=stages, microbatches=microbatches, accum=accum
    )
    specs = tree_specs(param_axes(cfg))
    mapped = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(specs, logical_to_spec(("batch", None))),
        out_specs=(P(), specs),
    )
    return mapped(params, tokens)
