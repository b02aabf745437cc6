"""The Cloud TPU catalog: generations, accelerator-type parsing, topologies, GKE machine types.

Pure data and arithmetic, no I/O. Everything else asks this module about hardware; nothing here
knows about Kubernetes objects.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

GBIT = 1e9


def generate_3d_topologies(max_cubes: int, nondecreasing: bool = True) -> tuple[str, ...]:
    """Every v4/v5p slice shape GKE and Cloud TPU accept, as xpk generates them.

    Source: xpk ``src/xpk/core/system_characteristics.py`` ``generate_tpu_topologies``: the four
    sub-cube shapes, then every AxBxC with A, B, C multiples of 4 up to 256 and at most
    ``max_cubes`` 4x4x4 cubes (v4: 64 cubes, any axis order; v5p: 140 cubes, A <= B <= C).
    """
    shapes = ["2x2x1", "2x2x2", "2x2x4", "2x4x4"]
    for x in range(4, 257, 4):
        for y in range(x if nondecreasing else 4, 257, 4):
            if (x // 4) * (y // 4) > max_cubes:
                break
            for z in range(y if nondecreasing else 4, 257, 4):
                if (x // 4) * (y // 4) * (z // 4) > max_cubes:
                    break
                shapes.append(f"{x}x{y}x{z}")
    return tuple(shapes)


@dataclass(frozen=True)
class Generation:
    """One TPU generation as Cloud TPU and GKE name it."""

    name: str  # v4, v5e, v5p, v6e
    prefix: str  # the accelerator-type prefix: v4, v5litepod, v5p, v6e
    cores_per_chip: int  # the number in the accelerator type counts cores for v4/v5p, chips else
    gke_accelerator: str  # cloud.google.com/gke-tpu-accelerator
    peak_bf16_flops: float  # per chip
    hbm_bytes: int  # per chip
    dcn_bits_per_chip: float  # DCN bandwidth per chip, bit/s
    dims: int  # topology dimensions: 3 for v4/v5p, 2 for v5e/v6e
    topologies: tuple[str, ...]  # valid slice shapes
    # Every GKE machine type of the generation, by chips per VM (the simulator accepts them all).
    machine_types: dict[int, str]
    # Slice sizes (chips) served by one VM of that many chips; every other size is built from
    # multi_host_chips_per_vm VMs, one Kubernetes node each. v5e/v6e 2x4 is deliberately not
    # single-host (the 8t VM): xpk runs it as two 4t VMs so that it can be multisliced.
    single_host_chips: tuple[int, ...]
    multi_host_chips_per_vm: int = 4


_2D_TOPOLOGIES = ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")

GENERATIONS: dict[str, Generation] = {
    g.prefix: g
    for g in (
        Generation(
            name="v4",
            prefix="v4",
            cores_per_chip=2,
            gke_accelerator="tpu-v4-podslice",
            peak_bf16_flops=275e12,
            hbm_bytes=32 * 2**30,
            dcn_bits_per_chip=12.5 * GBIT,  # the seed: 50 Gbit/s per 4-chip host
            dims=3,
            topologies=generate_3d_topologies(64, nondecreasing=False),
            machine_types={4: "ct4p-hightpu-4t"},
            single_host_chips=(4,),
        ),
        Generation(
            name="v5e",
            prefix="v5litepod",
            cores_per_chip=1,
            gke_accelerator="tpu-v5-lite-podslice",
            peak_bf16_flops=197e12,
            hbm_bytes=16 * 10**9,
            dcn_bits_per_chip=25 * GBIT,  # 2 x 100 Gbit/s per 8-chip physical host
            dims=2,
            topologies=_2D_TOPOLOGIES,
            machine_types={1: "ct5lp-hightpu-1t", 4: "ct5lp-hightpu-4t", 8: "ct5lp-hightpu-8t"},
            single_host_chips=(1, 4),
        ),
        Generation(
            name="v5p",
            prefix="v5p",
            cores_per_chip=2,
            gke_accelerator="tpu-v5p-slice",
            peak_bf16_flops=459e12,
            hbm_bytes=95 * 2**30,
            dcn_bits_per_chip=50 * GBIT,
            dims=3,
            topologies=generate_3d_topologies(140),
            machine_types={4: "ct5p-hightpu-4t"},
            single_host_chips=(4,),
        ),
        Generation(
            name="v6e",
            prefix="v6e",
            cores_per_chip=1,
            gke_accelerator="tpu-v6e-slice",
            peak_bf16_flops=918e12,
            hbm_bytes=32 * 10**9,
            dcn_bits_per_chip=100 * GBIT,  # 4 x 200 Gbit/s per 8-chip physical host
            dims=2,
            topologies=_2D_TOPOLOGIES,
            machine_types={1: "ct6e-standard-1t", 4: "ct6e-standard-4t", 8: "ct6e-standard-8t"},
            single_host_chips=(1, 4),
        ),
    )
}

ACCELERATOR_PATTERN = r"^(v4|v5litepod|v5p|v6e)-[0-9]+$"
_ACCELERATOR_RE = re.compile(r"^([a-z0-9]+)-([0-9]+)$")
# Names people type that mean one of ours.
_ALIASES = {"v5e": "v5litepod", "v5lite": "v5litepod", "v6": "v6e", "v5": "v5p"}


class CatalogError(ValueError):
    """A hardware name or shape that does not exist; the message says what would."""


class TopologyError(CatalogError):
    """A topology that does not fit the accelerator type."""


def topology_chips(topology: str) -> int:
    return math.prod(int(d) for d in topology.split("x"))


def known_families() -> str:
    return ", ".join(f"{g.prefix}-N ({g.name})" for g in GENERATIONS.values())


@dataclass(frozen=True)
class SliceShape:
    """What one slice of an accelerator type is, in chips, hosts and GKE terms."""

    accelerator: str
    generation: Generation
    topology: str
    chips: int
    chips_per_host: int
    hosts: int
    machine_type: str

    @property
    def multi_host(self) -> bool:
        return self.hosts > 1

    @property
    def peak_flops_per_slice(self) -> float:
        return self.chips * self.generation.peak_bf16_flops

    @property
    def dcn_bits_per_host(self) -> float:
        return self.chips_per_host * self.generation.dcn_bits_per_chip


def parse_accelerator(accelerator: str) -> tuple[Generation, int]:
    """Split `v5litepod-16` into its generation and chip count; raise CatalogError otherwise."""
    match = _ACCELERATOR_RE.match(accelerator.strip().lower())
    if not match:
        raise CatalogError(
            f"{accelerator!r} is not a Cloud TPU accelerator type; "
            f"use one of the families {known_families()}, e.g. v5litepod-16"
        )
    prefix, number = match.group(1), int(match.group(2))
    if prefix not in GENERATIONS:
        hint = ""
        if prefix in _ALIASES:
            hint = f"; did you mean {_ALIASES[prefix]}-{number}?"
        raise CatalogError(
            f"unknown TPU family {prefix!r} in {accelerator!r}{hint} "
            f"(known families: {known_families()})"
        )
    gen = GENERATIONS[prefix]
    if number % gen.cores_per_chip:
        raise CatalogError(
            f"{accelerator!r}: the number in a {gen.name} accelerator type counts TensorCores "
            f"({gen.cores_per_chip} per chip), so it must be even; e.g. {prefix}-8"
        )
    chips = number // gen.cores_per_chip
    if not topologies_for(gen, chips):
        raise CatalogError(
            f"{accelerator!r} is not a {gen.name} slice size; valid: {_describe_sizes(gen, number)}"
        )
    return gen, chips


def _describe_sizes(gen: Generation, near: int) -> str:
    """The first sizes, and the two nearest ``near`` when the list is long (v4/v5p have ~100)."""
    sizes = valid_sizes(gen)
    names = [f"{gen.prefix}-{n}" for n in sizes]
    if len(names) <= 10:
        return ", ".join(names)
    below = [n for n in sizes if n < near][-1:]
    above = [n for n in sizes if n > near][:1]
    nearest = ", ".join(f"{gen.prefix}-{n}" for n in below + above)
    return f"{', '.join(names[:6])}, ... {names[-1]} ({len(names)} sizes; nearest: {nearest})"


def _by_chips(gen: Generation) -> dict[int, tuple[str, ...]]:
    return _shapes_by_chips(gen.prefix)


@functools.cache
def _shapes_by_chips(prefix: str) -> dict[int, tuple[str, ...]]:
    by: dict[int, list[str]] = {}
    for t in GENERATIONS[prefix].topologies:
        by.setdefault(topology_chips(t), []).append(t)
    # The default shape first: the most cube-like (smallest longest side, then smallest sum of
    # sides). This reproduces every default xpk lists for v4 and v5p (e.g. v5p-384 -> 4x4x12).
    return {c: tuple(sorted(ts, key=_cubeness)) for c, ts in by.items()}


def _cubeness(topology: str) -> tuple[int, int, tuple[int, ...]]:
    dims = tuple(int(d) for d in topology.split("x"))
    return max(dims), sum(dims), dims


def topologies_for(gen: Generation, chips: int) -> list[str]:
    """Valid shapes of ``chips`` chips, the default one first."""
    return list(_by_chips(gen).get(chips, ()))


def valid_sizes(gen: Generation) -> list[int]:
    """Accelerator-type numbers that exist for a generation, smallest first."""
    return sorted(c * gen.cores_per_chip for c in _by_chips(gen))


def slice_shape(accelerator: str, topology: str | None = None) -> SliceShape:
    """Resolve an accelerator type (and optional topology) into the shape of one slice."""
    gen, chips = parse_accelerator(accelerator)
    valid = topologies_for(gen, chips)
    if topology is None:
        topology = valid[0]
    elif topology not in valid:
        shown = ", ".join(valid[:8]) + (f", ... ({len(valid)} shapes)" if len(valid) > 8 else "")
        raise TopologyError(
            f"topology {topology!r} is not valid for {accelerator} ({chips} chips); valid: {shown}"
        )
    chips_per_host = _chips_per_host(gen, chips)
    return SliceShape(
        accelerator=accelerator,
        generation=gen,
        topology=topology,
        chips=chips,
        chips_per_host=chips_per_host,
        hosts=chips // chips_per_host,
        machine_type=gen.machine_types[chips_per_host],
    )


def smallest_multi_host(gen: Generation) -> SliceShape:
    """The smallest slice of a generation made of several VMs (what Multislice needs)."""
    for size in valid_sizes(gen):
        shape = slice_shape(f"{gen.prefix}-{size}")
        if shape.multi_host:
            return shape
    raise AssertionError(f"{gen.name} has no multi-host shape")  # pragma: no cover


def _chips_per_host(gen: Generation, chips: int) -> int:
    # Single-host shapes use the VM that holds the whole slice (v5e/v6e 1t and 4t, v4/v5p 4t);
    # anything larger is built from the generation's multi-host VM, one Kubernetes node each.
    if chips in gen.single_host_chips:
        return chips
    return gen.multi_host_chips_per_vm
