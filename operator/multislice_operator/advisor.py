"""DCN advisor: will this layout be bound by the DCN, given what the shipped workload sends?

The seed's arithmetic (Cloud TPU Multislice overview, "when to use data parallelism"):
hardware intensity = chips per host x peak FLOP/s per chip / DCN bit/s per host;
backward-pass FLOPs per parameter = 4 x B, B the per-slice batch in tokens; a layout scales when
4 x B / (DCN bits per parameter per step) > hardware intensity.

The bits per parameter are those of the workload in this repository (workload/multislice_workload,
float32 parameters and gradients, layers rematerialized), per DCN axis:

- ``dcn.data``: one all-reduce of every gradient per step: 32 bits with two slices, up to 64 with
  more (the seed's figures).
- ``dcn.fsdp``: every weight is all-gathered twice per step (the forward and its recomputation in
  the backward) and its gradient reduce-scattered once: 3 x 32 x (n - 1) / n bits, 48 with two
  slices, up to 96 with more. With ``dcn.data`` as well, the all-reduce moves each slice's
  1 / dcn.fsdp share of the gradients.
- ``dcn.pipeline``: no weight or gradient of the staged layers crosses the DCN (the embedding and
  output layers run on every stage from the same inputs); activations do: each of the M + S - 1
  GPipe iterations moves one microbatch's activations across every stage boundary, 7 times
  (collective-permutes forward and backward, the finished microbatch's broadcast, the input
  gradient's reduction; counted in the compiled step). That traffic grows with tokens exactly as
  compute does, so the batch does not help: a stage hides it when
  6 x 12 x layers x d_model^2 FLOPs per token exceed intensity x 7 x 16 x d_model bits (bf16),
  i.e. layers per stage x d_model > intensity x 7 x 16 / 72.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from multislice_operator.catalog import SliceShape
from multislice_operator.parallelism import Parallelism

# The seed keeps a margin because the DCN can drop packets briefly: it asks for 350,000 tokens per
# slice with two slices where the bound is 176,000, i.e. about twice the minimum.
SAFETY_MARGIN = 2.0

VERDICT_OK = "ok"
VERDICT_DCN_BOUND = "dcn-bound"
VERDICT_UNKNOWN = "unknown"

GRADIENT_BITS = 32  # float32 gradients and weights in the shipped workload
FSDP_TRANSFERS = 3  # all-gather (forward), all-gather (recomputed forward), reduce-scatter
# Per GPipe iteration, transfers of one microbatch's activations between neighbouring stages, in
# the workload's compiled step (tests/workload/test_workload_model.py counts them).
PIPELINE_TRANSFERS = 7
ACTIVATION_BITS = 16  # bf16 activations on TPU
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
        return {
            "verdict": self.verdict,
            "hardwareIntensity": self.hardware_intensity,
            "bitsPerParameter": self.bits_per_parameter,
            "minTokensPerSlice": self.min_tokens_per_slice,
            "recommendedTokensPerSlice": self.recommended_tokens_per_slice,
            "tokensPerSlice": self.tokens_per_slice,
            "message": self.message,
            "traffic": self.traffic,
        }


def hardware_intensity(shape: SliceShape) -> float:
    """FLOPs a host can do per bit it can send over DCN (v4: 22,000)."""
    return shape.chips_per_host * shape.generation.peak_bf16_flops / shape.dcn_bits_per_host


def bits_per_parameter(gradient_groups: int) -> int:
    """Data parallelism: DCN bits per parameter per step, 32 for a pair of slices, 64 beyond."""
    if gradient_groups <= 1:
        return 0
    return 32 if gradient_groups == 2 else 64


def fsdp_bits_per_parameter(groups: int) -> int:
    """FSDP over DCN: two gathers and a reduce-scatter, (n - 1) / n each; 96 taken beyond two."""
    if groups <= 1:
        return 0
    return FSDP_TRANSFERS * GRADIENT_BITS // 2 if groups == 2 else FSDP_TRANSFERS * GRADIENT_BITS


def dcn_bits_per_parameter(par: Parallelism) -> float:
    """All per-parameter DCN traffic of one slice per step (data and FSDP axes)."""
    return bits_per_parameter(par.dcn_data) / par.dcn_fsdp + fsdp_bits_per_parameter(par.dcn_fsdp)


def min_tokens_per_slice(intensity: float, bits: float) -> int:
    """Smallest per-slice batch (tokens) where 4 x B / bits exceeds the hardware intensity."""
    return round(intensity * bits / 4)


def pipeline_min_layers_x_width(intensity: float) -> int:
    """Layers per stage x d_model above which a stage computes longer than its activations take
    to cross the DCN (the bubble, (S - 1) / (M + S - 1), not counted)."""
    return round(
        intensity * PIPELINE_TRANSFERS * ACTIVATION_BITS / (6 * LAYER_PARAMS_PER_WIDTH_SQUARED)
    )


def traffic(par: Parallelism, intensity: float) -> str:
    """What the shipped workload sends over DCN each step with this layout, in words."""
    parts = []
    if par.dcn_data > 1:
        parts.append(
            f"data x{par.dcn_data}: an all-reduce of every float32 gradient"
            + (f" (each slice's 1/{par.dcn_fsdp} share)" if par.dcn_fsdp > 1 else "")
        )
    if par.dcn_fsdp > 1:
        parts.append(
            f"fsdp x{par.dcn_fsdp}: every float32 weight all-gathered twice (forward and its "
            "recomputation) and its gradient reduce-scattered once"
        )
    if par.dcn_pipeline > 1:
        parts.append(
            f"pipeline x{par.dcn_pipeline}: no weights or gradients; activations, "
            f"{PIPELINE_TRANSFERS} transfers of one microbatch per GPipe iteration across each "
            f"stage boundary, hidden when layers per stage x d_model > "
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
        f"pipeline only across slices: no gradient or weight traffic, but activations cross "
        f"every stage boundary ({PIPELINE_TRANSFERS} microbatch transfers per GPipe iteration); "
        f"hidden when layers per stage x d_model > {pipeline_min_layers_x_width(intensity):,}, "
        f"whatever the batch"
    )
