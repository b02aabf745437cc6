"""The bytes every collective of the compiled train step moves, read from its optimized HLO
(`hlo.py`: op, shapes, dtypes, replica groups, loop trip counts), against the analytic minimum of
`traffic.py` for FSDP, tensor, data and pipeline layouts, and the operator's DCN advisor against
both. 8 CPU devices (conftest.py), the tiny model of test_workload_model.py.

Tolerance: 1% per (collective, mesh axes) for the weights, gradients and activations, and 1% of
the step's total; the small reductions (norm scales, loss, global norm for clipping, per-token
loss terms: `traffic.expected_parts`) may land in other groups (XLA folds an all-reduce over
``tensor`` into a later one over ``fsdp`` where the ops between are linear), so their bytes are
a slack on every key. The margins are for XLA splitting or combining collectives differently
across versions, which moves no bytes. A design that moves more (an all-reduce of a weight
gradient before its reduce-scatter, a weight gathered in float32 under bf16, a pipeline buffer
replicated over stages) misses by far more.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from multislice_workload import hlo, traffic, train
from multislice_workload.mesh import MESH_AXES
from tests.workload.compiled import cached_trainer
from tests.workload.test_workload_model import CFG

TOLERANCE = 0.01
LAYOUTS = {
    "fsdp": (1, 1, 8, 1),
    "fsdp x tensor": (1, 1, 4, 2),
    "data": (1, 8, 1, 1),
    "data x fsdp": (1, 2, 4, 1),
    "pipeline x fsdp x tensor": (2, 1, 2, 2),
    "pipeline x data": (2, 4, 1, 1),
}
LAYER_WEIGHTS = 6  # wq, wk, wv, wo, wi, wo_mlp (the norm scales are not gathered)


def measured(t: train.Trainer, text: str | None = None) -> dict[Any, dict[str, float]]:
    found = hlo.collectives(text or t.compiled.as_text(), t.mesh.size)
    return hlo.summarize(found, t.mesh.devices.shape, MESH_AXES)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_collective_moves_the_analytic_minimum(layout: str) -> None:
    t = cached_trainer(LAYOUTS[layout], CFG)
    got = {key: found["bytes"] for key, found in measured(t).items()}
    big, tiny = traffic.expected_parts(t.model, dict(t.mesh.shape), CFG.batch_size, t.microbatches)
    # The small reductions (norm scales, loss, global norm, per-token loss terms: a few KB)
    # may be regrouped by XLA; they bound how far any key may move, and nothing else does.
    slack = sum(tiny.values())
    assert slack < 0.02 * sum(big.values())
    for key, expected in big.items():
        assert abs(got.get(key, 0.0) - expected - tiny.get(key, 0.0)) <= (
            TOLERANCE * expected + slack
        ), (key, got.get(key), expected)
    for key in set(got) - set(big):
        # A small reduction moved into a larger group costs up to 2x its bytes (ring model:
        # 2 (n - 1) / n of the array), no more.
        assert got[key] <= 2 * slack, (key, got[key], slack)
    total = sum(big.values()) + slack
    assert sum(got.values()) == pytest.approx(total, rel=TOLERANCE)


def test_fsdp_reduce_scatters_each_gradient_once_and_all_reduces_none() -> None:
    t = cached_trainer(LAYOUTS["fsdp"], CFG)
    got = measured(t)
    layers = CFG.num_layers
    # Per step: each block weight gathered in the forward and in its recomputation, the
    # embedding and output layer once; one reduce-scatter per weight gradient.
    assert got[("all-gather", ("fsdp",))]["executions"] == 2 * LAYER_WEIGHTS * layers + 2
    assert got[("reduce-scatter", ("fsdp",))]["executions"] == LAYER_WEIGHTS * layers + 2
    # The only all-reduce over fsdp is the norm scales', the loss's and the global norm's
    # partial sums (one per sharded parameter): a few hundred floats, not a weight gradient
    # (the old step all-reduced every weight gradient at full size).
    partials = len(traffic.sharded_axes(t.model, dict(t.mesh.shape)))
    assert partials == LAYER_WEIGHTS + 2
    norms = 2 * layers * CFG.embed + CFG.embed + 1 + partials
    assert got[("all-reduce", ("fsdp",))]["bytes"] == pytest.approx(2 * 7 / 8 * 4 * norms)


@pytest.mark.parametrize(
    "reduce_flag, reduced",
    [(None, "f32"), ("float32", "f32"), ("bfloat16", "bf16")],
)
def test_bf16_weights_are_gathered_in_bf16_and_gradients_reduce_in_grad_reduce_dtype(
    reduce_flag: str | None, reduced: str
) -> None:
    """Under --dtype bfloat16 every all-gather is bf16 in the program, and moves half the
    float32 bytes. Every gradient collective (FSDP's reduce-scatter, the all-reduce over
    ``data``) is in --grad_reduce_dtype: float32 by default (MaxText's grad_dtype default),
    bf16 when asked, at half the bytes. Read from the HLO before XLA's passes: XLA:CPU has no
    bf16 collectives and widens them to f32 after the convert (the values stay bf16-rounded);
    a TPU keeps them bf16."""
    import jax
    import jax.numpy as jnp

    option = {} if reduce_flag is None else {"grad_reduce_dtype": reduce_flag}
    cfg = dataclasses.replace(CFG, dtype="bfloat16", **option)
    t = cached_trainer((1, 2, 2, 2), cfg)
    batch = jax.ShapeDtypeStruct(
        (cfg.batch_size, cfg.seq_len + 1), jnp.int32, sharding=t.batch_sharding
    )
    text = jax.jit(t._train_step).lower(t.abstract_state, batch).as_text(dialect="hlo")
    found = hlo.collectives(text, t.mesh.size)
    gathers = [c for c in found if c.op == "all-gather"]
    assert gathers and all(c.dtypes == {"bf16"} for c in gathers)
    scatters = [c for c in found if c.op == "reduce-scatter"]
    assert scatters and all(c.dtypes == {reduced} for c in scatters)
    data = [c for c in found if hlo.axes_of(c, t.mesh.devices.shape, MESH_AXES) == ("data",)]
    assert data and all(c.dtypes == {reduced} for c in data)
    got = hlo.summarize(found, t.mesh.devices.shape, MESH_AXES)
    want = traffic.expected_bytes(t.model, dict(t.mesh.shape), cfg.batch_size)
    for key in (
        ("all-gather", ("fsdp",)),
        ("reduce-scatter", ("fsdp",)),
        ("all-reduce", ("data",)),
    ):
        assert got[key]["bytes"] == pytest.approx(want[key], rel=TOLERANCE), key
    f32 = traffic.expected_bytes(
        dataclasses.replace(t.model, dtype="float32", grad_reduce_dtype="float32"),
        dict(t.mesh.shape),
        cfg.batch_size,
    )
    half = 2 if reduced == "bf16" else 1
    assert got[("all-gather", ("fsdp",))]["bytes"] == pytest.approx(
        f32[("all-gather", ("fsdp",))] / 2
    )
    for key in (("reduce-scatter", ("fsdp",)), ("all-reduce", ("data",))):
        assert got[key]["bytes"] == pytest.approx(f32[key] / half, rel=TOLERANCE), key


def test_the_pipeline_sends_stage_boundary_activations_only() -> None:
    t = cached_trainer(LAYOUTS["pipeline x fsdp x tensor"], CFG)
    got = measured(t)
    iterations = t.microbatches + t.stages - 1
    found = hlo.collectives(t.compiled.as_text(), t.mesh.size)
    permutes = [c for c in found if c.op == "collective-permute"]
    # 2 permutes per iteration forward (shift, input/output rotation) and 2 backward, each one
    # microbatch's activations on this device, [rows / fsdp / microbatches per stage, seq, embed].
    rows = CFG.batch_size // t.stages // 2 // (t.microbatches // t.stages)
    assert sum(c.count for c in permutes) == 4 * iterations
    assert all(c.size_bytes == 4 * rows * CFG.seq_len * CFG.embed for c in permutes)
    assert all(hlo.axes_of(c, t.mesh.devices.shape, MESH_AXES) == ("pipeline",) for c in permutes)
    # No wrap-around pair: the last stage sends nothing forward, stage 0 nothing back.
    assert all(len(c.groups) == t.mesh.size // t.stages for c in permutes)
    # FSDP gathers once per step, not on each of the M + S - 1 iterations.
    assert got[("all-gather", ("fsdp",))]["executions"] == LAYER_WEIGHTS + 2
    assert got[("reduce-scatter", ("fsdp",))]["executions"] == LAYER_WEIGHTS + 2


# --- The operator's DCN advisor describes the same program. ---------------------------------

# Layouts without tensor parallelism, read as one-chip slices: every mesh axis is a DCN axis.
DCN_LAYOUTS = ("data", "data x fsdp", "fsdp", "pipeline x data")


@pytest.mark.parametrize("layout", DCN_LAYOUTS)
def test_the_advisors_traffic_is_the_compiled_steps(layout: str) -> None:
    from multislice_operator.planning import advisor
    from multislice_operator.tpu.parallelism import Parallelism

    s, d, f, _ = LAYOUTS[layout]
    t = cached_trainer(LAYOUTS[layout], CFG)
    got = measured(t)
    model = t.model
    params = model.parameter_count()
    vocab_params = 2 * model.padded_vocab * model.embed

    def bits(*keys: tuple[str, tuple[str, ...]]) -> float:
        return 8 * sum(got[k]["bytes"] for k in keys if k in got)

    counts = {
        advisor.ALL: params,
        advisor.BLOCKS: params - vocab_params - model.embed,  # with their norm scales
        advisor.VOCAB: vocab_params,
    }
    keys = {
        "data": [("all-reduce", ("data",))],
        "fsdp": [("all-gather", ("fsdp",)), ("reduce-scatter", ("fsdp",))],
        "pipeline": [("all-reduce", ("pipeline", "data")), ("all-reduce", ("pipeline",))],
    }
    par = Parallelism(1, 1, 1, dcn_data=d, dcn_fsdp=f, dcn_pipeline=s, dcn_tensor=1)
    told = advisor.dcn_traffic(par, compute_bits=32)  # float32 matmuls on CPU
    axes = [a for a, n in (("data", d), ("fsdp", f), ("pipeline", s)) if n > 1]
    assert sorted({a.axis for a in told}) == sorted(axes)
    for axis in axes:
        said = sum(a.bits_per_parameter * counts[a.of] for a in told if a.axis == axis)
        assert bits(*keys[axis]) == pytest.approx(said, rel=TOLERANCE), axis
    if s > 1:
        permutes = got[("collective-permute", ("pipeline",))]["executions"]
        assert permutes == advisor.PIPELINE_TRANSFERS * (t.microbatches + s - 1)


@pytest.mark.parametrize("dcn", [(2, 1), (4, 1), (1, 2), (1, 4), (2, 2), (4, 2)])
def test_the_verdict_rounds_the_exact_traffic_up_as_the_seed_does(dcn: tuple[int, int]) -> None:
    """The verdict keeps the seed's figures (32 bits with two slices, 64 beyond, for data):
    equal to the exact traffic when every DCN factor is 2, above it beyond."""
    from multislice_operator.planning import advisor
    from multislice_operator.tpu.parallelism import Parallelism

    d, f = dcn
    par = Parallelism(1, 1, 1, dcn_data=d, dcn_fsdp=f, dcn_pipeline=1, dcn_tensor=1)
    # Per parameter of the whole model with the blocks' figure for every weight, as the
    # verdict counts (it does not know the vocabulary's share; the blocks' is the larger).
    exact = sum(a.bits_per_parameter for a in advisor.dcn_traffic(par) if a.of != advisor.VOCAB)
    verdict = advisor.dcn_bits_per_parameter(par)
    assert verdict == exact if max(dcn) == 2 else verdict > exact


# --- Gradient accumulation reduces over the batch axes once per step. ------------------------


@pytest.mark.parametrize("layout", ["data x fsdp", "pipeline x data"])
def test_gradient_accumulation_all_reduces_the_gradients_once_per_step(layout: str) -> None:
    """--grad_accum 4 (what --microbatch_size makes of fewer slices) sums the microbatches'
    gradients on each device first and all-reduces the sum over ``data`` (and ``pipeline`` for
    the embedding and output layers) once: the traffic between slices of one step is N = 1's.
    FSDP still reduce-scatters each microbatch's gradients (the accumulator is the shard, so
    each device holds 1/F of it), 4 times N = 1's bytes."""
    one_cfg = dataclasses.replace(CFG, batch_size=32)
    one = cached_trainer(LAYOUTS[layout], one_cfg)
    four = cached_trainer(LAYOUTS[layout], dataclasses.replace(one_cfg, grad_accum=4))
    got1, got4 = measured(one), measured(four)
    batch_keys = [k for k in got1 if k[0] == "all-reduce" and "data" in k[1]]
    assert batch_keys
    weights = ("all-reduce", ("data",))
    assert got4[weights]["executions"] == got1[weights]["executions"]
    assert got4[weights]["bytes"] == pytest.approx(got1[weights]["bytes"], rel=TOLERANCE)
    # Every all-reduce over the batch axes: the gradient shards, the norm scales and, once
    # per microbatch, the loss (4 bytes, the slack).
    total1 = sum(got1[k]["bytes"] for k in batch_keys)
    total4 = sum(got4.get(k, {"bytes": 0.0})["bytes"] for k in batch_keys)
    assert total4 == pytest.approx(total1, abs=2 * 4 * 4 * 4)
    scatter = ("reduce-scatter", ("fsdp",))
    if scatter in got1:
        assert got4[scatter]["bytes"] == pytest.approx(4 * got1[scatter]["bytes"], rel=TOLERANCE)
