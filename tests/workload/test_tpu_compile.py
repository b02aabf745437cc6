"""The train step compiled by the TPU compiler (libtpu, the workload's ``tpu`` extra) for every
generation of the catalog, on this CPU machine (`compile.py`): one slice, and two slices over DCN.

On each TPU program, the bytes of every collective against the analytic minimum of `traffic.py`
(the XLA:CPU checks of test_workload_traffic.py, run on the real TPU program), the collectives
between slices included; the dtypes the TPU keeps (XLA:CPU widens bf16 collectives to f32); HBM
and the exit code of a program that does not fit. One compile per (generation, slices), shared by
the module: a few seconds each.

What the TPU compiler does that XLA:CPU does not (libtpu 0.0.42.1): it all-reduces the
embedding table's gradient over ``fsdp`` at full size (then keeps its shard) instead of
reduce-scattering it on some generations, every weight gradient on others
(`ALL_REDUCED_VOCAB_GRADIENTS`); `analytic` moves those bytes from the reduce-scatter to an
all-reduce (twice the bytes), so a compiler that changes it (or a model change that breaks the
rest) shows here.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from multislice_workload import compile as tpu_compile
from multislice_workload import hardware, partitioning, traffic, train
from multislice_workload.env import ConfigError, Parallelism

TOLERANCE = 0.01
# Per generation, a multi-host shape of the catalog (docs/provisioning.md): 8 chips in two
# 4-chip hosts (tpu7x: one 4-chip host, 8 devices).
TOPOLOGIES = ("v4:2x2x2", "v5e:2x4", "v5p:2x2x2", "v6e:2x4", "tpu7x:2x2x1")
# Large enough that the compiler reduce-scatters the weights (it all-reduces arrays of a few KB).
CFG = train.TrainConfig(
    steps=10,
    batch_size=16,
    seq_len=128,
    embed=256,
    heads=2,
    head_dim=128,
    mlp=1024,
    num_layers=2,
    dtype="bfloat16",
    vocab=256,
)
CASES = [(t, s) for t in TOPOLOGIES for s in (1, 2)]
# Measured (libtpu 0.0.42.1): the weight gradients the TPU compiler all-reduces over fsdp in full
# (then keeps this device's shard) instead of reduce-scattering them, per generation: every one
# on v4 and v5p (the megacore chips), the embedding table's on v5e and v6e, none on tpu7x.
# XLA:CPU reduce-scatters them all. (Before the FSDP gather got its own backward, which
# reduce-scatters in --grad_reduce_dtype, v6e all-reduced the output layer's too: 2.)
EVERY = -1
ALL_REDUCED_VOCAB_GRADIENTS = {"v4": EVERY, "v5p": EVERY, "v5e": 1, "v6e": 1, "tpu7x": 0}

_COMPILED: dict[Any, tuple[tpu_compile.Result, train.Trainer]] = {}


def compiled(
    topology: str, slices: int, cfg: train.TrainConfig = CFG, par: Parallelism | None = None
) -> tuple[tpu_compile.Result, train.Trainer]:
    """FSDP over each slice's devices, data parallelism across slices (the operator's default)."""
    top = tpu_compile.parse_topology(topology)
    par = par or Parallelism(ici_fsdp=top.chips, dcn_data=slices)
    key = (topology, slices, cfg, par)
    if key not in _COMPILED:
        _COMPILED[key] = tpu_compile.compile_for(cfg, top, slices, par, allow_split=False)
    return _COMPILED[key]


def analytic(t: train.Trainer, generation: str) -> tuple[dict[Any, float], dict[Any, float]]:
    """`traffic.expected_parts`, with the gradients the TPU compiler all-reduces in full over
    fsdp (module docstring) moved from the reduce-scatter to an all-reduce (2x the bytes)."""
    mesh = dict(t.mesh.shape)
    big, tiny = traffic.expected_parts(t.model, mesh, t.cfg.batch_size)
    scattered = big.get(("reduce-scatter", ("fsdp",)), 0.0)
    if scattered:
        vocab = traffic.sizes(t.model, mesh, t.cfg.batch_size, 1).vocab_gathered
        # the gradient collectives reduce in --grad_reduce_dtype (float32 by default)
        c = 2 if t.model.grad_reduce_dtype == "bfloat16" else 4
        embedding = c * vocab * (mesh["fsdp"] - 1) / mesh["fsdp"]
        count = ALL_REDUCED_VOCAB_GRADIENTS[generation]
        moved = scattered if count == EVERY else count * embedding
        big[("reduce-scatter", ("fsdp",))] = scattered - moved
        big[("all-reduce", ("fsdp",))] = big.get(("all-reduce", ("fsdp",)), 0.0) + 2 * moved
        big = {k: v for k, v in big.items() if v}
    return big, tiny


def byte_problems(t: train.Trainer, generation: str) -> list[str]:
    """Each (collective, mesh axes) of the TPU program whose bytes miss the analytic minimum by
    more than 1% (plus the small reductions' slack, as test_workload_traffic.py)."""
    got = {key: found["bytes"] for key, found in tpu_compile.summarize(t).items()}
    big, tiny = analytic(t, generation)
    slack = sum(tiny.values())
    out = []
    for key, expected in big.items():
        if abs(got.get(key, 0.0) - expected - tiny.get(key, 0.0)) > TOLERANCE * expected + slack:
            out.append(f"{key}: {got.get(key, 0.0):.0f} bytes, expected {expected:.0f}")
    for key in set(got) - set(big):
        if got[key] > 2 * slack:
            out.append(f"{key}: {got[key]:.0f} bytes, expected none")
    return out


@pytest.mark.parametrize(("topology", "slices"), CASES)
def test_every_collective_moves_the_analytic_minimum(topology: str, slices: int) -> None:
    result, t = compiled(topology, slices)
    assert result.fits and result.hbm_bytes_per_device > 0
    assert byte_problems(t, topology.split(":")[0]) == []
    summary = tpu_compile.summarize(t)
    dcn = {key for key in summary if key[1] == ("data",)}
    # Two slices: the only traffic between them is the data-parallel gradient all-reduce.
    assert dcn == ({("all-reduce", ("data",))} if slices > 1 else set())


def test_a_wrong_sharding_fails_the_byte_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Weights replicated instead of sharded over fsdp: no gathers, every gradient all-reduced
    in full. The analytic figures still describe the design, so the check must flag it."""
    monkeypatch.setitem(partitioning.LOGICAL_RULES, "embed", None)
    broken = dataclasses.replace(CFG, seed=1)  # a cache key of its own
    _, t = compiled("v5e:2x4", 2, broken)
    problems = byte_problems(t, "v5e")
    assert any("all-gather" in p for p in problems), problems
    assert any("all-reduce" in p for p in problems), problems


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_fsdp_gathers_are_bf16_and_gradients_reduce_in_the_grad_reduce_dtype(topology: str) -> None:
    """Under --dtype bfloat16 (float32 parameters) the TPU program gathers the weights in bf16
    inside a slice (XLA:CPU widens them to f32 and could not show it); the weight gradients are
    reduced over fsdp (reduce-scatter, or all-reduce where the compiler chooses it) in the grad
    reduce dtype (bf16 today: the transpose of the bf16 gather; a --grad_reduce_dtype option
    sets it where the model has one), and all-reduced across slices (DCN) in float32, the
    parameters' dtype."""
    _, t = compiled(topology, 2)
    text = t.compiled.as_text()
    found = tpu_compile.ici_collectives(text, t.mesh.devices.size // 2)
    gathers = [c for c in found if c.op == "all-gather" and c.size_bytes >= 4096]
    assert len(gathers) >= 12 and all(c.dtypes == {"bf16"} for c in gathers)
    reduce = {"float32": "f32", "bfloat16": "bf16"}[
        getattr(t.model, "grad_reduce_dtype", "bfloat16")
    ]
    grads = [
        c
        for c in found
        if (c.op == "reduce-scatter" and c.size_bytes >= 4096)
        or (c.op == "all-reduce" and c.size_bytes >= 65536)
    ]
    assert len(grads) >= 2 and all(c.dtypes == {reduce} for c in grads), {
        (c.op, tuple(c.dtypes)) for c in grads
    }
    dcn = tpu_compile.dcn_transfers(text)
    assert dcn and all(x.kind == "ALL_REDUCE" for x in dcn)
    assert {d for x in dcn for d, _ in x.arrays} == {"f32"}


def test_the_roofline_and_hbm_come_from_the_compiled_program() -> None:
    result, t = compiled("v6e:2x4", 2)
    cost = t.compiled.cost_analysis()
    assert result.flops_per_device == pytest.approx(cost["flops"])
    peak = hardware.TPU_PEAK_BF16_FLOPS["v6e"]
    bandwidth = hardware.TPU_HBM_BANDWIDTH["v6e"]
    want = max(cost["flops"] / peak, cost["bytes accessed"] / bandwidth)
    assert result.step_time_s == pytest.approx(want)
    # libtpu's count is below the model FLOPs of one device's share (6 per parameter per token,
    # plus attention): 0.67x here, measured; why is not settled. Neither is a hardware count.
    model = t.model.flops_per_token() * CFG.batch_size * CFG.seq_len / t.mesh.devices.size
    assert 0.5 * model <= result.flops_per_device <= 2 * model
    memory = t.compiled.memory_analysis()
    assert result.hbm_bytes_per_device == tpu_compile.hbm_used(memory)
    assert result.hbm_bytes_per_device >= train.max_device_bytes(t.abstract_state)


def test_the_cli_exits_78_with_the_json_result_when_the_program_does_not_fit(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from multislice_workload import cli, termination

    log = tmp_path / "termination-log"
    monkeypatch.setenv(termination.TERMINATION_LOG_ENV, str(log))
    monkeypatch.setattr(termination, "STATUS", termination.RunStatus())
    monkeypatch.setattr(tpu_compile, "STATUS", termination.STATUS)
    # 4 layers of 8192 x 32768 on one v5e chip: about 14 GiB of float32 weights alone.
    big = ["--embed", "8192", "--mlp", "32768", "--heads", "64", "--head_dim", "128"]
    argv = ["compile", "--topology", "v5e:1x1", "--slices", "1", "--json", "--vocab", "256", *big]
    code = cli.main([*argv, "--num_layers", "4", "--batch_size", "1", "--seq_len", "128"])
    assert code == 78
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith('{"fits"')]
    result = json.loads(lines[-1])
    assert result["fits"] is False and "error" not in result
    assert "RESOURCE_EXHAUSTED" in result["compiler"]
    assert result["hbm_bytes_per_device"] > result["hbm_capacity_bytes"]
    assert result["hbm_capacity_bytes"] == hardware.TPU_COMPILER_HBM_BYTES["v5e"]
    message = json.loads(log.read_text())
    assert message["exitCode"] == 78 and message["fits"] is False
    assert message["hbm_bytes_per_device"] == result["hbm_bytes_per_device"]


# Issue 55: a 3.66B model (embed 2048, 56 layers, SwiGLU 8192, float32 parameters and Adam) on
# v5e-4 (FSDP 4), one sequence of 1,024 tokens per device, that libtpu compiles within its
# 15.75 GiB, and that the gate refused while it summed every temporary with the arguments and
# outputs against the spec sheet's 16 GB (14.90 GiB). Measured (libtpu 0.0.42.1): the sum 15.92
# GiB, the peak 15.545 GiB plus 29.5 MiB of code, 15.57 GiB of 15.75.
NEAR_FULL = train.TrainConfig(
    batch_size=4,
    seq_len=1024,
    embed=2048,
    heads=16,
    head_dim=128,
    kv_heads=8,
    mlp=8192,
    mlp_activation="swiglu",
    num_layers=56,
    dtype="bfloat16",
    vocab=32000,
)


# One large compile: about 2 CPU-minutes, 10-25 minutes of wall clock under nice on the loaded
# 2-core machine (2026-12-06).
@pytest.mark.timeout(3600)
def test_a_program_the_compiler_fits_passes_the_gate_at_its_peak() -> None:
    result, t = compiled("v5e:2x2", 1, NEAR_FULL)
    assert 3.6e9 < t.model.parameter_count() < 3.7e9
    memory = t.compiled.memory_analysis()
    summed = (
        memory.argument_size_in_bytes
        + memory.output_size_in_bytes
        + memory.temp_size_in_bytes
        + memory.generated_code_size_in_bytes
        - memory.alias_size_in_bytes
    )
    # The case of the issue: the sum is over the spec sheet's HBM, the compiler's peak within its.
    assert summed > hardware.TPU_HBM_BYTES["v5e"]  # 16e9 bytes
    peak = memory.peak_memory_in_bytes + memory.generated_code_size_in_bytes
    assert result.hbm_bytes_per_device == peak < summed
    assert result.hbm_capacity_bytes == hardware.TPU_COMPILER_HBM_BYTES["v5e"]
    assert result.fits, (peak / 2**30, result.hbm_capacity_bytes / 2**30)


@pytest.mark.timeout(3600)
def test_the_gate_refuses_the_same_model_just_over_the_compilers_hbm() -> None:
    """Twice the tokens per device: libtpu refuses it (15.91 GiB of 15.75 measured), and so does
    the gate, with the compiler's figure and words, 1% over its capacity."""
    result, _ = compiled("v5e:2x2", 1, dataclasses.replace(NEAR_FULL, seq_len=2048))
    assert not result.fits and "RESOURCE_EXHAUSTED" in result.compiler
    assert result.hbm_capacity_bytes == hardware.TPU_COMPILER_HBM_BYTES["v5e"]
    assert result.hbm_capacity_bytes < result.hbm_bytes_per_device
    assert result.hbm_bytes_per_device < 1.05 * result.hbm_capacity_bytes


@pytest.mark.parametrize("topology", ["v5e:2x4", "tpu7x:2x2x1"])
def test_the_dcn_advisors_traffic_is_the_tpu_programs(topology: str) -> None:
    """The operator's DCN advisor (docs/dcn-advisor.md) against the DCN sends of the TPU program:
    what one slice sends to the other per step, all its devices together."""
    from multislice_operator.planning import advisor
    from multislice_operator.tpu.parallelism import Parallelism as OperatorParallelism

    _, t = compiled(topology, 2)
    per_slice = t.mesh.devices.size // 2
    sent = (
        8 * per_slice * sum(x.total_bytes for x in tpu_compile.dcn_transfers(t.compiled.as_text()))
    )
    par = OperatorParallelism(1, 1, 1, dcn_data=2, dcn_fsdp=1, dcn_pipeline=1, dcn_tensor=1)
    told = advisor.dcn_traffic(par, compute_bits=16)
    assert [a.of for a in told] == [advisor.ALL]
    said = told[0].bits_per_parameter * t.model.parameter_count()
    # The norm scales are replicated over fsdp, so every device of a slice sends them: a few
    # thousand floats more than the advisor's one copy per parameter.
    norms = 32 * per_slice * (2 * t.model.layers + 1) * t.model.embed
    assert said <= sent <= said + norms + 8 * per_slice * 64


@pytest.mark.parametrize("reduce", ["float32", "bfloat16"])
def test_the_dcn_advisors_fsdp_traffic_is_the_tpu_programs(reduce: str) -> None:
    """FSDP across two slices: what one slice sends to the other per step, the TPU program's DCN
    sends against the advisor's bits per parameter for the blocks and for the embedding and
    output layers (docs/dcn-advisor.md)."""
    from multislice_operator.planning import advisor
    from multislice_operator.tpu.parallelism import Parallelism as OperatorParallelism

    cfg = dataclasses.replace(CFG, grad_reduce_dtype=reduce)
    top = tpu_compile.parse_topology("tpu7x:2x2x1")
    _, t = compiled("tpu7x:2x2x1", 2, cfg, Parallelism(ici_fsdp=top.chips, dcn_fsdp=2))
    per_slice = t.mesh.devices.size // 2
    sent = (
        8 * per_slice * sum(x.total_bytes for x in tpu_compile.dcn_transfers(t.compiled.as_text()))
    )
    par = OperatorParallelism(1, 1, 1, dcn_data=1, dcn_fsdp=2, dcn_pipeline=1, dcn_tensor=1)
    reduce_bits = 32 if reduce == "float32" else 16
    vocab = 2 * t.model.embed * t.model.padded_vocab
    count = {advisor.BLOCKS: t.model.parameter_count() - vocab, advisor.VOCAB: vocab}
    told = advisor.dcn_traffic(par, compute_bits=16, reduce_bits=reduce_bits)
    said = sum(a.bits_per_parameter * count[a.of] for a in told)
    # Within 5%: the norm scales (a few thousand floats) are reduced apart from the blocks.
    assert said * 0.95 <= sent <= said * 1.05, (sent / t.model.parameter_count(), said)


@pytest.mark.parametrize("reduce", ["float32", "bfloat16"])
def test_fsdp_over_dcn_gathers_in_bf16_and_reduces_in_the_gradient_dtype(reduce: str) -> None:
    """Settled on the TPU program (XLA:CPU widens bf16 collectives): under --dtype bfloat16 the
    weights cross the DCN gathered in bf16, their gradients reduce-scattered in
    --grad_reduce_dtype, as the DCN advisor counts them (docs/dcn-advisor.md)."""
    cfg = dataclasses.replace(CFG, grad_reduce_dtype=reduce)
    top = tpu_compile.parse_topology("tpu7x:2x2x1")
    _, t = compiled("tpu7x:2x2x1", 2, cfg, Parallelism(ici_fsdp=top.chips, dcn_fsdp=2))
    sent = tpu_compile.dcn_transfers(t.compiled.as_text())
    dtypes = {(x.kind, d) for x in sent for d, _ in x.arrays}
    want = "f32" if reduce == "float32" else "bf16"
    assert ("ALL_GATHER", "bf16") in dtypes and ("REDUCE_SCATTER", want) in dtypes, dtypes
    assert not {k for k, d in dtypes if k == "ALL_GATHER" and d != "bf16"}, dtypes
    assert not {k for k, d in dtypes if k == "REDUCE_SCATTER" and d != want}, dtypes


def test_the_layout_is_the_flags_over_the_jobs_environment_over_fsdp_and_data() -> None:
    from multislice_workload import cli

    args = cli.build_parser().parse_args(
        ["compile", "--topology", "v5e:4x4", "--ici_tensor_parallelism", "2"]
    )
    env = {"MULTISLICE_ICI_FSDP": "8", "MULTISLICE_ICI_TENSOR": "4", "MULTISLICE_DCN_DATA": "2"}
    assert tpu_compile.layout(args, env, 16, 2) == Parallelism(ici_fsdp=8, ici_tensor=2, dcn_data=2)
    assert tpu_compile.layout(args, {}, 16, 2) == Parallelism(ici_fsdp=16, ici_tensor=2, dcn_data=2)
    with pytest.raises(ConfigError, match="MULTISLICE_DCN_FSDP"):
        tpu_compile.layout(args, {"MULTISLICE_DCN_FSDP": "two"}, 16, 2)
    with pytest.raises(ConfigError, match="--topology"):
        tpu_compile.parse_topology("v9:4x4")
    assert tpu_compile.parse_topology("tpu7x:1x1x1").host_bounds == (1, 1, 1)
    assert tpu_compile.parse_topology("v5p:2x2x4").hosts == 4
