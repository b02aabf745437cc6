"""Training data: byte-level tokens of the Python standard library's own source, through Grain.

The corpus needs no download and is the same on every host of one image: the ``.py`` files under
``sysconfig.get_path("stdlib")`` (tests and installed packages excluded), in sorted order, each cut
into non-overlapping windows of ``seq_len + 1`` bytes (inputs and next-byte targets).

Determinism and resume. Window order is a seeded Grain shuffle (reshuffled every epoch). The
global batch of step s is the windows ``s x B .. s x B + B - 1`` of that order, whatever the
mesh: a process reads only the rows its devices hold (`process_rows`), and those come from the
same global positions on any layout, so ``dcn.pipeline=2`` and ``dcn.data=2`` train on the same
data. Those rows need not be contiguous (TPU hosts rarely hold one block of the batch). Each
process's Grain iterator state (the next position) is saved in every checkpoint and restored
with it.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import sysconfig
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from multislice_workload.env import ConfigError

SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test"})


def stdlib_root() -> Path:
    return Path(sysconfig.get_path("stdlib"))


def corpus_files(root: Path | None = None) -> list[Path]:
    """The corpus, in an order that is the same on every host."""
    root = root or stdlib_root()
    files = [
        p
        for p in root.rglob("*.py")
        if not SKIPPED_DIRS & set(p.relative_to(root).parts[:-1]) and p.is_file()
    ]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


class ByteWindows:
    """Grain random-access source: window i is ``window`` consecutive bytes of one file."""

    def __init__(self, files: list[Path], window: int, root: Path | None = None) -> None:
        self.window = window
        self._files: list[Path] = []
        self._starts: list[int] = []  # index of each file's first window
        total = 0
        digest = hashlib.sha256(str(window).encode())
        largest = 0
        for path in files:
            size = path.stat().st_size
            largest = max(largest, size)
            digest.update(f"{path.relative_to(root) if root else path.name}:{size}\n".encode())
            if size // window:
                self._files.append(path)
                self._starts.append(total)
                total += size // window
        self._len = total
        self.fingerprint = digest.hexdigest()[:16]
        if not total:
            # A flag problem (--seq_len too long for the corpus): fatal, not retried.
            raise ConfigError(
                f"--seq_len={window - 1}: no file of the corpus holds a window of {window} bytes "
                f"(the largest has {largest}); use a shorter --seq_len"
            )

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> np.ndarray:
        index = int(index) % self._len
        f = bisect.bisect_right(self._starts, index) - 1
        with self._files[f].open("rb") as handle:
            handle.seek((index - self._starts[f]) * self.window)
            data = handle.read(self.window)
        return np.frombuffer(data, np.uint8).astype(np.int32)


def process_rows(
    sharding: Any, global_shape: tuple[int, ...], process_index: int | None = None
) -> tuple[int, ...]:
    """The global batch rows this process's devices hold, in the order of its local array.

    That order is `jax.make_array_from_process_local_data`'s: the distinct row blocks of the
    process's devices, sorted by their first row, concatenated ("if given process addresses
    slices (8, 12) and (24, 28), then these slices will be mapped into (0, 4) and (4, 8) of the
    local_data", its docstring). The blocks need not be contiguous: on TPU they usually are not
    (a host of 2x2 chips holds two rows of the torus, and the mesh's physical order spreads them
    over the batch). Devices replicated over other axes hold the same block, counted once.
    """
    import jax

    process = jax.process_index() if process_index is None else process_index
    blocks = sorted(
        {
            (index[0].start or 0, global_shape[0] if index[0].stop is None else index[0].stop)
            for device, index in sharding.devices_indices_map(global_shape).items()
            if device.process_index == process
        }
    )
    return tuple(row for start, stop in blocks for row in range(start, stop))


def row_ranges(rows: tuple[int, ...]) -> list[tuple[int, int]]:
    """[lo, hi) runs of consecutive rows, for logs."""
    out: list[tuple[int, int]] = []
    for row in rows:
        if out and out[-1][1] == row:
            out[-1] = (out[-1][0], row + 1)
        else:
            out.append((row, row + 1))
    return out


@dataclasses.dataclass(frozen=True)
class DataConfig:
    global_batch: int
    seq_len: int
    seed: int
    steps: int
    threads: int = 2


def local_dataset(cfg: DataConfig, source: ByteWindows, rows: Sequence[int]) -> Any:
    """Grain MapDataset of this process's rows [len(rows), seq_len + 1] of each global batch."""
    import grain

    windows = grain.MapDataset.source(source).shuffle(seed=cfg.seed).repeat()
    count = len(rows)

    def sample(n: int) -> np.ndarray:
        step, i = divmod(int(n), count)
        return np.asarray(windows[step * cfg.global_batch + rows[i]])

    return grain.MapDataset.range(cfg.steps * count).map(sample).batch(count, drop_remainder=True)


class DataPipeline:
    """Global token batches [global_batch, seq_len + 1] assembled from process-local reads."""

    def __init__(self, cfg: DataConfig, sharding: Any, files: list[Path] | None = None) -> None:
        import grain

        root = None if files else stdlib_root()
        self.source = ByteWindows(files or corpus_files(), cfg.seq_len + 1, root)
        self.sharding = sharding
        self.global_shape = (cfg.global_batch, cfg.seq_len + 1)
        self.rows = process_rows(sharding, self.global_shape)
        dataset = local_dataset(cfg, self.source, self.rows)
        options = grain.ReadOptions(num_threads=cfg.threads, prefetch_buffer_size=2 * cfg.threads)
        self.iterator: Any = dataset.to_iter_dataset(options).__iter__()

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        import jax

        local = next(self.iterator)
        return jax.make_array_from_process_local_data(self.sharding, local, self.global_shape)

    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = self.iterator.get_state()
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        self.iterator.set_state(state)

    @staticmethod
    def state_at_step(step: int) -> dict[str, Any]:
        """The iterator state after `step` steps on any layout: one batch per step, and a
        batch's rows depend only on the step (module docstring). Restores use it when the
        checkpoint holds no state for this process (the job had another number of processes)."""
        return {"next_index": step}
