"""How many CPU threads torch uses for one command.

PyTorch starts one intra-op thread per core. On a machine whose cores are busy with other work, those
threads wait on each other and a run can become tens of times slower (measured on a 2-core machine with two
other busy processes: ``spectrakit ops`` 400 s with 2 threads against 12 s with 1). The command line
therefore uses only the cores that are free right now: ``round(cores - busy)``, at least 1, where ``busy``
is the CPU time that other processes used on this process's cores during a 0.2 s sample of ``/proc/stat``
(Linux; elsewhere the 1-minute load average). The load average alone is a poor guide: it still counts the
previous command for a minute, so back-to-back runs on an idle machine would get one thread.
``--threads N`` or ``OMP_NUM_THREADS`` override the choice.
"""

from __future__ import annotations

import os
import time

SAMPLE_S = 0.2  # length of the /proc/stat sample


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS reports it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover (macOS, Windows)
        return os.cpu_count() or 1


def _cpu_times() -> dict[int, tuple[int, int]]:
    """``{cpu: (busy jiffies, total jiffies)}`` from ``/proc/stat`` for the cores this process may use."""
    try:
        allowed = os.sched_getaffinity(0)
    except AttributeError:  # pragma: no cover
        allowed = None
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            name, *fields = line.split()
            if not (name.startswith("cpu") and name[3:].isdigit()):
                continue
            cpu = int(name[3:])
            if allowed is not None and cpu not in allowed:
                continue
            vals = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
            idle = vals[3] + vals[4]
            out[cpu] = (sum(vals) - idle, sum(vals))
    return out


def busy_cores(sample_s: float = SAMPLE_S) -> float | None:
    """Cores' worth of CPU time used by other work during ``sample_s`` seconds (this process sleeps
    meanwhile), from ``/proc/stat``; ``None`` where it cannot be read."""
    try:
        a = _cpu_times()
        time.sleep(sample_s)
        b = _cpu_times()
    except (OSError, ValueError):
        return None
    busy = total = 0
    cores = 0
    for cpu, (busy_b, total_b) in b.items():
        if cpu in a and total_b > a[cpu][1]:
            busy += busy_b - a[cpu][0]
            total += total_b - a[cpu][1]
            cores += 1
    if not cores or not total:
        return None
    return cores * busy / total


def choose_threads(requested: int | None = None) -> tuple[int, str]:
    """``(threads, reason)``: ``requested`` if given, else ``OMP_NUM_THREADS`` if set, else the free cores
    ``max(1, round(cores - busy))`` (see the module docstring for how ``busy`` is measured)."""
    if requested:
        return int(requested), "--threads"
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env), "OMP_NUM_THREADS"
    cores = usable_cores()
    busy = busy_cores()
    what = "busy with other work"
    if busy is None:
        try:
            busy, what = os.getloadavg()[0], "load average"
        except (AttributeError, OSError):  # pragma: no cover
            return cores, f"{cores} cores"
        text = f"{cores} cores, load average {busy:.1f}"
    else:
        text = f"{cores} cores, {busy:.1f} {what}"
    n = max(1, min(cores, int(cores - busy + 0.5)))
    return n, text


CHOICE: str | None = None  # why the command line chose its thread count, for result headers


def apply_threads(requested: int | None = None) -> int:
    """Set torch's intra-op threads by :func:`choose_threads` and remember the reason for result headers."""
    global CHOICE
    import torch  # (here: the command line imports it only for the commands that compute)

    n, CHOICE = choose_threads(requested)
    torch.set_num_threads(n)
    return n
