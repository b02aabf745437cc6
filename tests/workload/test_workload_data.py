"""Real data: the prepared corpus (ArrayRecord shards + a BPE tokenizer trained on it), JSONL /
Parquet / ArrayRecord text inputs, and the global batch iterator whose state is a global example
index (the same on every process, whatever the process count)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from multislice_workload import datasets, prepare, tokenizer
from multislice_workload.mesh import MESH_AXES
from multislice_workload.partitioning import named

VOCAB = 1024


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("prepared")
    docs = prepare.builtin_documents(["python-docs"])
    prepare.prepare(docs, out, vocab_size=VOCAB, shards=3, chunk_tokens=1000, source="test")
    return out


def test_the_builtin_corpus_is_the_language_reference_every_cpython_ships() -> None:
    docs = prepare.python_docs()
    assert len(docs) > 50 and sum(map(len, docs)) > 300_000
    assert any(d.startswith('The "assert" statement') for d in docs)


def test_prepare_writes_shards_a_tokenizer_and_a_manifest(prepared: Path) -> None:
    manifest = json.loads((prepared / datasets.MANIFEST).read_text())
    tok = tokenizer.load(prepared)
    assert tok.vocab_size == manifest["vocab_size"] == VOCAB  # read from the tokenizer file
    assert manifest["dtype"] == "uint16"
    train, held_out = manifest["splits"]["train"], manifest["splits"]["eval"]
    assert [s["file"] for s in train["shards"]] == [
        f"train-{k:05d}-of-00003.array_record" for k in range(3)
    ]
    assert all((prepared / s["file"]).is_file() for s in train["shards"] + held_out["shards"])
    docs = prepare.python_docs()
    assert train["documents"] + held_out["documents"] == len(docs)
    assert held_out["documents"] == len(docs) // datasets.EVAL_EVERY
    # Every record is one chunk; the tokens on disk are the stream of the train documents.
    stream = datasets.ChunkedArrayRecord(prepared, manifest, "train")
    expected = datasets.token_stream(
        [d for i, d in enumerate(docs) if datasets.in_split(i, "train")], tok
    )
    assert stream.tokens == len(expected) == train["tokens"]
    np.testing.assert_array_equal(stream.read(0, stream.tokens), expected)
    np.testing.assert_array_equal(stream.read(995, 10), expected[995:1005])  # across records


def test_the_bpe_tokenizer_round_trips_and_compresses(prepared: Path) -> None:
    tok = tokenizer.load(prepared)
    text = 'The "assert" statement: assert_stmt ::= "assert" expression ["," expression]'
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert len(ids) < len(text.encode()) / 2  # a trained vocabulary, not bytes
    assert tok.encode(tokenizer.END_OF_TEXT) == [tok.eos_id]  # the document separator


def test_windows_of_a_prepared_split_are_real_text(prepared: Path) -> None:
    tok = tokenizer.load(prepared)
    spec = datasets.DatasetSpec((str(prepared),))
    train = datasets.open_windows(spec, tok, 65, "train")
    held_out = datasets.open_windows(spec, tok, 65, "eval")
    assert len(train) > 10 * len(held_out) > 0
    assert train[0].dtype == np.int32 and train[0].shape == (65,)
    docs = [d for i, d in enumerate(prepare.python_docs()) if datasets.in_split(i, "train")]
    text = tok.decode(list(train[1]))
    assert len(text) > 100 and text in docs[0]  # a window is a stretch of a real document
    assert train.fingerprint != held_out.fingerprint
    other = tokenizer.ByteTokenizer()
    with pytest.raises(ValueError, match="vocabulary of 1024"):
        datasets.open_windows(spec, other, 65, "train")


def write_inputs(tmp_path: Path, docs: list[str]) -> dict[str, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from array_record.python.array_record_module import ArrayRecordWriter

    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs)))
    parquet = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"text": docs}), parquet)
    records = tmp_path / "docs.array_record"
    writer = ArrayRecordWriter(str(records), "group_size:1")
    for d in docs:
        writer.write(d.encode())
    writer.close()
    return {"jsonl": jsonl, "parquet": parquet, "array_record": records}


def test_jsonl_parquet_and_arrayrecord_text_give_the_prepared_tokens(
    prepared: Path, tmp_path: Path
) -> None:
    docs = prepare.python_docs()[:30]
    inputs = write_inputs(tmp_path, docs)
    for path in inputs.values():
        assert datasets.read_documents(path) == docs, path.name
    tok = tokenizer.load(prepared)
    out = tmp_path / "from-jsonl"
    prepare.prepare(
        datasets.read_documents(inputs["jsonl"]),
        out,
        vocab_size=VOCAB,
        tokenizer_path=str(prepared / "tokenizer.json"),
    )
    from_prepared = datasets.open_windows(datasets.DatasetSpec((str(out),)), tok, 33, "eval")
    for kind, path in inputs.items():
        raw = datasets.open_windows(datasets.DatasetSpec((str(path),)), tok, 33, "eval")
        assert len(raw) == len(from_prepared) > 0, kind
        for i in range(len(raw)):
            np.testing.assert_array_equal(raw[i], from_prepared[i], err_msg=kind)


def test_a_missing_text_field_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"body": "x"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: no field 'text' \(--text_field\)"):
        datasets.read_documents(path)


# --- Tokenizers other than ours: the end-of-text id is the tokenizer's. ------------------------

DOCS = [f"document {i}: the quick brown fox jumps over the lazy dog {i % 7}." for i in range(40)]


def sentencepiece_model(path: Path) -> Path:
    """A tiny SentencePiece model trained here (sentencepiece's trainer, no download); its
    pieces 0..3 are unk, bos, eos, pad (eos 2 by default)."""
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(DOCS), model_writer=model, vocab_size=48, pad_id=3,
        minloglevel=2,
    )  # fmt: skip
    path.write_bytes(model.getvalue())
    return path


def llama3_style_json(directory: Path, config: bool) -> Path:
    """A JSON tokenizer whose document separator is Llama 3's ``<|end_of_text|>``, named by a
    tokenizer_config.json beside it (`config`) or only a special token."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    tok.train_from_iterator(
        DOCS,
        trainers.BpeTrainer(
            vocab_size=300, special_tokens=specials, show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )  # fmt: skip
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    if config:
        (directory / "tokenizer_config.json").write_text(
            json.dumps({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"})
        )
    return directory / "tokenizer.json"


def test_a_sentencepiece_model_loads_with_its_own_eos(tmp_path: Path) -> None:
    import sentencepiece as spm

    path = sentencepiece_model(tmp_path / "sp.model")
    tok = tokenizer.load(path)
    reference = spm.SentencePieceProcessor(model_file=str(path))
    assert tok.vocab_size == reference.get_piece_size() == 48
    assert tok.eos_id == reference.eos_id() == 2
    assert tok.decode(tok.encode(DOCS[0])) == DOCS[0]
    stream = datasets.token_stream(DOCS[:2], tok)
    first = len(tok.encode(DOCS[0]))
    assert stream[first] == 2 and stream[-1] == 2 and list(stream).count(2) == 2


@pytest.mark.parametrize("config", [True, False])
def test_a_llama3_style_json_tokenizer_ends_documents_with_its_eos(
    tmp_path: Path, config: bool
) -> None:
    tok = tokenizer.load(llama3_style_json(tmp_path / "llama3", config))
    assert tok.eos_id == 1  # <|end_of_text|>, not GPT-2's <|endoftext|> (absent)
    assert datasets.token_stream(DOCS[:1], tok)[-1] == 1


def test_a_json_tokenizer_whose_eos_cannot_be_told_is_refused(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models

    bare = tmp_path / "tokenizer.json"
    Tokenizer(models.BPE()).save(str(bare))
    with pytest.raises(ValueError, match=r'tokenizer_config\.json with "eos_token"'):
        tokenizer.load(bare)


@pytest.mark.parametrize("kind", ["sentencepiece", "llama3"])
def test_train_and_prepare_run_with_another_tokenizer(tmp_path: Path, kind: str) -> None:
    """A job whose --tokenizer is a SentencePiece model or a Llama-3-style tokenizer.json trains
    (it exited 78: no '<|endoftext|>'), and `prepare --tokenizer` keeps that tokenizer."""
    from tests.workload.test_workload_cli import TINY, run_workload

    if kind == "sentencepiece":
        path = sentencepiece_model(tmp_path / "tokenizer.model")
    else:
        path = llama3_style_json(tmp_path / "llama3", config=True)
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    tok = tokenizer.load(path)
    args = ["train", *TINY, "--seq_len", "8", "--steps", "2", "--tokenizer", str(path)]
    code, events, stderr = run_workload([*args, "--dataset", str(data)], timeout=600)
    assert code == 0, stderr[-3000:]
    config = next(e for e in events if e["event"] == "train_config")
    assert config["vocab_size"] == tok.vocab_size and config["tokenizer"] == str(path)
    assert config["eos_id"] == tok.eos_id
    out = tmp_path / "prepared"
    prepare.prepare(DOCS, out, vocab_size=0, tokenizer_path=str(path))
    again = tokenizer.load(out)
    assert (again.vocab_size, again.eos_id) == (tok.vocab_size, tok.eos_id)


# --- The global batch iterator. --------------------------------------------------------------


def mesh(shape: tuple[int, int, int, int]) -> Any:
    import jax

    count = int(np.prod(shape))
    return jax.sharding.Mesh(np.array(jax.devices()[:count]).reshape(shape), MESH_AXES)


class _Windows:
    window = 5
    fingerprint = "ramp"

    def __len__(self) -> int:
        return 1000

    def __getitem__(self, index: int) -> np.ndarray:
        return np.full(5, int(index) % 1000, np.int32)


def test_local_rows_need_not_be_contiguous() -> None:
    class Device:
        def __init__(self, process_index: int) -> None:
            self.process_index = process_index

    a, b, c = Device(0), Device(0), Device(1)

    class Sharding:
        def devices_indices_map(self, shape: tuple[int, ...]) -> dict[Any, Any]:
            rows = {a: (0, 2), b: (4, 6), c: (2, 4)}
            return {d: (slice(*r), slice(None)) for d, r in rows.items()}

    assert datasets.local_rows(Sharding(), (8, 5), process_index=0) == [0, 1, 4, 5]
    assert datasets.local_rows(Sharding(), (8, 5), process_index=1) == [2, 3]


def test_batches_and_their_position_are_the_same_on_any_layout() -> None:
    """The global batch of each step and the saved state do not depend on the mesh, so a
    checkpoint of one layout (or process count) resumes on another."""
    layouts = [(1, 1, 8, 1), (1, 2, 2, 2), (2, 1, 1, 1)]
    runs = []
    for shape in layouts:
        m = mesh(shape)
        it = datasets.GlobalBatches(_Windows(), 8, named(m, ("batch", None)), seed=3, threads=2)
        batches = [np.asarray(next(it)) for _ in range(3)]
        runs.append((batches, it.get_state()))
    for batches, state in runs[1:]:
        assert state == runs[0][1] == {"next_example": 24}
        for got, want in zip(batches, runs[0][0], strict=True):
            np.testing.assert_array_equal(got, want)
    first = runs[0][0][0][:, 0]
    assert len(set(first.tolist())) == 8 and sorted(first) != list(range(8))  # shuffled


def test_set_state_resumes_at_the_global_example() -> None:
    m = mesh((1, 1, 4, 1))
    sharding = named(m, ("batch", None))
    first = datasets.GlobalBatches(_Windows(), 8, sharding, seed=0, threads=2)
    next(first), next(first)
    state = first.get_state()
    expected = [np.asarray(next(first)) for _ in range(3)]
    second = datasets.GlobalBatches(_Windows(), 8, sharding, seed=0, threads=0)
    second.set_state(state)
    for batch in expected:
        got = next(second)
        assert got.shape == (8, 5) and tuple(got.sharding.spec) == (
            ("pipeline", "data", "fsdp"),
            None,
        )
        np.testing.assert_array_equal(np.asarray(got), batch)
    # Another global batch size resumes from the same example (an elastic resize).
    wider = datasets.GlobalBatches(_Windows(), 16, sharding, seed=0, threads=0)
    wider.set_state(state)
    np.testing.assert_array_equal(np.asarray(next(wider))[:8], expected[0])


def test_eval_batches_are_in_order() -> None:
    m = mesh((1, 1, 2, 1))
    it = datasets.GlobalBatches(_Windows(), 4, named(m, ("batch", None)), 0, shuffle=False)
    np.testing.assert_array_equal(np.asarray(next(it))[:, 0], [0, 1, 2, 3])
