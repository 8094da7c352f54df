"""The local multi-process launcher: results per rank, worker errors surface, hung workers are killed."""

from __future__ import annotations

import os
import time

import pytest
import torch.multiprocessing as mp

from spectrakit.distributed import launch
from spectrakit.distributed.launch import run_workers

pytestmark = pytest.mark.distributed


def test_timeout_kills_workers_and_errors_surface(tmp_path):
    src = tmp_path / "w.py"
    src.write_text(
        "import time, torch.distributed as dist\n"
        "def hang(rank, ws):\n    time.sleep(120)\n"
        "def boom(rank, ws):\n    raise RuntimeError(f'boom on rank {rank} of {dist.get_world_size()}')\n")
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="did not finish within 1 s"):
        run_workers(f"{src}:hang", 1, timeout=1)
    # killed at its timeout, not waited for (the worker sleeps 120 s); the margin covers a loaded machine's start-up
    assert time.monotonic() - t0 < 100
    with pytest.raises(mp.ProcessRaisedException, match="boom on rank 0 of 1"):
        run_workers(f"{src}:boom", 1, timeout=60)


def test_death_in_teardown_tolerated_death_before_barrier_fails(tmp_path):
    """Gloo's teardown occasionally aborts a process after the work is done (seen under load): that exit must
    not fail a finished run; a process that dies before the final barrier must. Deaths are simulated with
    ``os._exit(134)`` (the exit status of SIGABRT, without a core file)."""
    src = tmp_path / "w.py"
    src.write_text(
        "import os, torch.distributed as dist\n"
        "def dies_in_teardown(rank, ws):\n"
        "    if rank == 0:\n"
        "        dist.destroy_process_group = lambda *a, **k: os._exit(134)\n"
        "    return 10 * rank\n"
        "def dies_early(rank, ws):\n"
        "    if rank == 1:\n"
        "        os._exit(134)\n"
        "    return rank\n")
    assert run_workers(f"{src}:dies_in_teardown", 2, timeout=60) == [0, 10]
    with pytest.raises(mp.ProcessExitedException, match="exit code 134"):
        run_workers(f"{src}:dies_early", 2, timeout=60)


@pytest.mark.parametrize("kwargs, match", [
    (dict(world_size=0), "world_size must be an int in \\[1, 64\\]"),
    (dict(timeout=0), "timeout must be a number of seconds in \\(0, 3600\\]"),
    (dict(backend="mpi"), "backend must be one of"),
    (dict(threads=0), "threads must be an int in \\[1, 256\\]"),
    (dict(start_method="thread"), "start_method must be one of"),
])
def test_argument_errors(kwargs, match):
    args = dict(target="x.py:f", world_size=1)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        run_workers(**args)


def test_workers_see_the_callers_environment_and_spawn_still_works(tmp_path, monkeypatch):
    """The fork server keeps the environment it started with; each launch must hand the workers the caller's
    environment of that moment (a variable set, one changed, one removed since the server started). The
    ``spawn`` start method (a fresh interpreter per rank, one rank here) gives the same result."""
    src = tmp_path / "w.py"
    src.write_text(
        "import os\n"
        "def env(rank, ws):\n"
        "    return [os.environ.get(k) for k in ('SPECTRAKIT_T_NEW', 'SPECTRAKIT_T_OLD', 'SPECTRAKIT_T_GONE')]\n"
        "def env_and_where(rank, ws):\n"
        "    import spectrakit.distributed.launch as m\n"
        "    return env(rank, ws) + [m.__file__]\n")
    monkeypatch.setenv("SPECTRAKIT_T_OLD", "before")
    monkeypatch.setenv("SPECTRAKIT_T_GONE", "before")
    assert run_workers(f"{src}:env", 2, timeout=120) == [[None, "before", "before"]] * 2  # server started
    monkeypatch.setenv("SPECTRAKIT_T_NEW", "new")
    monkeypatch.setenv("SPECTRAKIT_T_OLD", "changed")
    monkeypatch.delenv("SPECTRAKIT_T_GONE")
    expected = [["new", "changed", None]] * 2
    # ... and run this copy of spectrakit (the fork server does not take the caller's sys.path by itself)
    assert run_workers(f"{src}:env_and_where", 2, timeout=120) == [e + [launch.__file__] for e in expected]
    assert run_workers(f"{src}:env", 1, timeout=120, start_method="spawn") == expected[:1]


def _parent_and_group(rank, ws):
    return os.getppid(), os.getpgid(0)


def test_a_forked_child_spawns_instead_of_using_the_parents_fork_server():
    """After ``os.fork`` the fork server (started by the parent, e.g. by an earlier test) is the parent's: its
    workers would not be the child's children nor in the child's process group, so the child spawns, and an
    explicit ``start_method="forkserver"`` is refused with a clear error. ``start_method="fork"`` from that
    single-threaded child forks the workers from it: its children, in its process group."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (child)
        try:
            msg = launch._default_start_method() + "|"
            try:
                run_workers("x.py:f", 1, start_method="forkserver")
            except ValueError as e:
                msg += str(e)
            os.setpgid(0, 0)
            me = (os.getpid(), os.getpgid(0))
            msg += "|" + str(run_workers(_parent_and_group, 2, timeout=120, start_method="fork") == [me] * 2)
            os.write(w, msg.encode()[:4000])
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        msg = f.read().decode()
    os.waitpid(pid, 0)
    assert launch._default_start_method() in ("forkserver", "spawn")  # the parent is unaffected
    assert msg.startswith("spawn|") and "not available in a process made by os.fork" in msg, msg
    assert msg.endswith("|True"), msg
