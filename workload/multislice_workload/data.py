"""The default corpus: byte-level tokens of the Python standard library's own source.

The corpus needs no download and is the same on every host of one image: the ``.py`` files under
``sysconfig.get_path("stdlib")`` (tests and installed packages excluded), in sorted order, each cut
into non-overlapping windows of ``seq_len + 1`` bytes (inputs and next-byte targets).

Batches, shuffling and the checkpointed position are `datasets.GlobalBatches`', as for every
other source: the global batch of step s is the same windows on any layout, so ``dcn.pipeline=2``
and ``dcn.data=2`` train on the same data.
"""

from __future__ import annotations

import bisect
import hashlib
import sysconfig
from pathlib import Path

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
