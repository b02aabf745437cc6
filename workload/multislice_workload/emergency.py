"""Orbax emergency (multi-tier) checkpointing: a fast local tier on every non-primary slice and
the persistent tier (`checkpoint_dir`) written by the primary slice.

``orbax.checkpoint.experimental.emergency.checkpoint_manager.CheckpointManager`` (Orbax 0.12.8)
splits the mesh into replicas along one axis (here ``data``, whose DCN factor spans the slices):
the primary replica saves to persistent storage every `every` steps, the others save their own
shards to node-local storage (a RAM disk on TPU VMs) every `local_every` steps. On restore, a
replica that holds a complete local checkpoint of the latest step reads it and broadcasts it to
the others over the network, so a slice replaced after a pod loss (empty local storage) resumes
from the recent local step rather than the older persistent one. With one replica it is a plain
persistent manager.

The manager saves one item, the state, so the data position travels inside it (a replicated
scalar, `POSITION`); the checkpoint-request metadata of `checkpoint.py` is not kept here.
"""

from __future__ import annotations

import os
import time
from typing import Any

from multislice_workload import logs

POSITION = "data_next_example"
REPLICA_AXIS = "data"


def _process_tables(multihost: Any) -> None:
    """Set up the tables through which the emergency manager maps processes to devices.

    Orbax fills them through the jax.distributed client's key-value store (its own emergency
    benchmark calls the same two initializers: orbax/checkpoint/_src/testing/benchmarks/
    emergency_checkpoint_manager_benchmark.py), and raises when there is no client. A job of
    one process never starts jax.distributed (`runtime.initialize`), and for it the tables are
    what those initializers would compute for one process: runtime id 0 is distributed id 0,
    which holds every device."""
    import jax

    if jax.process_count() == 1:
        if not multihost.is_runtime_to_distributed_ids_initialized():
            multihost._RUNTIME_TO_DISTRIBUTED_ID = [0]
        if not multihost.is_distributed_to_device_ids_initialized():
            multihost._DISTRIBUTED_TO_DEVICE_IDS = [[d.id for d in jax.local_devices()]]
        return
    if not multihost.is_runtime_to_distributed_ids_initialized():
        multihost.initialize_runtime_to_distributed_ids()
    if not multihost.is_distributed_to_device_ids_initialized():
        multihost.initialize_distributed_to_device_ids()


class EmergencyCheckpointer:
    """`checkpoint.Checkpointer`'s interface over Orbax's emergency manager."""

    def __init__(
        self,
        directory: str,
        local_directory: str,
        every: int,
        local_every: int,
        keep: int,
        mesh: Any,
        abstract: dict[str, Any],
    ) -> None:
        """`abstract`: the train state's shapes, dtypes and shardings (`Trainer.abstract_state`;
        arrays work too): the manager restores into them, and nothing is allocated for it."""
        import jax
        import jax.numpy as jnp
        import orbax.checkpoint as ocp
        from absl import flags
        from orbax.checkpoint._src.multihost import multihost
        from orbax.checkpoint.experimental.emergency import checkpoint_manager as emergency

        from multislice_workload.checkpoint import _directory

        # The restore path reads absl flags (mesh_consistency.py's
        # experimental_use_distributed_id_for_mesh_consistency); this program does not parse
        # absl's command line, so take their defaults.
        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()
        _process_tables(multihost)
        self.directory = directory
        self.every, self.local_every = every, local_every
        # Node-local storage is per host: one directory per process (it must exist).
        self.local_directory = os.path.join(local_directory, f"process-{jax.process_index()}")
        os.makedirs(self.local_directory, exist_ok=True)
        self._mesh = mesh
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        position = jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(mesh, P()))
        self._abstract = jax.tree.map(
            ocp.utils.to_shape_dtype_struct, {**abstract, POSITION: position}
        )
        replica_axis = list(mesh.axis_names).index(REPLICA_AXIS)
        options = emergency.CheckpointManagerOptions(
            local=emergency.LocalCheckpointOptions(save_interval_steps=local_every, max_to_keep=2),
            persistent=emergency.PersistentCheckpointOptions(
                save_interval_steps=every, max_to_keep=keep
            ),
            replica_axis_index=replica_axis,
            enable_async_checkpointing=True,
        )
        self.replicas = int(mesh.devices.shape[replica_axis])
        self._manager = emergency.CheckpointManager(
            self.local_directory,
            _directory(directory),
            global_mesh=mesh,
            abstract_state=self._abstract,
            options=options,
        )
        self._last_saved: int | None = None
        self._last_forced = False
        self._pending: tuple[int, float] | None = None
        self._finished = False
        logs.emit(
            "emergency_checkpointing",
            local_directory=self.local_directory,
            persistent_directory=directory,
            replicas=self.replicas,
            local_every=local_every,
            persistent_every=every,
        )

    def with_position(self, state: dict[str, Any], next_example: int) -> dict[str, Any]:
        import jax
        import numpy as np
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        value = np.asarray(next_example, np.int32)
        position = jax.make_array_from_callback((), NamedSharding(self._mesh, P()), lambda _: value)
        return {**state, POSITION: position}

    @property
    def enabled(self) -> bool:
        return True

    @property
    def saving(self) -> bool:
        return self._pending is not None

    def latest_step(self) -> int | None:
        step: int | None = self._manager.latest_step()
        return step

    def due(self, step: int) -> bool:
        return step % self.every == 0 or step % self.local_every == 0

    @property
    def last_saved(self) -> int | None:
        return self._last_saved

    def save(
        self,
        step: int,
        state: Any,
        data: dict[str, Any],
        meta: dict[str, Any],
        *,
        forced: bool = True,
    ) -> float | None:
        """`forced` (a final, preemption, requested or restart save): every tier writes the
        step, the primary replica to `--checkpoint_dir` whatever `--checkpoint_every` says.
        Unforced (a periodic save, `due`), Orbax's intervals pick the tiers: with one replica
        the manager is a plain persistent one, and a step due for the local tier only is not
        saved at all. A step is saved once: a forced save must come first (Orbax refuses a
        step its tier already holds)."""
        import orbax.checkpoint as ocp

        del meta  # the emergency manager keeps the state item only
        if self._last_saved == step:
            if forced and not self._last_forced:
                raise RuntimeError(
                    f"step {step} was saved by its intervals (perhaps to the local tier only); "
                    "a forced save of the same step must come first"
                )
            return None
        start = time.perf_counter()
        item = self.with_position(state, int(data["next_example"]))
        saved = self._manager.save(
            step, args=ocp.args.Composite(state=ocp.args.PyTreeSave(item)), force=forced
        )
        if not saved:
            return None
        self._last_saved, self._last_forced = step, forced
        self._pending = (step, start)
        return time.perf_counter() - start

    def restore(self, step: int, like: Any, data: Any) -> tuple[Any, dict[str, Any]]:
        del like  # the manager restores into the abstract state it was built with
        restored = self._manager.restore(step)
        state = dict(restored.state if hasattr(restored, "state") else restored)
        data.set_state({"next_example": int(state.pop(POSITION))})
        self._last_saved, self._last_forced = step, True
        return state, {}

    def poll_finished(self) -> tuple[int, float] | None:
        """Once per save, after `wait` saw it finish (the emergency manager has no
        non-blocking query)."""
        if self._pending is None or not self._finished:
            return None
        step, start = self._pending
        self._pending, self._finished = None, False
        return step, time.perf_counter() - start

    def wait(self, timeout_s: float | None = None) -> bool:
        del timeout_s
        self._manager.wait_until_finished()
        self._finished = self._pending is not None
        return True

    def close(self) -> None:
        self._manager.close()
