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
MIB = 2**20


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


class Placement:
    """How GKE places a multi-host slice's VMs (the node pool's ``placementPolicy``)."""

    # type COMPACT + tpuTopology: GKE makes the compact placement policy itself (v4-v6e).
    COMPACT = "compact"
    # policyName (a Compute Engine HIGH_THROUGHPUT workload policy with the accelerator
    # topology) + tpuTopology, no type: tpu7x (GKE "About Ironwood (TPU7x) in GKE").
    WORKLOAD_POLICY = "workload-policy"


@dataclass(frozen=True)
class Generation:
    """One TPU generation as Cloud TPU and GKE name it."""

    name: str  # v4, v5e, v5p, v6e, tpu7x
    prefix: str  # the accelerator-type prefix: v4, v5litepod, v5p, v6e, tpu7x
    cores_per_chip: int  # the number in the accelerator type counts cores for v4/v5p, chips else
    gke_accelerator: str  # cloud.google.com/gke-tpu-accelerator
    peak_bf16_flops: float  # per chip
    hbm_bytes: int  # per chip, as Cloud TPU's pages say
    # Per device: the HBM the TPU compiler (libtpu) lets one device's program use, what its
    # out-of-HBM refusals state ("available HBM (15.75G)"): the spec's less what libtpu reserves.
    # The workload's hardware.TPU_COMPILER_HBM_BYTES has the sources; tests check both.
    usable_hbm_bytes: int
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
    placement: str = Placement.COMPACT
    # JAX devices per chip: 1 where the two TensorCores of a v4/v5p chip run as one megacore;
    # 2 on tpu7x, whose two chiplets are two devices (Cloud TPU "TPU7x (Ironwood)", dual-chiplet
    # architecture).
    devices_per_chip: int = 1
    # Flex-start (Dynamic Workload Scheduler) node pools: the first GKE version that has them for
    # this generation, None where GKE has none (v4; GKE "About flex-start": "TPU v3 and v4 are
    # not supported"). GKE 1.33.0-gke.1712000 for TPUs.
    flex_start_min_gke: str | None = "1.33.0-gke.1712000"
    # The first GKE Standard version that runs the generation at all (None: every supported one).
    min_gke: str | None = None
    # Served by the Cloud TPU API (tpu.googleapis.com, acceleratorTypes); tpu7x is GKE/Compute
    # Engine only ("The Cloud TPU API is not supported on TPU7x and later TPU versions", Cloud
    # TPU "Create Cloud TPU VMs").
    cloud_tpu_api: bool = True
    # Compute Engine quota metrics GKE reports for on-demand and spot/flex-start chips of this
    # generation (regional; the 403 names them: resource "..."); see docs/provisioning.md.
    quota_metric: str = ""
    spot_quota_metric: str = ""
    # The topology of one reservation sub-block (None: the generation has none we know of). On
    # Ironwood a sub-block is a 4x4x4 cube of 16 tpu7x VMs, "the fundamental logical building
    # unit of Ironwood (TPU7x) capacity" (GKE "Configure TPUs with GKE dynamic slicing",
    # https://docs.cloud.google.com/kubernetes-engine/docs/how-to/use-gke-dynamic-slicing).
    sub_block_topology: str | None = None


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
            usable_hbm_bytes=32 * 1024 * MIB - 1283 * MIB,  # 30.75 GiB
            dcn_bits_per_chip=12.5 * GBIT,  # the seed: 50 Gbit/s per 4-chip host
            dims=3,
            topologies=generate_3d_topologies(64, nondecreasing=False),
            machine_types={4: "ct4p-hightpu-4t"},
            single_host_chips=(4,),
            flex_start_min_gke=None,
            quota_metric="TPU_V4_PODSLICE",  # UNCONFIRMED (the v5e naming pattern)
            spot_quota_metric="PREEMPTIBLE_TPU_V4_PODSLICE",  # UNCONFIRMED
        ),
        Generation(
            name="v5e",
            prefix="v5litepod",
            cores_per_chip=1,
            gke_accelerator="tpu-v5-lite-podslice",
            peak_bf16_flops=197e12,
            hbm_bytes=16 * 10**9,
            usable_hbm_bytes=16 * 1024 * MIB - 258 * MIB,  # 15.75 GiB
            dcn_bits_per_chip=25 * GBIT,  # 2 x 100 Gbit/s per 8-chip physical host
            dims=2,
            topologies=_2D_TOPOLOGIES,
            machine_types={1: "ct5lp-hightpu-1t", 4: "ct5lp-hightpu-4t", 8: "ct5lp-hightpu-8t"},
            single_host_chips=(1, 4),
            # `gcloud compute regions describe` lists both (public quota checks of v5e users).
            quota_metric="TPU_LITE_PODSLICE_V5",
            spot_quota_metric="PREEMPTIBLE_TPU_LITE_PODSLICE_V5",
        ),
        Generation(
            name="v5p",
            prefix="v5p",
            cores_per_chip=2,
            gke_accelerator="tpu-v5p-slice",
            peak_bf16_flops=459e12,
            hbm_bytes=95 * 2**30,
            usable_hbm_bytes=96 * 1024 * MIB - 263 * MIB,  # 95.74 GiB
            dcn_bits_per_chip=50 * GBIT,
            dims=3,
            topologies=generate_3d_topologies(140),
            machine_types={4: "ct5p-hightpu-4t"},
            single_host_chips=(4,),
            # compute.googleapis.com/tpu_v5p and /preemptible_tpu_v5p (console quota links).
            quota_metric="TPU_V5P",
            spot_quota_metric="PREEMPTIBLE_TPU_V5P",
        ),
        Generation(
            name="v6e",
            prefix="v6e",
            cores_per_chip=1,
            gke_accelerator="tpu-v6e-slice",
            peak_bf16_flops=918e12,
            hbm_bytes=32 * 10**9,
            usable_hbm_bytes=32256 * MIB - 260 * MIB,  # 31.25 GiB
            dcn_bits_per_chip=100 * GBIT,  # 4 x 200 Gbit/s per 8-chip physical host
            dims=2,
            topologies=_2D_TOPOLOGIES,
            machine_types={1: "ct6e-standard-1t", 4: "ct6e-standard-4t", 8: "ct6e-standard-8t"},
            single_host_chips=(1, 4),
            # Cloud Quotas only: on-demand chips count against the family quota
            # TPUS-PER-TPU-FAMILY-per-project-region (tpu_family=CT6E), spot and flex-start
            # against PREEMPTIBLE-TPU-V6E-per-project-region; there is no TPU_V6E metric.
            quota_metric="TPUS_PER_TPU_FAMILY",
            spot_quota_metric="PREEMPTIBLE_TPU_V6E",
        ),
        Generation(
            # Ironwood. xpk system_characteristics.py: prefix tpu7x, 2 TensorCores per chip,
            # gke_accelerator tpu7x, tpu7x-standard-4t over generate_tpu_topologies(max_cubes=144)
            # (A <= B <= C; 144 cubes = 9,216 chips, the TPU7x pod) and tpu7x-standard-1t for 1x1x1;
            # requires_workload_policy for multi-host slices. Cloud TPU "TPU7x (Ironwood)": 2,307
            # bf16 TFLOP/s, 192 GiB HBM and 100 Gbit/s DCN per chip; 4 chips, 2 NICs, 2 NUMA
            # nodes per VM (GKE "About Ironwood (TPU7x) in GKE").
            name="tpu7x",
            prefix="tpu7x",
            cores_per_chip=2,
            gke_accelerator="tpu7x",
            peak_bf16_flops=2307e12,
            hbm_bytes=192 * 2**30,
            usable_hbm_bytes=95 * 1024 * MIB - 260 * MIB,  # 94.75 GiB per TensorCore (device)
            dcn_bits_per_chip=100 * GBIT,
            dims=3,
            topologies=("1x1x1", *generate_3d_topologies(144)),
            machine_types={1: "tpu7x-standard-1t", 4: "tpu7x-standard-4t"},
            single_host_chips=(1, 4),
            placement=Placement.WORKLOAD_POLICY,
            devices_per_chip=2,
            # GKE "About Ironwood (TPU7x) in GKE": Standard 1.34.0-gke.2201000 and later.
            # Flex-start TPU7x pools: public GKE examples (cluster-toolkit gke-tpu-7x DWS
            # flex-start blueprint); not in GKE's flex-start zone list: UNCONFIRMED, allowed from
            # the TPU7x minimum.
            min_gke="1.34.0-gke.2201000",
            flex_start_min_gke="1.34.0-gke.2201000",
            cloud_tpu_api=False,
            # On-demand: the family quota, as for v6e (Cloud Quotas); spot: UNCONFIRMED name.
            quota_metric="TPUS_PER_TPU_FAMILY",
            spot_quota_metric="PREEMPTIBLE_TPU7X",
            sub_block_topology="4x4x4",
        ),
    )
}

ACCELERATOR_PATTERN = r"^(v4|v5litepod|v5p|v6e|tpu7x)-[0-9]+$"
_ACCELERATOR_RE = re.compile(r"^([a-z0-9]+)-([0-9]+)$")
# Names people type that mean one of ours.
_ALIASES = {
    "v5e": "v5litepod",
    "v5lite": "v5litepod",
    "v6": "v6e",
    "v5": "v5p",
    "v7x": "tpu7x",
    "v7": "tpu7x",
    "tpu7": "tpu7x",
    "ironwood": "tpu7x",
}


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
    def tensorcores(self) -> int:
        """TensorCores per slice: the number in v4/v5p/tpu7x names (2 per chip), chips else."""
        return self.chips * self.generation.cores_per_chip

    @property
    def workload_policy(self) -> bool:
        """Whether GKE places this slice with a workload policy (multi-host tpu7x)."""
        return self.multi_host and self.generation.placement == Placement.WORKLOAD_POLICY

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


_GKE_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:-gke\.(\d+))?")


def gke_version_key(version: str) -> tuple[int, int, int, int]:
    """1.34.0-gke.2201000 -> (1, 34, 0, 2201000), for comparing GKE versions; a version that
    does not parse sorts first (it is never taken to be new enough)."""
    match = _GKE_VERSION_RE.match(version.strip())
    if not match:
        return (0, 0, 0, 0)
    major, minor, patch, gke = match.groups()
    return (int(major), int(minor), int(patch), int(gke or 0))


def gke_at_least(version: str, minimum: str) -> bool:
    return gke_version_key(version) >= gke_version_key(minimum)
