"""Chunk sizes of Shard(d) against torch.chunk / DTensor, and layout classification of plain tensors.

DTensor layouts (Replicate, Shard, Partial, two sharded mesh dims) are checked on 2 processes in
test_optimizer.py (they need a device mesh)."""

from __future__ import annotations

import pytest
import torch

from spectrakit.optim.sharding.layout import chunk_sizes, is_dtensor, layout_of


@pytest.mark.parametrize("D", [0, 1, 2, 3, 5, 7, 8, 16, 17, 100])
@pytest.mark.parametrize("W", [1, 2, 3, 4, 8])
def test_chunk_sizes_match_torch_chunk(D, W):
    x = torch.arange(D)
    pieces = [len(p) for p in torch.chunk(x, W)] if D else []
    pieces += [0] * (W - len(pieces))
    assert chunk_sizes(D, W) == pieces
    assert sum(chunk_sizes(D, W)) == D


def test_chunk_examples_from_docstring():
    assert chunk_sizes(7, 2) == [4, 3]
    assert chunk_sizes(3, 4) == [1, 1, 1, 0]
    assert chunk_sizes(5, 4) == [2, 2, 1, 0]  # torch.chunk rule, not the balanced 2,1,1,1


@pytest.mark.parametrize("shape", [(3,), (4, 5), (2, 3, 4)])
def test_plain_tensor_is_replicated(shape):
    t = torch.randn(shape)
    lay = layout_of(t)
    assert not is_dtensor(t)
    assert lay.kind == "replicated" and lay.global_shape == shape and lay.shard_dim is None


def test_errors():
    with pytest.raises(TypeError, match="param must be a torch.Tensor"):
        layout_of([1, 2])
    with pytest.raises(ValueError, match="dim_size must be an int in \\[0"):
        chunk_sizes(-1, 2)
    with pytest.raises(ValueError, match="world_size must be an int in \\[1"):
        chunk_sizes(4, 0)
