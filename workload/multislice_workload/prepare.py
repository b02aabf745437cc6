"""`prepare` mode: a corpus -> a tokenizer trained on it + ArrayRecord shards of its tokens.

    python -m multislice_workload prepare --output DIR [--input FILES...] [--vocab_size 4096]

Without `--input` the corpus is one that every CPython ships, so it is the same on every host and
needs no download: the Python Language Reference, as the ``pydoc_data.topics`` module carries it
for ``help()`` (79 documents, about 465 kB of English prose with code), and with
``--corpus python-docs,python-docstrings`` also the docstrings of the standard library's modules
(about 1.8 MB more). `--input` takes JSONL / Parquet (`--text_field`), ArrayRecord text records
or .txt files instead.

The output, read by ``train --dataset DIR``: ``tokenizer.json`` (a byte-level BPE trained on the
train split only; with ``--tokenizer`` a copy of that tokenizer.json, with its
tokenizer_config.json, or SentencePiece ``tokenizer.model``),
``train-0000K-of-0000N.array_record`` and ``eval-00000-of-00001.array_record``
(one record per `chunk_tokens` tokens of the split's stream, `datasets.py`), and ``dataset.json``
(the manifest: vocabulary, token dtype, chunk size, shards, token and document counts, a
fingerprint of the tokens).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from multislice_workload import datasets, logs, tokenizer
from multislice_workload.env import ConfigError

CORPORA = ("python-docs", "python-docstrings")


def python_docs() -> list[str]:
    """The Language Reference topics ``help()`` shows, in a fixed order."""
    from pydoc_data.topics import topics

    return [topics[name] for name in sorted(topics)]


def python_docstrings() -> list[str]:
    """Per standard-library module: its docstrings (module, classes, functions), joined."""
    from multislice_workload.data import corpus_files

    docs = []
    for path in corpus_files():
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        nodes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        parts = [ast.get_docstring(n) for n in ast.walk(tree) if isinstance(n, nodes)]
        text = "\n\n".join(p for p in parts if p)
        if text:
            docs.append(text)
    return docs


def builtin_documents(names: Sequence[str]) -> list[str]:
    readers = {"python-docs": python_docs, "python-docstrings": python_docstrings}
    unknown = [n for n in names if n not in readers]
    if unknown:
        raise ConfigError(f"--corpus {','.join(unknown)}: not one of {', '.join(CORPORA)}")
    return [d for name in names for d in readers[name]()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--output", required=True, help="directory for the tokenizer, shards and manifest")
    add("--input", nargs="*", default=[], help="JSONL/Parquet/ArrayRecord/txt files or globs")
    add("--text_field", default="text", help="JSONL field / Parquet column with the text")
    add("--corpus", default="python-docs", help=f"without --input: any of {', '.join(CORPORA)}")
    add("--vocab_size", type=int, default=4096, help="BPE vocabulary, end-of-text included")
    add(
        "--tokenizer",
        default=None,
        help="use this tokenizer.json or SentencePiece .model instead of training one",
    )
    add("--shards", type=int, default=4, help="ArrayRecord files for the train split")
    add("--chunk_tokens", type=int, default=4096, help="tokens per record")


def write_split(
    out: Path, split: str, tokens: np.ndarray, shards: int, chunk: int, dtype: Any
) -> dict[str, Any]:
    from array_record.python.array_record_module import ArrayRecordWriter

    chunks = [tokens[i : i + chunk].astype(dtype) for i in range(0, len(tokens), chunk)]
    shards = max(1, min(shards, len(chunks)))
    per = -(-len(chunks) // shards)
    entries = []
    for k in range(shards):
        name = f"{split}-{k:05d}-of-{shards:05d}.array_record"
        # group_size:1: every record is its own chunk of the file, so reading one record
        # decompresses only that record (random access, as Grain's ArrayRecord source expects).
        writer = ArrayRecordWriter(str(out / name), "group_size:1")
        mine = chunks[k * per : (k + 1) * per]
        for c in mine:
            writer.write(c.tobytes())
        writer.close()
        entries.append({"file": name, "records": len(mine)})
    return {"shards": entries, "tokens": len(tokens)}


def prepare(
    documents: Sequence[str],
    out: Path,
    *,
    vocab_size: int,
    tokenizer_path: str | None = None,
    shards: int = 4,
    chunk_tokens: int = 4096,
    source: str = "",
) -> dict[str, Any]:
    """Write the tokenizer, shards and manifest of `documents` into `out`; the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    split_docs = {
        s: [d for i, d in enumerate(documents) if datasets.in_split(i, s)] for s in datasets.SPLITS
    }
    if not split_docs["train"] or not split_docs["eval"]:
        raise ConfigError(
            f"{len(documents)} documents: need at least {datasets.EVAL_EVERY} (one in "
            f"{datasets.EVAL_EVERY} is held out for eval)"
        )
    if tokenizer_path:
        given = tokenizer.load_file(tokenizer_path)
        tok: tokenizer.Tokenizer = tokenizer.load(tokenizer.copy_to(given, out))
    else:
        tok = tokenizer.train_bpe(split_docs["train"], vocab_size, out / "tokenizer.json")
    dtype = np.uint16 if tok.vocab_size <= 1 << 16 else np.uint32
    digest = hashlib.sha256(f"{tok.vocab_size}:{chunk_tokens}".encode())
    splits = {}
    for split, docs in split_docs.items():
        tokens = datasets.token_stream(docs, tok)
        digest.update(tokens.astype(np.uint32).tobytes())
        info = write_split(
            out, split, tokens, shards if split == "train" else 1, chunk_tokens, dtype
        )
        splits[split] = {**info, "documents": len(docs)}
    manifest = {
        "format": datasets.FORMAT,
        "source": source,
        "tokenizer": Path(tok.name).name,
        "vocab_size": tok.vocab_size,
        "eos_id": tok.eos_id,
        "dtype": np.dtype(dtype).name,
        "chunk_tokens": chunk_tokens,
        "eval_every": datasets.EVAL_EVERY,
        "splits": splits,
        "fingerprint": digest.hexdigest()[:16],
    }
    (out / datasets.MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def run(args: argparse.Namespace) -> int:
    if args.vocab_size < 257:
        raise ConfigError(
            f"--vocab_size must be >= 257 (the bytes + end-of-text), got {args.vocab_size}"
        )
    if args.shards < 1 or args.chunk_tokens < 1:
        raise ConfigError("--shards and --chunk_tokens must be >= 1")
    if args.input:
        try:
            files = datasets.expand(args.input)
        except FileNotFoundError as err:
            raise ConfigError(f"--input: {err}") from err
        documents = [d for f in files for d in datasets.read_documents(f, args.text_field)]
        source = ",".join(f.name for f in files)
    else:
        names = [n for n in args.corpus.split(",") if n]
        documents = builtin_documents(names)
        source = ",".join(names)
    manifest = prepare(
        documents,
        Path(args.output),
        vocab_size=args.vocab_size,
        tokenizer_path=args.tokenizer,
        shards=args.shards,
        chunk_tokens=args.chunk_tokens,
        source=source,
    )
    logs.emit(
        "prepared",
        output=str(args.output),
        source=source,
        vocab_size=manifest["vocab_size"],
        **{f"{s}_tokens": manifest["splits"][s]["tokens"] for s in datasets.SPLITS},
        **{f"{s}_documents": manifest["splits"][s]["documents"] for s in datasets.SPLITS},
        fingerprint=manifest["fingerprint"],
    )
    return 0
