"""Small models and token streams shared by the training tests."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectrakit.models.llama import Llama, LlamaConfig


def pattern_tokens(n: int, vocab: int = 16, seed: int = 0) -> np.ndarray:
    """A learnable stream: random-length runs of an arithmetic pattern ``t_{i+1} = t_i + 1 mod vocab``."""
    rng = np.random.default_rng(seed)
    out, cur = [], 0
    while len(out) < n:
        cur = int(rng.integers(vocab))
        run = int(rng.integers(3, 12))
        out.extend((cur + k) % vocab for k in range(run))
    return np.asarray(out[:n], dtype=np.uint16)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs single-threaded (the shared ``one_thread`` fixture)."""


@pytest.fixture
def tokens():
    return pattern_tokens(20000), pattern_tokens(4000, seed=1)


@pytest.fixture
def make_model():
    def make(seed: int = 0, **kw) -> Llama:
        torch.manual_seed(seed)
        cfg = dict(vocab_size=16, dim=16, n_layers=1, n_heads=2, max_seq_len=16) | kw
        return Llama(LlamaConfig(**cfg))

    return make
