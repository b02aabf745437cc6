"""The operator's TPU catalog against libtpu's own topology descriptions (the TPU compiler of the
workload's ``tpu`` extra, on this CPU): for every slice shape the catalog lists, libtpu builds
the slice and agrees on its chips, hosts (processes), chips per host, devices per chip and shape;
and the workload's hardware tables (it cannot import the operator) repeat the catalog's figures.

Host bounds: GKE's multi-host TPU VMs hold a 2x2x1 block of chips, the single-host ones the
whole slice (catalog `_chips_per_host`); libtpu takes them as ``chips_per_host_bounds``.
"""

from __future__ import annotations

import collections
import os
from typing import Any

import pytest

from multislice_operator.tpu import catalog
from multislice_workload import compile as tpu_compile
from multislice_workload import hardware

os.environ.setdefault("JAX_PLATFORMS", "cpu")

BOUNDS = {1: (1, 1, 1), 4: (2, 2, 1)}
# libtpu makes a Python object per device (about 20 us each on the 2-core machine): the v4, v5p
# and tpu7x lists hold 2 million chips each (4.5 minutes in all). `make test` checks every shape
# of up to SMALL chips (every v5e and v6e shape, and 114 + 34 + 35 of the 3D ones) and the
# largest of each generation; MSJ_LIBTPU_ALL_SHAPES=1 checks every one.
SMALL = 1024
ALL_SHAPES = os.environ.get("MSJ_LIBTPU_ALL_SHAPES") == "1"


def checked_shapes(gen: catalog.Generation) -> list[str]:
    if ALL_SHAPES:
        return list(gen.topologies)
    largest = max(gen.topologies, key=catalog.topology_chips)
    small = [t for t in gen.topologies if catalog.topology_chips(t) <= SMALL]
    return small + ([largest] if largest not in small else [])


def describe(generation: catalog.Generation, topology: str, chips_per_host: int) -> list[Any]:
    from jax.experimental import topologies

    tpu_compile.allow_concurrent_compilers()
    desc = topologies.get_topology_desc(
        topology_name=f"{generation.name}:{topology}",
        platform="tpu",
        chip_config_name=tpu_compile.CHIP_CONFIG.get(generation.name, "default"),
        chips_per_host_bounds=BOUNDS[chips_per_host],
    )
    return list(desc.devices)


@pytest.mark.parametrize("prefix", list(catalog.GENERATIONS))
def test_libtpu_builds_every_catalog_shape_as_the_catalog_says(prefix: str) -> None:
    gen = catalog.GENERATIONS[prefix]
    checked = 0
    for topology in checked_shapes(gen):
        chips = catalog.topology_chips(topology)
        shape = catalog.slice_shape(f"{prefix}-{chips * gen.cores_per_chip}", topology)
        devices = describe(gen, topology, shape.chips_per_host)
        where = f"{prefix} {topology}"
        assert len(devices) == shape.chips * gen.devices_per_chip, where
        per_host = collections.Counter(d.process_index for d in devices)
        assert len(per_host) == shape.hosts, where
        assert set(per_host.values()) == {shape.chips_per_host * gen.devices_per_chip}, where
        assert hardware.devices_per_chip(devices) == gen.devices_per_chip, where
        dims = [int(x) for x in topology.split("x")] + [1] * (3 - gen.dims)
        extent = [max(d.coords[i] for d in devices) + 1 for i in range(3)]
        assert extent == dims, where
        assert {hardware.tpu_generation(d.device_kind) for d in devices} == {gen.name}, where
        checked += 1
    assert checked == len(checked_shapes(gen)) > 0


@pytest.mark.parametrize("prefix", list(catalog.GENERATIONS))
def test_the_workload_tables_repeat_the_catalog(prefix: str) -> None:
    gen = catalog.GENERATIONS[prefix]
    assert hardware.TPU_HBM_BYTES[gen.name] == gen.hbm_bytes
    assert hardware.TPU_PEAK_BF16_FLOPS[gen.name] == gen.peak_bf16_flops
    assert hardware.DEVICES_PER_CHIP.get(gen.name, 1) == gen.devices_per_chip
    assert gen.name in hardware.TPU_HBM_BANDWIDTH
    assert hardware.TPU_COMPILER_HBM_BYTES[gen.name] == gen.usable_hbm_bytes


PAGE = 4096  # a float32 vector's tile on every generation (f32[n]{0:T(1024)})


def compile_vector(device: Any, nbytes: int) -> tuple[int | None, str]:
    """Compile a program of one float32 argument of `nbytes` on `device` (its sum is the output):
    its `compile.hbm_used`, or None and libtpu's words when it refuses it for HBM."""
    import jax
    import jax.numpy as jnp

    sharding = jax.sharding.SingleDeviceSharding(device)
    arg = jax.ShapeDtypeStruct((nbytes // 4,), jnp.float32, sharding=sharding)
    try:
        compiled = jax.jit(jnp.sum).lower(arg).compile()
    except Exception as err:
        if "RESOURCE_EXHAUSTED" not in str(err):
            raise
        return None, str(err)
    return tpu_compile.hbm_used(compiled.memory_analysis()), ""


@pytest.mark.parametrize("prefix", list(catalog.GENERATIONS))
def test_the_compiler_gives_a_device_exactly_the_catalogs_usable_hbm(prefix: str) -> None:
    """The largest program libtpu accepts has a peak plus code (`compile.hbm_used`) within two
    pages of the catalog's usable HBM per device (the code's size moves with the argument's, and
    libtpu counts it to the 512 bytes), a page more is refused, and the refusal states that
    capacity: the compile gate's capacity and figure are the compiler's."""
    gen = catalog.GENERATIONS[prefix]
    topology = gen.topologies[0]
    chips = catalog.topology_chips(topology)
    shape = catalog.slice_shape(f"{prefix}-{chips * gen.cores_per_chip}", topology)
    device = describe(gen, topology, shape.chips_per_host)[0]
    usable = gen.usable_hbm_bytes
    probe = usable // 2 // PAGE * PAGE
    used, _ = compile_vector(device, probe)
    assert used is not None and 0 < used - probe < 2**20  # the output and the program's code
    estimate = (usable - (used - probe)) // PAGE * PAGE
    # The code's size at the edge is not the probe's (tens of KiB apart on tpu7x): a MiB each way.
    fits, refused = estimate - 2**20, estimate + 2**20
    fitting, _ = compile_vector(device, fits)
    over, said = compile_vector(device, refused)
    assert fitting is not None and over is None
    while refused - fits > PAGE:  # the edge, to the page
        middle = (fits + refused) // 2 // PAGE * PAGE
        got, words = compile_vector(device, middle)
        if got is None:
            refused, said = middle, words
        else:
            fits, fitting = middle, got
    assert usable - 2 * PAGE < fitting <= usable
    stated = tpu_compile._parse_oom(said)
    assert stated is not None, said[:500]
    # libtpu prints GiB to 2 decimals ("Used 15.75G of 15.75G hbm").
    assert abs(stated[1] - usable) <= 0.005 * 2**30, (stated, usable)
