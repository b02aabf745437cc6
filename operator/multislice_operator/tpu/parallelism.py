"""ICI/DCN parallelism rules: defaults, products, and why DCN tensor parallelism is refused.

ICI axes (data, fsdp, tensor) split the chips of one slice; their product must equal the chips per
slice. DCN axes (data, fsdp, pipeline, tensor) split the slices; their product must equal the
number of slices. Pure functions; errors carry the field path and a valid example.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from multislice_operator.common.errors import FieldError

ICI_AXES = ("data", "fsdp", "tensor")
DCN_AXES = ("data", "fsdp", "pipeline", "tensor")


@dataclass(frozen=True)
class Parallelism:
    ici_data: int
    ici_fsdp: int
    ici_tensor: int
    dcn_data: int
    dcn_fsdp: int
    dcn_pipeline: int
    dcn_tensor: int

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {
            "ici": {"data": self.ici_data, "fsdp": self.ici_fsdp, "tensor": self.ici_tensor},
            "dcn": {
                "data": self.dcn_data,
                "fsdp": self.dcn_fsdp,
                "pipeline": self.dcn_pipeline,
                "tensor": self.dcn_tensor,
            },
        }


def _fill(
    given: dict[str, int | None],
    total: int,
    fill_axis: str,
    path: str,
    unit: str,
    pinned: dict[str, int] | None = None,
) -> tuple[dict[str, int], list[FieldError]]:
    """Default unset axes to 1, except `fill_axis`, which takes whatever makes the product right.
    `pinned` axes have one valid value (dcn.tensor: 1): the example offered keeps it."""
    errors: list[FieldError] = []
    values = {axis: v for axis, v in given.items() if v is not None}
    if fill_axis not in values:
        rest = math.prod(v for a, v in values.items() if a != fill_axis) or 1
        if total % rest == 0:
            values[fill_axis] = total // rest
        else:
            values[fill_axis] = 1
    full = {axis: values.get(axis, 1) for axis in given}
    product = math.prod(full.values())
    if product != total:
        formula = " x ".join(given)
        shown = " x ".join(str(full[a]) for a in given)
        example = _example({**full, **(pinned or {})}, total, fill_axis, set(values) - {fill_axis})
        errors.append(
            FieldError(
                path,
                f"{formula} = {shown} = {product}, but it must equal {total} ({unit}); "
                f"e.g. {example}",
            )
        )
    return full, errors


def _example(full: dict[str, int], total: int, fill_axis: str, given: set[str]) -> str:
    """A valid setting close to `full`; the axes the user set are shown even where 1."""
    others = math.prod(v for a, v in full.items() if a != fill_axis)
    if others and total % others == 0:
        fixed = dict(full, **{fill_axis: total // others})
    else:
        fixed = {a: (total if a == fill_axis else 1) for a in full}
    return ", ".join(
        f"{a}: {v}" for a, v in fixed.items() if v != 1 or a == fill_axis or a in given
    )


def resolve(
    ici: dict[str, int | None],
    dcn: dict[str, int | None],
    chips_per_slice: int,
    slices: int,
    accelerator: str,
    devices_per_chip: int = 1,
) -> tuple[Parallelism, list[FieldError]]:
    """Fill defaults (ici.fsdp takes the slice, dcn.data the slices) and check both products.
    ICI axes split the JAX devices of one slice: one per chip, except where each TensorCore of
    a chip is a device of its own (tpu7x: 2, no megacore; jax.experimental.pallas.tpu
    ChipVersion)."""
    devices = chips_per_slice * devices_per_chip
    what = (
        f"{accelerator} has {chips_per_slice} chips per slice"
        if devices_per_chip == 1
        else f"{accelerator} has {devices} JAX devices per slice ({chips_per_slice} chips x "
        f"{devices_per_chip} TensorCores)"
    )
    ici_full, errors = _fill(
        {a: ici.get(a) for a in ICI_AXES}, devices, "fsdp", "spec.parallelism.ici", what
    )
    dcn_full, dcn_errors = _fill(
        {a: dcn.get(a) for a in DCN_AXES},
        slices,
        "data",
        "spec.parallelism.dcn",
        f"spec.slices is {slices}",
        pinned={"tensor": 1},
    )
    errors += dcn_errors
    if dcn_full["tensor"] != 1:
        errors.append(
            FieldError(
                "spec.parallelism.dcn.tensor",
                f"must be 1, got {dcn_full['tensor']}: tensor parallelism exchanges activations "
                "every layer and DCN bandwidth between slices is far too low for it; shard "
                "tensors over ICI (spec.parallelism.ici.tensor) and use dcn.data across slices",
            )
        )
    par = Parallelism(
        ici_data=ici_full["data"],
        ici_fsdp=ici_full["fsdp"],
        ici_tensor=ici_full["tensor"],
        dcn_data=dcn_full["data"],
        dcn_fsdp=dcn_full["fsdp"],
        dcn_pipeline=dcn_full["pipeline"],
        dcn_tensor=dcn_full["tensor"],
    )
    return par, errors


# ---------------------------------------------------------------- elastic slice counts

FIXED_DCN_AXES = ("fsdp", "pipeline", "tensor")  # what a shrink keeps: only dcn.data changes


def fixed_dcn(dcn: dict[str, int | None]) -> tuple[int, dict[str, int]]:
    """The product of the DCN axes that stay fixed when the slice count changes (every axis but
    data, unset ones 1), and those set above 1, by name: what the sizes must be multiples of."""
    named = {a: v for a in FIXED_DCN_AXES if (v := dcn.get(a)) is not None and v > 1}
    return math.prod(named.values()), named


def elastic_sizes(slices: int, min_slices: int, fixed: int) -> list[int]:
    """The slice counts an elastic job can run at, largest first: from `slices` down to
    `min_slices`, each a multiple of `fixed` (dcn.data = k / fixed)."""
    return [k for k in range(slices, max(min_slices, 1) - 1, -1) if k % fixed == 0]


def sizes_phrase(named: dict[str, int], fixed: int, below: int, shown: int = 8) -> str:
    """Which sizes below `below` a layout allows, for an error message: "with dcn.pipeline 2 the
    sizes are multiples of 2: 2, 4, 6"."""
    sizes = [str(k) for k in range(fixed, below, fixed)]
    if len(sizes) > shown:
        sizes = [*sizes[: shown - 1], "...", sizes[-1]]
    listed = ", ".join(sizes)
    layout = " x ".join(f"dcn.{a} {v}" for a, v in named.items()) or "this layout"
    return f"with {layout} the sizes are multiples of {fixed}: {listed or 'none'}"
