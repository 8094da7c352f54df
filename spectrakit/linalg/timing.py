"""Device-synchronised wall-clock timing of a callable and the peak extra memory of a CPU call (used by
``spectrakit ops``, the benchmarks and the memory tests)."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator

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


_PROFILER_READY = False


@contextlib.contextmanager
def quiet_profiler() -> Iterator[None]:
    """Send the process's native stderr (file descriptor 2) to ``/dev/null`` while the block runs: the
    profiler's C++ library prints a ``USDT ... profiler_start`` / ``profiler_stop`` line at every session on
    CPU builds, noise in a report. Python's own ``sys.stderr`` is flushed first and restored after."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # pragma: no cover (no descriptor 2)
        yield
        return
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def cpu_peak_extra_bytes(fn: Callable[[], object], *, python: bool = True) -> int:
    """Peak of (bytes allocated - bytes freed) on the CPU while ``fn()`` runs: from the profiler's memory
    events of PyTorch's allocator in time order (the CPU counterpart of ``torch.cuda.max_memory_allocated() -
    memory_allocated()``; the allocation pattern of device-independent code is the same on both), plus the
    peak that :mod:`tracemalloc` sees (NumPy arrays, e.g. the outputs of SciPy's LAPACK calls, and Python
    objects; ``python=False`` leaves them out). The two peaks are added, so the figure is an upper bound
    when both allocate; the Python objects of a step are a few tens of kB. The first call of a process opens
    one empty profiler session beforehand (its imports are counted in no figure)."""
    import tracemalloc

    from torch.profiler import ProfilerActivity, profile

    global _PROFILER_READY
    if not _PROFILER_READY:
        # the first session of a process imports the profiler's own modules: once, untraced, so that they
        # count in no figure (tracemalloc saw a 68 MB peak) and load fast (8.7 s traced, 1.8 s untraced)
        with quiet_profiler(), profile(activities=[ProfilerActivity.CPU], profile_memory=True):
            pass
        _PROFILER_READY = True
    started = python and not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    base = 0
    if python:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
    try:
        with quiet_profiler(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
            # (read before the profiler's own bookkeeping at exit)
            py_peak = tracemalloc.get_traced_memory()[1] - base if python else 0
    finally:
        if started:
            tracemalloc.stop()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    cur = peak = 0
    for e in events:
        cur += e.nbytes()
        peak = max(peak, cur)
    return peak + py_peak
