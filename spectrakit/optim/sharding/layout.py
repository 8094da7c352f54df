"""How a parameter is laid out across ranks, and which layouts the sharded spectral step supports.

Three layouts reach the optimizer:

- ``replicated``: a plain tensor (DDP, single process) or a DTensor whose placements are all
  ``Replicate``: every rank holds the whole matrix.
- ``sharded``: a DTensor (FSDP2 ``fully_shard``, or HSDP) sharded along one tensor dim ``d`` on exactly one
  mesh dim, ``Replicate`` on the others. The local piece of rank ``r`` is ``torch.chunk``'s ``r``-th chunk
  along ``d`` (chunk size ``ceil(D/W)``, trailing ranks may get fewer or zero rows).
- ``blocks``: a DTensor sharded on several mesh dims of size > 1 (FSDP2 x tensor parallel: a Colwise
  matrix is ``(_StridedShard(0) or Shard(0) on dp, Shard(0) on tp)``, a Rowwise one ``(Shard(0) on dp,
  Shard(1) on tp)``; HSDP x TP on a 3-D mesh), or by a ``_StridedShard``. The local tensor of each rank is a
  block of index ranges (:func:`~spectrakit.optim.sharding.blocks.block_ranges`); the exchange runs over the
  flattened sharding group, the ranks that differ only in the sharding mesh dims.
- anything else is refused with a ``ValueError`` naming the parameter: ``Partial`` placements (pending
  reductions) and custom placements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from spectrakit._checks import check_int
from spectrakit.optim.sharding.blocks import block_ranges, placement_spec

try:  # torch >= 2.4
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - very old torch or a build without distributed
    DTensor = None


def chunk_sizes(dim_size: int, world_size: int) -> list[int]:
    """Sizes of the ``world_size`` pieces of ``torch.chunk``-style sharding of a dim of length ``dim_size``.

    ``size_r = clamp(dim_size - r * ceil(dim_size / W), 0, ceil(dim_size / W))`` — the rule ``Shard(d)``
    of DTensor (and so FSDP2) uses; e.g. 7 rows on 2 ranks -> [4, 3], 3 rows on 4 ranks -> [1, 1, 1, 0].

    Raises:
        ValueError: ``dim_size < 0`` or ``world_size < 1``.
    """
    check_int(dim_size, "dim_size", low=0)
    check_int(world_size, "world_size", low=1)
    cs = -(-dim_size // world_size)
    return [max(0, min(cs, dim_size - r * cs)) for r in range(world_size)]


@dataclass(frozen=True)
class Layout:
    """Placement of one parameter: ``kind`` is ``"replicated"``, ``"sharded"`` or ``"blocks"``.

    For ``"sharded"``: ``shard_dim`` is the tensor dim split across the ranks of ``group`` (the process
    group of the sharding mesh dim), ``mesh_dim`` that mesh dim; ``global_shape`` is the full shape.
    For ``"blocks"``: ``group`` is the flattened sharding group and ``blocks[s]`` the index ranges
    (per tensor dim) of group rank ``s``'s local tensor.
    """

    kind: str
    global_shape: tuple[int, ...]
    shard_dim: int | None = None
    mesh_dim: int | None = None
    group: object = None
    blocks: tuple | None = None


def is_dtensor(t) -> bool:
    """Whether ``t`` is a ``torch.distributed.tensor.DTensor``."""
    return DTensor is not None and isinstance(t, DTensor)


_GROUPS: dict[tuple, object] = {}


def sharding_group(mesh, mesh_dims: tuple[int, ...]):
    """The process group of this rank's ranks that differ only in ``mesh_dims`` of ``mesh``, and their
    global ranks in group-rank order (ascending, as ``torch.distributed.new_group`` orders them).

    The first call for a mesh and set of dims creates the groups of every slice with
    ``new_subgroups_by_enumeration``, a collective of the whole job: every rank must reach it (the
    optimizer does, since every rank classifies the same parameters in the same order). Cached.
    """
    ranks = mesh.mesh
    key = (tuple(ranks.flatten().tolist()), tuple(ranks.shape), tuple(mesh_dims))
    if key not in _GROUPS:
        rest = [d for d in range(ranks.ndim) if d not in mesh_dims]
        slices = ranks.permute(*rest, *mesh_dims).reshape(-1, math.prod(ranks.shape[d] for d in mesh_dims))
        lists = [sorted(row) for row in slices.tolist()]
        _, groups = dist.new_subgroups_by_enumeration(lists)
        _GROUPS[key] = {r: (g, tuple(lst)) for lst, g in zip(lists, groups) for r in lst}
    return _GROUPS[key][dist.get_rank()]


def _coord(ranks: torch.Tensor, rank: int) -> tuple[int, ...]:
    return tuple(int(i) for i in (ranks == rank).nonzero()[0].tolist())


def layout_of(t: torch.Tensor, name: str = "param") -> Layout:
    """Classify the layout of ``t`` (a tensor or DTensor); see the module docstring.

    Args:
        t: the parameter (or gradient / update) tensor.
        name: used in error messages.

    Raises:
        TypeError: ``t`` is not a tensor.
        ValueError: unsupported DTensor placements (``Partial``, custom placements).
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or DTensor, got {type(t).__name__}")
    shape = tuple(int(s) for s in t.shape)
    if not is_dtensor(t):
        return Layout("replicated", shape)
    try:
        spec = placement_spec(t.placements, len(shape))
    except ValueError as e:
        raise ValueError(
            f"{name}: {e} (placements {tuple(t.placements)}); the spectral optimizer supports Replicate, "
            "Shard(d) and FSDP2's strided shards on any number of mesh dims (DDP, FSDP2, HSDP, tensor "
            "parallel). Partial placements must be reduced before the optimizer step") from None
    mesh = t.device_mesh
    mesh_shape = tuple(int(s) for s in mesh.mesh.shape)
    sharded = [m for m, (kind, _, _) in enumerate(spec) if kind != "r" and mesh_shape[m] > 1]
    if not sharded:
        return Layout("replicated", shape)
    if len(sharded) == 1 and spec[sharded[0]][0] == "s":
        mesh_dim = sharded[0]
        return Layout("sharded", shape, shard_dim=spec[mesh_dim][1], mesh_dim=mesh_dim,
                      group=mesh.get_group(mesh_dim))
    group, members = sharding_group(mesh, tuple(sharded))
    blocks = tuple(block_ranges(shape, spec, mesh_shape, _coord(mesh.mesh, r)) for r in members)
    return Layout("blocks", shape, group=group, blocks=blocks)
