"""Tokenizers: a Hugging Face `tokenizers` file (``tokenizer.json``), a SentencePiece model
(``tokenizer.model``: Llama 2, Gemma, T5 ship one), or bytes when none is given.

`prepare` trains a byte-level BPE (GPT-2's pre-tokenization: every byte sequence encodes, no
unknown token) on the corpus it prepares and saves it beside the shards; `train` loads it from
the file. The model's vocabulary is always the tokenizer's (`vocab_size`), padded by the model to
a multiple of 128 (`model.padded_vocab`), never a constant; so is the end-of-text id (`eos_id`)
that ends every document in the token stream and bounds the packed segments
(`model.segments`): SentencePiece's own ``eos_id()``; for a JSON tokenizer the ``eos_token`` of
the ``tokenizer_config.json`` beside it (what ``transformers`` reads; Llama 3's is
``<|end_of_text|>``), else its one special token among the usual end-of-text spellings.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

END_OF_TEXT = "<|endoftext|>"  # the document separator of the BPE `prepare` trains
# Special tokens that end a document in common JSON tokenizers without a tokenizer_config.json:
# GPT-2 and ours, Llama 3, Llama 2 / Mistral / T5, Gemma.
EOS_SPELLINGS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")
CONFIG = "tokenizer_config.json"  # Hugging Face's, beside tokenizer.json


class Tokenizer(Protocol):
    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_id(self) -> int: ...

    @property
    def name(self) -> str: ...

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes 0..255 and one end-of-text id (256)."""

    name = "bytes"

    @property
    def vocab_size(self) -> int:
        return 257

    @property
    def eos_id(self) -> int:
        return 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A `tokenizers.Tokenizer` loaded from its JSON file."""

    def __init__(self, tokenizer: Any, name: str, eos_token: str | None = None) -> None:
        self._tok = tokenizer
        self.name = name
        self.eos_token = eos_token or _special_eos(tokenizer, name)
        eos = tokenizer.token_to_id(self.eos_token)
        if eos is None:
            raise ValueError(f"tokenizer {name}: its eos_token {self.eos_token!r} is not a token")
        self._eos = int(eos)

    @classmethod
    def load(cls, path: str | Path) -> HFTokenizer:
        from tokenizers import Tokenizer as Tok

        return cls(Tok.from_file(str(path)), str(path), _configured_eos(Path(path)))

    @property
    def files(self) -> list[Path]:
        config = Path(self.name).with_name(CONFIG)
        return [Path(self.name), *([config] if config.is_file() else [])]

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    @property
    def eos_id(self) -> int:
        return self._eos

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text).ids)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(e.ids) for e in self._tok.encode_batch(list(texts))]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids)))


def _configured_eos(path: Path) -> str | None:
    """The ``eos_token`` of the tokenizer_config.json beside `path` (a string, or an added
    token's {"content": ...}), None without one."""
    config = path.with_name(CONFIG)
    if not config.is_file():
        return None
    eos = json.loads(config.read_text(encoding="utf-8")).get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    return str(eos) if eos else None


def _special_eos(tokenizer: Any, name: str) -> str:
    """The one special token of `tokenizer` spelled as an end-of-text (EOS_SPELLINGS)."""
    special = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}
    found = [t for t in EOS_SPELLINGS if t in special]
    if len(found) != 1:
        raise ValueError(
            f"tokenizer {name}: cannot tell its end-of-text token (special tokens among "
            f'{list(EOS_SPELLINGS)}: {found}); put a {CONFIG} with "eos_token" beside it'
        )
    return found[0]


class SentencePieceTokenizer:
    """A SentencePiece model file; its end-of-text id is the model's ``eos_id()``."""

    def __init__(self, path: str | Path) -> None:
        import sentencepiece as spm

        self.name = str(path)
        self._sp = spm.SentencePieceProcessor(model_file=str(path))
        self._eos = int(self._sp.eos_id())
        if self._eos < 0:
            raise ValueError(
                f"SentencePiece model {path} has no eos piece (trained with eos_id=-1): "
                "documents could not be separated"
            )

    @property
    def files(self) -> list[Path]:
        return [Path(self.name)]

    @property
    def vocab_size(self) -> int:
        return int(self._sp.get_piece_size())

    @property
    def eos_id(self) -> int:
        return self._eos

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self._sp.encode(text)]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [[int(i) for i in ids] for ids in self._sp.encode(list(texts))]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._sp.decode([int(i) for i in ids]))


FILE_NAMES = ("tokenizer.json", "tokenizer.model")  # looked for, in order, in a directory


def load(path: str | Path | None) -> Tokenizer:
    """The tokenizer in `path` (a ``tokenizer.json``, a SentencePiece ``.model``, or a directory
    holding one), bytes when None."""
    return ByteTokenizer() if path is None else load_file(path)


def load_file(path: str | Path) -> HFTokenizer | SentencePieceTokenizer:
    """`load` of a file or a directory."""
    p = Path(path)
    if p.is_dir():
        p = next((p / n for n in FILE_NAMES if (p / n).is_file()), p / FILE_NAMES[0])
    if not p.is_file():
        raise FileNotFoundError(f"no tokenizer file at {p} (run `prepare`, or pass --tokenizer)")
    with p.open("rb") as handle:
        json_file = handle.read(1).lstrip() == b"{" or p.suffix == ".json"
    return HFTokenizer.load(p) if json_file else SentencePieceTokenizer(p)


def copy_to(tok: HFTokenizer | SentencePieceTokenizer, out: Path) -> Path:
    """Copy the tokenizer's files into directory `out` under their usual names (the JSON one as
    tokenizer.json with its tokenizer_config.json, a SentencePiece model as tokenizer.model);
    the path to load."""
    out.mkdir(parents=True, exist_ok=True)
    main = out / FILE_NAMES[0 if isinstance(tok, HFTokenizer) else 1]
    for source in tok.files:
        target = main if source == Path(tok.name) else out / source.name
        if source.resolve() != target.resolve():
            shutil.copyfile(source, target)
    return main


def train_bpe(texts: Iterable[str], vocab_size: int, out: Path) -> HFTokenizer:
    """Train a byte-level BPE with `vocab_size` entries (end-of-text included) on `texts`; save
    it to `out` and return it loaded from that file (what `train` will read)."""
    from tokenizers import Tokenizer as Tok
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = Tok(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out))
    return HFTokenizer.load(out)
