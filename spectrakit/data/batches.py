"""Batches of token windows from a memory-mapped token array, reproducible from ``(seed, position)``.

Training batch number ``i`` is a pure function of ``(seed, i, rank, world_size)``: its window offsets are
drawn by a ``torch.Generator`` seeded with ``seed * 1_000_003 + i * world_size + rank``. So the whole data
stream state is the integer ``position`` — checkpoints store it and resume is exact — and every optimizer in a
comparison sees the same data order. Validation uses fixed, non-overlapping consecutive windows.
"""

from __future__ import annotations

import numpy as np
import torch

from spectrakit._checks import check_int


def _windows(tokens: np.ndarray, offsets: np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    idx = offsets[:, None] + np.arange(seq_len + 1)[None, :]
    block = torch.from_numpy(np.asarray(tokens[idx], dtype=np.int64))
    return block[:, :-1], block[:, 1:]


class TokenBatches:
    """Random windows ``(x, y = x shifted by one)`` of ``seq_len`` tokens.

    Args:
        tokens: 1-D integer array (e.g. the uint16 memmap of :func:`spectrakit.data.tokens.prepare`), longer
            than ``seq_len + 1``.
        batch_size: windows per batch, >= 1.
        seq_len: tokens per window, >= 1.
        seed: data-order seed, >= 0.
        rank, world_size: this process' share under data parallelism (0 <= rank < world_size).
    """

    def __init__(
        self,
        tokens: np.ndarray,
        batch_size: int,
        seq_len: int,
        *,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        check_int(batch_size, "batch_size", low=1)
        check_int(seq_len, "seq_len", low=1)
        check_int(seed, "seed", low=0)
        check_int(world_size, "world_size", low=1)
        check_int(rank, "rank", low=0, high=world_size - 1)
        if tokens.ndim != 1 or len(tokens) < seq_len + 2:
            raise ValueError(
                f"tokens must be 1-D with more than seq_len + 1 = {seq_len + 1} entries, "
                f"got shape {tokens.shape}"
            )
        self.tokens, self.batch_size, self.seq_len = tokens, batch_size, seq_len
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.position = 0

    def batch(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch number ``i`` (int64 tensors of shape (batch_size, seq_len)), independent of ``position``."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i * self.world_size + self.rank)
        high = len(self.tokens) - self.seq_len - 1
        offsets = torch.randint(0, high + 1, (self.batch_size,), generator=g).numpy()
        return _windows(self.tokens, offsets, self.seq_len)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch at ``position``, then advance ``position`` by one."""
        out = self.batch(self.position)
        self.position += 1
        return out

    def state_dict(self) -> dict:
        return {"position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if state.get("seed", self.seed) != self.seed:
            raise ValueError(f"data state has seed {state['seed']}, this stream has seed {self.seed}")
        self.position = int(state["position"])


def eval_batches(tokens: np.ndarray, batch_size: int, seq_len: int, max_tokens: int | None = None):
    """Yield consecutive non-overlapping validation windows ``(x, y)`` covering ``tokens`` (at most
    ``max_tokens`` target tokens, rounded down to whole windows; at least one window)."""
    check_int(batch_size, "batch_size", low=1)
    check_int(seq_len, "seq_len", low=1)
    n_win = (len(tokens) - 1) // seq_len
    if max_tokens is not None:
        n_win = min(n_win, max(1, max_tokens // seq_len))
    if n_win < 1:
        raise ValueError(f"validation tokens ({len(tokens)}) must be more than seq_len = {seq_len}")
    starts = np.arange(n_win) * seq_len
    for b in range(0, n_win, batch_size):
        yield _windows(tokens, starts[b : b + batch_size], seq_len)
