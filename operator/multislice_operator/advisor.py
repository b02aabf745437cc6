"""DCN advisor: will data or FSDP parallelism across slices be bound by the DCN?

The seed's arithmetic (Cloud TPU Multislice overview, "when to use data parallelism"):
hardware intensity = chips per host x peak FLOP/s per chip / DCN bit/s per host;
DCN traffic per parameter per step = 32 bits with two slices, up to 64 with more;
backward-pass FLOPs per parameter = 4 x B, B the per-slice batch in tokens.
Data/FSDP parallelism over DCN scales when 4 x B / bits > hardware intensity.
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


@dataclass(frozen=True)
class DcnAdvice:
    verdict: str  # ok | dcn-bound | unknown
    hardware_intensity: float  # FLOPs per DCN bit
    bits_per_parameter: int  # DCN bits per parameter per step (0: no DCN gradient traffic)
    min_tokens_per_slice: int
    recommended_tokens_per_slice: int  # with the seed's safety margin
    tokens_per_slice: int | None
    message: str

    def as_dict(self) -> dict[str, object]:
        return {
            "verdict": self.verdict,
            "hardwareIntensity": self.hardware_intensity,
            "bitsPerParameter": self.bits_per_parameter,
            "minTokensPerSlice": self.min_tokens_per_slice,
            "recommendedTokensPerSlice": self.recommended_tokens_per_slice,
            "tokensPerSlice": self.tokens_per_slice,
            "message": self.message,
        }


def hardware_intensity(shape: SliceShape) -> float:
    """FLOPs a host can do per bit it can send over DCN (v4: 22,000)."""
    return shape.chips_per_host * shape.generation.peak_bf16_flops / shape.dcn_bits_per_host


def bits_per_parameter(gradient_groups: int) -> int:
    """DCN bits per parameter per step: 32 for a pair of slices, 64 beyond (full permutation)."""
    if gradient_groups <= 1:
        return 0
    return 32 if gradient_groups == 2 else 64


def min_tokens_per_slice(intensity: float, bits: int) -> int:
    """Smallest per-slice batch (tokens) where 4 x B / bits exceeds the hardware intensity."""
    return round(intensity * bits / 4)


def advise(
    shape: SliceShape, slices: int, par: Parallelism, global_batch_tokens: int | None
) -> DcnAdvice:
    intensity = hardware_intensity(shape)
    groups = par.dcn_data * par.dcn_fsdp  # slices that exchange gradients or weights over DCN
    bits = bits_per_parameter(groups)
    minimum = min_tokens_per_slice(intensity, bits)
    recommended = round(minimum * SAFETY_MARGIN)
    common: dict[str, Any] = {
        "hardware_intensity": intensity,
        "bits_per_parameter": bits,
        "min_tokens_per_slice": minimum,
        "recommended_tokens_per_slice": recommended,
    }
    if slices == 1 or groups == 1:
        why = (
            "one slice: no DCN traffic"
            if slices == 1
            else (
                "no data or FSDP parallelism over DCN (pipeline only): no per-parameter DCN traffic"
            )
        )
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
            f"all-reduce ({bits} bits/parameter, {intensity:,.0f} FLOPs/bit): raise "
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
