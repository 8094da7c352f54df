"""The ``spectrakit`` executable's entry point: its first instruction puts SIGINT/SIGTERM handlers in place.

Until the command line installs its own (:func:`spectrakit.cli.main`), a signal prints one line and ends
the process with status 130 / 143 at once: nothing has been written yet, and a ``KeyboardInterrupt`` raised
inside the heavy imports (torch, NumPy) would print a traceback or be swallowed by them. Only the
interpreter's own start-up (before any spectrakit code runs) is outside its reach.
"""

import os
import signal


def _stop(signum, frame):  # pragma: no cover (ends the process)
    os.write(2, b"terminated (SIGTERM)\n" if signum == signal.SIGTERM else b"interrupted (SIGINT, Ctrl-C)\n")
    os._exit(128 + signum)


signal.signal(signal.SIGINT, _stop)
signal.signal(signal.SIGTERM, _stop)


def main() -> int:
    """``spectrakit.cli.main()`` for the process's own command line."""
    from spectrakit.cli import main as run

    return run()
