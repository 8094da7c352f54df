"""Device-synchronised wall-clock timing of a callable (used by ``spectrakit ops`` and the benchmark)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def time_ms(fn: Callable[[], object], device: torch.device | str, *, warmup: int = 1, reps: int = 3) -> float:
    """Median wall time of ``fn()`` in milliseconds; CUDA events on GPU, ``perf_counter`` on CPU."""
    dev = torch.device(device)
    for _ in range(warmup):
        fn()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    times = []
    for _ in range(reps):
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(dev)
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]
