"""Steps skipped for a non-finite or negative tensor learning rate, counted per group without a host read.

A tensor ``lr`` on a GPU cannot be checked on the host without waiting for the device, so such a step is
skipped through the step's flag (and counted in ``skipped_steps``). :class:`LrSkips` also counts those steps
per group on the device and copies the counts to pinned host memory without blocking; a later step reads
the copy once the device has finished it (``Event.query``, never a wait) and warns once per group.
"""

from __future__ import annotations

import warnings

import torch


class LrSkips:
    """Per-group device counters of steps skipped for a bad tensor lr, reported with a one-time warning."""

    def __init__(self):
        self.counts: dict[int, torch.Tensor] = {}
        self._copies: dict[int, tuple[torch.Tensor, object]] = {}
        self._warned: set[int] = set()

    def add(self, index: int, ok: torch.Tensor) -> None:
        """Count one step of group ``index`` whose lr flag ``ok`` (0-d, 1 or 0) is 0."""
        counter = self.counts.get(index)
        if counter is None or counter.device != ok.device:
            counter = self.counts[index] = torch.zeros((), dtype=torch.int64, device=ok.device)
        counter.add_((ok == 0).to(torch.int64))

    def publish(self) -> None:
        """Start a non-blocking copy of every counter to host memory (read by a later :meth:`poll`)."""
        for index, counter in self.counts.items():
            if index in self._warned:
                continue
            pinned = counter.is_cuda and torch.cuda.is_available()
            host = torch.empty((), dtype=torch.int64, pin_memory=pinned)
            host.copy_(counter, non_blocking=pinned)
            event = None
            if pinned:
                event = torch.cuda.Event()
                event.record()
            self._copies[index] = (host, event)

    def poll(self, optimizer: str) -> None:
        """Warn once per group whose finished copy shows a skipped step (never waits for the device)."""
        for index, (host, event) in list(self._copies.items()):
            if event is not None and not event.query():
                continue
            del self._copies[index]
            if int(host) > 0 and index not in self._warned:
                self._warned.add(index)
                warnings.warn(f"{optimizer}: param group {index}: its tensor lr was not finite or negative; "
                              f"{int(host)} step(s) were skipped so far (counted in skipped_steps; "
                              "lr_skipped_steps() gives the count)", RuntimeWarning, stacklevel=3)

    def totals(self) -> dict[int, int]:
        """The counts as numbers (reads the device: not for a hot loop)."""
        return {i: int(c) for i, c in self.counts.items()}
