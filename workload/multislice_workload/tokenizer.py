"""Tokenizers: a Hugging Face `tokenizers` file (``tokenizer.json``), or bytes when none is given.

`prepare` trains a byte-level BPE (GPT-2's pre-tokenization: every byte sequence encodes, no
unknown token) on the corpus it prepares and saves it beside the shards; `train` loads it from
the file. The model's vocabulary is always the tokenizer's (`vocab_size`), padded by the model to
a multiple of 128 (`model.padded_vocab`), never a constant.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

END_OF_TEXT = "<|endoftext|>"  # separates documents in the token stream


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

    def __init__(self, tokenizer: Any, name: str) -> None:
        self._tok = tokenizer
        self.name = name
        eos = tokenizer.token_to_id(END_OF_TEXT)
        if eos is None:
            raise ValueError(f"tokenizer {name} has no {END_OF_TEXT!r} token (document separator)")
        self._eos = int(eos)

    @classmethod
    def load(cls, path: str | Path) -> HFTokenizer:
        from tokenizers import Tokenizer as Tok

        return cls(Tok.from_file(str(path)), str(path))

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


def load(path: str | Path | None) -> Tokenizer:
    """The tokenizer in `path` (a ``tokenizer.json``), bytes when None."""
    if path is None:
        return ByteTokenizer()
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise FileNotFoundError(f"no tokenizer file at {p} (run `prepare`, or pass --tokenizer)")
    return HFTokenizer.load(p)


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
