"""Device mesh from the injected ICI and DCN parallelism.

Axes are ordered by increasing communication intensity, as `mesh_utils` expects:
``pipeline`` (DCN only), ``data``, ``fsdp``, ``tensor``. Each axis of the hybrid mesh is the ICI
size times the DCN size, with the DCN factor outermost, so that within one slice only ICI links are
used and traffic between slices is confined to the axes that have a DCN factor.

On TPU the runtime tags every device with ``slice_index``. CPU and GPU devices have no such tag;
there we group processes into slices the way the operator numbers them
(process id = slice id x hosts per slice + worker id) and hand the same function tagged proxies, so
both paths go through `mesh_utils.create_hybrid_device_mesh`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from multislice_workload.env import ConfigError, Parallelism
from multislice_workload.hardware import devices_per_chip

MESH_AXES: tuple[str, ...] = ("pipeline", "data", "fsdp", "tensor")


def ici_shape(p: Parallelism) -> tuple[int, ...]:
    return (1, p.ici_data, p.ici_fsdp, p.ici_tensor)


def dcn_shape(p: Parallelism) -> tuple[int, ...]:
    return (p.dcn_pipeline, p.dcn_data, p.dcn_fsdp, p.dcn_tensor)


@dataclasses.dataclass(frozen=True)
class _SliceTagged:
    """A device plus the slice it belongs to, for platforms whose devices carry no slice_index."""

    device: Any
    slice_index: int

    @property
    def platform(self) -> str:
        return str(self.device.platform)

    @property
    def device_kind(self) -> str:
        return str(self.device.device_kind)

    @property
    def process_index(self) -> int:
        return int(self.device.process_index)

    @property
    def id(self) -> int:
        return int(self.device.id)


def has_native_slices(devices: Sequence[Any]) -> bool:
    """Only the TPU runtime knows real slices. Distributed CPU devices do carry a slice_index,
    but it is 0 for every process, so off TPU the attribute cannot be trusted."""
    return all(d.platform == "tpu" and getattr(d, "slice_index", None) is not None for d in devices)


def _tag_by_process(devices: Sequence[Any], hosts_per_slice: int) -> list[_SliceTagged]:
    ordered = sorted(devices, key=lambda d: (d.process_index, d.id))
    return [_SliceTagged(d, d.process_index // hosts_per_slice) for d in ordered]


def check_device_count(
    num_devices: int, num_slices: int, chips_per_slice: int, per_chip: int = 1
) -> None:
    """The seed's `len(jax.devices())` check: every chip of every slice must be visible."""
    expected = num_slices * chips_per_slice * per_chip
    if num_devices != expected:
        cores = f" x {per_chip} TensorCore devices per chip" if per_chip > 1 else ""
        raise ConfigError(
            f"JAX sees {num_devices} devices but the job has {num_slices} slices x "
            f"{chips_per_slice} chips{cores} = {expected}; a host or slice did not join"
        )


def per_device(parallelism: Parallelism, per_chip: int, chips_per_slice: int) -> Parallelism:
    """The ICI parallelism over devices. The operator counts chips (ICI products = chips per
    slice); where a chip is several devices (TPU7x: 2 TensorCores), the chip's devices join the
    innermost parallel axis (tensor if tensor-parallel, else fsdp), which the TensorCores of one
    chip serve best (mesh_utils lays TPU7x out with the core as the fastest physical axis).
    Products already given in devices (flags) are kept."""
    if per_chip == 1 or parallelism.ici_product != chips_per_slice:
        return parallelism
    if parallelism.ici_tensor > 1:
        return parallelism.replace(ici_tensor=parallelism.ici_tensor * per_chip)
    return parallelism.replace(ici_fsdp=parallelism.ici_fsdp * per_chip)


def device_array(
    devices: Sequence[Any],
    parallelism: Parallelism,
    *,
    num_slices: int,
    chips_per_slice: int,
    hosts_per_slice: int,
    allow_split_physical_axes: bool = False,
) -> np.ndarray:
    """Devices arranged as a (pipeline, data, fsdp, tensor) array. Raises ConfigError.

    `allow_split_physical_axes` is passed to `mesh_utils` as MaxText passes its flag of that name
    (``maxtext_utils.create_device_mesh``): it lets a logical axis take part of a physical TPU
    axis, for ICI shapes that do not follow the torus (e.g. tensor=2 on a 4-long axis)."""
    from jax.experimental import mesh_utils  # here so env-only users never import JAX

    per_chip = devices_per_chip(devices)
    check_device_count(len(devices), num_slices, chips_per_slice, per_chip)
    parallelism = per_device(parallelism, per_chip, chips_per_slice)
    parallelism.check(num_slices, chips_per_slice * per_chip)
    native = has_native_slices(devices)
    candidates: Sequence[Any] = devices if native else _tag_by_process(devices, hosts_per_slice)
    try:
        arranged = mesh_utils.create_hybrid_device_mesh(
            ici_shape(parallelism),
            dcn_shape(parallelism),
            devices=candidates,
            allow_split_physical_axes=allow_split_physical_axes,
        )
    except (ValueError, AssertionError, NotImplementedError) as err:
        raise ConfigError(f"cannot build the device mesh: {err}") from err
    if native:
        return np.asarray(arranged)
    unwrapped: np.ndarray = np.vectorize(lambda t: t.device, otypes=[object])(arranged)
    return unwrapped


def build_mesh(
    parallelism: Parallelism,
    *,
    num_slices: int,
    chips_per_slice: int,
    hosts_per_slice: int,
    devices: Sequence[Any] | None = None,
    allow_split_physical_axes: bool = False,
) -> Any:
    """The jax.sharding.Mesh over all global devices."""
    import jax

    devices = list(jax.devices()) if devices is None else list(devices)
    arranged = device_array(
        devices,
        parallelism,
        num_slices=num_slices,
        chips_per_slice=chips_per_slice,
        hosts_per_slice=hosts_per_slice,
        allow_split_physical_axes=allow_split_physical_axes,
    )
    return jax.sharding.Mesh(arranged, MESH_AXES)


def slice_layout(arranged: np.ndarray, hosts_per_slice: int) -> list[list[int]]:
    """For logs and tests: the slice of each device, flattened per (pipeline x data) row."""

    native = has_native_slices(list(arranged.flat))

    def slice_of(d: Any) -> int:
        return int(d.slice_index) if native else int(d.process_index) // hosts_per_slice

    slices = np.vectorize(slice_of, otypes=[int])(arranged)
    rows = int(np.prod(arranged.shape[:2]))
    return [[int(s) for s in row] for row in slices.reshape(rows, -1)]
