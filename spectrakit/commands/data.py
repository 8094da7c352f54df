"""Prepare offline corpora: ``spectrakit data list``, ``spectrakit data prepare NAME [--tokenizer bpeN]``.

``prepare`` tokenises the corpus once into memory-mapped files under the cache folder
(``$SPECTRAKIT_CACHE`` or ``~/.cache/spectrakit``); a missing Debian package is named in the error.
"""

from __future__ import annotations

import argparse
import sys

from spectrakit.data.corpora import CORPORA, CorpusUnavailableError, corpus_files
from spectrakit.data.tokenizer import tokenizer_name


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    sub.add_parser("list", help="list the corpora and whether they are installed")
    p = sub.add_parser(
        "prepare",
        help="tokenise a corpus into the cache",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("name", choices=sorted(CORPORA), help="corpus name")
    p.add_argument("--tokenizer", default="bpe4096", type=tokenizer_name, help="'bytes' or 'bpeN'")
    p.add_argument("--val-percent", type=float, default=5.0, help="share of files held out for validation")
    p.add_argument(
        "--cache", default=None, help="cache folder (default $SPECTRAKIT_CACHE or ~/.cache/spectrakit)"
    )


def run(args: argparse.Namespace) -> int:
    if args.action == "list":
        for name, c in CORPORA.items():
            try:
                status = f"{len(corpus_files(name))} files"
            except CorpusUnavailableError as e:
                status = f"missing ({e})"
            print(f"{name:11s} {c.description}: {status}")
        return 0
    from spectrakit.data.tokens import prepare, unigram_entropy

    try:
        splits = prepare(
            args.name, args.tokenizer, val_percent=args.val_percent, root=args.cache, verbose=True
        )
    except CorpusUnavailableError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    m = splits.meta
    print(
        f"{args.name}: {m['train_tokens']:,} train / {m['val_tokens']:,} validation tokens "
        f"({m['train_docs']} / {m['val_docs']} documents), vocab {m['vocab_size']}, "
        f"unigram entropy {unigram_entropy(splits.val, m['vocab_size']):.3f} nats; in {splits.path}"
    )
    return 0
