"""GKE TPU host layouts, on stand-in devices that carry what the TPU runtime reports (``coords``,
``core_on_chip``, ``process_index``, ``slice_index``, ``device_kind``), through the same mesh
code (`mesh.device_array`, JAX's mesh_utils) and the row assignment `datasets.GlobalBatches` uses
(`datasets.local_rows`, `datasets.device_blocks`).

Hosts are Kubernetes nodes: 4-chip VMs holding a 2x2 block of chips (2x2x1 on 3D tori), the
block of GKE's multi-host TPU node pools; a TPU7x chip is 2 devices (its 2 TensorCores).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest

from multislice_workload import datasets, hardware
from multislice_workload.env import Parallelism
from multislice_workload.mesh import MESH_AXES, device_array
from multislice_workload.partitioning import named


@dataclasses.dataclass(frozen=True)
class TpuDevice:
    id: int
    process_index: int
    slice_index: int
    coords: tuple[int, int, int]
    core_on_chip: int
    device_kind: str
    platform: str = "tpu"


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    device_kind: str
    topology: tuple[int, int, int]  # chips along x, y, z (z = 1 for the 2D generations)
    host: tuple[int, int, int] = (2, 2, 1)  # chips of one VM
    cores: int = 1  # JAX devices per chip

    @property
    def chips(self) -> int:
        return math.prod(self.topology)

    @property
    def hosts(self) -> int:
        return self.chips // math.prod(self.host)


# The multi-host shapes of the catalog's generations (docs/provisioning.md), and TPU7x.
SHAPES = {
    "v4-32 2x2x4": Shape("v4", "TPU v4", (2, 2, 4)),
    "v5e 4x4": Shape("v5e", "TPU v5 lite", (4, 4, 1)),
    "v5e 8x8": Shape("v5e", "TPU v5 lite", (8, 8, 1)),
    "v5p-32 2x2x4": Shape("v5p", "TPU v5", (2, 2, 4)),
    "v6e 4x4": Shape("v6e", "TPU v6 lite", (4, 4, 1)),
    "v6e 4x8": Shape("v6e", "TPU v6 lite", (4, 8, 1)),
    "tpu7x-128 4x4x4": Shape("tpu7x", "TPU7x", (4, 4, 4), cores=2),
}


def tpu_devices(shape: Shape, slices: int) -> list[TpuDevice]:
    """Every device of `slices` slices; hosts numbered x fastest, as TPU_WORKER_ID counts them."""
    hx, hy, hz = (t // h for t, h in zip(shape.topology, shape.host, strict=True))
    per_host = math.prod(shape.host) * shape.cores
    out = []
    for s, (z, y, x) in itertools.product(
        range(slices), itertools.product(*map(range, (hz, hy, hx)))
    ):
        host = s * shape.hosts + (z * hy + y) * hx + x
        chips = itertools.product(*(range(h) for h in shape.host))
        for i, ((cx, cy, cz), core) in enumerate(itertools.product(chips, range(shape.cores))):
            coords = (x * shape.host[0] + cx, y * shape.host[1] + cy, z * shape.host[2] + cz)
            out.append(TpuDevice(host * per_host + i, host, s, coords, core, shape.device_kind))
    return out[::-1]  # order must not matter


def layouts(shape: Shape) -> list[Parallelism]:
    """ICI layouts that occur in practice: all-FSDP, data x FSDP, FSDP x tensor (data and
    tensor along one whole physical axis, as mesh_utils requires without split axes)."""
    chips, axis = shape.chips, max(shape.topology)
    return [
        Parallelism(ici_fsdp=chips),
        Parallelism(ici_data=axis, ici_fsdp=chips // axis),
        Parallelism(ici_fsdp=chips // axis, ici_tensor=axis),
    ]


def cases() -> list[tuple[str, Parallelism, int]]:
    out = []
    for name, shape in SHAPES.items():
        for p in layouts(shape):
            out.append((name, p, 1))
        out.append((name, dataclasses.replace(layouts(shape)[1], dcn_data=2), 2))
    return out


def arrange(shape: Shape, p: Parallelism, slices: int) -> np.ndarray:
    return device_array(
        tpu_devices(shape, slices),
        p,
        num_slices=slices,
        chips_per_slice=shape.chips,
        hosts_per_slice=shape.hosts,
    )


@pytest.mark.parametrize(("name", "parallelism", "slices"), cases(), ids=lambda v: str(v))
def test_every_process_reads_exactly_the_rows_its_devices_hold(
    name: str, parallelism: Parallelism, slices: int
) -> None:
    import jax

    shape = SHAPES[name]
    arranged = arrange(shape, parallelism, slices)
    mesh = jax.sharding.Mesh(arranged, MESH_AXES)
    sharding = named(mesh, ("batch", None))
    batch_shards = math.prod(mesh.shape[a] for a in ("pipeline", "data", "fsdp"))
    global_shape = (2 * batch_shards, 17)
    held = sharding.devices_indices_map(global_shape)
    seen: set[int] = set()
    for process in range(slices * shape.hosts):
        rows = datasets.local_rows(sharding, global_shape, process_index=process)
        mine = {d: idx[0] for d, idx in held.items() if d.process_index == process}
        assert len(rows) == len(set(rows))
        assert set(rows) == {r for s in mine.values() for r in range(s.start, s.stop)}
        # Each device is handed exactly its rows of the process-local batch (row i of which is
        # global row rows[i]), as `GlobalBatches.to_global` puts them on it.
        blocks = datasets.device_blocks(sharding, global_shape, rows, process)
        assert set(blocks) == set(mine)
        for device, (positions, columns) in blocks.items():
            index = mine[device]
            assert [rows[i] for i in positions] == list(range(index.start, index.stop))
            assert columns == held[device][1]
        seen |= set(rows)
    assert seen == set(range(global_shape[0]))


def test_the_layouts_that_broke_the_old_pipeline_are_not_contiguous() -> None:
    """v5e 4x4 with 2x2-chip hosts and all-FSDP: a host's rows are not one block (the old
    `data.process_rows` refused them with a ValueError, exit 1, retried until the budget ran
    out)."""
    import jax

    arranged = arrange(SHAPES["v5e 4x4"], Parallelism(ici_fsdp=16), 1)
    sharding = named(jax.sharding.Mesh(arranged, MESH_AXES), ("batch", None))
    gaps = [
        rows
        for p in range(4)
        if (rows := datasets.local_rows(sharding, (32, 17), process_index=p))
        and list(rows) != list(range(rows[0], rows[0] + len(rows)))
    ]
    assert gaps  # at least one host holds rows from several places of the batch
    assert datasets.row_ranges(gaps[0]) != [(gaps[0][0], gaps[0][-1] + 1)]


@pytest.mark.parametrize("name", list(SHAPES))
def test_a_slice_is_one_ici_block_and_hosts_split_evenly(name: str) -> None:
    shape = SHAPES[name]
    axis = max(shape.topology)
    p = Parallelism(ici_data=axis, ici_fsdp=shape.chips // axis, dcn_data=2)
    arranged = arrange(shape, p, 2)
    assert arranged.shape == (1, 2 * axis, shape.chips // axis * shape.cores, 1)
    halves = [{d.slice_index for d in arranged[:, i * axis : (i + 1) * axis].flat} for i in (0, 1)]
    assert halves == [{0}, {1}]
    # Along fsdp, a host's devices are neighbours: hosts x (chips x cores) per row of the mesh.
    for row in arranged.reshape(2 * axis, -1):
        per_host = [
            sum(1 for d in row if d.process_index == p) for p in {d.process_index for d in row}
        ]
        assert len(set(per_host)) == 1


def test_tpu7x_counts_two_devices_per_chip() -> None:
    devices = tpu_devices(SHAPES["tpu7x-128 4x4x4"], 1)
    assert len(devices) == 128 and hardware.devices_per_chip(devices) == 2
    assert len({d.process_index for d in devices}) == 16  # 16 VMs of 4 chips, 8 devices each
    # The operator's ICI product counts chips (64); the chip's 2 cores join the fsdp axis ...
    arranged = arrange(SHAPES["tpu7x-128 4x4x4"], Parallelism(ici_fsdp=64), 1)
    assert arranged.shape == (1, 1, 128, 1)
    # ... or the tensor axis when there is one; a product already in devices is kept.
    tensor = arrange(SHAPES["tpu7x-128 4x4x4"], Parallelism(ici_fsdp=16, ici_tensor=4), 1)
    assert tensor.shape == (1, 1, 16, 8)
    kept = arrange(SHAPES["tpu7x-128 4x4x4"], Parallelism(ici_fsdp=64, ici_tensor=2), 1)
    assert kept.shape == (1, 1, 64, 2)
    # Both cores of one chip are neighbours on the innermost axis.
    flat = tensor.reshape(-1, 8)
    for row in flat:
        for pair in zip(row[0::2], row[1::2], strict=True):
            assert len({(d.coords, d.process_index) for d in pair}) == 1


def test_tpu7x_peak_and_hbm_are_per_device() -> None:
    # https://cloud.google.com/tpu/docs/tpu7x: 2307 TFLOP/s bf16 and 192 GiB per chip.
    assert hardware.tpu_generation("TPU7x") == "tpu7x"
    assert hardware.catalog_peak("TPU7x") == pytest.approx(2307e12 / 2)
    assert hardware.catalog_hbm("TPU7x") == 96 * 2**30
    assert hardware.catalog_peak("TPU v5 lite") == 197e12  # one device per chip elsewhere
    assert hardware.devices_per_chip(tpu_devices(SHAPES["v5p-32 2x2x4"], 2)) == 1
