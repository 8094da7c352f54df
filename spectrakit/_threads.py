"""How many CPU threads torch uses for one command.

PyTorch starts one intra-op thread per core. On a machine whose cores are busy with other work, those
threads wait on each other and a run can become tens of times slower (measured on a 2-core machine with two
other busy processes: ``spectrakit ops`` 400 s with 2 threads against 12 s with 1). The command line
therefore uses only the cores that are free: ``cores - load average`` rounded, at least 1. ``--threads N``
or ``OMP_NUM_THREADS`` override the choice.
"""

from __future__ import annotations

import os

import torch


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS reports it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover (macOS, Windows)
        return os.cpu_count() or 1


def choose_threads(requested: int | None = None) -> tuple[int, str]:
    """``(threads, reason)``: ``requested`` if given, else ``OMP_NUM_THREADS`` if set, else the free cores
    ``max(1, round(cores - load average over the last minute))``."""
    if requested:
        return int(requested), "--threads"
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env), "OMP_NUM_THREADS"
    cores = usable_cores()
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # pragma: no cover
        return cores, f"{cores} cores"
    n = max(1, min(cores, int(cores - load + 0.5)))
    return n, f"{cores} cores, load average {load:.1f}"


CHOICE: str | None = None  # why the command line chose its thread count, for result headers


def apply_threads(requested: int | None = None) -> int:
    """Set torch's intra-op threads by :func:`choose_threads` and remember the reason for result headers."""
    global CHOICE
    n, CHOICE = choose_threads(requested)
    torch.set_num_threads(n)
    return n
