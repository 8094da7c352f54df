"""How a parameter is laid out across ranks, and which layouts the sharded spectral step supports.

Three layouts reach the optimizer:

- ``replicated``: a plain tensor (DDP, single process) or a DTensor whose placements are all
  ``Replicate``: every rank holds the whole matrix.
- ``sharded``: a DTensor (FSDP2 ``fully_shard``, or HSDP) sharded along one tensor dim ``d`` on exactly one
  mesh dim, ``Replicate`` on the others. The local piece of rank ``r`` is ``torch.chunk``'s ``r``-th chunk
  along ``d`` (chunk size ``ceil(D/W)``, trailing ranks may get fewer or zero rows).
- anything else is refused with a ``ValueError`` naming the parameter: ``Partial`` placements (pending
  reductions), several mesh dims sharding the same tensor (FSDP + tensor parallel), strided/custom
  shards. Gathering those would need the tensor-parallel plan; guessing would give wrong results.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spectrakit._checks import check_int

try:  # torch >= 2.4
    from torch.distributed.tensor import DTensor, Replicate, Shard
except ImportError:  # pragma: no cover - very old torch or a build without distributed
    DTensor = Replicate = Shard = None


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
    """Placement of one parameter: ``kind`` is ``"replicated"`` or ``"sharded"``.

    For ``"sharded"``: ``shard_dim`` is the tensor dim split across the ranks of ``group`` (the process
    group of the sharding mesh dim), ``mesh_dim`` that mesh dim; ``global_shape`` is the full shape.
    """

    kind: str
    global_shape: tuple[int, ...]
    shard_dim: int | None = None
    mesh_dim: int | None = None
    group: object = None


def is_dtensor(t) -> bool:
    """Whether ``t`` is a ``torch.distributed.tensor.DTensor``."""
    return DTensor is not None and isinstance(t, DTensor)


def layout_of(t: torch.Tensor, name: str = "param") -> Layout:
    """Classify the layout of ``t`` (a tensor or DTensor); see the module docstring.

    Args:
        t: the parameter (or gradient / update) tensor.
        name: used in error messages.

    Raises:
        TypeError: ``t`` is not a tensor.
        ValueError: unsupported DTensor placements (``Partial``, more than one sharded mesh dim, strided
            or non-``Shard`` shard placements, a dim sharded twice).
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or DTensor, got {type(t).__name__}")
    shape = tuple(int(s) for s in t.shape)
    if not is_dtensor(t):
        return Layout("replicated", shape)
    sharded = []
    for mesh_dim, pl in enumerate(t.placements):
        if isinstance(pl, Replicate):
            continue
        if type(pl) is Shard:
            sharded.append((mesh_dim, pl.dim if pl.dim >= 0 else pl.dim + len(shape)))
            continue
        raise ValueError(
            f"{name}: unsupported DTensor placement {pl!r} on mesh dim {mesh_dim} (placements "
            f"{tuple(t.placements)}); the spectral optimizer supports Replicate and Shard(d) on one mesh dim "
            "(DDP, FSDP2, HSDP). Partial placements must be reduced and strided/tensor-parallel shards "
            "redistributed before the optimizer step")
    if not sharded:
        return Layout("replicated", shape)
    if len(sharded) > 1:
        raise ValueError(
            f"{name}: DTensor sharded on {len(sharded)} mesh dims (placements {tuple(t.placements)}, e.g. "
            "FSDP + tensor parallel); the spectral optimizer can gather a matrix along one mesh dim only. "
            "Use FSDP2/HSDP without tensor-parallel sharding of matrix parameters, or redistribute them to "
            "Replicate on the tensor-parallel mesh dim")
    mesh_dim, dim = sharded[0]
    return Layout("sharded", shape, shard_dim=dim, mesh_dim=mesh_dim, group=t.device_mesh.get_group(mesh_dim))
