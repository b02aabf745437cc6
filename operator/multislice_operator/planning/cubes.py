"""Reservation sub-blocks and GKE dynamic slicing (Ironwood 4x4x4 cubes), as the plan sees them.

What a sub-block can hold, judged before anything is created; which Slice topologies GKE forms;
the names of the `Slice` objects a dynamic-slicing job makes. Pure.

Sources (every limit here carries one):
- A sub-block is one 4x4x4 cube of 16 tpu7x VMs, and in All Capacity mode one node pool is one
  sub-block: GKE "Configure TPUs with GKE dynamic slicing",
  https://docs.cloud.google.com/kubernetes-engine/docs/how-to/use-gke-dynamic-slicing
- Super-slicing (topologies of whole cubes, 4i x 4j x 4k) from GKE 1.35.2-gke.1842000; sub-slicing
  (2x2x1, 2x2x2, 2x2x4, 2x4x4 inside one cube) from 1.36.0-gke.3712000: the same page, requirements.
- Slice names: at most 49 characters (the controller appends '-' and an 8-character cluster hash
  to Compute Engine names of 63 at most), ^[a-z]([-a-z0-9]*[a-z0-9])?$: GKE "Slice" CRD reference,
  https://docs.cloud.google.com/kubernetes-engine/docs/reference/crds/slice (one revision of the
  page says 54; xpk's slice controller, slice-main slice/internal/core/slice.go
  maxSliceNameLength, keeps 49: the stricter is used).
"""

from __future__ import annotations

import re

from multislice_operator.api.models import CubeSource, MultisliceJobSpec
from multislice_operator.common.errors import FieldError
from multislice_operator.tpu import catalog

SUB_BLOCK_DOC = (
    "https://docs.cloud.google.com/kubernetes-engine/docs/how-to/use-gke-dynamic-slicing"
)
SUB_SLICING_MIN_GKE = "1.36.0-gke.3712000"
SUB_SLICE_TOPOLOGIES = ("2x2x1", "2x2x2", "2x2x4", "2x4x4")
_SUB_BLOCK_RE = re.compile(
    r"^(?P<block>.+/reservationBlocks/[^/]+)/reservationSubBlocks/(?P<sub>[^/]+)$"
)
BLOCKS = "/reservationBlocks/"
# A Slice's cubes share one reservation block: GKE fails a Slice whose partitions are not "part
# of the same reservation block" (create-dynamic-slices), xpk resolves a reservation or block to
# its sub-blocks before it creates a super-slicing pool (src/xpk/core/capacity.py,
# force_sub_block_targeting), and its slice controller's webhook requires every pod of a slice
# in one cloud.google.com/gce-topology-block (slice-main slice/internal/webhooks/defaults.go).
SAME_BLOCK_DOC = "https://docs.cloud.google.com/kubernetes-engine/docs/how-to/create-dynamic-slices"

RESERVATION = "spec.capacity.reservation"
MODE = "DynamicSlicing"  # its spec.provisioning.mode (plugins/dynamic.py registers it)


def sub_block(reservation: str | None) -> tuple[str, str] | None:
    """(the block's path, the sub-block's name) of a reservation aimed at a sub-block, else None."""
    m = _SUB_BLOCK_RE.match(reservation or "")
    return (m["block"], m["sub"]) if m else None


def cube_shape(gen: catalog.Generation) -> catalog.SliceShape | None:
    """One sub-block as a slice shape (tpu7x: 4x4x4, 64 chips, 16 VMs); None: no sub-blocks."""
    if gen.sub_block_topology is None:
        return None
    chips = catalog.topology_chips(gen.sub_block_topology)
    return catalog.slice_shape(f"{gen.prefix}-{chips * gen.cores_per_chip}", gen.sub_block_topology)


def cubes_per_slice(shape: catalog.SliceShape) -> int:
    """Whole cubes one slice of this shape is stitched from (super-slicing); 0: not whole cubes."""
    cube = cube_shape(shape.generation)
    if (
        cube is None
        or shape.chips % cube.chips
        or any(int(d) % 4 for d in shape.topology.split("x"))
    ):
        return 0
    return shape.chips // cube.chips


def cube_policy_name(cube: catalog.SliceShape) -> str:
    """The workload policy every cube pool is placed with: HIGH_THROUGHPUT, the cube's topology,
    accelerator topology mode PROVISION_ONLY (VMs without ICI links until a Slice forms them);
    apart from a whole 4x4x4 slice's policy, which forms its links at once."""
    return f"msj-{cube.generation.prefix}-{cube.topology}-cubes"


def slice_names(job_key: str, index: int) -> tuple[str, str]:
    """The two names slice `index`'s `Slice` takes in turn. Slices are cluster-scoped (named by
    the job's key) and their spec is immutable: a slice re-formed on other cubes is a new Slice,
    created under the other name while the old one is still going away. Both are known from the
    plan, so the JobSet's pods can select exactly the job's Slices."""
    return f"msj-{job_key}-{index}a", f"msj-{job_key}-{index}b"


def all_slice_names(job_key: str, slices: int) -> list[str]:
    return [n for i in range(slices) for n in slice_names(job_key, i)]


# ---------------------------------------------------------------- what a sub-block can hold


def sub_block_errors(spec: MultisliceJobSpec, shape: catalog.SliceShape) -> list[FieldError]:
    """A job aimed at one sub-block that the sub-block cannot hold: a slice larger than its cube,
    or more node pools (Managed) or cubes (DynamicSlicing) than it has room for."""
    aimed = sub_block(spec.capacity.reservation)
    cube = cube_shape(shape.generation)
    if aimed is None or cube is None:
        return []
    block, sub = aimed
    where = (
        f"aims at sub-block {sub}, one {cube.topology} cube ({cube.hosts} VMs, {cube.chips} "
        f"chips; {SUB_BLOCK_DOC})"
    )
    if shape.chips > cube.chips:
        need = -(-shape.chips // cube.chips)
        return [
            FieldError(
                RESERVATION,
                f"{where}, and one {shape.accelerator} slice ({shape.topology}, {shape.hosts} "
                f"VMs) needs {need} cubes: it can never provision there; aim at the block "
                f"({block}) with provisioning.mode DynamicSlicing, or use slices of at most "
                f"{cube.topology}",
            )
        ]
    units, what = _demand(spec, shape, cube)
    total = units * (cube.chips if _dynamic(spec) else shape.chips)
    if total <= cube.chips:
        return []
    return [
        FieldError(
            RESERVATION,
            f"{where}, and the job's {units} {what} need {total} chips: the ones past the "
            f"first that fit can never provision; aim at the block ({block}), or lower "
            "spec.slices or spec.spares",
        )
    ]


def _dynamic(spec: MultisliceJobSpec) -> bool:
    return spec.provisioning.mode == MODE


def _demand(spec: MultisliceJobSpec, shape: catalog.SliceShape, cube: catalog.SliceShape
            ) -> tuple[int, str]:  # fmt: skip
    """How many units (node pools, or cubes with dynamic slicing) the job holds, and what."""
    spares = f" + {spec.spares} spare{'s' if spec.spares > 1 else ''}" if spec.spares else ""
    if _dynamic(spec):
        per = max(1, shape.chips // cube.chips)
        slices = f"{spec.slices} slice{'s' if spec.slices > 1 else ''}"
        return spec.slices * per + spec.spares, f"cubes ({slices} of {per}{spares})"
    n = spec.slices + spec.spares
    return n, f"node pools ({spec.slices} slices{spares}) of {shape.chips} chips"


# ---------------------------------------------------------------- dynamic slicing's own rules


def dynamic_slicing_errors(spec: MultisliceJobSpec, shape: catalog.SliceShape) -> list[FieldError]:
    """Slice topologies the operator forms: whole cubes (super-slicing). Sub-slices share one
    cube's partition and need GKE 1.36.0-gke.3712000: not formed by the operator yet. The cubes
    of a Slice come from one reservation block."""
    if not _dynamic(spec) or shape.generation.sub_block_topology is None:
        return []  # not tpu7x: the accelerator rule has said so
    per = cubes_per_slice(shape)
    if per:
        return _block_errors(spec, shape, per)
    cube = cube_shape(shape.generation)
    assert cube is not None
    kind = (
        f"a sub-slice (GKE sub-slicing, {SUB_SLICING_MIN_GKE}+), which the operator does not "
        "form yet"
        if shape.topology in SUB_SLICE_TOPOLOGIES
        else "not a GKE Slice topology"
    )
    return [
        FieldError(
            "spec.topology",
            f"{shape.accelerator} {shape.topology} is {kind}: with provisioning.mode "
            f"DynamicSlicing each slice is whole {cube.topology} cubes (4i x 4j x 4k, "
            f"i <= j <= k; {SUB_BLOCK_DOC}); use {cube.accelerator} ({cube.topology}) or larger",
        )
    ]


def _block_errors(spec: MultisliceJobSpec, shape: catalog.SliceShape, per: int) -> list[FieldError]:
    """Managed cubes of a slice of several cubes aimed at a reservation that names no block:
    GKE places each cube pool in any block of the reservation, and a Slice over cubes of two
    blocks fails. One-cube slices, a block or sub-block, and Existing cubes (grouped by block
    when a Slice is formed) are fine."""
    ds = spec.provisioning.dynamic_slicing
    reservation = spec.capacity.reservation
    managed = ds is None or ds.cubes == CubeSource.MANAGED
    if per < 2 or not managed or not reservation or BLOCKS in reservation:
        return []
    return [
        FieldError(
            RESERVATION,
            f"{reservation} names no reservation block, and a {shape.accelerator} slice "
            f"({shape.topology}) is {per} cubes that GKE forms into one Slice only from one "
            f"block (a Slice over two blocks goes FAILED; {SAME_BLOCK_DOC}); a cube pool aimed "
            "at the reservation may land in any block. Aim at one block: "
            f"{reservation}/reservationBlocks/BLOCK (gcloud compute reservations blocks list), "
            "or use slices of one cube (tpu7x-128)",
        )
    ]
