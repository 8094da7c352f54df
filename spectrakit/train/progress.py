"""Plain progress lines for logs and pipes (where a progress bar cannot redraw).

One line every ~10% of the run or every 30 s, whichever comes first, and at the end::

    [adamw s0] step 20/200 loss 5.12 3.1k tok/s eta 1m20s
"""

from __future__ import annotations

import sys
import time


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def _rate(tok_s: float) -> str:
    for unit, div in (("M", 1e6), ("k", 1e3)):
        if tok_s >= div:
            return f"{tok_s / div:.1f}{unit}"
    return f"{tok_s:.0f}"


class ProgressLines:
    """Print ``[desc] step k/N loss L R tok/s eta T`` lines to ``stream`` (default stderr) every
    ``fraction`` of the run or ``interval`` seconds, and at the last step."""

    def __init__(self, desc: str, total: int, start: int = 0, *, fraction: float = 0.1, interval: float = 30.0,
                 stream=None):
        self.desc, self.total, self.start = desc, total, start
        self.every = max(1, int(total * fraction))
        self.interval = interval
        self.stream = stream
        self.t_start = self.t_last = time.perf_counter()
        self.next_step = start + self.every

    def update(self, step: int, loss: float, tok_s: float) -> None:
        now = time.perf_counter()
        if step < self.next_step and step < self.total and now - self.t_last < self.interval:
            return
        done = step - self.start
        eta = (now - self.t_start) / done * (self.total - step) if done > 0 else 0.0
        print(f"[{self.desc}] step {step}/{self.total} loss {loss:.3f} {_rate(tok_s)} tok/s eta {_duration(eta)}",
              file=self.stream or sys.stderr, flush=True)
        self.t_last = now
        while self.next_step <= step:
            self.next_step += self.every
