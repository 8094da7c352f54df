"""Graceful stop on Ctrl-C (SIGINT) and SIGTERM: the training loop finishes its current step, writes a
checkpoint and raises :class:`Interrupted`; the command then prints how to resume and exits 130 / 143."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

_requested: int | None = None


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
def graceful() -> Iterator[None]:
    """Within this block SIGINT and SIGTERM request a graceful stop instead of killing the process; a second
    Ctrl-C stops at once (KeyboardInterrupt). Previous handlers are restored afterwards."""
    clear()

    def handler(signum, frame):
        if _requested is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        request(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        clear()
