"""One process of a script, forked from the test process's fork server (see ``forked_ranks.fork_ranks``):
the globals ``ENV``, ``CWD``, ``SCRIPT``, ``ARGV``, ``STDOUT`` and ``STDERR`` come from ``runpy.run_path``'s
``init_globals``. Sets the environment, arguments and output files the way ``torchrun`` / ``python script.py``
would, then runs the script as ``__main__``; its exit code is the process's (``parser.error`` exits 2).
Not collected by pytest (no ``test_`` prefix)."""

import os
import runpy
import sys

import torch

os.environ.clear()
os.environ.update(ENV)  # noqa: F821 (init_globals)
os.chdir(CWD)  # noqa: F821
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
sys.stdout.flush()
sys.stderr.flush()
for fd, path in ((1, STDOUT), (2, STDERR)):  # noqa: F821
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(target, fd)
    os.close(target)
sys.argv = [SCRIPT, *ARGV]  # noqa: F821
sys.path.insert(0, os.path.dirname(SCRIPT))  # noqa: F821 (as `python script.py` does)
runpy.run_path(SCRIPT, run_name="__main__")  # noqa: F821
