"""Training data: token windows from a prepared ArrayRecord dataset, JSONL, Parquet, ArrayRecord
text records, or (the default) the bytes of the standard library's source (`data.py`).

Every source is a token stream: documents tokenized, each followed by the end-of-text token, one
after the other. Example i is the window ``[i x W, (i + 1) x W)`` of that stream (W = seq_len + 1,
inputs and next-token targets; packed: the model masks attention to each document, the
segments it derives from the end-of-text tokens, `model.segments`). A
prepared dataset (`prepare.py`) stores the stream in fixed-size chunks, one ArrayRecord record
each, so a window is one or two record reads and no index is built at start-up; JSONL, Parquet
and text-record ArrayRecord files are tokenized in memory at start-up by every process (for a
large corpus, `prepare` it once instead).

Held-out data: document d is in the ``eval`` split when ``d % EVAL_EVERY == EVAL_EVERY - 1``,
for every format, so prepared and raw files split alike.

Position, not per-process state. The global batch of a step holds the examples
``n .. n + B - 1`` of a seeded shuffle of the windows (reshuffled every epoch), n the *global*
position. A process reads only the rows its devices hold, and its copy of the iterator state is
``{"next_example": n}``: the same on every process, whatever the process count or layout. A run
resumed on another number of slices (or another batch size) continues from example n.
"""

from __future__ import annotations

import bisect
import dataclasses
import glob
import hashlib
import json
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from multislice_workload.tokenizer import Tokenizer

MANIFEST = "dataset.json"
FORMAT = "multislice-tokens/1"
EVAL_EVERY = 10  # one document in 10 is held out
SPLITS = ("train", "eval")


def in_split(document: int, split: str) -> bool:
    held_out = document % EVAL_EVERY == EVAL_EVERY - 1
    return held_out if split == "eval" else not held_out


class Windows(Protocol):
    """Random access to fixed-length token windows."""

    window: int
    fingerprint: str

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> np.ndarray: ...


# --- Token streams. --------------------------------------------------------------------------


class StreamWindows:
    """Windows over a token stream held by `read(start, length)`."""

    def __init__(self, tokens: int, window: int, fingerprint: str, reader: Any) -> None:
        self.window = window
        self._len = tokens // window
        self._read = reader
        self.fingerprint = hashlib.sha256(f"{fingerprint}:{window}".encode()).hexdigest()[:16]
        if not self._len:
            raise ValueError(f"the dataset holds {tokens} tokens: not one window of {window}")

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> np.ndarray:
        start = (int(index) % self._len) * self.window
        out: np.ndarray = self._read(start, self.window)
        return out


def in_memory(tokens: np.ndarray, window: int, fingerprint: str) -> StreamWindows:
    def read(start: int, length: int) -> np.ndarray:
        return tokens[start : start + length].astype(np.int32)

    return StreamWindows(len(tokens), window, fingerprint, read)


def token_stream(documents: Sequence[str], tokenizer: Tokenizer) -> np.ndarray:
    """The documents' tokens, each document followed by end-of-text."""
    parts = [
        np.asarray([*ids, tokenizer.eos_id], np.int32) for ids in tokenizer.encode_batch(documents)
    ]
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)


@dataclasses.dataclass(frozen=True)
class Shard:
    file: str
    records: int


class ChunkedArrayRecord:
    """A prepared split: the token stream in chunks of `chunk` tokens, one record per chunk (the
    last record of the split may be shorter), records numbered across the shards in order."""

    def __init__(self, root: Path, manifest: dict[str, Any], split: str) -> None:
        info = manifest["splits"][split]
        self.chunk = int(manifest["chunk_tokens"])
        self.tokens = int(info["tokens"])
        self.dtype = np.dtype(manifest["dtype"])
        self._paths = [str(root / s["file"]) for s in info["shards"]]
        self._starts: list[int] = []
        total = 0
        for s in info["shards"]:
            self._starts.append(total)
            total += int(s["records"])
        self._readers: dict[int, Any] = {}
        self._lock = threading.Lock()  # Grain's threads share the readers

    def _reader(self, shard: int) -> Any:
        from array_record.python.array_record_module import ArrayRecordReader

        with self._lock:
            if shard not in self._readers:
                self._readers[shard] = ArrayRecordReader(
                    self._paths[shard], "readahead_buffer_size:0"
                )
            return self._readers[shard]

    def record(self, index: int) -> np.ndarray:
        shard = bisect.bisect_right(self._starts, index) - 1
        data = self._reader(shard).read([index - self._starts[shard]])[0]
        return np.frombuffer(data, self.dtype)

    def read(self, start: int, length: int) -> np.ndarray:
        first, last = start // self.chunk, (start + length - 1) // self.chunk
        joined = np.concatenate([self.record(c) for c in range(first, last + 1)])
        offset = start - first * self.chunk
        return joined[offset : offset + length].astype(np.int32)


def read_manifest(root: Path) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads((root / MANIFEST).read_text())
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{root / MANIFEST}: format {manifest.get('format')!r}, not {FORMAT!r}")
    return manifest


# --- Raw documents. -------------------------------------------------------------------------


def read_documents(path: Path, text_field: str = "text") -> list[str]:
    """The text documents of one JSONL, Parquet or ArrayRecord (UTF-8 records) file."""
    name = path.name
    if name.endswith((".jsonl", ".json")):
        docs = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                row = json.loads(line)
                if text_field not in row:
                    raise ValueError(f"{path}:{n}: no field {text_field!r} (--text_field)")
                docs.append(str(row[text_field]))
        return docs
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq

        table = pq.read_table(path, columns=[text_field])
        return [str(t) for t in table.column(text_field).to_pylist()]
    if ".array_record" in name:
        from array_record.python.array_record_module import ArrayRecordReader

        reader = ArrayRecordReader(str(path))
        try:
            return [r.decode("utf-8") for r in reader.read_all()]
        finally:
            reader.close()
    if name.endswith(".txt"):
        return [path.read_text(encoding="utf-8")]
    raise ValueError(f"{path}: unknown format (.jsonl, .parquet, .array_record, .txt)")


def expand(paths: Sequence[str]) -> list[Path]:
    """Files named, or matched by a glob, or inside a directory, in sorted order."""
    out: list[Path] = []
    for spec in paths:
        p = Path(spec)
        if p.is_dir():
            out += sorted(q for q in p.iterdir() if q.is_file() and q.name != MANIFEST)
        elif any(c in spec for c in "*?["):
            out += sorted(Path(m) for m in glob.glob(spec) if Path(m).is_file())
        elif p.is_file():
            out.append(p)
        else:
            raise FileNotFoundError(f"no dataset file {spec}")
    if not out:
        raise FileNotFoundError(f"no dataset files in {list(paths)}")
    return out


def files_fingerprint(files: Sequence[Path], tokenizer: Tokenizer, split: str) -> str:
    digest = hashlib.sha256(f"{tokenizer.name}:{tokenizer.vocab_size}:{split}".encode())
    for f in files:
        digest.update(f"{f.name}:{f.stat().st_size}\n".encode())
    return digest.hexdigest()[:16]


# --- Opening a dataset. -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """What `--dataset` names: None for the stdlib bytes, else a prepared directory or files."""

    paths: tuple[str, ...] = ()
    text_field: str = "text"

    @property
    def prepared(self) -> Path | None:
        if len(self.paths) == 1 and (Path(self.paths[0]) / MANIFEST).is_file():
            return Path(self.paths[0])
        return None


def open_windows(spec: DatasetSpec, tokenizer: Tokenizer, window: int, split: str) -> Windows:
    """The windows of one split of the dataset, tokenized with `tokenizer`."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r} is not one of {SPLITS}")
    if not spec.paths:
        return stdlib_windows(window, split)
    root = spec.prepared
    if root is not None:
        manifest = read_manifest(root)
        if manifest["vocab_size"] != tokenizer.vocab_size:
            raise ValueError(
                f"{root} was tokenized with a vocabulary of {manifest['vocab_size']}, the "
                f"tokenizer {tokenizer.name} has {tokenizer.vocab_size} (--tokenizer)"
            )
        stream = ChunkedArrayRecord(root, manifest, split)
        fingerprint = f"{manifest['fingerprint']}:{split}"
        return StreamWindows(stream.tokens, window, fingerprint, stream.read)
    files = expand(spec.paths)
    docs = [d for f in files for d in read_documents(f, spec.text_field)]
    chosen = [d for i, d in enumerate(docs) if in_split(i, split)]
    return in_memory(
        token_stream(chosen, tokenizer), window, files_fingerprint(files, tokenizer, split)
    )


def stdlib_windows(window: int, split: str) -> Windows:
    from multislice_workload.data import ByteWindows, corpus_files, stdlib_root

    files = [f for i, f in enumerate(corpus_files()) if in_split(i, split)]
    return ByteWindows(files, window, stdlib_root())


# --- The global batch iterator. ------------------------------------------------------------------


def local_rows(
    sharding: Any, global_shape: tuple[int, ...], process_index: int | None = None
) -> list[int]:
    """The rows of the global batch held by the devices of process `process_index` (default:
    this one), sorted. Any layout: on TPU hosts the rows are rarely one block (a host of 2x2
    chips holds two rows of the torus, and the mesh's physical order spreads them over the
    batch); devices replicated over other axes hold the same rows, counted once."""
    import jax

    process = jax.process_index() if process_index is None else process_index
    rows: set[int] = set()
    for device, index in sharding.devices_indices_map(global_shape).items():
        if device.process_index == process:
            rows.update(range(*index[0].indices(global_shape[0])))
    return sorted(rows)


def row_ranges(rows: Sequence[int]) -> list[tuple[int, int]]:
    """[lo, hi) runs of consecutive rows, for logs."""
    out: list[tuple[int, int]] = []
    for row in rows:
        if out and out[-1][1] == row:
            out[-1] = (out[-1][0], row + 1)
        else:
            out.append((row, row + 1))
    return out


def device_blocks(
    sharding: Any, global_shape: tuple[int, ...], rows: Sequence[int], process_index: int | None
) -> dict[Any, tuple[list[int], slice]]:
    """For each device of the process, where its shard lies in the process-local batch (whose
    row i is global row ``rows[i]``): the local row positions and the column slice."""
    import jax

    process = jax.process_index() if process_index is None else process_index
    position = {r: i for i, r in enumerate(rows)}
    return {
        device: ([position[r] for r in range(*index[0].indices(global_shape[0]))], index[1])
        for device, index in sharding.devices_indices_map(global_shape).items()
        if device.process_index == process
    }


class GlobalBatches:
    """Global batches [global_batch, window] of a shuffled `Windows`, from process-local reads.

    `shuffle=False` reads the examples in order (the eval batches: the same ones every time)."""

    def __init__(
        self,
        windows: Windows,
        global_batch: int,
        sharding: Any,
        seed: int,
        *,
        shuffle: bool = True,
        threads: int = 2,
    ) -> None:
        import grain

        self.source = windows
        self.global_batch = global_batch
        self.sharding = sharding
        self.global_shape = (global_batch, windows.window)
        self.rows = local_rows(sharding, self.global_shape)
        self._blocks = device_blocks(sharding, self.global_shape, self.rows, None)
        self._examples = grain.MapDataset.source(windows)
        if shuffle:
            self._examples = self._examples.shuffle(seed=seed)
        self._examples = self._examples.repeat()
        self._options = grain.ReadOptions(num_threads=threads, prefetch_buffer_size=2 * threads)
        self._threads = threads
        self.set_state({"next_example": 0})

    @property
    def fingerprint(self) -> str:
        return self.source.fingerprint

    def local_batch(self, first: int) -> np.ndarray:
        return np.stack([np.asarray(self._examples[first + r]) for r in self.rows])

    def set_state(self, state: dict[str, Any]) -> None:
        """Continue from global example `next_example` (what `get_state` returned anywhere)."""
        import grain

        self._first = int(state["next_example"])
        self._taken = 0
        first, batch = self._first, self.global_batch
        steps = grain.MapDataset.range(1 << 40).map(lambda k: self.local_batch(first + k * batch))
        self._iter: Iterator[np.ndarray] = (
            iter(steps.to_iter_dataset(self._options)) if self._threads else iter(steps)
        )

    def get_state(self) -> dict[str, Any]:
        return {"next_example": self._first + self._taken * self.global_batch}

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        local = next(self._iter)
        self._taken += 1
        return self.to_global(local)

    def to_global(self, local: np.ndarray) -> Any:
        """Each device gets its rows of the local batch (its slice of the global rows)."""
        import jax

        arrays = [
            jax.device_put(local[positions][:, columns], device)
            for device, (positions, columns) in self._blocks.items()
        ]
        return jax.make_array_from_single_device_arrays(self.global_shape, self.sharding, arrays)
