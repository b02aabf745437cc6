"""Orbax checkpoints of the whole training state, on a local path or gs://.

Every process takes part in every save and restore: each writes the shards it holds, and the
primary process commits the step only once all shards are written, so a crash mid-save leaves the
previous step as the latest one. Saves are synchronous because the next step donates the state's
buffers, and because a preemption exit must not race an unfinished write.
"""

from __future__ import annotations

import os
from typing import Any


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
        self._manager: Any = None
        if directory:
            import orbax.checkpoint as ocp

            options = ocp.CheckpointManagerOptions(
                max_to_keep=keep, create=True, enable_async_checkpointing=False
            )
            self._manager = ocp.CheckpointManager(_directory(directory), options=options)

    @property
    def enabled(self) -> bool:
        return self._manager is not None

    def latest_step(self) -> int | None:
        return self._manager.latest_step() if self._manager else None

    def restore(self, step: int, like: Any) -> Any:
        """The state saved at `step`, with the shapes, dtypes and shardings of `like`."""
        import jax
        import orbax.checkpoint as ocp

        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        restored = self._manager.restore(step, args=ocp.args.StandardRestore(abstract))
        self._last_saved = step
        return restored

    def due(self, step: int) -> bool:
        return self.enabled and step % self.every == 0

    def save(self, step: int, state: Any) -> bool:
        """Save now (collective: every process must call it at the same step)."""
        if not self._manager or self._last_saved == step:
            return False
        import orbax.checkpoint as ocp

        self._manager.save(step, args=ocp.args.StandardSave(state), force=True)
        self._manager.wait_until_finished()
        self._last_saved = step
        return True

    def close(self) -> None:
        if self._manager:
            self._manager.close()
