"""Tokenise a corpus once into memory-mapped ``uint16`` token files with a held-out validation split.

Layout under the cache folder (``$SPECTRAKIT_CACHE`` or ``~/.cache/spectrakit``)::

    <cache>/<corpus>-<hash>/<tokenizer>/{train.bin, val.bin, meta.json}   (+ tokenizer.json for BPE)

``<hash>`` is a digest of the corpus' file list (paths and sizes), so an updated package re-tokenises.
Documents are the corpus files (files larger than ``chunk_bytes`` are cut into chunks at line breaks, so a
one-file corpus such as a dictionary still has a validation split); each document is followed by the
tokenizer's end-of-document token. A document goes to ``val.bin`` when
:func:`spectrakit.data.corpora.is_validation` says so for its relative path (split by file, never by
position inside a file).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import numpy as np

from spectrakit._checks import check_scalar
from spectrakit.data.corpora import corpus_files, is_validation, read_text
from spectrakit.data.tokenizer import load_or_train, parse_tokenizer


def cache_dir() -> str:
    """``$SPECTRAKIT_CACHE`` if set, else ``~/.cache/spectrakit``."""
    return os.environ.get("SPECTRAKIT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "spectrakit")


@dataclasses.dataclass
class TokenSplits:
    """Memory-mapped token arrays of one prepared corpus and the tokenizer that made them."""

    train: np.ndarray
    val: np.ndarray
    tokenizer: object
    meta: dict
    path: str


def documents(files: list[str], root: str, chunk_bytes: int = 1 << 20) -> list[tuple[str, str]]:
    """``(relpath, text)`` pairs in file order; texts longer than ``chunk_bytes`` characters are split at line
    breaks into pieces named ``relpath#k``."""
    out = []
    for path in files:
        rel = os.path.relpath(path, root)
        text = read_text(path)
        if len(text) <= chunk_bytes:
            out.append((rel, text))
            continue
        start, k = 0, 0
        while start < len(text):
            end = text.find("\n", start + chunk_bytes)
            end = len(text) if end < 0 else end + 1
            out.append((f"{rel}#{k}", text[start:end]))
            start, k = end, k + 1
    return out


def _digest(files: list[str]) -> str:
    h = hashlib.sha1()
    for f in files:
        h.update(f.encode())
        h.update(str(os.path.getsize(f)).encode())
    return h.hexdigest()[:12]


def _write_tokens(path: str, seqs: list[list[int]], eot: int) -> int:
    n = sum(len(s) + 1 for s in seqs)
    arr = np.lib.format.open_memmap(path + ".tmp.npy", mode="w+", dtype=np.uint16, shape=(n,))
    pos = 0
    for s in seqs:
        arr[pos : pos + len(s)] = s
        arr[pos + len(s)] = eot
        pos += len(s) + 1
    arr.flush()
    del arr
    os.replace(path + ".tmp.npy", path)
    return n


def prepare(
    corpus: str = "stdlib",
    tokenizer: str = "bpe4096",
    *,
    val_percent: float = 5.0,
    root: str | None = None,
    files: list[str] | None = None,
    verbose: bool = False,
) -> TokenSplits:
    """Tokenise ``corpus`` once (cached) and return memory-mapped train/validation token arrays.

    Args:
        corpus: a name from :data:`spectrakit.data.corpora.CORPORA`, or any label when ``files`` is given.
        tokenizer: ``"bytes"`` or ``"bpeN"`` (byte-level BPE with N tokens, trained on the training split
            only and cached as ``tokenizer.json``).
        val_percent: share of documents (by file) held out for validation, in (0, 50].
        root: cache folder (default :func:`cache_dir`).
        files: explicit list of text files instead of a named corpus (e.g. tests).
        verbose: print what is being done.

    Raises ``ValueError`` for bad arguments, :class:`~spectrakit.data.corpora.CorpusUnavailableError` for a
    missing corpus, ``ValueError`` when either split comes out empty.
    """
    check_scalar(val_percent, "val_percent", low=0, high=50, low_inclusive=False, allow_tensor=False)
    kind, _ = parse_tokenizer(tokenizer)
    files = sorted(files) if files is not None else corpus_files(corpus)
    base = (
        os.path.commonpath([os.path.dirname(f) for f in files])
        if len(files) > 1
        else os.path.dirname(files[0])
    )
    folder = os.path.join(root or cache_dir(), f"{corpus}-{_digest(files)}-val{val_percent:g}", tokenizer)
    meta_path = os.path.join(folder, "meta.json")
    tok_path = os.path.join(folder, "tokenizer.json") if kind == "bpe" else None
    if not os.path.exists(meta_path):
        if verbose:
            print(f"[data] tokenising corpus {corpus!r} ({len(files)} files) with {tokenizer} into {folder}")
        os.makedirs(folder, exist_ok=True)
        docs = documents(files, base)
        split = [is_validation(rel, val_percent) for rel, _ in docs]
        train_texts = [t for (_, t), v in zip(docs, split) if not v]
        val_texts = [t for (_, t), v in zip(docs, split) if v]
        if not train_texts or not val_texts:
            raise ValueError(
                f"corpus {corpus!r}: {len(train_texts)} train / {len(val_texts)} validation documents;"
                f" both must be non-empty (adjust val_percent={val_percent})"
            )
        tok = load_or_train(tokenizer, lambda: train_texts, tok_path)
        n_train = _write_tokens(os.path.join(folder, "train.npy"), tok.encode_batch(train_texts), tok.eot_id)
        n_val = _write_tokens(os.path.join(folder, "val.npy"), tok.encode_batch(val_texts), tok.eot_id)
        meta = {
            "corpus": corpus,
            "tokenizer": tokenizer,
            "vocab_size": tok.vocab_size,
            "eot_id": tok.eot_id,
            "files": len(files),
            "train_docs": len(train_texts),
            "val_docs": len(val_texts),
            "train_tokens": n_train,
            "val_tokens": n_val,
            "val_percent": val_percent,
            "train_chars": sum(map(len, train_texts)),
        }
        with open(meta_path + ".tmp", "w") as f:
            json.dump(meta, f, indent=1)
        os.replace(meta_path + ".tmp", meta_path)
    with open(meta_path) as f:
        meta = json.load(f)
    tok = load_or_train(tokenizer, lambda: [], tok_path)
    train = np.load(os.path.join(folder, "train.npy"), mmap_mode="r")
    val = np.load(os.path.join(folder, "val.npy"), mmap_mode="r")
    return TokenSplits(train=train, val=val, tokenizer=tok, meta=meta, path=folder)


def unigram_entropy(tokens: np.ndarray, vocab_size: int) -> float:
    """Entropy in nats of the empirical unigram distribution of ``tokens`` (the loss of the best model that
    ignores context: a trained LM should go well below it)."""
    counts = np.bincount(np.asarray(tokens, dtype=np.int64), minlength=vocab_size).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())
