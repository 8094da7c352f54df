"""The owner-compute exchange of matrices sharded as blocks over several mesh dims (FSDP2 x tensor
parallel, HSDP x TP); the layouts and range arithmetic are in :mod:`spectrakit.optim.sharding.blocks`.

1. one ``all_to_all_single`` (uneven splits) over the flattened sharding group sends the owner of each
   matrix every rank's block of it;
2. the owner writes the blocks into the whole matrix (one slice copy per range combination) and transforms it;
3. a second ``all_to_all_single`` sends each rank its block of the result.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist

from spectrakit.optim.sharding.blocks import Ranges, block_shape, cut, place
from spectrakit.optim.sharding.exchange import SpectralSharder, Transform, _check_out, group_size_rank


def apply_blocks(sharder: SpectralSharder, local_batches: Sequence[torch.Tensor],
                 global_shapes: Sequence[tuple], blocks: Sequence[Sequence[Sequence[Ranges]]],
                 fn: Transform) -> list[torch.Tensor]:
    """Transform matrices whose blocks are spread over the ranks of ``sharder.group`` (see the module
    docstring); collective over that group.

    Args:
        sharder: owner plans and the process group (the flattened sharding group).
        local_batches: ``(k_b, *block_shape)``: this rank's block of each of ``k_b`` matrices.
        global_shapes: full matrix shape of each batch (at least 2 dims).
        blocks: ``blocks[b][s]``: :func:`block_ranges` of group rank ``s`` for batch ``b``; together they
            must tile the global shape.
        fn: the per-matrix transform, called on whole matrices ``(len(idx), *global_shape_b)``.

    Returns:
        This rank's blocks of the transformed matrices, shaped like ``local_batches``.

    Raises:
        ValueError: inconsistent lengths, blocks that do not tile the global shape, a local shape that is
            not this rank's block, or ``fn`` returning a wrong shape/dtype.
    """
    if not (len(local_batches) == len(global_shapes) == len(blocks)):
        raise ValueError("local_batches, global_shapes and blocks must have the same length, got "
                         f"{len(local_batches)}, {len(global_shapes)}, {len(blocks)}")
    W, rank = group_size_rank(sharder.group)
    global_shapes = [tuple(int(s) for s in g) for g in global_shapes]
    for b, (x, g, bl) in enumerate(zip(local_batches, global_shapes, blocks)):
        if len(g) < 2 or len(bl) != W or any(len(r) != len(g) for r in bl):
            raise ValueError(f"blocks[{b}] must give {W} blocks of {len(g)} dims for global shape {g}")
        if sum(math.prod(block_shape(r)) for r in bl) != math.prod(g):
            raise ValueError(f"blocks[{b}] do not tile the global shape {g}")
        if tuple(x.shape[1:]) != block_shape(bl[rank]):
            raise ValueError(f"local_batches[{b}] has shape {tuple(x.shape)}; rank {rank} of {W} holds "
                             f"{(x.shape[0],) + block_shape(bl[rank])} of global shape {g}")
    if W == 1:
        return [_check_out(fn(b, list(range(x.shape[0])), x), x, b) for b, x in enumerate(local_batches)]
    owners = sharder.owners([(x.shape[0], g) for x, g in zip(local_batches, global_shapes)])

    def numel(b: int, s: int) -> int:
        return math.prod(block_shape(blocks[b][s]))

    outs = [torch.empty_like(x) for x in local_batches]
    for dtype in dict.fromkeys(x.dtype for x in local_batches):
        members = [b for b, x in enumerate(local_batches) if x.dtype == dtype]
        device = local_batches[members[0]].device
        table = sharder._owned(owners, device)
        # phase 1: my block of every matrix -> its owner
        send_split = [sum(len(table[b][o][0]) * numel(b, rank) for b in members) for o in range(W)]
        recv_split = [sum(len(table[b][rank][0]) * numel(b, s) for b in members) for s in range(W)]
        pieces = [local_batches[b].index_select(0, table[b][o][1]).reshape(-1)
                  for o in range(W) for b in members if table[b][o][0]]
        send = torch.cat(pieces) if pieces else torch.empty(0, dtype=dtype, device=device)
        recv = torch.empty(sum(recv_split), dtype=dtype, device=device)
        dist.all_to_all_single(recv, send, recv_split, send_split, group=sharder.group)
        # assemble whole matrices on the owner, transform, cut them into the ranks' blocks
        fulls = {b: torch.empty(len(table[b][rank][0]), *global_shapes[b], dtype=dtype, device=device)
                 for b in members if table[b][rank][0]}
        off = 0
        for s in range(W):
            for b in fulls:
                k, n = fulls[b].shape[0], fulls[b].shape[0] * numel(b, s)
                place(fulls[b], recv[off:off + n].view(k, *block_shape(blocks[b][s])), blocks[b][s])
                off += n
        back: list[list[torch.Tensor]] = [[] for _ in range(W)]
        for b, full in fulls.items():
            y = _check_out(fn(b, table[b][rank][0], full), full, b)
            for s in range(W):
                if numel(b, s):
                    back[s].append(cut(y, blocks[b][s]).reshape(-1))
        send2 = torch.cat([p for s in range(W) for p in back[s]]) if any(back) else \
            torch.empty(0, dtype=dtype, device=device)
        recv2 = torch.empty(sum(send_split), dtype=dtype, device=device)
        # phase 2: result blocks -> every rank (the splits of phase 1, reversed)
        dist.all_to_all_single(recv2, send2, send_split, recv_split, group=sharder.group)
        off = 0
        for o in range(W):
            for b in members:
                idx, idx_t = table[b][o]
                if not idx:
                    continue
                n = len(idx) * numel(b, rank)
                outs[b].index_copy_(0, idx_t, recv2[off:off + n].view(len(idx), *local_batches[b].shape[1:]))
                off += n
    return outs
