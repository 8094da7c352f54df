"""Offline text corpora: which files make up each corpus, in a deterministic order.

Nothing is downloaded. The built-in corpus ``stdlib`` is the Python standard library's own ``*.py`` sources
(``sysconfig.get_paths()['stdlib']``, without ``site-packages``/``dist-packages``), plus the reST sources of
the Python documentation when a ``python3.X-doc`` package is installed. Larger corpora come from Debian
packages; when the package is missing, :func:`corpus_files` raises :class:`CorpusUnavailableError` naming
the ``apt-get install`` command.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import os
import sys
import sysconfig
import zlib
from collections.abc import Callable


class CorpusUnavailableError(RuntimeError):
    """A corpus whose source files are not installed on this machine (the message names the package)."""


@dataclasses.dataclass(frozen=True)
class Corpus:
    """A named corpus: ``files()`` lists its source files (sorted), ``package`` is the Debian package."""

    name: str
    description: str
    package: str | None
    files: Callable[[], list[str]]


def _sorted_glob(root: str, patterns: tuple[str, ...]) -> list[str]:
    out: set[str] = set()
    for pat in patterns:
        out.update(glob.glob(os.path.join(root, pat), recursive=True))
    return sorted(p for p in out if os.path.isfile(p))


def _python_doc_root() -> str | None:
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for root in (f"/usr/share/doc/{ver}-doc/html/_sources", f"/usr/share/doc/{ver}/html/_sources"):
        if os.path.isdir(root):
            return root
    return None


def _stdlib_files() -> list[str]:
    """The standard library's ``*.py`` files (the same set as ``glob("**/*.py")`` without installed packages):
    ``site-packages`` is pruned from the walk, not listed and filtered, since it often holds far more files
    than the standard library."""
    root = sysconfig.get_paths()["stdlib"]
    found = []
    for folder, subdirs, names in os.walk(root, followlinks=True):
        subdirs[:] = [d for d in subdirs if not d.startswith(".") and d not in ("site-packages", "dist-packages")]
        found.extend(os.path.join(folder, n) for n in names if n.endswith(".py") and not n.startswith("."))
    files = sorted(p for p in found if os.path.isfile(p))
    doc = _python_doc_root()
    return files + (_sorted_glob(doc, ("**/*.txt",)) if doc else [])


def _python_doc_files() -> list[str]:
    doc = _python_doc_root()
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    if doc is None:
        raise CorpusUnavailableError(
            f"corpus 'python-doc' needs the Debian package {ver}-doc: sudo apt-get install {ver}-doc"
        )
    return _sorted_glob(doc, ("**/*.txt",))


def _linux_doc_files() -> list[str]:
    roots = sorted(glob.glob("/usr/share/doc/linux-doc*/Documentation"))
    if not roots:
        raise CorpusUnavailableError(
            "corpus 'linux-doc' needs the Debian package linux-doc-6.1 "
            "(reST sources of the kernel docs): sudo apt-get install linux-doc-6.1"
        )
    return _sorted_glob(roots[-1], ("**/*.rst", "**/*.rst.gz", "**/*.txt", "**/*.txt.gz"))


def _gcide_files() -> list[str]:
    files = _sorted_glob("/usr/share/dictd", ("gcide.dict.dz", "gcide.dict"))
    if not files:
        raise CorpusUnavailableError(
            "corpus 'gcide' needs the Debian package dict-gcide "
            "(GNU Collaborative International Dictionary of English): "
            "sudo apt-get install dict-gcide"
        )
    return files


CORPORA: dict[str, Corpus] = {
    "stdlib": Corpus(
        "stdlib",
        "Python standard library sources (+ its reST docs if python3.X-doc is installed)",
        None,
        _stdlib_files,
    ),
    "python-doc": Corpus(
        "python-doc", "Python documentation reST sources", "python3.X-doc", _python_doc_files
    ),
    "linux-doc": Corpus(
        "linux-doc",
        "Linux kernel documentation reST sources (~21 MB English)",
        "linux-doc-6.1",
        _linux_doc_files,
    ),
    "gcide": Corpus(
        "gcide", "GNU Collaborative International Dictionary of English (~40 MB)", "dict-gcide", _gcide_files
    ),
}


def corpus_files(name: str) -> list[str]:
    """Sorted list of the source files of corpus ``name`` (one of :data:`CORPORA`).

    Raises ``ValueError`` for an unknown name and :class:`CorpusUnavailableError` (naming the Debian package
    to install) when the corpus is not present, or has no files.
    """
    from spectrakit._checks import check_choice  # (here: listing the corpora needs no torch)

    check_choice(name, "corpus", CORPORA)
    files = CORPORA[name].files()
    if not files:
        raise CorpusUnavailableError(f"corpus {name!r} has no files on this machine")
    return files


def read_text(path: str) -> str:
    """File contents as text (UTF-8 with replacement); ``.gz``/``.dz`` (dictzip) files are decompressed."""
    if path.endswith((".gz", ".dz")):
        with gzip.open(path, "rb") as f:
            data = f.read()
    else:
        with open(path, "rb") as f:
            data = f.read()
    return data.decode("utf-8", errors="replace")


def is_validation(relpath: str, val_percent: float) -> bool:
    """Held-out split by file: ``crc32(relpath) % 10000 < 100 * val_percent`` (stable across machines)."""
    return zlib.crc32(relpath.encode("utf-8")) % 10000 < round(100 * val_percent)
