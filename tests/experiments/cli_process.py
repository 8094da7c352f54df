"""The ``spectrakit`` command in a process forked from the test process's fork server (see
``conftest.cli_process``): ``runpy.run_path`` runs this file with the globals ``ENV``, ``ARGV``, ``STDOUT`` and
``STDERR``. Sets the environment, arguments and output files as ``spectrakit ARGV...`` in a shell would, then
runs the console script's entry point; its exit status is the process's. Not collected by pytest (no
``test_`` prefix)."""

import os
import sys

os.environ.clear()
os.environ.update(ENV)  # noqa: F821 (init_globals)
sys.stdout.flush()
sys.stderr.flush()
for fd, path in ((1, STDOUT), (2, STDERR)):  # noqa: F821
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(target, fd)
    os.close(target)
sys.argv = ["spectrakit", *ARGV]  # noqa: F821

from spectrakit.cli import main  # noqa: E402

sys.exit(main())
