"""Run a script (``[python, script, *argv]``) on several processes the way ``torchrun`` / ``python script.py``
would, without a fresh interpreter per process: each process is forked from Python's fork server, which has
imported torch once (``rank_main.py`` sets the environment, arguments, working directory and output files,
then runs the script as ``__main__``; its exit code is the process's). A fresh interpreter would import torch
and the distributed packages again, about 6 s of CPU per process on a loaded 2-core machine. Used by the
example tests and the DDP test; the soak tier runs the same scripts under torchrun itself.
Not collected by pytest (no ``test_`` prefix)."""

from __future__ import annotations

import multiprocessing
import os
import runpy
import socket
import subprocess
import tempfile
import time

import pytest

from spectrakit.distributed.launch import _ensure_fork_server

RANK_MAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_main.py")


def fork_ranks(args, envs, cwd, timeout=300):
    """Run ``args`` (``[python, script, *argv]``, the script relative to ``cwd`` or absolute) in
    ``len(envs)`` processes, process ``r`` with environment ``envs[r]``, each forked from the fork server.
    Returns process 0's completed process and every exit code; fails the test if they do not end within
    ``timeout`` seconds (the processes are then killed)."""
    _ensure_fork_server()  # the distributed launcher's server (torch imported once), started if not yet
    ctx = multiprocessing.get_context("forkserver")
    with tempfile.TemporaryDirectory(prefix="spectrakit_ranks_") as tmp:
        procs, outs = [], []
        for r, env in enumerate(envs):
            out, err = os.path.join(tmp, f"{r}.out"), os.path.join(tmp, f"{r}.err")
            for path in (out, err):
                open(path, "w").close()  # there to read even if the process dies before writing
            init = dict(ENV=env, CWD=cwd, SCRIPT=os.path.join(cwd, args[1]), ARGV=list(args[2:]), STDOUT=out,
                        STDERR=err)
            procs.append(ctx.Process(target=runpy.run_path, args=(RANK_MAIN,),
                                     kwargs=dict(init_globals=init, run_name="_spectrakit_forked_rank")))
            procs[-1].start()
            outs.append((out, err))
        deadline = time.monotonic() + timeout
        try:
            for p in procs:
                p.join(max(0.0, deadline - time.monotonic()))
            hung = [r for r, p in enumerate(procs) if p.exitcode is None]
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join(5)
        texts = []
        for out, err in outs:
            with open(out) as fo, open(err) as fe:
                texts.append((fo.read(), fe.read()))
    if hung:  # what each process had written, to tell a hang in the rendezvous from one in the job
        tails = "\n".join(f"--- process {r} (exit code {p.exitcode}): stdout ...{texts[r][0][-1500:]}\n"
                          f"stderr ...{texts[r][1][-1500:]}" for r, p in enumerate(procs))
        pytest.fail(f"{args[1]} on {len(envs)} processes did not finish within {timeout} s (processes {hung} "
                    f"still running)\n{tails}")
    codes = [p.exitcode for p in procs]
    return subprocess.CompletedProcess(args, codes[0], *texts[0]), codes


def torchrun_envs(env, nproc):
    """``nproc`` copies of ``env`` with the variables torchrun sets for a local job (rank, local rank, world
    size, and a free port on 127.0.0.1 for the rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Gloo on the loopback interface: without GLOO_SOCKET_IFNAME it takes the address the host name resolves
    # to, which on some machines no other process can reach
    base = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(nproc),
                LOCAL_WORLD_SIZE=str(nproc), GLOO_SOCKET_IFNAME=env.get("GLOO_SOCKET_IFNAME", "lo"))
    return [dict(base, RANK=str(r), LOCAL_RANK=str(r)) for r in range(nproc)]
