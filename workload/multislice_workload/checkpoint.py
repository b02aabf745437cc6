"""Orbax checkpoints of the training state, the data iterator and run metadata; async saves.

One checkpoint holds three items: ``state`` (step, parameters, optimizer state: every process
writes the shards it owns), ``data`` (the data iterator's global position,
``{"next_example": n}``, the same on every process: one JSON file, so a checkpoint resumes on any
process count; Grain's own handler writes one file per process and ties the checkpoint to that
count) and ``meta`` (the last checkpoint request served, the corpus fingerprint). The primary
process commits a step only after every process finished writing (the temporary directory is
renamed), so a crash mid-save leaves the previous step the latest.

Saves are asynchronous: `save` returns once the arrays are copied to host memory (Orbax 0.12.8
copies every array before returning unless a device-host byte limit is set, none here), so the
next step may donate the state's buffers while the files are written in the background. Every
exit path waits for the write in flight (`wait`), and only a finished save counts as durable.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

STATE, DATA, META = "state", "data", "meta"


def _directory(path: str) -> Any:
    from etils import epath

    # Orbax wants an absolute path; gs:// is handled by etils (gcsfs in the image).
    return epath.Path(path if "://" in path else os.path.abspath(path))


class Checkpointer:
    """Save every `every` steps, keep the `keep` most recent; no-op without a directory."""

    def __init__(self, directory: str | None, every: int, keep: int) -> None:
        self.directory = directory
        self.every = every
        self._last_saved: int | None = None
        self._durable: int | None = None
        self._pending: tuple[int, float] | None = None  # (step, start) of the save in flight
        self._abandoned = False  # a wait timed out: the save in flight will never finish
        self._manager: Any = None
        if directory:
            import orbax.checkpoint as ocp

            options = ocp.CheckpointManagerOptions(
                max_to_keep=keep,
                create=True,
                enable_async_checkpointing=True,
                cleanup_tmp_directories=True,  # leftovers of saves killed half-way
            )
            self._manager = ocp.CheckpointManager(
                _directory(directory),
                options=options,
                item_handlers={
                    STATE: ocp.StandardCheckpointHandler(),
                    DATA: ocp.JsonCheckpointHandler(),
                    META: ocp.JsonCheckpointHandler(),
                },
            )

    @property
    def enabled(self) -> bool:
        return self._manager is not None

    @property
    def durable_step(self) -> int | None:
        """The last step whose checkpoint is complete on storage."""
        if self._manager is not None and not self._manager.is_saving_in_progress():
            self._durable = self._last_saved
        return self._durable

    @property
    def saving(self) -> bool:
        """A save was started and not yet reported by `poll_finished`."""
        return self._pending is not None

    def latest_step(self) -> int | None:
        return self._manager.latest_step() if self._manager else None

    def restore(self, step: int, abstract: Any, data: Any) -> tuple[Any, dict[str, Any]]:
        """The state saved at `step` and its metadata; `data` (the iterator: `set_state`) is
        moved to where it was at that step.

        `abstract` gives each leaf's shape, dtype and sharding (`jax.ShapeDtypeStruct`s, e.g.
        from `jax.eval_shape`): Orbax reads every array straight into those shardings, so nothing
        is allocated but the restored state, and the mesh may differ from the one that saved it
        (another number of slices, another dcn.data): each process reads the slices its devices
        now hold. The data position is global (one JSON file), so any process count resumes."""
        import orbax.checkpoint as ocp

        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                **{
                    STATE: ocp.args.StandardRestore(abstract),
                    DATA: ocp.args.JsonRestore(),
                    META: ocp.args.JsonRestore(),
                }
            ),
        )
        data.set_state(dict(restored[DATA]))
        self._last_saved = self._durable = step
        return restored[STATE], dict(restored[META] or {})

    def due(self, step: int) -> bool:
        return self.enabled and step % self.every == 0

    @property
    def last_saved(self) -> int | None:
        """The last step saved (being written, or durable) or restored."""
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
        """Start saving (collective: every process calls it at the same step) the state, the
        data position `data` and `meta`. Returns the seconds it blocked, None when nothing was
        started (disabled, or already saved). One tier: every save is written, `forced` or
        periodic (`EmergencyCheckpointer.save`'s distinction)."""
        del forced
        if not self._manager or self._last_saved == step:
            return None
        import orbax.checkpoint as ocp

        start = time.perf_counter()
        self._manager.save(
            step,
            args=ocp.args.Composite(
                **{
                    STATE: ocp.args.StandardSave(state),
                    DATA: ocp.args.JsonSave(data),
                    META: ocp.args.JsonSave(meta),
                }
            ),
            force=True,
        )
        self._last_saved = step
        self._pending = (step, start)
        return time.perf_counter() - start

    def poll_finished(self) -> tuple[int, float] | None:
        """Once per save, when it is complete: (step, seconds from its start to now)."""
        if self._pending is None or self._manager.is_saving_in_progress():
            return None
        step, start = self._pending
        self._pending = None
        self._durable = step
        return step, time.perf_counter() - start

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the save in flight is on storage; False if `timeout_s` passed first
        (a peer died mid-save: that step never commits, the previous one stays the latest)."""
        if not self._manager:
            return True
        if timeout_s is None:
            self._manager.wait_until_finished()
            self._durable = self._last_saved
            return True
        waiter = threading.Thread(target=self._manager.wait_until_finished, daemon=True)
        waiter.start()
        waiter.join(timeout_s)
        if waiter.is_alive():
            self._abandoned = True
            return False
        self._durable = self._last_saved
        return True

    def close(self) -> None:
        # Orbax's close waits for the save in flight, forever if a peer died during it.
        if self._manager and not self._abandoned:
            self._manager.close()
