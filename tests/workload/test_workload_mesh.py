"""Mesh construction for several ICI/DCN layouts, on stand-in devices (no backend needed)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from multislice_workload.env import ConfigError, Parallelism
from multislice_workload.mesh import MESH_AXES, device_array, slice_layout


@dataclasses.dataclass(frozen=True)
class FakeDevice:
    """What mesh_utils reads from a CPU device."""

    id: int
    process_index: int
    platform: str = "cpu"
    device_kind: str = "cpu"


@dataclasses.dataclass(frozen=True)
class FakeTpuDevice:
    id: int
    process_index: int
    slice_index: int
    coords: tuple[int, int, int]
    core_on_chip: int = 0
    platform: str = "tpu"
    device_kind: str = "TPU v5 lite"


def cpu_devices(slices: int, hosts: int, per_host: int) -> list[FakeDevice]:
    devices = [
        FakeDevice(id=p * per_host + d, process_index=p)
        for p in range(slices * hosts)
        for d in range(per_host)
    ]
    return devices[::-1]  # order must not matter


def arrange(slices: int, hosts: int, per_host: int, p: Parallelism) -> np.ndarray:
    return device_array(
        cpu_devices(slices, hosts, per_host),
        p,
        num_slices=slices,
        chips_per_slice=hosts * per_host,
        hosts_per_slice=hosts,
    )


@pytest.mark.parametrize(
    ("slices", "hosts", "per_host", "parallelism", "shape"),
    [
        (1, 1, 4, Parallelism(ici_fsdp=4), (1, 1, 4, 1)),
        (1, 2, 2, Parallelism(ici_fsdp=2, ici_tensor=2), (1, 1, 2, 2)),
        (2, 2, 2, Parallelism(ici_fsdp=4, dcn_data=2), (1, 2, 4, 1)),
        (2, 1, 4, Parallelism(ici_data=2, ici_fsdp=2, dcn_fsdp=2), (1, 2, 4, 1)),
        (4, 1, 2, Parallelism(ici_tensor=2, dcn_data=2, dcn_pipeline=2), (2, 2, 1, 2)),
        (4, 2, 1, Parallelism(ici_fsdp=2, dcn_data=4), (1, 4, 2, 1)),
    ],
)
def test_layouts(
    slices: int, hosts: int, per_host: int, parallelism: Parallelism, shape: tuple[int, ...]
) -> None:
    arranged = arrange(slices, hosts, per_host, parallelism)
    assert arranged.shape == shape
    assert len({d.id for d in arranged.flat}) == slices * hosts * per_host
    # The unit of DCN is a slice: every ICI block (one slice) holds one slice's devices only.
    ici = (1, parallelism.ici_data, parallelism.ici_fsdp, parallelism.ici_tensor)
    for block_index in np.ndindex(*(s // i for s, i in zip(shape, ici, strict=True))):
        block = arranged[
            tuple(slice(b * i, (b + 1) * i) for b, i in zip(block_index, ici, strict=True))
        ]
        assert len({d.process_index // hosts for d in block.flat}) == 1


def test_data_parallel_over_dcn_puts_slices_on_the_data_axis() -> None:
    arranged = arrange(2, 2, 2, Parallelism(ici_fsdp=4, dcn_data=2))
    assert slice_layout(arranged, hosts_per_slice=2) == [[0, 0, 0, 0], [1, 1, 1, 1]]
    # Within a slice, a host's devices stay contiguous along fsdp.
    assert [d.process_index for d in arranged[0, 0, :, 0]] == [0, 0, 1, 1]


def test_tpu_devices_use_their_slice_index() -> None:
    devices = [
        FakeTpuDevice(i, i // 2, slice_index=1 - i // 4, coords=(i % 2, i // 2 % 2, 0))
        for i in range(8)
    ]
    arranged = device_array(
        devices,
        Parallelism(ici_fsdp=4, dcn_data=2),
        num_slices=2,
        chips_per_slice=4,
        hosts_per_slice=2,
    )
    # Sorted by slice_index: slice 0 (devices 4..7) comes first whatever the process numbering.
    assert sorted(d.id for d in arranged[0, 0].flat) == [4, 5, 6, 7]


@pytest.mark.parametrize(
    ("parallelism", "message"),
    [
        (Parallelism(ici_fsdp=2, dcn_data=2), "ICI parallelism data x fsdp x tensor = 1 x 2 x 1"),
        (Parallelism(ici_fsdp=4, dcn_data=1), "must equal the number of slices (2)"),
        (Parallelism(ici_fsdp=4, dcn_data=2, dcn_pipeline=2), "= 4 must equal the number of"),
    ],
)
def test_wrong_products_fail_clearly(parallelism: Parallelism, message: str) -> None:
    with pytest.raises(ConfigError, match="must equal") as err:
        arrange(2, 2, 2, parallelism)
    assert message in str(err.value)


def test_missing_devices_fail_like_the_seed_check() -> None:
    devices = cpu_devices(2, 2, 2)[:6]  # one host did not join
    with pytest.raises(ConfigError, match="JAX sees 6 devices but the job has 2 slices x 4 chips"):
        device_array(
            devices,
            Parallelism(ici_fsdp=4, dcn_data=2),
            num_slices=2,
            chips_per_slice=4,
            hosts_per_slice=2,
        )


def test_axis_names() -> None:
    assert MESH_AXES == ("pipeline", "data", "fsdp", "tensor")
