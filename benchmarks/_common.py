"""Helpers for benchmark scripts: timing (CUDA events on GPU, perf_counter on CPU) and writing a
section of docs/BENCHMARKS.md between markers, so each script owns its own section."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable

import torch

from spectrakit.linalg.timing import time_ms

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH_MD = os.path.join(ROOT, "docs", "BENCHMARKS.md")


def sync(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_fn(fn: Callable[[], object], device: torch.device | str, *, warmup: int = 2, reps: int = 5) -> float:
    """Median wall time of ``fn()`` in ms, device-synchronised (:func:`spectrakit.linalg.timing.time_ms`)."""
    return time_ms(fn, device, warmup=warmup, reps=reps)


def parse_widths(parser, text: str, flag: str) -> list[int]:
    """Comma-separated model widths (integers >= 8) of option ``flag``; a bad value is ``parser.error``."""
    try:
        widths = [int(w) for w in text.split(",")]
        if not widths or min(widths) < 8:
            raise ValueError
    except ValueError:
        parser.error(f"{flag} must be comma-separated integers >= 8, got {text!r}")
    return widths


def command_line() -> str:
    return "python " + " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])


def write_section(key: str, text: str, *, path: str = BENCH_MD) -> None:
    """Replace (or append) the block between ``<!-- bench:KEY:start -->`` and ``<!-- bench:KEY:end -->``.

    Several device runs may be kept side by side by using keys such as ``linalg-cpu`` and ``linalg-cuda``.
    """
    start, end = f"<!-- bench:{key}:start -->", f"<!-- bench:{key}:end -->"
    block = f"{start}\n{text.rstrip()}\n{end}"
    body = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    body = pattern.sub(lambda _: block, body) if pattern.search(body) else body.rstrip() + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(body)
