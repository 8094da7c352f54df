"""Tokenizers: raw bytes, or a byte-level BPE trained on the corpus with the ``tokenizers`` library.

Both expose ``vocab_size``, ``eot_id`` (the end-of-document token inserted between files),
``encode_batch(texts) -> list[list[int]]`` and ``decode(ids) -> str``. A trained BPE is saved as JSON and
reloaded from the cache; nothing is fetched from a hub.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable

EOT = "<|endoftext|>"


class ByteTokenizer:
    """UTF-8 bytes as tokens (vocab 256); byte 0 (NUL, absent from text corpora) marks end of document."""

    vocab_size = 256
    eot_id = 0
    name = "bytes"

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        return [list(t.encode("utf-8")) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(int(i) for i in ids if int(i) != self.eot_id).decode("utf-8", errors="replace")


class BPETokenizer:
    """Byte-level BPE (GPT-2 style pre-tokenisation) backed by a ``tokenizers.Tokenizer``."""

    def __init__(self, tok) -> None:
        self._tok = tok
        self.vocab_size = tok.get_vocab_size()
        self.eot_id = tok.token_to_id(EOT)
        self.name = f"bpe{self.vocab_size}"

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts))]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids])

    def save(self, path: str) -> None:
        self._tok.save(path)

    @classmethod
    def load(cls, path: str) -> BPETokenizer:
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(path))


def train_bpe(texts: Iterable[str], vocab_size: int) -> BPETokenizer:
    """Train a byte-level BPE with ``vocab_size`` tokens (in [258, 65535]) on ``texts``.

    The initial alphabet is all 256 byte symbols, plus the special token ``<|endoftext|>``, so any text is
    encodable. Deterministic for a given input order. Raises ``ValueError`` for a vocab size out of range.
    """
    from spectrakit._checks import check_int  # (here: parsing a tokenizer name needs no torch)

    check_int(vocab_size, "vocab_size", low=258, high=65535)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    return BPETokenizer(tok)


def parse_tokenizer(spec: str) -> tuple[str, int]:
    """``"bytes"`` -> ("bytes", 256); ``"bpeN"`` -> ("bpe", N) with N in [258, 65535]; else ``ValueError``."""
    if spec == "bytes":
        return "bytes", 256
    if spec.startswith("bpe") and spec[3:].isdigit():
        n = int(spec[3:])
        if not 258 <= n <= 65535:  # (a plain check: parsing a tokenizer name needs no torch)
            raise ValueError(f"tokenizer vocab size must be an int in [258, 65535], got {n}")
        return "bpe", n
    raise ValueError(
        f"tokenizer must be 'bytes' or 'bpeN' with N in [258, 65535] (e.g. 'bpe4096'), got {spec!r}"
    )


def load_or_train(spec: str, texts_fn, cache_path: str | None):
    """Tokenizer from ``spec`` (see :func:`parse_tokenizer`); a BPE is loaded from ``cache_path`` if it
    exists, else trained on ``texts_fn()`` and saved there."""
    kind, n = parse_tokenizer(spec)
    if kind == "bytes":
        return ByteTokenizer()
    if cache_path and os.path.exists(cache_path):
        return BPETokenizer.load(cache_path)
    tok = train_bpe(texts_fn(), n)
    if cache_path:
        os.makedirs(os.path.dirname(cache_path), exist_ok=True)
        tmp = cache_path + f".tmp{os.getpid()}"
        tok.save(tmp)
        os.replace(tmp, cache_path)
    return tok


def tokenizer_name(text: str) -> str:
    """argparse ``type=`` for ``--tokenizer``: ``bytes`` or ``bpeN`` with N in [258, 65535]."""
    try:
        parse_tokenizer(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).replace("tokenizer must be", "expected")) from None
    return text
