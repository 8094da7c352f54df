"""Block layouts of DTensors sharded on several mesh dims: the range arithmetic against a brute-force
simulation with ``torch.chunk`` on index tensors (DTensor's documented left-to-right rule, and the
right-to-left order ``_StridedShard`` encodes), tiling, and the slice copies. The real DTensors of FSDP2 x TP
are checked against these ranges in the multi-process suite (test_tensor_parallel.py)."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from spectrakit.optim.sharding.block_exchange import apply_blocks
from spectrakit.optim.sharding.blocks import block_ranges, block_shape, cut, place, placement_spec
from spectrakit.optim.sharding.exchange import SpectralSharder


def _chunk(idx: torch.Tensor, n: int, i: int) -> torch.Tensor:
    pieces = list(torch.chunk(idx, n)) if idx.numel() else []
    return pieces[i] if i < len(pieces) else idx[:0]


def brute_force(shape, spec, mesh_shape, coord) -> list[torch.Tensor]:
    """Per tensor dim, the global indices of the local tensor, by chunking index tensors."""
    idx = [torch.arange(s) for s in shape]
    for (kind, d, sf), n, i in zip(spec, mesh_shape, coord):
        if kind == "s":
            idx[d] = _chunk(idx[d], n, i)
        elif kind == "ss":
            idx[d] = torch.cat([_chunk(_chunk(idx[d], sf, j), n, i) for j in range(sf)])
    return idx


def expand(ranges) -> torch.Tensor:
    return torch.cat([torch.arange(a, b) for a, b in ranges]) if ranges else torch.empty(0, dtype=torch.long)


def test_strided_shard_matches_torch_docstring_example():
    # 8 rows, mesh (dp=2, tp=2): (_StridedShard(0, sf=2), Shard(0)) gives rows 0-1, 4-5, 2-3, 6-7 to ranks 0..3
    spec = (("ss", 0, 2), ("s", 0, 1))
    rows = [block_ranges((8, 8), spec, (2, 2), c)[0] for c in itertools.product(range(2), range(2))]
    assert rows == [((0, 2),), ((4, 6),), ((2, 4),), ((6, 8),)]
    # left-to-right Shard, Shard: rows in rank order
    spec = (("s", 0, 1), ("s", 0, 1))
    rows = [block_ranges((8, 8), spec, (2, 2), c)[0] for c in itertools.product(range(2), range(2))]
    assert rows == [((0, 2),), ((2, 4),), ((4, 6),), ((6, 8),)]


def test_strided_shard_alone_gives_several_ranges():
    # (_StridedShard(0, sf=2)) on 2 ranks of 8 rows: rank 0 holds rows 0-1 and 4-5
    assert block_ranges((8, 3), (("ss", 0, 2),), (2,), (0,)) == (((0, 2), (4, 6)), ((0, 3),))


def _random_case(rng):
    ndim = rng.choice([2, 2, 3])
    shape = tuple(rng.choice([0, 1, 2, 3, 5, 7, 8, 12, 13]) for _ in range(ndim))
    mesh_shape = tuple(rng.choice([1, 2, 3, 4]) for _ in range(rng.choice([1, 2, 3])))
    spec = []
    for _ in mesh_shape:
        kind = rng.choice(["r", "s", "ss"])
        d = rng.randrange(ndim)
        spec.append(("r", -1, 1) if kind == "r" else (kind, d, rng.choice([1, 2, 3]) if kind == "ss" else 1))
    return shape, tuple(spec), mesh_shape


@pytest.mark.parametrize("seed", range(6))
def test_ranges_match_brute_force_and_tile(seed):
    rng = random.Random(seed)
    for _ in range(60):
        shape, spec, mesh_shape = _random_case(rng)
        sharding = [m for m, s in enumerate(spec) if s[0] != "r"]
        count = torch.zeros(shape, dtype=torch.long)
        for coord in itertools.product(*(range(n) for n in mesh_shape)):
            ranges = block_ranges(shape, spec, mesh_shape, coord)
            want = brute_force(shape, spec, mesh_shape, coord)
            for d in range(len(shape)):
                assert torch.equal(expand(ranges[d]), want[d]), (shape, spec, mesh_shape, coord, d)
                assert all(a < b for a, b in ranges[d])  # no empty ranges
            if all(coord[m] == 0 for m in range(len(mesh_shape)) if m not in sharding):
                count[torch.meshgrid(*[expand(r) for r in ranges], indexing="ij")] += 1
        assert bool((count == 1).all()), (shape, spec, mesh_shape)  # the ranks' blocks tile the tensor


def test_place_and_cut_round_trip_through_non_contiguous_blocks():
    g = torch.Generator().manual_seed(0)
    full = torch.randn(3, 9, 7, generator=g)
    spec, mesh_shape = (("ss", 0, 3), ("s", 1, 1)), (2, 2)
    rebuilt = torch.full_like(full, float("nan"))
    for coord in itertools.product(range(2), range(2)):
        ranges = block_ranges((9, 7), spec, mesh_shape, coord)
        piece = cut(full, ranges)
        assert piece.shape == (3, *block_shape(ranges))
        idx = [expand(r) for r in ranges]
        assert torch.equal(piece, full[:, idx[0]][:, :, idx[1]])
        place(rebuilt, piece, ranges)
    assert torch.equal(rebuilt, full)


def test_placement_spec_refuses_partial():
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    assert placement_spec((Replicate(), Shard(-1), _StridedShard(0, split_factor=4)), 2) == (
        ("r", -1, 1), ("s", 1, 1), ("ss", 0, 4))
    with pytest.raises(ValueError, match="unsupported DTensor placement Partial"):
        placement_spec((Shard(0), Partial()), 2)


def test_apply_blocks_single_process_and_errors():
    x = torch.randn(2, 5, 4, dtype=torch.float64)
    blocks = [[block_ranges((5, 4), (("s", 0, 1),), (1,), (0,))]]
    sh = SpectralSharder()
    y = apply_blocks(sh, [x], [(5, 4)], blocks, lambda b, i, t: 2 * t)[0]
    assert torch.equal(y, 2 * x)
    with pytest.raises(ValueError, match="do not tile"):
        apply_blocks(sh, [x], [(5, 4)], [[(((0, 4),), ((0, 4),))]], lambda b, i, t: t)
    with pytest.raises(ValueError, match="local_batches\\[0\\] has shape"):
        apply_blocks(sh, [x[:, :4]], [(5, 4)], blocks, lambda b, i, t: t)
    with pytest.raises(ValueError, match="same length"):
        apply_blocks(sh, [x], [(5, 4)], [], lambda b, i, t: t)
    with pytest.raises(ValueError, match="input's shape and dtype"):
        apply_blocks(sh, [x], [(5, 4)], blocks, lambda b, i, t: t.float())
    assert math.prod(block_shape(blocks[0][0])) == 20
