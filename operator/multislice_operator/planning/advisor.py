"""DCN advisor: will this layout be bound by the DCN, given what the shipped workload sends?

The seed's arithmetic (Cloud TPU Multislice overview, "when to use data parallelism"):
hardware intensity = chips per host x peak FLOP/s per chip / DCN bit/s per host;
backward-pass FLOPs per parameter = 4 x B, B the per-slice batch in tokens; a layout scales when
4 x B / (DCN bits per parameter per step) > hardware intensity.

The bits per parameter are those of the workload in this repository (workload/multislice_workload:
float32 parameters and gradients, bf16 matmuls on TPU, layers rematerialized), per DCN axis, in
the ring model (an all-reduce over n moves 2 (n - 1) / n of the array per participant, a gather
or a reduce-scatter (n - 1) / n). `dcn_traffic` gives them exactly; they match the bytes of the
workload's compiled step (tests/workload/test_workload_traffic.py parses its HLO):

- ``dcn.data``: one all-reduce of every float32 gradient per step: 2 x 32 x (n - 1) / n bits, 32
  with two slices, up to 64 with more (the seed's figures, which the verdict uses).
- ``dcn.fsdp``: every weight is all-gathered in the compute dtype (bf16) twice per step (the
  forward and its recomputation in the backward) and its gradient reduce-scattered once, in the
  gradient-reduction dtype (the workload's ``--grad_reduce_dtype``, float32 by default, as
  MaxText's ``grad_dtype``; the TPU program's DCN reduce-scatters are f32, its gathers bf16:
  tests/workload/test_tpu_compile.py): (2 x 16 + 32) x (n - 1) / n bits, 32 with two slices, up
  to 64 with more. With ``dcn.data`` as well, the all-reduce moves each slice's 1 / dcn.fsdp
  share of the gradients.
- ``dcn.pipeline``: no weight or gradient of the staged layers crosses the DCN. Outside them the
  stages split the batch (each embeds and scores its own rows), so the embedding and output
  layers are data-parallel over the stages: their float32 gradients are all-reduced over them,
  2 x 32 x (S - 1) / S bits per parameter of those layers. Activations cross too: each of the
  M + S - 1 GPipe iterations moves one microbatch's activations across every stage boundary 4
  times (2 collective-permutes forward: the pipeline's shift and the input/output rotation, as
  MaxText's; 2 backward). That traffic grows with tokens exactly as compute does, so the batch
  does not help: a stage hides it when 6 x 12 x layers x d_model^2 FLOPs per token exceed
  intensity x 4 x 16 x d_model bits (bf16), i.e. layers per stage x d_model > intensity x 4 x
  16 / 72.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from multislice_operator.common.records import as_camel
from multislice_operator.tpu.catalog import SliceShape
from multislice_operator.tpu.parallelism import Parallelism

# The seed keeps a margin because the DCN can drop packets briefly: it asks for 350,000 tokens per
# slice with two slices where the bound is 176,000, i.e. about twice the minimum.
SAFETY_MARGIN = 2.0

VERDICT_OK = "ok"
VERDICT_DCN_BOUND = "dcn-bound"
VERDICT_UNKNOWN = "unknown"

GRADIENT_BITS = 32  # float32 gradients, all-reduced and reduce-scattered as float32 (default)
COMPUTE_BITS = 16  # bf16 matmuls on TPU: weights are gathered in bf16
FSDP_GATHERS = 2  # all-gather (forward), all-gather (recomputed forward); then one reduce-scatter
# Per GPipe iteration, transfers of one microbatch's activations between neighbouring stages, in
# the workload's compiled step (tests/workload/test_workload_traffic.py counts them).
PIPELINE_TRANSFERS = 4
ACTIVATION_BITS = COMPUTE_BITS
LAYER_PARAMS_PER_WIDTH_SQUARED = 12  # 4 d^2 attention + 8 d^2 MLP (mlp = 4 x d_model)


@dataclass(frozen=True)
class DcnAdvice:
    verdict: str  # ok | dcn-bound | unknown
    hardware_intensity: float  # FLOPs per DCN bit
    bits_per_parameter: float  # DCN bits per parameter per step (0: no DCN gradient traffic)
    min_tokens_per_slice: int
    recommended_tokens_per_slice: int  # with the seed's safety margin
    tokens_per_slice: int | None
    message: str
    traffic: str = ""  # what the workload sends over DCN with this layout

    def as_dict(self) -> dict[str, object]:
        return as_camel(self)


def hardware_intensity(shape: SliceShape) -> float:
    """FLOPs a host can do per bit it can send over DCN (v4: 22,000)."""
    return shape.chips_per_host * shape.generation.peak_bf16_flops / shape.dcn_bits_per_host


def bits_per_parameter(gradient_groups: int) -> int:
    """Data parallelism: DCN bits per parameter per step, 32 for a pair of slices, 64 beyond."""
    if gradient_groups <= 1:
        return 0
    return 32 if gradient_groups == 2 else 64


def fsdp_bits_per_parameter(
    groups: int, compute_bits: int = COMPUTE_BITS, reduce_bits: int = GRADIENT_BITS
) -> int:
    """FSDP over DCN: two gathers in the compute dtype and a reduce-scatter in the gradient-
    reduction dtype, (n - 1) / n each; the seed's rounding: 1/2 with two slices, 1 beyond (64
    bits on TPU)."""
    if groups <= 1:
        return 0
    full = FSDP_GATHERS * compute_bits + reduce_bits
    return full // 2 if groups == 2 else full


def dcn_bits_per_parameter(par: Parallelism) -> float:
    """All per-parameter DCN traffic of one slice per step (data and FSDP axes), rounded up as
    the seed does beyond two slices: what the verdict uses."""
    return bits_per_parameter(par.dcn_data) / par.dcn_fsdp + fsdp_bits_per_parameter(par.dcn_fsdp)


@dataclass(frozen=True)
class AxisTraffic:
    """What one DCN axis carries per step, exactly (ring model), in bits per parameter of the
    group `of` (the whole model's parameters of that group, per slice)."""

    axis: str  # data | fsdp | pipeline
    what: str
    bits_per_parameter: float
    of: str  # ALL | BLOCKS | VOCAB


ALL = "all parameters"
BLOCKS = "the blocks' weights"  # the staged layers under pipeline parallelism
VOCAB = "the embedding and output layers"


def _ring(n: int, all_reduce: bool) -> float:
    return (2.0 if all_reduce else 1.0) * (n - 1) / n


def dcn_traffic(
    par: Parallelism,
    compute_bits: int = COMPUTE_BITS,
    remat: bool = True,
    reduce_bits: int = GRADIENT_BITS,
) -> list[AxisTraffic]:
    """Each DCN axis's traffic per step as the workload's compiled step moves it."""
    out = []
    stages = par.dcn_pipeline  # a slice holds 1/S of the blocks
    if par.dcn_data > 1:
        share = f" (each slice's 1/{par.dcn_fsdp} share)" if par.dcn_fsdp > 1 else ""
        bits = GRADIENT_BITS * _ring(par.dcn_data, True) / par.dcn_fsdp
        what = f"an all-reduce of every float32 gradient{share}"
        out.append(
            AxisTraffic("data", what, bits / stages, BLOCKS)
            if stages > 1
            else AxisTraffic("data", what, bits, ALL)
        )
    if par.dcn_fsdp > 1:
        gather = compute_bits * _ring(par.dcn_fsdp, False)
        scatter = reduce_bits * _ring(par.dcn_fsdp, False)
        # Blocks: gathered in the forward and in its recomputation, except under the pipeline,
        # which gathers a stage's weights once per step; the embedding and output layer once.
        twice = remat and stages == 1
        gathered = "twice (forward and its recomputation)" if twice else "once"
        blocks = (
            f"every block weight all-gathered {gathered} in {compute_bits}-bit floats and its "
            f"gradient reduce-scattered once in {reduce_bits}-bit floats"
        )
        out.append(
            AxisTraffic("fsdp", blocks, ((2 if twice else 1) * gather + scatter) / stages, BLOCKS)
        )
        vocab = "the embedding and output layers gathered and reduce-scattered once"
        out.append(AxisTraffic("fsdp", vocab, gather + scatter, VOCAB))
    if stages > 1:
        out.append(
            AxisTraffic(
                "pipeline",
                "the stages split the batch outside the staged layers: an all-reduce of the "
                "embedding and output layers' float32 gradients",
                GRADIENT_BITS * _ring(stages * par.dcn_data, True) / par.dcn_fsdp,
                VOCAB,
            )
        )
    return out


def min_tokens_per_slice(intensity: float, bits: float) -> int:
    """Smallest per-slice batch (tokens) where 4 x B / bits exceeds the hardware intensity."""
    return round(intensity * bits / 4)


def pipeline_min_layers_x_width(intensity: float) -> int:
    """Layers per stage x d_model above which a stage computes longer than its activations take
    to cross the DCN (the bubble, (S - 1) / (M + S - 1), not counted; nor the embedding and
    output layers' gradients, which are data parallelism over the stages)."""
    return round(
        intensity * PIPELINE_TRANSFERS * ACTIVATION_BITS / (6 * LAYER_PARAMS_PER_WIDTH_SQUARED)
    )


def traffic(par: Parallelism, intensity: float) -> str:
    """What the shipped workload sends over DCN each step with this layout, in words, with the
    exact bits per parameter of `dcn_traffic`."""
    sizes = {"data": par.dcn_data, "fsdp": par.dcn_fsdp, "pipeline": par.dcn_pipeline}
    parts: list[str] = []
    for t in dcn_traffic(par):
        figure = f"{t.what}, {t.bits_per_parameter:g} bits per parameter"
        figure += "" if t.of == ALL else f" of {t.of}"
        if parts and parts[-1].startswith(f"{t.axis} x"):
            parts[-1] += f", {figure}"
        else:
            parts.append(f"{t.axis} x{sizes[t.axis]}: {figure}")
    if par.dcn_pipeline > 1:
        parts[-1] += (
            f"; activations, {PIPELINE_TRANSFERS} transfers of one microbatch per GPipe "
            f"iteration across each stage boundary, hidden when layers per stage x d_model > "
            f"{pipeline_min_layers_x_width(intensity):,}"
        )
    return "; ".join(parts) or "nothing: one slice, or no DCN parallelism"


def advise(
    shape: SliceShape, slices: int, par: Parallelism, global_batch_tokens: int | None
) -> DcnAdvice:
    intensity = hardware_intensity(shape)
    groups = par.dcn_data * par.dcn_fsdp  # slices that exchange gradients or weights over DCN
    bits = dcn_bits_per_parameter(par)
    minimum = min_tokens_per_slice(intensity, bits)
    recommended = round(minimum * SAFETY_MARGIN)
    common: dict[str, Any] = {
        "hardware_intensity": intensity,
        "bits_per_parameter": bits,
        "min_tokens_per_slice": minimum,
        "recommended_tokens_per_slice": recommended,
        "traffic": traffic(par, intensity) if slices > 1 else "nothing: one slice",
    }
    if slices == 1 or groups == 1:
        why = "one slice: no DCN traffic" if slices == 1 else _pipeline_only(intensity)
        tokens = global_batch_tokens // max(groups, 1) if global_batch_tokens else None
        return DcnAdvice(VERDICT_OK, tokens_per_slice=tokens, message=why, **common)
    if not global_batch_tokens:
        return DcnAdvice(
            VERDICT_UNKNOWN,
            tokens_per_slice=None,
            message=(
                f"set spec.training.globalBatchTokens to check; data/FSDP over DCN needs at least "
                f"{minimum:,} tokens per slice ({recommended:,} with the safety margin)"
            ),
            **common,
        )
    tokens = global_batch_tokens // groups
    if tokens <= minimum:
        message = (
            f"{tokens:,} tokens per slice is below the {minimum:,} needed to hide the DCN "
            f"traffic ({bits:g} bits/parameter, {intensity:,.0f} FLOPs/bit): raise "
            f"globalBatchTokens to at least {minimum * groups:,} "
            f"({recommended * groups:,} with margin) or use fewer, larger slices"
        )
        return DcnAdvice(VERDICT_DCN_BOUND, tokens_per_slice=tokens, message=message, **common)
    margin_note = (
        ""
        if tokens >= recommended
        else (f"; below the recommended {recommended:,} (the seed's margin for DCN packet loss)")
    )
    message = f"{tokens:,} tokens per slice exceeds the DCN bound of {minimum:,}{margin_note}"
    return DcnAdvice(VERDICT_OK, tokens_per_slice=tokens, message=message, **common)


def _pipeline_only(intensity: float) -> str:
    return (
        f"pipeline only across slices: no gradient or weight traffic for the staged layers (the "
        f"embedding and output layers' gradients are all-reduced over the stages), but "
        f"activations cross every stage boundary ({PIPELINE_TRANSFERS} microbatch transfers per "
        f"GPipe iteration); hidden when layers per stage x d_model > "
        f"{pipeline_min_layers_x_width(intensity):,}, whatever the batch"
    )
