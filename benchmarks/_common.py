"""Helpers for benchmark scripts: timing (CUDA events on GPU, perf_counter on CPU) and writing a
block of docs/results/bench/KEY.md between markers (the benchmark's latest raw output), so each script owns its
own file."""

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


RESULTS_BENCH = os.path.join(os.path.dirname(BENCH_MD), "results", "bench")


def write_section(key: str, text: str, *, path: str | None = None) -> None:
    """Replace (or append) the block between ``<!-- bench:KEY:start -->`` and ``<!-- bench:KEY:end -->`` of
    ``path``, by default ``docs/results/bench/KEY.md`` (the benchmark's latest raw output; docs/BENCHMARKS.md
    holds the current figures and links to these files).

    Several device runs may be kept side by side by using keys such as ``linalg-cpu`` and ``linalg-cuda``.
    """
    if path is None:
        path = os.path.join(RESULTS_BENCH, f"{key}.md")
        os.makedirs(RESULTS_BENCH, exist_ok=True)
    start, end = f"<!-- bench:{key}:start -->", f"<!-- bench:{key}:end -->"
    block = f"{start}\n{text.rstrip()}\n{end}"
    body = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    body = pattern.sub(lambda _: block, body) if pattern.search(body) else body.rstrip() + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(body)
