"""Causal attention that does not materialize the [T, T] scores: a kernel per platform.

`attend(q, k, v)` takes q [batch, T, heads, head_dim] and k, v [batch, T, kv_heads, head_dim]
(grouped-query attention when kv_heads < heads; heads % kv_heads == 0) and returns
[batch, T, heads, head_dim]. Implementations (`--attention`):

- ``splash``: Pallas splash attention on TPU (``jax.experimental.pallas.ops.tpu.splash_attention``,
  the kernel MaxText uses), run per device under ``shard_map`` (batch over ``data`` x ``fsdp``,
  heads over ``tensor``), as a Pallas call cannot be partitioned automatically.
- ``cudnn``: ``jax.nn.dot_product_attention(implementation="cudnn")``, cuDNN's fused flash
  attention (bf16/fp16 only).
- ``blockwise``: flash attention in plain JAX, the CPU path and every platform's fallback: the
  online softmax over key blocks of `block` positions (FlashAttention, Dao et al. 2022), with a
  custom VJP that saves only the output and the log-sum-exp and recomputes the probabilities block
  by block (FlashAttention-2's backward), so forward and backward hold O(T) memory, never
  O(T^2). Causal blocks above the diagonal are skipped, not masked: half the work.
- ``xla``: ``jax.nn.dot_product_attention(implementation="xla")``, the reference: fp32 scores
  [batch, heads, T, T] (what the workload ran before).

``auto`` picks splash on TPU, cudnn on GPU under bf16, blockwise otherwise.

Packed rows (`segment_ids` [batch, T], `model.segments`): a query attends only to the keys of its
own segment (document), causally: blockwise and splash mask inside their blocks (splash takes
``SegmentIds``, as MaxText passes its packed segmentation), ``xla`` and ``cudnn`` take the
[batch, 1, T, T] mask (cuDNN through jax.nn's bias: O(T^2) memory for that mask).
"""

from __future__ import annotations

import functools
from typing import Any, Literal

IMPLEMENTATIONS = ("auto", "splash", "cudnn", "blockwise", "xla")
DEFAULT_BLOCK = 512
_MASKED = -0.7 * 3.4028235e38  # a finite "minus infinity": exp() of it is 0, never NaN


def resolve(impl: str, platform: str, dtype: Any) -> str:
    import jax.numpy as jnp

    if impl != "auto":
        return impl
    if platform == "tpu":
        return "splash"
    if platform == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16):
        return "cudnn"
    return "blockwise"


def attend(
    q: Any,
    k: Any,
    v: Any,
    *,
    impl: str = "auto",
    block: int = DEFAULT_BLOCK,
    mesh: Any = None,
    interpret: bool = False,
    segment_ids: Any = None,
) -> Any:
    """Causal attention; q [B, T, H, D], k and v [B, T, K, D] with H % K == 0; with
    `segment_ids` [B, T], within each segment only."""
    import jax

    heads, kv_heads = q.shape[2], k.shape[2]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads do not split into {kv_heads} key/value groups")
    platform = jax.devices()[0].platform if mesh is None else mesh.devices.flat[0].platform
    impl = resolve(impl, platform, q.dtype)
    if impl in ("xla", "cudnn"):
        # jax.nn.dot_product_attention takes grouped key/value heads as they are.
        mask = None
        if segment_ids is not None:
            mask = segment_ids[:, None, :, None] == segment_ids[:, None, None, :]
        kernel: Literal["xla", "cudnn"] = "xla" if impl == "xla" else "cudnn"
        return jax.nn.dot_product_attention(
            q, k, v, mask=mask, is_causal=True, implementation=kernel
        )
    if impl == "splash":
        return splash(q, k, v, block=block, mesh=mesh, interpret=interpret, segment_ids=segment_ids)
    if impl == "blockwise":
        return blockwise(q, k, v, block=block, segment_ids=segment_ids)
    raise ValueError(f"attention {impl!r} is not one of {IMPLEMENTATIONS}")


def _repeat_kv(q: Any, k: Any, v: Any) -> tuple[Any, Any]:
    import jax.numpy as jnp

    groups = q.shape[2] // k.shape[2]
    if groups == 1:
        return k, v
    return jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)


# --- Blockwise (flash) attention in JAX. -----------------------------------------------------


def blockwise(
    q: Any, k: Any, v: Any, *, block: int = DEFAULT_BLOCK, segment_ids: Any = None
) -> Any:
    import jax.numpy as jnp

    k, v = _repeat_kv(q, k, v)  # the transpose of the repeat sums each group's gradient
    length = q.shape[1]
    block = min(block, length)
    padded = -(-length // block) * block
    # One segment for every position when the rows are not packed.
    seg = jnp.zeros(q.shape[:2], jnp.int32) if segment_ids is None else segment_ids
    # [B, T, H, D] -> [B, H, T, D]; padding keys come after every real query, so the causal
    # mask hides them; padded queries are cut off (their gradient is zero).
    q, k, v = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))
    if padded != length:
        pad = ((0, 0), (0, 0), (0, padded - length), (0, 0))
        q, k, v = (jnp.pad(x, pad) for x in (q, k, v))
        seg = jnp.pad(seg, ((0, 0), (0, padded - length)), mode="edge")
    out = _flash()(q, k, v, seg, block)
    return jnp.swapaxes(out[:, :, :length], 1, 2)


def _blocks(x: Any, block: int) -> Any:
    b, h, t, d = x.shape
    return x.reshape(b, h, t // block, block, d)


def _scores(qi: Any, kj: Any, i: Any, j: Any, block: int, segb: Any) -> Any:
    """Scaled scores of query block i against key block j, fp32, masked causally and to the
    query's segment (`segb` [B, blocks, block])."""
    import jax.numpy as jnp

    s = jnp.einsum("bhqd,bhkd->bhqk", qi, kj, preferred_element_type=jnp.float32)
    rows = i * block + jnp.arange(block)[:, None]
    cols = j * block + jnp.arange(block)[None, :]
    same = segb[:, i][:, None, :, None] == segb[:, j][:, None, None, :]
    return jnp.where((rows >= cols) & same, s, _MASKED)


def _forward(q: Any, k: Any, v: Any, seg: Any, block: int) -> tuple[Any, Any]:
    """(out [B, H, T, D], log-sum-exp [B, H, T] fp32)."""
    import jax
    import jax.numpy as jnp

    from multislice_workload.partitioning import vary, varying_axes

    scale = q.shape[-1] ** -0.5
    qb, kb, vb = (_blocks(x, block) for x in (q, k, v))
    b, h, n, _, d = qb.shape
    segb = seg.reshape(b, n, block)
    axes = varying_axes(q, k, v)  # inside `model.loss`'s shard_map: the carries vary as q, k, v

    def query_block(i: Any) -> tuple[Any, Any]:
        qi = (qb[:, :, i] * scale).astype(q.dtype)

        def step(j: Any, carry: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
            m, total, acc = carry
            s = _scores(qi, kb[:, :, j], i, j, block, segb)
            m_new = jnp.maximum(m, s.max(-1))
            p = jnp.exp(s - m_new[..., None])
            correction = jnp.exp(m - m_new)
            pv = jnp.einsum(
                "bhqk,bhkd->bhqd", p.astype(v.dtype), vb[:, :, j],
                preferred_element_type=jnp.float32,
            )  # fmt: skip
            return m_new, total * correction + p.sum(-1), acc * correction[..., None] + pv

        init = (
            vary(jnp.full((b, h, block), _MASKED, jnp.float32), axes),
            vary(jnp.zeros((b, h, block), jnp.float32), axes),
            vary(jnp.zeros((b, h, block, d), jnp.float32), axes),
        )
        m, total, acc = jax.lax.fori_loop(0, i + 1, step, init)  # key blocks 0..i: causal
        return (acc / total[..., None]).astype(q.dtype), m + jnp.log(total)

    out, lse = jax.lax.map(query_block, jnp.arange(n))  # [n, B, H, block, ...]
    out = jnp.moveaxis(out, 0, 2).reshape(q.shape)
    return out, jnp.moveaxis(lse, 0, 2).reshape(b, h, n * block)


@functools.cache
def _flash() -> Any:
    """The custom-VJP flash attention (built on first use: jax is imported lazily here)."""
    import jax

    def flash(q: Any, k: Any, v: Any, seg: Any, block: int) -> Any:
        return _forward(q, k, v, seg, block)[0]

    fn = jax.custom_vjp(flash, nondiff_argnums=(4,))
    fn.defvjp(_flash_fwd, _flash_bwd)
    return fn


def _flash_fwd(q: Any, k: Any, v: Any, seg: Any, block: int) -> tuple[Any, tuple[Any, ...]]:
    out, lse = _forward(q, k, v, seg, block)
    return out, (q, k, v, seg, out, lse)


def _flash_bwd(block: int, residuals: tuple[Any, ...], dout: Any) -> tuple[Any, Any, Any, None]:
    """dq, dk, dv recomputing each probability block from the saved log-sum-exp: a pass over
    key blocks (dk, dv) and a pass over query blocks (dq)."""
    import jax
    import jax.numpy as jnp

    from multislice_workload.partitioning import vary, varying_axes

    q, k, v, seg, out, lse = residuals
    axes = varying_axes(q, k, v, dout)
    scale = q.shape[-1] ** -0.5
    delta = jnp.sum(dout.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
    qb, kb, vb, dob = (_blocks(x, block) for x in (q, k, v, dout))
    b, h, n, _, d = qb.shape
    segb = seg.reshape(b, n, block)
    lseb = lse.reshape(b, h, n, block)
    deltab = delta.reshape(b, h, n, block)

    def probs(i: Any, j: Any) -> tuple[Any, Any]:
        qi = (qb[:, :, i] * scale).astype(q.dtype)
        s = _scores(qi, kb[:, :, j], i, j, block, segb)
        p = jnp.exp(s - lseb[:, :, i][..., None])
        dp = jnp.einsum(
            "bhqd,bhkd->bhqk", dob[:, :, i], vb[:, :, j], preferred_element_type=jnp.float32
        )
        return p, p * (dp - deltab[:, :, i][..., None])  # p, dscores

    def key_block(j: Any) -> tuple[Any, Any]:
        def step(i: Any, carry: tuple[Any, Any]) -> tuple[Any, Any]:
            dk, dv = carry
            p, ds = probs(i, j)
            qi = (qb[:, :, i] * scale).astype(q.dtype)
            dv = dv + jnp.einsum(
                "bhqk,bhqd->bhkd", p.astype(v.dtype), dob[:, :, i],
                preferred_element_type=jnp.float32,
            )  # fmt: skip
            dk = dk + jnp.einsum(
                "bhqk,bhqd->bhkd", ds.astype(q.dtype), qi, preferred_element_type=jnp.float32
            )
            return dk, dv

        zeros = vary(jnp.zeros((b, h, block, d), jnp.float32), axes)
        dk, dv = jax.lax.fori_loop(j, n, step, (zeros, zeros))
        return dk, dv  # query blocks j..n-1: causal

    def query_block(i: Any) -> Any:
        def step(j: Any, dq: Any) -> Any:
            _, ds = probs(i, j)
            return dq + jnp.einsum(
                "bhqk,bhkd->bhqd", ds.astype(k.dtype), kb[:, :, j],
                preferred_element_type=jnp.float32,
            )  # fmt: skip

        zeros = vary(jnp.zeros((b, h, block, d), jnp.float32), axes)
        return jax.lax.fori_loop(0, i + 1, step, zeros)

    dk, dv = jax.lax.map(key_block, jnp.arange(n))
    dq = jax.lax.map(query_block, jnp.arange(n)) * scale

    def whole(x: Any, like: Any) -> Any:
        return jnp.moveaxis(x, 0, 2).reshape(like.shape).astype(like.dtype)

    return whole(dq, q), whole(dk, k), whole(dv, v), None  # segment ids: integers


# --- Splash attention (TPU). -----------------------------------------------------------------


def splash(
    q: Any,
    k: Any,
    v: Any,
    *,
    block: int = DEFAULT_BLOCK,
    mesh: Any = None,
    interpret: bool = False,
    segment_ids: Any = None,
) -> Any:
    """Pallas splash attention, per device: [B, T, H, D] in and out, heads-major inside; the
    segment ids [B, T] go to the kernel as ``SegmentIds(q=ids, kv=ids)``."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    k, v = _repeat_kv(q, k, v)
    length, heads = q.shape[1], q.shape[2]
    b = min(block, length)
    if length % b or b % 128:
        raise ValueError(f"splash attention needs seq_len a multiple of {b} (>= 128), got {length}")
    sizes = sk.BlockSizes(
        block_q=b, block_kv=b, block_kv_compute=b,
        block_q_dkv=b, block_kv_dkv=b, block_kv_dkv_compute=b,
        block_q_dq=b, block_kv_dq=b,
    )  # fmt: skip
    scale = q.shape[-1] ** -0.5

    def per_device(qd: Any, kd: Any, vd: Any, sd: Any) -> Any:
        local_heads = qd.shape[2]
        mask = sm.MultiHeadMask([sm.CausalMask((length, length)) for _ in range(local_heads)])
        kernel = sk.make_splash_mha(
            mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret
        )
        qh, kh, vh = (jnp.swapaxes(x, 1, 2) for x in ((qd * scale).astype(qd.dtype), kd, vd))

        def row(qr: Any, kr: Any, vr: Any, sr: Any) -> Any:
            return kernel(qr, kr, vr, segment_ids=sk.SegmentIds(q=sr, kv=sr))

        return jnp.swapaxes(jax.vmap(row)(qh, kh, vh, sd), 1, 2)

    seg = jnp.zeros(q.shape[:2], jnp.int32) if segment_ids is None else segment_ids
    if mesh is None or mesh.size == 1:
        return _in_manual_region(per_device, q, k, v, seg)
    from multislice_workload.partitioning import logical_to_spec

    spec = logical_to_spec(("batch", None, "act_heads", None))
    rows = logical_to_spec(("batch", None))
    del heads
    return jax.shard_map(
        per_device,
        mesh=mesh,
        in_specs=(spec, spec, spec, rows),
        out_specs=spec,
        check_vma=False,
    )(q, k, v, seg)


def _in_manual_region(kernel: Any, q: Any, k: Any, v: Any, seg: Any) -> Any:
    """`kernel(q, k, v, seg)` (`seg`: integers, no gradient), also inside a ``shard_map`` that
    checks replication (`model.loss`).

    A Pallas call has no replication type for its outputs, so under ``check_vma=True`` it is
    refused ("manual_axis_type ... must not be None"); JAX's own Pallas collectives run under
    ``check_vma=False`` instead. Here the kernel and its VJP run in a nested ``shard_map`` that
    makes no new axis manual and checks nothing, on untyped copies of their inputs, inside a
    custom VJP that marks the output and the input cotangents varying as q, k and v are: per
    device the values and gradients are the kernel's, and no collective is added. The forward's
    residuals (the kernel's own, from `jax.vjp`) are passed to the backward, so the forward runs
    once per (rematerialized) pass."""
    import jax
    from jax.sharding import PartitionSpec as P

    from multislice_workload.partitioning import vary, varying_axes

    axes = varying_axes(q, k, v)
    if not axes:
        return kernel(q, k, v, seg)
    each = [varying_axes(x) for x in (q, k, v)]  # static: the cotangents vary as their inputs

    def unchecked(fn: Any) -> Any:
        mesh = jax.sharding.get_abstract_mesh()
        return jax.shard_map(
            fn, mesh=mesh, in_specs=P(), out_specs=P(), axis_names=frozenset(), check_vma=False
        )

    def forward(q: Any, k: Any, v: Any, seg: Any) -> tuple[Any, Any]:
        def run(q: Any, k: Any, v: Any, seg: Any) -> Any:
            fixed = _untyped(seg)
            return jax.vjp(
                lambda q, k, v: kernel(q, k, v, fixed), _untyped(q), _untyped(k), _untyped(v)
            )

        out, vjp = unchecked(run)(q, k, v, seg)
        return vary(out, axes), vjp

    def backward(vjp: Any, g: Any) -> tuple[Any, ...]:
        grads = unchecked(lambda vjp, g: vjp(_untyped(g)))(vjp, g)
        return (*(vary(d, a) for d, a in zip(grads, each, strict=True)), None)

    call = jax.custom_vjp(lambda q, k, v, seg: forward(q, k, v, seg)[0])
    call.defvjp(forward, backward)
    return call(q, k, v, seg)


def _untyped(x: Any) -> Any:
    """`x` as a computed value: in a region that checks nothing it carries no replication type
    (an input keeps its own), as the kernel's output has none; the select is folded by XLA."""
    import jax.numpy as jnp

    return jnp.where(True, x, jnp.zeros((), x.dtype))
