"""Compiled trainers shared by the workload test files (conftest.py sets the 8 CPU devices)."""

from __future__ import annotations

from typing import Any

_TRAINERS: dict[Any, Any] = {}


def cached_trainer(shape: tuple[int, int, int, int], cfg: Any) -> Any:
    """One compiled `train.Trainer` per (mesh shape, config) for the whole session: a compile
    takes tens of seconds on 2 cores, and several test files read the same programs. Callers
    must not step the cached trainer's `initial_state` (donated buffers); use `init_state()`."""
    key = (shape, cfg)
    if key not in _TRAINERS:
        import jax
        import numpy as np

        from multislice_workload import train
        from multislice_workload.mesh import MESH_AXES

        count = int(np.prod(shape))
        mesh = jax.sharding.Mesh(np.array(jax.devices()[:count]).reshape(shape), MESH_AXES)
        _TRAINERS[key] = train.Trainer(cfg, mesh, train.check_shapes(cfg, mesh))
    return _TRAINERS[key]
