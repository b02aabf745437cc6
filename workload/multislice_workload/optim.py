"""The optimizer: AdamW with a warmup + cosine schedule, clipping by global norm, weight decay off
the norms and the embedding, moments in a chosen dtype.

Defaults are MaxText's (``configs/base.yml``): b1 0.9, b2 0.95, eps 1e-8, weight decay 0.1,
clipping at global norm 1.0, warmup over 10% of the steps, cosine down to 10% of the peak.

The update is ``chain(clip_by_global_norm, scale_by_adam, add_decayed_weights(mask),
scale_by_learning_rate(schedule))``: decoupled weight decay as in AdamW (Loshchilov & Hutter),
applied to the matmul weights only (`decay_mask`). `scale_by_adam` here keeps both moments in
`state_dtype` (optax's own keeps the second moment in the parameter dtype whatever ``mu_dtype``
says); the arithmetic is float32 either way.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

STATE_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    learning_rate: float = 1e-3
    total_steps: int = 100
    warmup_steps: int = 10
    end_lr_fraction: float = 0.1
    weight_decay: float = 0.1
    clip_norm: float = 1.0  # 0: no clipping
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    state_dtype: str = "float32"


def schedule(cfg: OptimConfig) -> Any:
    """Linear warmup to the peak over `warmup_steps` (step 0 already moves: peak/(W+1)), then a
    cosine decay to ``end_lr_fraction x peak`` at `total_steps`."""
    import jax.numpy as jnp

    peak, end = cfg.learning_rate, cfg.learning_rate * cfg.end_lr_fraction
    warm, decay = cfg.warmup_steps, max(1, cfg.total_steps - cfg.warmup_steps)

    def lr(count: Any) -> Any:
        t = jnp.asarray(count, jnp.float32)
        warmup = peak * (t + 1) / (warm + 1)
        progress = jnp.clip((t - warm) / decay, 0.0, 1.0)
        cosine = end + (peak - end) * 0.5 * (1 + jnp.cos(math.pi * progress))
        return jnp.where(t < warm, warmup, cosine)

    return lr


def decays(path: tuple[Any, ...]) -> bool:
    """Weight decay applies to matmul weights, not to norm scales or the embedding table."""
    name = str(getattr(path[-1], "key", path[-1]))
    return not (name.endswith("norm") or name == "embedding")


def decay_mask(params: Any) -> Any:
    import jax

    return jax.tree_util.tree_map_with_path(lambda path, _: decays(path), params)


def scale_by_adam(b1: float, b2: float, eps: float, state_dtype: str) -> Any:
    """Adam's preconditioning, both moments stored in `state_dtype`, computed in float32. The
    state is optax's ``ScaleByAdamState`` so `optax.tree_map_params` sees the moments."""
    import jax
    import jax.numpy as jnp
    import optax

    dtype = jnp.dtype(state_dtype)

    def init(params: Any) -> Any:
        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, dtype), params)
        return optax.ScaleByAdamState(count=jnp.zeros((), jnp.int32), mu=zeros, nu=zeros)

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        del params
        count = optax.safe_increment(state.count)
        g32 = jax.tree.map(lambda g: g.astype(jnp.float32), updates)
        mu = jax.tree.map(lambda m, g: b1 * m.astype(jnp.float32) + (1 - b1) * g, state.mu, g32)
        nu = jax.tree.map(lambda v, g: b2 * v.astype(jnp.float32) + (1 - b2) * g * g, state.nu, g32)
        c = count.astype(jnp.float32)
        mu_hat_scale, nu_hat_scale = 1 / (1 - b1**c), 1 / (1 - b2**c)
        out = jax.tree.map(
            lambda m, v: m * mu_hat_scale / (jnp.sqrt(v * nu_hat_scale) + eps), mu, nu
        )
        cast = _cast_to(dtype)
        return out, optax.ScaleByAdamState(count=count, mu=cast(mu), nu=cast(nu))

    return optax.GradientTransformation(init, update)


def _cast_to(dtype: Any) -> Any:
    import jax

    return lambda tree: jax.tree.map(lambda x: x.astype(dtype), tree)


def build(cfg: OptimConfig) -> Any:
    import optax

    parts = [optax.clip_by_global_norm(cfg.clip_norm)] if cfg.clip_norm > 0 else []
    parts += [
        scale_by_adam(cfg.b1, cfg.b2, cfg.eps, cfg.state_dtype),
        optax.add_decayed_weights(cfg.weight_decay, mask=decay_mask),
        optax.scale_by_learning_rate(schedule(cfg)),
    ]
    return optax.chain(*parts)
