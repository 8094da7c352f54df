"""Graceful stop on Ctrl-C (SIGINT) and SIGTERM: the training loop finishes its current step, writes a
checkpoint and raises :class:`Interrupted`; the command then prints how to resume and exits 130 / 143.

Outside the training loop (data preparation, model set-up, between runs) there is nothing to save: the
signal unwinds at once, as :class:`KeyboardInterrupt` for SIGINT and :class:`Terminated` (a subclass) for
SIGTERM, and the command line prints one line and exits 130 / 143 (:func:`install_exit_handlers`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
from collections.abc import Iterator

_requested: int | None = None
_deferring = 0  # > 0 inside the training loop (see deferred): the first signal only requests a stop
_exiting: int | None = None  # the signal being unwound by install_exit_handlers' handler
_exit_on_second = False  # a command line (install_exit_handlers): a second signal while stopping ends the process
_immediate = False  # a command line's start-up (imports, parsing): a signal ends the process at once


class Terminated(KeyboardInterrupt):
    """SIGTERM outside the training loop's graceful stop: unwinds like Ctrl-C, exit status 143."""


def exit_code(exc: BaseException) -> int:
    """128 + the signal number: 143 for :class:`Terminated`, 130 for any other :class:`KeyboardInterrupt`."""
    return 128 + int(signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)


def message(exc: BaseException) -> str:
    """The one line a command prints when a signal stops it outside the training loop."""
    return "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted (SIGINT, Ctrl-C)"


def _raise(signum: int) -> None:
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _unwind(signum: int) -> None:
    """Raise for ``signum``; under a command line a further signal while this one unwinds exits at once, and
    during its start-up (:func:`end_start_up` not yet called) the first one does."""
    global _exiting
    if _immediate:
        exit_now(signum)
    if _exit_on_second:
        if _exiting is not None:
            exit_now(signum)
        _exiting = signum
    _raise(signum)


def install_exit_handlers(immediate: bool = False) -> None:
    """For a command line: SIGINT raises :class:`KeyboardInterrupt` and SIGTERM raises :class:`Terminated`,
    at any moment, so that both unwind to the command's entry point (which prints one line and exits
    130 / 143). A further signal while the first one unwinds prints that line and exits at once.

    ``immediate`` (a command-line process): until :func:`end_start_up`, a signal prints the line and ends
    the process at once (:func:`exit_now`). The start-up imports torch and NumPy, and an exception raised
    inside their module initialisation was measured to be swallowed there (turned into an ImportError that
    optional imports catch): the command then went on with half-imported modules and failed later, or ran
    to its end. Nothing has been written before the command starts."""

    def handler(signum, frame):
        _unwind(signum)

    global _exiting, _exit_on_second, _immediate
    _exiting, _exit_on_second, _immediate = None, True, immediate
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, handler)


def end_start_up() -> None:
    """The command starts its work: from now on a signal unwinds (see :func:`install_exit_handlers`)."""
    global _immediate
    _immediate = False


def uninstall_exit_handlers(previous: dict) -> None:
    """Give a Python caller its signal handlers back (``previous``: signal number -> handler)."""
    global _exit_on_second, _immediate
    _exit_on_second = _immediate = False
    for s, h in previous.items():
        signal.signal(s, h)


def exit_now(signum: int, frame=None) -> None:
    """A signal handler that prints the one line for ``signum`` and ends the process at once with
    ``128 + signum`` (no clean-up; for a process that has nothing left to save)."""
    exc = Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
    try:
        sys.stderr.write(message(exc) + "\n")
        sys.stderr.flush()
    finally:
        os._exit(128 + int(signum))


def end_process(code: int) -> None:
    """End a command-line process stopped by a signal outside the training loop, with exit status ``code``,
    after flushing its output, without the interpreter's shutdown: a signal that lands while torch is being
    imported (about a second after start) can leave the half-imported modules in a state in which that
    shutdown ended the process by SIGINT after the one line was printed (measured: 1 in 3 at 1 s). Nothing
    is left to save at that point (the training loop stops through :class:`Interrupted` instead)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def ignore_signals() -> None:
    """Ignore SIGINT and SIGTERM from now on (a command that is already stopping, its line printed)."""
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)


def report_stop(line: str) -> None:
    """Print ``line``, the one line of a command whose training loop stopped at a signal (where it stopped, how
    to go on), on stderr. Under a command line (:func:`install_exit_handlers`) further signals are ignored
    from here on: the command is ending, and a late Ctrl-C must not add a second line."""
    if _exit_on_second:
        ignore_signals()
    print(line, file=sys.stderr)


class Interrupted(Exception):
    """Training stopped at ``step`` by signal ``signum``; ``checkpoint`` is the step directory written (or
    None when the run has no checkpoint folder)."""

    def __init__(self, step: int, signum: int, checkpoint: str | None):
        super().__init__(f"interrupted at step {step}")
        self.step, self.signum, self.checkpoint = step, signum, checkpoint

    @property
    def exit_code(self) -> int:
        """The shell's convention: 128 + signal number (130 for SIGINT, 143 for SIGTERM)."""
        return 128 + int(self.signum)


def request(signum: int = signal.SIGINT, frame=None) -> None:
    """Ask the running training loop to stop after its current step (a signal handler)."""
    global _requested
    _requested = int(signum)


def requested() -> int | None:
    """The signal number of a pending stop request, or None."""
    return _requested


def clear() -> None:
    global _requested
    _requested = None


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Mark the training loop: within :func:`graceful` and this block, the first SIGINT/SIGTERM only
    requests a stop (the loop saves a checkpoint after its current step)."""
    global _deferring
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1


def defers(fn):
    """Decorator: run ``fn`` (a training loop) inside :func:`deferred`."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with deferred():
            return fn(*args, **kwargs)

    return wrapper


@contextlib.contextmanager
def graceful() -> Iterator[None]:
    """Within this block, SIGINT and SIGTERM received inside the training loop (:func:`deferred`) request a
    graceful stop instead of killing the process; a second signal, or one received outside the loop (data
    preparation, model set-up), stops at once: :class:`KeyboardInterrupt` for SIGINT, :class:`Terminated`
    for SIGTERM. Under a command line (:func:`install_exit_handlers`) a second signal while the first one's
    checkpoint is being written ends the process at once (:func:`exit_now`, exit status 128 + signal): an
    exception raised inside the writer would turn into an unrelated error, and the save is atomic, so the
    previous checkpoint stays current. Previous handlers are restored afterwards."""
    clear()

    def handler(signum, frame):
        if _deferring and _requested is None:
            request(signum)
            return
        if _requested is not None and _exit_on_second:
            exit_now(signum)
        _unwind(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        clear()
