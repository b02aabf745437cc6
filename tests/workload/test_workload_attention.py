"""Attention kernels against the reference (XLA's dot_product_attention, which materializes the
[T, T] scores), and the memory they need as the context grows."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from multislice_workload import attention
from multislice_workload.mesh import MESH_AXES


def qkv(batch: int, length: int, heads: int, kv_heads: int, dim: int, dtype: Any) -> Any:
    import jax

    key = jax.random.key(0)
    shapes = [(batch, length, heads, dim), (batch, length, kv_heads, dim)]
    return tuple(
        jax.random.normal(jax.random.fold_in(key, i), shapes[min(i, 1)]).astype(dtype)
        for i in range(3)
    )


def loss(impl: str, block: int = 32, **kw: Any) -> Any:
    def f(q: Any, k: Any, v: Any) -> Any:
        out = attention.attend(q, k, v, impl=impl, block=block, **kw)
        return (out.astype("float32") ** 2).sum()

    return f


@pytest.mark.parametrize(
    "length, heads, kv_heads", [(100, 4, 2), (96, 2, 1)]
)  # grouped-query with padding (100 = 3 x 32 + 4), multi-query
def test_blockwise_matches_the_reference_and_its_gradients(
    length: int, heads: int, kv_heads: int
) -> None:
    import jax

    q, k, v = qkv(2, length, heads, kv_heads, 16, "float32")
    ref = attention.attend(q, k, v, impl="xla")
    out = jax.jit(lambda q, k, v: attention.attend(q, k, v, impl="blockwise", block=32))(q, k, v)
    np.testing.assert_allclose(out, ref, atol=2e-6, rtol=1e-5)
    grads_ref = jax.jit(jax.grad(loss("xla"), argnums=(0, 1, 2)))(q, k, v)
    grads = jax.jit(jax.grad(loss("blockwise"), argnums=(0, 1, 2)))(q, k, v)
    for name, got, want in zip("qkv", grads, grads_ref, strict=True):
        np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4, err_msg=f"d{name}")


def test_blockwise_is_causal() -> None:
    """Changing the last key/value position changes only the last query's output."""
    import jax

    q, k, v = qkv(1, 64, 2, 2, 16, "float32")
    run = jax.jit(lambda q, k, v: attention.attend(q, k, v, impl="blockwise", block=16))
    out, moved = run(q, k, v), run(q, k, v.at[:, -1].add(1.0))
    np.testing.assert_array_equal(out[:, :-1], moved[:, :-1])
    assert not np.allclose(out[:, -1], moved[:, -1])


def test_blockwise_in_bfloat16_is_close_to_the_float32_reference() -> None:
    import jax

    q, k, v = qkv(2, 64, 2, 2, 32, "bfloat16")
    ref = attention.attend(*(x.astype("float32") for x in (q, k, v)), impl="xla")
    out = jax.jit(lambda q, k, v: attention.attend(q, k, v, impl="blockwise", block=16))(q, k, v)
    assert out.dtype == q.dtype
    np.testing.assert_allclose(np.asarray(out, np.float32), ref, atol=3e-2, rtol=3e-2)


def temp_bytes(impl: str, length: int) -> int:
    """Scratch memory XLA allocates for the forward + backward pass (compiled, not run)."""
    import jax
    import jax.numpy as jnp

    q = jax.ShapeDtypeStruct((1, length, 2, 32), jnp.float32)
    grad = jax.jit(jax.grad(loss(impl, block=128), argnums=(0, 1, 2)))
    analysis = grad.lower(q, q, q).compile().memory_analysis()
    return int(analysis.temp_size_in_bytes)


def test_blockwise_memory_grows_linearly_in_context_not_quadratically() -> None:
    lengths = (512, 1024, 2048)
    growth = {}
    for impl in ("xla", "blockwise"):
        sizes = [temp_bytes(impl, t) for t in lengths]
        # The exponent of temp bytes ~ T^e, from the two ends.
        growth[impl] = math.log(sizes[-1] / sizes[0]) / math.log(lengths[-1] / lengths[0])
    assert growth["xla"] > 1.8  # the reference holds [T, T] scores: quadratic
    assert growth["blockwise"] < 1.2  # blockwise holds blocks and O(T) residuals
    assert temp_bytes("blockwise", 2048) < temp_bytes("xla", 2048) / 8


def test_auto_picks_the_platform_kernel() -> None:
    assert attention.resolve("auto", "tpu", "bfloat16") == "splash"
    assert attention.resolve("auto", "gpu", "bfloat16") == "cudnn"
    assert attention.resolve("auto", "gpu", "float32") == "blockwise"
    assert attention.resolve("auto", "cpu", "bfloat16") == "blockwise"
    assert attention.resolve("xla", "tpu", "bfloat16") == "xla"


def test_splash_attention_kernel_matches_the_reference_per_device_under_a_mesh() -> None:
    """The TPU kernel, run by the Pallas interpreter on CPU: the shard_map wrapper (batch over
    fsdp, heads over tensor) and the kernel's masks and scaling give the reference's output."""
    import jax

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]).reshape(1, 1, 2, 2), MESH_AXES)
    q, k, v = qkv(2, 256, 2, 1, 128, "float32")
    ref = attention.attend(q, k, v, impl="xla")
    out = jax.jit(
        lambda q, k, v: attention.attend(
            q, k, v, impl="splash", block=128, mesh=mesh, interpret=True
        )
    )(q, k, v)
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("impl", ["blockwise", "splash"])
def test_attention_runs_per_device_inside_the_models_manual_region(impl: str) -> None:
    """`model.decoder_layer` calls `attend` inside `model.loss`'s shard_map (every axis manual,
    replication checked): each device's heads (over tensor) and rows (over fsdp) alone, loop
    carries that vary over the axes q, k and v vary over; a Pallas kernel, which has no
    replication type, inside a nested unchecked region. Output and gradients equal the
    reference's on the whole arrays; splash runs in the Pallas interpreter."""
    import jax
    from jax.sharding import PartitionSpec as P

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]).reshape(1, 1, 2, 2), MESH_AXES)
    length, block, dim = (256, 128, 128) if impl == "splash" else (64, 16, 16)
    q, k, v = qkv(2, length, 4, 2, dim, "float32")
    spec = P("fsdp", None, "tensor", None)
    kw: dict[str, Any] = {"interpret": True} if impl == "splash" else {}

    def per_device(q: Any, k: Any, v: Any) -> Any:
        return attention.attend(q, k, v, impl=impl, block=block, **kw)

    mapped = jax.shard_map(per_device, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)
    ref = attention.attend(q, k, v, impl="xla")
    np.testing.assert_allclose(jax.jit(mapped)(q, k, v), ref, atol=2e-5, rtol=1e-4)

    def total(q: Any, k: Any, v: Any) -> Any:
        return (mapped(q, k, v) ** 2).sum()

    grads = jax.jit(jax.grad(total, argnums=(0, 1, 2)))(q, k, v)
    want = jax.jit(jax.grad(loss("xla"), argnums=(0, 1, 2)))(q, k, v)
    for name, got, expected in zip("qkv", grads, want, strict=True):
        np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4, err_msg=f"d{name}")


# --- Packed rows: attention within each document. --------------------------------------------


@pytest.mark.parametrize("impl", ["blockwise", "xla", "splash"])
def test_packed_rows_attend_only_within_their_segment(impl: str) -> None:
    """Row 0 holds two documents (segment 0 up to position `cut`, 1 after; not on a block
    boundary), row 1 three. A query's output is that of its document attended alone: the same
    when the other documents' queries, keys and values change, and equal to the attention of
    its document cut out of the row."""
    import jax
    import jax.numpy as jnp

    length, block, dim = (256, 128, 128) if impl == "splash" else (64, 16, 16)
    cut = 100 if impl == "splash" else 21
    q, k, v = qkv(2, length, 4, 2, dim, "float32")
    t = jnp.arange(length)
    ids = jnp.stack([(t >= cut).astype(jnp.int32), (t >= 5).astype(jnp.int32) + (t >= 40)])
    kw: dict[str, Any] = {"interpret": True} if impl == "splash" else {}

    def attend(q: Any, k: Any, v: Any, seg: Any = ids) -> Any:
        return attention.attend(q, k, v, impl=impl, block=block, segment_ids=seg, **kw)

    out = jax.jit(attend)(q, k, v)
    noise = [jnp.where((t < cut)[None, :, None, None], x + 1.0, x) for x in (q, k, v)]
    changed = jax.jit(attend)(*noise)
    np.testing.assert_array_equal(out[0, cut:], changed[0, cut:])
    assert not np.allclose(out[0, :cut], changed[0, :cut])
    # The second document alone, from its first position (its own causal attention).
    alone = attention.attend(q[:1, cut:], k[:1, cut:], v[:1, cut:], impl="xla")
    np.testing.assert_allclose(out[0, cut:], alone[0], atol=2e-5, rtol=1e-4)


def test_blockwise_gradients_with_segments_match_the_masked_reference() -> None:
    import jax
    import jax.numpy as jnp

    q, k, v = qkv(2, 64, 4, 2, 16, "float32")
    t = jnp.arange(64)
    ids = jnp.stack([(t >= 21).astype(jnp.int32), (t >= 5).astype(jnp.int32) + (t >= 40)])
    got = jax.jit(jax.grad(loss("blockwise", 16, segment_ids=ids), argnums=(0, 1, 2)))(q, k, v)
    want = jax.jit(jax.grad(loss("xla", segment_ids=ids), argnums=(0, 1, 2)))(q, k, v)
    for name, a, b in zip("qkv", got, want, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4, err_msg=f"d{name}")
