"""A decoder-only transformer LM in plain JAX: parameters are a dict of arrays, each leaf with
logical axis names (`PARAM_AXES`) that `sharding.LOGICAL_RULES` maps onto the mesh.

Token embedding, then `layers` pre-norm blocks (RMSNorm, causal attention with rotary positions,
multi-head or grouped-query (`kv_heads`), through `attention.attend`; RMSNorm, a GELU or SwiGLU
MLP), a final RMSNorm and an untied output projection. The vocabulary is the tokenizer's, padded
to a multiple of 128 (`padded_vocab`). The blocks are
one stacked array per weight (leading ``layers`` dimension), run by ``lax.scan`` with each block
rematerialized; under pipeline parallelism the same stack is split into contiguous stages
(`pipeline.py`). Parameters are float32; the matmuls run in `ModelConfig.dtype`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from multislice_workload import attention as attn
from multislice_workload.sharding import Logical, constrain, fsdp_gather

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
ACT = ("batch", None, None)  # [batch, sequence, embed]

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


# --- Forward. -------------------------------------------------------------------------------------


def rms_norm(x: Any, scale: Any, eps: float = 1e-6) -> Any:
    import jax.numpy as jnp

    x32 = x.astype(jnp.float32)
    normed = x32 * jnp.reciprocal(jnp.sqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps))
    return (normed * scale).astype(x.dtype)


def rotary(x: Any) -> Any:
    """Rotary position embedding over [batch, sequence, heads, head_dim] (rotate-half form)."""
    import jax.numpy as jnp

    half = x.shape[-1] // 2
    freq = 1.0 / (10000.0 ** (jnp.arange(half, dtype=jnp.float32) / half))
    angle = jnp.arange(x.shape[1], dtype=jnp.float32)[:, None] * freq[None, :]
    sin, cos = jnp.sin(angle)[None, :, None, :], jnp.cos(angle)[None, :, None, :]
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def gather_layer(layer: dict[str, Any], cfg: ModelConfig, mesh: Any, lead: Logical = ()) -> Any:
    """One block's weights, gathered over ``fsdp`` and cast to the compute dtype. `lead` names
    extra leading dimensions (the pipeline's ``stage``)."""
    import jax.numpy as jnp

    dtype = jnp.dtype(cfg.dtype)
    return {
        name: fsdp_gather(w, mesh, (*lead, *WEIGHT_AXES[name])).astype(dtype)
        for name, w in layer.items()
    }


def decoder_layer(x: Any, w: dict[str, Any], cfg: ModelConfig, mesh: Any) -> Any:
    """One block on activations [batch, sequence, embed], with gathered weights `w`."""
    import jax
    import jax.numpy as jnp
    from jax.ad_checkpoint import checkpoint_name

    heads = ("batch", None, "act_heads", None)
    h = rms_norm(x, w["attn_norm"])
    q, k, v = (
        checkpoint_name(constrain(jnp.einsum("bte,ehd->bthd", h, w[n]), mesh, heads), tag)
        for n, tag in (("wq", "query_proj"), ("wk", "key_proj"), ("wv", "value_proj"))
    )
    attended = attn.attend(
        rotary(q), rotary(k), v, impl=cfg.attention, block=cfg.attention_block, mesh=mesh
    )
    attended = checkpoint_name(attended, "context")
    out = checkpoint_name(jnp.einsum("bthd,hde->bte", attended, w["wo"]), "out_proj")
    x = constrain(x + out, mesh, ACT)
    h = rms_norm(x, w["mlp_norm"])
    up = checkpoint_name(jnp.einsum("bte,em->btm", h, w["wi"]), "mlpwi")
    if "wi_gate" in w:  # SwiGLU (Shazeer 2020): silu(x W_gate) * (x W_in)
        gate = checkpoint_name(jnp.einsum("bte,em->btm", h, w["wi_gate"]), "mlpwi")
        hidden = jax.nn.silu(gate) * up
    else:
        hidden = jax.nn.gelu(up)
    h = constrain(hidden, mesh, ("batch", None, "act_mlp"))
    down = checkpoint_name(jnp.einsum("btm,me->bte", h, w["wo_mlp"]), "mlpwo")
    return constrain(x + down, mesh, ACT)


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


def run_layers(layers: dict[str, Any], x: Any, cfg: ModelConfig, mesh: Any) -> Any:
    """The stacked blocks in `layers` (leading dimension = blocks), in order, under lax.scan."""
    import jax

    def block(h: Any, layer: dict[str, Any]) -> tuple[Any, None]:
        return decoder_layer(h, gather_layer(layer, cfg, mesh), cfg, mesh), None

    out, _ = jax.lax.scan(remat(block, cfg), x, layers)
    return out


def embed(params: dict[str, Any], inputs: Any, cfg: ModelConfig, mesh: Any) -> Any:
    import jax.numpy as jnp

    table = fsdp_gather(params["embedding"], mesh, PARAM_AXES["embedding"])
    return constrain(jnp.take(table, inputs, axis=0).astype(jnp.dtype(cfg.dtype)), mesh, ACT)


def logits(params: dict[str, Any], x: Any, cfg: ModelConfig, mesh: Any) -> Any:
    import jax.numpy as jnp

    unembed = fsdp_gather(params["unembed"], mesh, PARAM_AXES["unembed"])
    h = rms_norm(x, params["final_norm"])
    out = jnp.einsum("bte,ev->btv", h, unembed.astype(h.dtype), preferred_element_type=jnp.float32)
    return constrain(out, mesh, ("batch", None, "vocab"))


def cross_entropy(out: Any, targets: Any) -> Any:
    import optax

    return optax.softmax_cross_entropy_with_integer_labels(out, targets).mean()
