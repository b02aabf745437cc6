"""Pieces shared by both modes: parallelism flags and the mesh start-up line."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from multislice_workload import logs
from multislice_workload.env import Parallelism, WorkloadEnv
from multislice_workload.hardware import devices_per_chip
from multislice_workload.mesh import MESH_AXES, build_mesh, slice_layout

# Flag names follow the seed's shardings.py; dcn_pipeline is the operator's extra DCN axis.
PARALLELISM_FLAGS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Parallelism))


def add_parallelism_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("parallelism (default: from MULTISLICE_ICI_*/DCN_*)")
    for name in PARALLELISM_FLAGS:
        group.add_argument(f"--{name}_parallelism", dest=name, type=int, default=None)
    group.add_argument(
        "--allow_split_physical_axes",
        action="store_true",
        help="let a mesh axis take part of a physical TPU axis (MaxText's flag)",
    )


def parallelism_from(args: argparse.Namespace, env: WorkloadEnv) -> Parallelism:
    """Environment values with any flag given on the command line applied on top."""
    return env.parallelism.replace(**{name: getattr(args, name) for name in PARALLELISM_FLAGS})


def make_mesh(
    env: WorkloadEnv, parallelism: Parallelism, allow_split_physical_axes: bool = False
) -> Any:
    """Build the global mesh and log it; ConfigError when devices or products do not add up."""
    import jax

    mesh = build_mesh(
        parallelism,
        num_slices=env.num_slices,
        chips_per_slice=env.chips_per_slice,
        hosts_per_slice=env.hosts_per_slice,
        allow_split_physical_axes=allow_split_physical_axes,
    )
    logs.emit(
        "mesh",
        global_devices=jax.device_count(),
        local_devices=jax.local_device_count(),
        expected_devices=env.global_chips * devices_per_chip(jax.devices()),
        platform=jax.devices()[0].platform,
        device_kind=jax.devices()[0].device_kind,
        axes=dict(zip(MESH_AXES, mesh.devices.shape, strict=True)),
        slices_by_row=slice_layout(mesh.devices, env.hosts_per_slice),
    )
    return mesh


def divisible(what: str, size: int, shards: int) -> list[str]:
    return [] if size % shards == 0 else [f"{what}={size} is not divisible by {shards} shards"]
