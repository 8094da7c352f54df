"""Corpora, tokenizers, token files and batches: round trips against the source text, split by file,
caching, determinism of the data stream, clear errors."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from spectrakit.data import corpora
from spectrakit.data.batches import TokenBatches, eval_batches
from spectrakit.data.corpora import CorpusUnavailableError, corpus_files, is_validation
from spectrakit.data.tokenizer import ByteTokenizer, parse_tokenizer, train_bpe
from spectrakit.data.tokens import documents, prepare, unigram_entropy

TEXTS = [
    "def f(x):\n    return x + 1\n",
    "héllo wörld — ünïcode ✓\n" * 3,
    "",
    "class A:\n    pass\n" * 40,
    "import os\nprint(os.getcwd())\n",
]


@pytest.fixture
def text_files(tmp_path):
    files = []
    for i in range(60):
        p = tmp_path / "src" / f"dir{i % 3}" / f"f{i:02d}.py"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(TEXTS[i % len(TEXTS)] + f"# file {i}\n", encoding="utf-8")
        files.append(str(p))
    return files


def test_stdlib_corpus_is_sorted_and_excludes_site_packages():
    files = corpus_files("stdlib")
    assert files == sorted(files) and len(files) > 100
    assert not any("site-packages" in f for f in files)
    assert any(f.endswith(os.sep + "os.py") for f in files)


def test_stdlib_walk_equals_the_glob_without_installed_packages(tmp_path, monkeypatch):
    """The pruned walk lists exactly what ``glob("**/*.py")`` minus ``site-packages``/``dist-packages`` lists
    (the definition), on a tree with nested and hidden folders, hidden and non-.py files, a folder named like a
    .py file, and installed packages at two depths."""
    import glob

    for rel in ["a.py", "pkg/b.py", "pkg/sub/c.py", "pkg/.hidden/d.py", ".hid/e.py", "pkg/.f.py", "g.pyc",
                "h.txt", "site-packages/torch/i.py", "x/dist-packages/j.py", "x/site-packages-not/k.py",
                "dir.py/l.py"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    (tmp_path / "pkg" / "link").symlink_to(tmp_path / "pkg" / "sub")
    monkeypatch.setattr(corpora.sysconfig, "get_paths", lambda: {"stdlib": str(tmp_path)})
    monkeypatch.setattr(corpora, "_python_doc_root", lambda: None)
    oracle = sorted(p for p in glob.glob(os.path.join(tmp_path, "**/*.py"), recursive=True)
                    if os.path.isfile(p) and not {"site-packages", "dist-packages"}
                    & set(os.path.relpath(p, tmp_path).split(os.sep)))
    got = corpora._stdlib_files()
    assert got == oracle and len(got) == 6, got


@pytest.mark.parametrize("name,package", [("linux-doc", "linux-doc-6.1"), ("gcide", "dict-gcide")])
def test_missing_debian_corpus_names_the_package(name, package, monkeypatch):
    monkeypatch.setattr(corpora.glob, "glob", lambda *a, **k: [])
    with pytest.raises(CorpusUnavailableError, match=package):
        corpus_files(name)


def test_unknown_corpus():
    with pytest.raises(ValueError, match="corpus must be one of"):
        corpus_files("wikipedia")


def test_validation_split_is_by_path_and_stable():
    picks = [is_validation(f"a/{i}.py", 10.0) for i in range(5000)]
    assert 0.07 < np.mean(picks) < 0.13
    assert picks == [is_validation(f"a/{i}.py", 10.0) for i in range(5000)]


@pytest.mark.parametrize("spec,expected", [("bytes", ("bytes", 256)), ("bpe300", ("bpe", 300))])
def test_parse_tokenizer(spec, expected):
    assert parse_tokenizer(spec) == expected


@pytest.mark.parametrize("spec", ["bpe", "bpe10", "bpe70000", "gpt2", "BYTES"])
def test_parse_tokenizer_errors(spec):
    with pytest.raises(ValueError, match="tokenizer"):
        parse_tokenizer(spec)


def test_bpe_round_trip_on_unicode_and_is_deterministic():
    tok = train_bpe(TEXTS * 5, 300)
    tok2 = train_bpe(TEXTS * 5, 300)
    assert tok.vocab_size == 300 and tok.eot_id is not None
    for t in TEXTS + ["unseen ∑ text \x00 with NUL"]:
        ids = tok.encode_batch([t])[0]
        assert tok.decode(ids) == t
        assert ids == tok2.encode_batch([t])[0]
    assert len(tok.encode_batch([TEXTS[3]])[0]) < len(TEXTS[3].encode()) / 2  # merges compress


def test_bytes_tokenizer_round_trip():
    tok = ByteTokenizer()
    for t in TEXTS:
        assert tok.decode(tok.encode_batch([t])[0]) == t


@pytest.mark.parametrize("tokenizer", ["bytes", "bpe300"])
def test_prepare_round_trip_split_and_cache(text_files, tmp_path, tokenizer):
    s = prepare("toy", tokenizer, files=text_files, root=str(tmp_path / "cache"), val_percent=20.0)
    assert s.train.dtype == np.uint16 and isinstance(s.train, np.memmap)
    root = os.path.commonpath([os.path.dirname(f) for f in text_files])
    docs = documents(sorted(text_files), root)
    val_docs = [t for rel, t in docs if is_validation(rel, 20.0)]
    train_docs = [t for rel, t in docs if not is_validation(rel, 20.0)]
    assert len(val_docs) == s.meta["val_docs"] > 0 and len(train_docs) == s.meta["train_docs"] > 0
    eot = s.tokenizer.eot_id
    for arr, expected in ((s.train, train_docs), (s.val, val_docs)):
        ids = np.asarray(arr).tolist()
        assert ids[-1] == eot and ids.count(eot) == len(expected)
        pieces, cur = [], []
        for i in ids:
            if i == eot:
                pieces.append(s.tokenizer.decode(cur))
                cur = []
            else:
                cur.append(i)
        assert pieces == expected  # exact text round trip, in file order
    mtime = os.path.getmtime(os.path.join(s.path, "train.npy"))
    s2 = prepare("toy", tokenizer, files=text_files, root=str(tmp_path / "cache"), val_percent=20.0)
    assert os.path.getmtime(os.path.join(s2.path, "train.npy")) == mtime  # cached, not re-tokenised
    assert np.array_equal(s2.train, s.train)


def test_prepare_errors(text_files, tmp_path):
    with pytest.raises(ValueError, match="val_percent"):
        prepare("toy", "bytes", files=text_files, root=str(tmp_path), val_percent=0.0)
    with pytest.raises(ValueError, match="both must be non-empty"):
        prepare("toy", "bytes", files=text_files[:1], root=str(tmp_path), val_percent=1.0)


def test_large_file_is_chunked_at_line_breaks(tmp_path):
    p = tmp_path / "dict.txt"
    p.write_text("".join(f"line {i} " + "x" * 50 + "\n" for i in range(2000)))
    docs = documents([str(p)], str(tmp_path), chunk_bytes=10_000)
    assert len(docs) > 5 and "".join(t for _, t in docs) == p.read_text()
    assert all(t.endswith("\n") for _, t in docs) and docs[1][0] == "dict.txt#1"


def test_unigram_entropy_against_formula():
    tokens = np.array([0, 0, 1, 2, 2, 2, 2, 3], dtype=np.uint16)
    p = np.array([2, 1, 4, 1]) / 8
    assert unigram_entropy(tokens, 5) == pytest.approx(-(p * np.log(p)).sum())


def test_token_batches_are_pure_functions_of_position():
    tokens = np.arange(1000, dtype=np.uint16)
    a = TokenBatches(tokens, 4, 16, seed=3)
    x0, y0 = a.next()
    x1, _ = a.next()
    assert x0.shape == (4, 16) and x0.dtype == torch.int64
    assert torch.equal(y0[:, :-1], x0[:, 1:]) and torch.equal(y0[:, -1], x0[:, -1] + 1)
    b = TokenBatches(tokens, 4, 16, seed=3)
    b.load_state_dict({"position": 1, "seed": 3})
    assert torch.equal(b.next()[0], x1)
    assert torch.equal(TokenBatches(tokens, 4, 16, seed=3).batch(0)[0], x0)
    assert not torch.equal(TokenBatches(tokens, 4, 16, seed=4).batch(0)[0], x0)
    assert int(x0.max()) <= 999
    r0, r1 = (TokenBatches(tokens, 4, 16, seed=3, rank=r, world_size=2).batch(0)[0] for r in (0, 1))
    assert not torch.equal(r0, r1)  # ranks see different data
    with pytest.raises(ValueError, match="seed"):
        b.load_state_dict({"position": 0, "seed": 5})


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(batch_size=0), "batch_size"),
        (dict(seq_len=2000), "seq_len"),
        (dict(rank=2, world_size=2), "rank"),
    ],
)
def test_token_batches_errors(kwargs, match):
    args = dict(batch_size=2, seq_len=8) | kwargs
    with pytest.raises(ValueError, match=match):
        TokenBatches(np.arange(100), args.pop("batch_size"), args.pop("seq_len"), **args)


def test_eval_batches_cover_consecutive_windows():
    tokens = np.arange(103)
    xs = [x for x, _ in eval_batches(tokens, 3, 10)]
    flat = torch.cat(xs).flatten()
    assert torch.equal(flat, torch.arange(100))
    assert sum(x.shape[0] for x, _ in eval_batches(tokens, 3, 10, max_tokens=35)) == 3
    with pytest.raises(ValueError, match="validation tokens"):
        list(eval_batches(np.arange(5), 2, 10))


def test_data_cli_list_and_missing_package(monkeypatch, capsys):
    import argparse

    from spectrakit.commands import data as cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert cli.run(parser.parse_args(["list"])) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in corpora.CORPORA)
    monkeypatch.setattr(corpora.glob, "glob", lambda *a, **k: [])
    assert cli.run(parser.parse_args(["prepare", "gcide"])) == 2
    assert "apt-get install dict-gcide" in capsys.readouterr().err
