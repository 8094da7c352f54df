"""Argument types and checks shared by the ``spectrakit`` sub-commands.

Every user error of the command line (a bad value, a missing data set or device, an unwritable output
folder) is reported as one line ``error: ...`` on stderr with exit status 2, never as a traceback:
argparse ``type=`` functions reject bad values while parsing, and :class:`UsageError` carries the errors
found after parsing. Errors raised by the library's own argument checks (:mod:`spectrakit._checks`) are
reported the same way. Any other failure is one line too, with exit status 1 (`SPECTRAKIT_DEBUG=1` shows its traceback).
"""

from __future__ import annotations

import argparse
import math
import os


class UsageError(Exception):
    """A user error of the command line: printed as one line ``error: <message>``, exit status 2."""


def finite_float(text: str) -> float:
    """``type=`` for float options: any finite number (nan and inf are rejected)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """``type=`` for counts that must be >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value


def thread_count(text: str) -> int:
    """``type=`` for ``--threads``: 1 up to the cores this process may run on (more threads than cores only
    wait on each other, and far more make torch's thread pool fail)."""
    value = positive_int(text)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover (macOS, Windows)
        cores = os.cpu_count() or 1
    if value > cores:
        raise argparse.ArgumentTypeError(f"expected 1..{cores} (the cores this process may use), got {value}")
    return value


def _items(text: str) -> list[str]:
    """The items of a comma-separated list; an empty item (``0,,1``, ``0,``) is an error."""
    parts = [t.strip() for t in text.split(",")]
    if len(parts) > 1 and not all(parts):
        raise argparse.ArgumentTypeError(f"empty item in the comma-separated list {text!r}")
    return [t for t in parts if t]


def shape(text: str) -> tuple[int, ...]:
    """``type=`` for a shape: comma-separated whole numbers >= 1 (``3,32,32``)."""
    try:
        values = tuple(int(t) for t in _items(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers >= 1 such as 3,32,32, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected whole numbers >= 1 such as 3,32,32, got {text!r}")
    return values


def int_list(text: str) -> tuple[int, ...]:
    """``type=`` for a non-empty comma-separated list of integers (``0,1,2``)."""
    try:
        values = tuple(int(t) for t in _items(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers such as 0,1,2, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one whole number, got an empty list")
    return values


def name_list(choices) -> callable:
    """``type=`` factory for a non-empty comma-separated list of names from ``choices``."""
    accepted = ", ".join(choices)

    def parse(text: str) -> tuple[str, ...]:
        names = tuple(_items(text))
        if not names:
            raise argparse.ArgumentTypeError(f"expected at least one name from: {accepted}")
        unknown = [n for n in names if n not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown name(s) {', '.join(unknown)}; accepted: {accepted}")
        return names

    parse.__name__ = "names"
    return parse


def device_name(text: str) -> str:
    """``type=`` for ``--device``: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``; CUDA must be available."""
    if text in ("auto", "cpu"):
        return text
    import torch  # (only here: parsing the other options imports no heavy library)

    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(
                f"{text!r}: CUDA is not available on this machine (torch {torch.__version__}); use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise argparse.ArgumentTypeError(
                f"{text!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type != "cpu":
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")
    return text


def check_output_folder(path: str | None, flag: str = "--out") -> None:
    """Create ``path`` (when given) and check that it is a writable folder, before any work starts."""
    if not path:
        return
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot create the folder ({e.strerror or e})") from None
    if not os.path.isdir(path) or not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: the folder is not writable; choose another {flag}")
