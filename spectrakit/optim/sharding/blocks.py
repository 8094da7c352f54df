"""Parameters sharded on several mesh dims (FSDP2 x tensor parallel, HSDP x TP): block layouts and their
owner-compute exchange.

A DTensor on an N-d device mesh has one placement per mesh dim. DTensor applies them left to right:
``Shard(d)`` on a mesh dim of size ``n`` splits what earlier mesh dims left of tensor dim ``d`` into ``n``
``torch.chunk`` pieces; ``_StridedShard(d, split_factor=f)`` (what FSDP2 produces on a tensor-parallel
module whose own shard dim is ``d``: the tensor-parallel split happened first) splits it into ``f`` pieces,
each of those into ``n``, and gives mesh coordinate ``i`` the ``i``-th sub-piece of every piece. Either way
the local tensor of a rank is a Cartesian product of index sets, one per tensor dim, each a short list of
contiguous ranges (``f`` ranges for a strided shard). :func:`block_ranges` computes them from shapes only.

The owner-compute exchange (:func:`~spectrakit.optim.sharding.block_exchange.apply_blocks`) runs over
the *flattened sharding group*: the ranks that differ only in the mesh dims that shard the parameter (size > 1);
mesh dims with ``Replicate`` keep separate groups that repeat the same work. With ``W`` ranks in the group:

1. one ``all_to_all_single`` (uneven splits) sends the owner of each matrix every rank's block of it;
2. the owner writes the blocks into the whole matrix (one slice copy per range combination), transforms it;
3. a second ``all_to_all_single`` sends each rank its block of the result."""

# A rank sends its block of every matrix it does not own and receives the other ``W-1`` blocks of the
# matrices it owns, and the reverse for the results: about ``(W-1)/W^2`` of all matrix bytes per phase and
# rank with balanced owners, as along one mesh dim (:mod:`spectrakit.distributed.cost_model`); the owners
# are balanced by FLOPs over all ``W`` ranks (:mod:`spectrakit.optim.sharding.assign`).
# torchtitan's ``DistMuon`` and Dion (Ahn et al. 2025) use the same owner-compute idea.

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence

import torch

Ranges = tuple[tuple[int, int], ...]  # disjoint [start, stop) global ranges, in local order


def _length(ranges: Ranges) -> int:
    return sum(b - a for a, b in ranges)


def _take(ranges: Ranges, start: int, stop: int) -> Ranges:
    """Positions ``[start, stop)`` of the concatenation of ``ranges``, as ranges."""
    out, pos = [], 0
    for a, b in ranges:
        lo, hi = max(start, pos), min(stop, pos + b - a)
        if lo < hi:
            out.append((a + lo - pos, a + hi - pos))
        pos += b - a
    return tuple(out)


def _chunk(ranges: Ranges, n: int, i: int) -> Ranges:
    """The ``i``-th of ``n`` ``torch.chunk`` pieces of ``ranges`` (chunk size ``ceil(L/n)``, trailing pieces
    shorter or empty)."""
    size = _length(ranges)
    cs = -(-size // n)
    return _take(ranges, min(size, i * cs), min(size, (i + 1) * cs))


def _merge(ranges: Ranges) -> Ranges:
    out: list[tuple[int, int]] = []
    for a, b in ranges:
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        elif b > a:
            out.append((a, b))
    return tuple(out)


def placement_spec(placements, ndim: int) -> tuple:
    """Hashable ``(kind, dim, split_factor)`` per mesh dim: ``("r", -1, 1)`` for ``Replicate``,
    ``("s", d, 1)`` for ``Shard(d)``, ``("ss", d, f)`` for ``_StridedShard(d, split_factor=f)``.

    Raises:
        ValueError: any other placement (``Partial``, custom placements).
    """
    from torch.distributed.tensor import Replicate, Shard

    spec = []
    for mesh_dim, pl in enumerate(placements):
        if isinstance(pl, Replicate):
            spec.append(("r", -1, 1))
        elif type(pl) is Shard or type(pl).__name__ == "_StridedShard":
            d = pl.dim if pl.dim >= 0 else pl.dim + ndim
            sf = int(getattr(pl, "split_factor", 1)) if type(pl) is not Shard else 1
            spec.append(("ss", d, sf) if type(pl) is not Shard else ("s", d, 1))
        else:
            raise ValueError(f"unsupported DTensor placement {pl!r} on mesh dim {mesh_dim}")
    return tuple(spec)


@functools.lru_cache(maxsize=4096)
def block_ranges(global_shape: tuple[int, ...], spec: tuple, mesh_shape: tuple[int, ...],
                 coord: tuple[int, ...]) -> tuple[Ranges, ...]:
    """Global index ranges, per tensor dim, of the local tensor at mesh coordinate ``coord``.

    Args:
        global_shape: the DTensor's shape.
        spec: :func:`placement_spec` of its placements.
        mesh_shape: the device mesh's shape.
        coord: this rank's coordinate on the mesh (one int per mesh dim).

    Returns:
        ``ranges[d]``: disjoint ``(start, stop)`` ranges along tensor dim ``d`` whose concatenation, in
        order, is the local tensor's dim ``d`` (empty tuple for an empty local dim).
    """
    ranges: list[Ranges] = [((0, s),) if s else () for s in global_shape]
    for (kind, d, sf), n, i in zip(spec, mesh_shape, coord):
        if kind == "s":
            ranges[d] = _chunk(ranges[d], n, i)
        elif kind == "ss":
            pieces = [_chunk(ranges[d], sf, j) for j in range(sf)]
            ranges[d] = _merge(tuple(r for p in pieces for r in _chunk(p, n, i)))
    return tuple(ranges)


def block_shape(ranges: Sequence[Ranges]) -> tuple[int, ...]:
    """Local shape of a block given by :func:`block_ranges`."""
    return tuple(_length(r) for r in ranges)


def _copies(ranges: Sequence[Ranges]):
    """``(global slices, local slices)`` of every combination of one range per dim."""
    per_dim = []
    for rs in ranges:
        opts, off = [], 0
        for a, b in rs:
            opts.append((slice(a, b), slice(off, off + b - a)))
            off += b - a
        per_dim.append(opts)
    for combo in itertools.product(*per_dim):
        yield tuple(c[0] for c in combo), tuple(c[1] for c in combo)


def place(full: torch.Tensor, piece: torch.Tensor, ranges: Sequence[Ranges]) -> None:
    """Write ``piece`` ``(k, *block_shape)`` into ``full`` ``(k, *global_shape)`` at the block ``ranges``."""
    for g, loc in _copies(ranges):
        full[(slice(None), *g)] = piece[(slice(None), *loc)]


def cut(full: torch.Tensor, ranges: Sequence[Ranges]) -> torch.Tensor:
    """The block ``ranges`` of ``full`` ``(k, *global_shape)``, shaped ``(k, *block_shape)``."""
    out = full.new_empty((full.shape[0], *block_shape(ranges)))
    for g, loc in _copies(ranges):
        out[(slice(None), *loc)] = full[(slice(None), *g)]
    return out
