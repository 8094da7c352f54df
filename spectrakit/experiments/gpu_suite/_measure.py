"""Timing and peak memory for the suite's stages: CUDA events after warm-up, median of the timed calls
(:func:`spectrakit.linalg.timing.time_ms`; ``time.perf_counter`` without synchronisation on the CPU), and the
peak memory a call allocates beyond what is held before it (``torch.cuda.max_memory_allocated`` on CUDA,
the profiler's memory events on the CPU)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from spectrakit.linalg.timing import cpu_peak_extra_bytes, time_ms

__all__ = ["peak_extra_bytes", "time_ms", "error_text"]


def peak_extra_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes allocated by ``fn()`` beyond those held before the call."""
    if device.type != "cuda":
        return cpu_peak_extra_bytes(fn)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base


def error_text(e: BaseException) -> str:
    """One line naming an exception, for a table cell (a row that failed while the others went on)."""
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {first}"[:200]
