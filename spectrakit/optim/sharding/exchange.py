"""Run a per-matrix transform on the owner rank of each matrix and exchange the results.

Jiang, Semenov and Stich 2026 §6 names efficient distributed spectral clipping as future work; its reference code
(Table F.2:
+18.7% step time at 160M on 4 GPUs) repeats every matrix's clipping on every rank. Here each matrix is
transformed once, by its owner (:mod:`spectrakit.optim.sharding.assign`), and only results move.

Two communication patterns (bytes per rank: :mod:`spectrakit.distributed.cost_model`):

- **replicated** (DDP): every rank holds every matrix. Rank ``r`` transforms the matrices it owns, packs
  the results into one flat buffer per dtype; one padded all-gather (sizes balanced) or one broadcast per
  owning rank (a few very large matrices, many ranks) gives every rank every result.
- **sharded** (FSDP2 / HSDP, ``Shard(d)`` DTensors): rank ``r`` holds chunk ``r`` of every matrix along
  dim ``d``. One ``all_to_all_single`` (uneven splits) sends each owner the chunks of its matrices, the
  owner concatenates them to whole matrices, transforms them, and a second ``all_to_all_single`` sends
  every rank its chunk of every result back. Nothing is gathered on ranks that do not own a matrix."""

# The transform ``fn(b, idx, x)`` gets the batch index ``b``, the list ``idx`` of matrix indices in that
# batch (the ones this rank owns) and the whole matrices ``x`` of shape ``(len(idx), *shape_b)``; it must
# return a tensor of the same shape and dtype. No host-device synchronisation: all sizes come from shapes,
# index tensors are built once per plan and cached on the device.

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from spectrakit._checks import check_choice
from spectrakit.optim.sharding.assign import plan_batches, spectral_flops
from spectrakit.optim.sharding.layout import chunk_sizes

Transform = Callable[[int, list, torch.Tensor], torch.Tensor]

# torch >= 2.13 renames all_gather_into_tensor (same collective, same arguments)
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def group_size_rank(group=None) -> tuple[int, int]:
    """``(world_size, rank)`` of ``group`` (the default group if None); ``(1, 0)`` without an initialized
    process group, so the same code runs in a single process."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


def _check_out(y: torch.Tensor, x: torch.Tensor, b: int) -> torch.Tensor:
    if not isinstance(y, torch.Tensor) or y.shape != x.shape or y.dtype != x.dtype:
        got = f"{tuple(y.shape)} {y.dtype}" if isinstance(y, torch.Tensor) else type(y).__name__
        raise ValueError(f"fn must return a tensor of the input's shape and dtype for batch {b}: expected "
                         f"{tuple(x.shape)} {x.dtype}, got {got}")
    return y


class SpectralSharder:
    """Owner plans, cached index tensors and the two exchange patterns for one process group.

    Args:
        group: process group (default: the default group; a single process works without one).
        cost: cost of one matrix of a given shape, used for load balancing (default
            :func:`~spectrakit.optim.sharding.assign.spectral_flops`).
        replicated_exchange: ``"all_gather"`` (one padded all-gather), ``"broadcast"`` (one broadcast per
            owning rank) or ``"auto"`` (see :meth:`replicated_method`).

    Methods :meth:`apply_replicated` and :meth:`apply_sharded` are collective: every rank of ``group`` must
    call them with the same batch shapes in the same order.
    """

    def __init__(self, group=None, cost: Callable[[tuple], float] = spectral_flops,
                 replicated_exchange: str = "auto"):
        check_choice(replicated_exchange, "replicated_exchange", {"auto", "all_gather", "broadcast"})
        self.group = group
        self.replicated_exchange = replicated_exchange
        self.cost = cost
        self._plans: dict = {}
        self._loads: list[float] | None = None
        self._calls: list[tuple] = []          # (count, shape) batches of the current step, in call order
        self._expected: tuple | None = None    # the batches of the previous step

    def reset_loads(self) -> None:
        """Start a new step (the optimizer calls this before each step).

        The first step is planned greedily call by call (each batch on top of the earlier ones' loads).
        From the second step on, when the calls repeat those of the previous step (the usual case), each
        call uses its part of ONE greedy plan over all the step's matrices, largest first — the same plan on
        every rank, since every rank makes the same calls. A call that departs from the recorded sequence
        falls back to the call-by-call plan for the rest of the step."""
        if self._calls:
            self._expected = tuple(self._calls)
        self._calls = []
        self._loads = None

    @property
    def world_size(self) -> int:
        """Size of the process group (1 without an initialized process group)."""
        return group_size_rank(self.group)[0]

    @property
    def rank(self) -> int:
        """This process's rank in the group (0 without an initialized process group)."""
        return group_size_rank(self.group)[1]

    def _add_loads(self, loads, batches, owners) -> list[float]:
        new = list(loads)
        for (_, shape), ob in zip(batches, owners):
            c = self.cost(shape)
            for r in ob:
                new[r] += c
        return new

    def owners(self, batch_shapes: Sequence[tuple[int, tuple]]) -> list[list[int]]:
        """Owner rank of every matrix of this call's batches, ``owners[b][i]`` (see :meth:`reset_loads`
        for how consecutive calls of a step are planned together; plans are cached)."""
        W = self.world_size
        batches = tuple((int(k), tuple(int(v) for v in s)) for k, s in batch_shapes)
        if len(self._calls) > 100_000:  # used without reset_loads(): do not grow without bound
            self.reset_loads()
            self._expected = None
        i = len(self._calls)
        self._calls.extend(batches)
        exp = self._expected
        if exp is not None and self._loads is None and tuple(self._calls) == exp[:len(self._calls)]:
            return self.owners_of_step(exp)[i:i + len(batches)]
        if self._loads is None:  # first call of a step, or the sequence departs from the recorded one
            prev = self._calls[:i]
            loads = [0.0] * W
            if prev and exp is not None and tuple(prev) == exp[:i]:
                loads = self._add_loads(loads, prev, self.owners_of_step(exp)[:i])
            elif prev:
                loads = self._add_loads(loads, prev, plan_batches(prev, W, self.cost))
            self._loads = loads
        loads = tuple(self._loads)
        key = ("owners", batches, loads)
        if key not in self._plans:
            owners = plan_batches(list(batches), W, self.cost, loads)
            self._plans[key] = (owners, self._add_loads(loads, batches, owners))
        owners, self._loads = self._plans[key]
        return owners

    def owners_of_step(self, batches: tuple) -> list[list[int]]:
        """One greedy plan (:func:`~spectrakit.optim.sharding.assign.plan_batches`) over a step's batches."""
        key = ("step", tuple(batches), self.world_size)
        if key not in self._plans:
            self._plans[key] = plan_batches(list(batches), self.world_size, self.cost)
        return self._plans[key]

    def _owned(self, owners: list[list[int]], device: torch.device):
        """Per batch and rank: (python index list, cached index tensor on ``device``)."""
        key = ("idx", tuple(tuple(o) for o in owners), self.world_size, str(device))
        if key not in self._plans:
            W = self.world_size
            table = []
            for ob in owners:
                per_rank = []
                for r in range(W):
                    idx = [i for i, o in enumerate(ob) if o == r]
                    per_rank.append((idx, torch.tensor(idx, dtype=torch.long, device=device)))
                table.append(per_rank)
            self._plans[key] = table
        return self._plans[key]

    # ------------------------------------------------------------------ replicated (DDP)
    def apply_replicated(self, batches: Sequence[torch.Tensor], fn: Transform) -> list[torch.Tensor]:
        """``[fn(b, all, batches[b]) for b]`` computed with each matrix on its owner rank only.

        Args:
            batches: tensors ``(k_b, *shape_b)`` (``*shape_b`` at least 2 dims), identical on every rank.
            fn: the per-matrix transform (see the module docstring).

        Returns:
            New tensors with the transformed batches, identical on every rank.

        Raises:
            ValueError: a batch with fewer than 3 dims, or ``fn`` returning a wrong shape/dtype.
        """
        for b, x in enumerate(batches):
            if x.ndim < 3:
                raise ValueError(f"batches[{b}] must have shape (k, m, n, ...), got {tuple(x.shape)}")
        W, rank = group_size_rank(self.group)
        if W == 1:
            return [_check_out(fn(b, list(range(x.shape[0])), x), x, b) for b, x in enumerate(batches)]
        owners = self.owners([(x.shape[0], tuple(x.shape[1:])) for x in batches])
        outs = [torch.empty_like(x) for x in batches]
        for dtype in dict.fromkeys(x.dtype for x in batches):
            members = [b for b, x in enumerate(batches) if x.dtype == dtype]
            device = batches[members[0]].device
            table = self._owned(owners, device)
            sizes = [sum(len(table[b][r][0]) * math.prod(batches[b].shape[1:]) for b in members)
                     for r in range(W)]
            if max(sizes) == 0:
                continue
            pieces = []
            for b in members:
                idx, idx_t = table[b][rank]
                if idx:
                    x = batches[b].index_select(0, idx_t)
                    pieces.append(_check_out(fn(b, idx, x), x, b).reshape(-1))
            mine = torch.cat(pieces) if len(pieces) > 1 else (pieces[0] if pieces else None)
            for r, flat in enumerate(self._gather_uneven(mine, sizes, dtype, device)):
                off = 0
                for b in members:
                    idx, idx_t = table[b][r]
                    if not idx:
                        continue
                    n = len(idx) * math.prod(batches[b].shape[1:])
                    outs[b].index_copy_(0, idx_t, flat[off:off + n].view(len(idx), *batches[b].shape[1:]))
                    off += n
        return outs

    def replicated_method(self, sizes: Sequence[int]) -> str:
        """``"all_gather"`` or ``"broadcast"`` for a replicated exchange of per-rank sizes ``sizes``.

        A padded all-gather moves ``(W-1) max_r E_r`` elements per rank, one broadcast per owning rank about
        ``sum_r E_r``: the all-gather is kept while ``(W-1) max_r E_r <= 1.25 sum_r E_r`` (balanced sizes,
        one collective), otherwise broadcasts (many ranks, a few very large matrices such as embeddings).
        """
        if self.replicated_exchange != "auto":
            return self.replicated_exchange
        W = len(sizes)
        return "all_gather" if (W - 1) * max(sizes) <= 1.25 * sum(sizes) else "broadcast"

    def _gather_uneven(self, mine, sizes: list[int], dtype, device) -> list[torch.Tensor]:
        """Every rank's flat buffer: rank ``r`` contributes ``sizes[r]`` elements, ``mine`` is this rank's."""
        W, rank = group_size_rank(self.group)
        if self.replicated_method(sizes) == "all_gather":
            width = max(sizes)
            send = torch.zeros(width, dtype=dtype, device=device)
            if mine is not None:
                send[:sizes[rank]] = mine
            recv = torch.empty(W * width, dtype=dtype, device=device)
            _all_gather_flat(recv, send, group=self.group)
            return [recv[r * width:r * width + sizes[r]] for r in range(W)]
        bufs, works = [], []
        for r in range(W):
            buf = mine.contiguous() if r == rank and mine is not None else \
                torch.empty(sizes[r], dtype=dtype, device=device)
            bufs.append(buf)
            if sizes[r]:
                src = r if self.group is None else dist.get_global_rank(self.group, r)
                works.append(dist.broadcast(buf, src=src, group=self.group, async_op=True))
        for w in works:
            w.wait()
        return bufs

    # ------------------------------------------------------------------ sharded (FSDP2 / HSDP)
    def apply_sharded(self, local_batches: Sequence[torch.Tensor], global_shapes: Sequence[tuple],
                      shard_dims: Sequence[int], fn: Transform) -> list[torch.Tensor]:
        """Transform matrices that are ``Shard(d)``-split across the ranks of the group.

        Args:
            local_batches: ``(k_b, *local_shape_b)``: this rank's chunk of each of ``k_b`` matrices.
            global_shapes: full matrix shape of each batch (at least 2 dims).
            shard_dims: the matrix dim ``d_b`` (``0 <= d_b < len(global_shapes[b])``) split across ranks
                (``torch.chunk`` rule, see :func:`~spectrakit.optim.sharding.layout.chunk_sizes`).
            fn: the per-matrix transform, called on whole matrices ``(len(idx), *global_shape_b)``.

        Returns:
            This rank's chunks of the transformed matrices, shaped like ``local_batches``.

        Raises:
            ValueError: inconsistent lengths, a shard dim out of range, a local shape that is not this
                rank's chunk of the global shape, or ``fn`` returning a wrong shape/dtype.
        """
        if not (len(local_batches) == len(global_shapes) == len(shard_dims)):
            raise ValueError("local_batches, global_shapes and shard_dims must have the same length, got "
                             f"{len(local_batches)}, {len(global_shapes)}, {len(shard_dims)}")
        W, rank = group_size_rank(self.group)
        global_shapes = [tuple(int(s) for s in g) for g in global_shapes]
        chunks = []
        for b, (x, g, d) in enumerate(zip(local_batches, global_shapes, shard_dims)):
            if len(g) < 2 or not 0 <= d < len(g):
                raise ValueError(f"shard_dims[{b}] must be in [0, {len(g) - 1}] for global shape {g}, "
                                 f"got {d}")
            sizes = chunk_sizes(g[d], W)
            want = (x.shape[0],) + g[:d] + (sizes[rank],) + g[d + 1:]
            if tuple(x.shape) != want:
                raise ValueError(f"local_batches[{b}] has shape {tuple(x.shape)}; rank {rank} of {W} holds "
                                 f"{want} for global shape {g} sharded on dim {d}")
            chunks.append(sizes)
        if W == 1:
            return [_check_out(fn(b, list(range(x.shape[0])), x), x, b) for b, x in enumerate(local_batches)]
        owners = self.owners([(x.shape[0], g) for x, g in zip(local_batches, global_shapes)])

        def local_numel(b: int, r: int) -> int:
            g, d = global_shapes[b], shard_dims[b]
            return math.prod(g) // g[d] * chunks[b][r] if g[d] else 0

        outs = [torch.empty_like(x) for x in local_batches]
        for dtype in dict.fromkeys(x.dtype for x in local_batches):
            members = [b for b, x in enumerate(local_batches) if x.dtype == dtype]
            device = local_batches[members[0]].device
            table = self._owned(owners, device)
            # phase 1: my chunk of every matrix -> its owner
            send_split = [sum(len(table[b][o][0]) * local_numel(b, rank) for b in members) for o in range(W)]
            recv_split = [sum(len(table[b][rank][0]) * local_numel(b, s) for b in members) for s in range(W)]
            pieces = [local_batches[b].index_select(0, table[b][o][1]).reshape(-1)
                      for o in range(W) for b in members if table[b][o][0]]
            send = torch.cat(pieces) if pieces else torch.empty(0, dtype=dtype, device=device)
            recv = torch.empty(sum(recv_split), dtype=dtype, device=device)
            dist.all_to_all_single(recv, send, recv_split, send_split, group=self.group)
            # assemble whole matrices, transform, cut them back into chunks
            parts: dict[int, list[torch.Tensor]] = {b: [] for b in members}
            off = 0
            for s in range(W):
                for b in members:
                    idx = table[b][rank][0]
                    if not idx:
                        continue
                    n = len(idx) * local_numel(b, s)
                    g, d = global_shapes[b], shard_dims[b]
                    parts[b].append(recv[off:off + n].view(len(idx), *g[:d], chunks[b][s], *g[d + 1:]))
                    off += n
            back: list[list[torch.Tensor]] = [[] for _ in range(W)]
            for b in members:
                idx = table[b][rank][0]
                if not idx:
                    continue
                d = shard_dims[b]
                full = torch.cat(parts[b], dim=1 + d)
                y = _check_out(fn(b, idx, full), full, b)
                for s, piece in enumerate(torch.split(y, chunks[b], dim=1 + d)):
                    if piece.numel():
                        back[s].append(piece.reshape(-1))
            send2 = torch.cat([p for s in range(W) for p in back[s]]) if any(back) else \
                torch.empty(0, dtype=dtype, device=device)
            recv2 = torch.empty(sum(send_split), dtype=dtype, device=device)
            # phase 2: result chunks -> every rank (the splits of phase 1, reversed)
            dist.all_to_all_single(recv2, send2, send_split, recv_split, group=self.group)
            off = 0
            for o in range(W):
                for b in members:
                    idx, idx_t = table[b][o]
                    if not idx:
                        continue
                    n = len(idx) * local_numel(b, rank)
                    piece = recv2[off:off + n].view(len(idx), *local_batches[b].shape[1:])
                    outs[b].index_copy_(0, idx_t, piece)
                    off += n
        return outs
