"""Start N local worker processes with an initialized process group (tests, benchmarks, examples).

``torchrun`` is the launcher for real jobs; this helper runs a function on ``world_size`` processes of
this machine (rendezvous through a ``file://`` store in a private temporary directory, so no TCP port has to
be picked), with a wall-clock limit after which every worker is killed, and returns each rank's return value."""

# Start method: ``"forkserver"`` by default where the platform has it (Linux, macOS). Python's fork server is one
# clean process, started on the first call, that imports torch and this module once (and ``torch._dynamo``,
# which building an optimizer imports); every later worker is a fork of it and starts in a fraction of a second,
# where ``"spawn"`` starts a fresh interpreter per rank that imports torch again (about 3 s of CPU per rank,
# 35-45 s per launch measured on a loaded 2-core machine, against 0.3 s with the fork server). Unlike a plain
# ``fork`` of the caller, the server holds no threads or locks of the caller, so it is safe from threaded
# programs (pytest-xdist, data loaders). Each worker receives the caller's environment variables as they are at
# the call (the server's own were fixed when it started).
# In a process made by ``os.fork`` the default is ``"spawn"``: a fork server inherited from the parent belongs to
# the parent, and its workers would be neither this process's children nor in its process group (a ``killpg``
# of this process's group must reach them). ``"fork"`` (asked for explicitly) forks the workers from the caller
# itself: the cheapest start, and the workers are the caller's children in its process group, but only safe
# from a caller that runs no other threads (a fork copies no thread, so a lock or an OpenMP pool in use by one
# stays taken in the workers): e.g. a single-threaded process itself made by ``os.fork`` for that purpose.
#
# Teardown: each rank saves its result, then all ranks meet at a barrier, and a rank that has passed it
# leaves a marker file before ``destroy_process_group``. Under load, gloo has been seen to abort a process
# (``terminate called without an active exception``, SIGABRT); when that happens in the teardown, the work is
# already done: once a rank has passed the barrier every rank has finished saving its result, so such an exit
# does not fail the run. A worker that raises, or dies before the barrier, still fails it.

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from spectrakit._checks import check_choice, check_int


def _resolve(target: str | Callable) -> Callable:
    if callable(target):
        return target
    path, _, name = target.rpartition(":")
    spec = importlib.util.spec_from_file_location(f"_spectrakit_worker_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return getattr(module, name)


_FORKED = False  # this process was made by os.fork: the fork server, if any, belongs to the parent


def _forked_child() -> None:
    global _FORKED
    _FORKED = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked_child)


# imported by the fork server besides this module (and torch): ``torch._dynamo``, which ``torch.optim`` imports
# when a process builds its first optimizer (1-2 s of CPU per worker otherwise, often more than its work)
_PRELOAD = ("torch._dynamo",)


def _ensure_fork_server(extra_preload: tuple[str, ...] = ()) -> None:
    """Start Python's fork server (once per process) with torch, this module, ``torch._dynamo`` and
    ``extra_preload`` imported (whichever call starts it sets what it preloads). The server is a fresh
    interpreter that does not take the caller's ``sys.path`` before importing (Python 3.11), so the folder
    holding this copy of spectrakit goes first on its ``PYTHONPATH``: the workers then run this very module,
    not another installed copy."""
    from multiprocessing import forkserver

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, old) if p)
    try:
        mp.set_forkserver_preload([__name__, *_PRELOAD, *extra_preload])
        forkserver.ensure_running()
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old


def _default_start_method() -> str:
    return "forkserver" if "forkserver" in mp.get_all_start_methods() and not _FORKED else "spawn"


def _worker(rank: int, target, world_size: int, init_file: str, out_dir: str, backend: str, args: tuple,
            threads: int, environ: dict[str, str]) -> None:
    if os.environ != environ:  # a fork server's environment is the one it started with: take the caller's
        os.environ.clear()
        os.environ.update(environ)
    torch.set_num_threads(threads)
    if backend == "gloo" and sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size))
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        result = _resolve(target)(rank, world_size, *args)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()
        # past the barrier: every rank's result is on disk (see the module docstring)
        open(os.path.join(out_dir, f"rank{rank}.done"), "w").close()
    finally:
        dist.destroy_process_group()


def _finished(out_dir: str, world_size: int) -> bool:
    """Whether the work is complete: some rank passed the final barrier and every result file exists."""
    names = os.listdir(out_dir)
    return (any(n.endswith(".done") for n in names)
            and all(f"rank{r}.pt" in names for r in range(world_size)))


def run_workers(target: str | Callable, world_size: int = 2, *, args: tuple = (), timeout: float = 120.0,
                backend: str = "gloo", threads: int = 1, start_method: str | None = None) -> list[Any]:
    """Run ``target(rank, world_size, *args)`` on ``world_size`` local processes; return the results.

    Args:
        target: a picklable top-level function, or ``"path/to/file.py:function"`` (the file is imported in
            each worker, which lets test files define their workers without being importable packages).
        world_size: number of processes, an int in [1, 64].
        args: extra positional arguments (picklable).
        timeout: seconds, in (0, 3600]; after it all workers are killed and ``TimeoutError`` is raised.
        backend: ``"gloo"`` (CPU) or ``"nccl"`` (one CUDA device per rank).
        threads: ``torch.set_num_threads`` in each worker, an int in [1, 256].
        start_method: ``"forkserver"`` (the default where available: workers forked from a server process that
            has imported torch once), ``"spawn"`` (a fresh interpreter per rank; the default in a process
            made by ``os.fork``) or ``"fork"`` (forked from the caller: only from a single-threaded caller);
            see the module docstring.

    Returns:
        ``[result of rank 0, result of rank 1, ...]`` (transferred with ``torch.save``/``torch.load``).

    Raises:
        ValueError: bad arguments. TimeoutError: the workers did not finish in time.
        torch.multiprocessing.ProcessRaisedException: a worker raised (its traceback is included).
        torch.multiprocessing.ProcessExitedException: a worker died (signal, exit code) before the final
            barrier; a death in the teardown after it is tolerated (module docstring).
    """
    check_int(world_size, "world_size", low=1, high=64)
    check_int(threads, "threads", low=1, high=256)
    check_choice(backend, "backend", {"gloo", "nccl"})
    if start_method is None:
        start_method = _default_start_method()
    check_choice(start_method, "start_method", set(mp.get_all_start_methods()) & {"forkserver", "spawn", "fork"})
    if start_method == "forkserver" and _FORKED:
        raise ValueError("start_method='forkserver' is not available in a process made by os.fork (the fork "
                         "server belongs to the parent, and its workers would not be this process's children); "
                         "use 'spawn', or 'fork' from a single-threaded process")
    if not (isinstance(timeout, (int, float)) and 0 < timeout <= 3600):
        raise ValueError(f"timeout must be a number of seconds in (0, 3600], got {timeout!r}")
    with tempfile.TemporaryDirectory(prefix="spectrakit_dist_") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        worker_args = (target, world_size, init_file, tmp, backend, tuple(args), threads, dict(os.environ))
        if start_method == "forkserver":
            _ensure_fork_server()
        ctx = mp.start_processes(_worker, args=worker_args, nprocs=world_size, join=False,
                                 start_method=start_method)
        deadline = time.monotonic() + timeout
        try:
            while not ctx.join(timeout=max(0.0, min(1.0, deadline - time.monotonic()))):
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"distributed workers did not finish within {timeout} s")
        except mp.ProcessExitedException:
            # a process died without a Python exception (a signal or a non-zero exit code): a failure unless
            # it happened in the teardown after the final barrier (module docstring)
            if not _finished(tmp, world_size):
                raise
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                    p.join(5)
        return [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False) for r in range(world_size)]
