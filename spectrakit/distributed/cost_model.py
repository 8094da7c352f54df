"""Cost model of the sharded spectral step: FLOPs per rank and bytes moved per rank per step.

Notation: matrices ``j = 1..J`` with ``M_j`` elements, ``b`` bytes per element, ``W`` ranks, owner
``o(j)`` from :func:`~spectrakit.optim.sharding.assign.plan_batches` (greedy by FLOPs over all matrices
of a step, largest first: the optimizer's plan from its second step on), ``E_r = sum_{o(j)=r}
M_j`` (elements owned by rank ``r``), ``s_{j,r}`` = elements of matrix ``j`` held by rank ``r`` under
``Shard(d)`` (``torch.chunk`` rule).

- **DDP** (replicated), one exchange per batch of same-shaped matrices (``E_r`` counted per batch): a
  padded ``all_gather`` makes every rank send ``(W-1) * max_r E_r * b`` and receive the same (ring
  all-gather); one broadcast per owning rank moves at most ``sum_r E_r * b`` per rank (pipelined
  broadcasts forward each buffer once). The ideal is ``(W-1)/W * sum_j M_j * b``; ``"auto"`` keeps the
  all-gather while ``(W-1) max_r E_r <= 1.25 sum_r E_r`` (balanced batch), else broadcasts.
- **FSDP2** (two ``all_to_all``): rank ``r`` sends ``sum_{o(j)!=r} s_{j,r} + sum_{o(j)=r} (M_j - s_{j,r})``
  elements (its chunks to the owners, then the owned results' other chunks back) and receives the same
  amount with the roles swapped; about ``2 (W-1)/W * sum_j M_j / W`` elements when chunks are even and
  the owned sizes balanced — a ``W/2``-th of the DDP exchange."""

# - **FSDP2 x tensor parallel** (blocks over several mesh dims, :func:`mesh_exchange`): the same two
#   all-to-alls over the flattened sharding group of each matrix (the ``G`` ranks that differ only in its
#   sharding mesh dims), with ``s_{j,r}`` = elements of rank ``r``'s block (from the placements:
#   :func:`~spectrakit.optim.sharding.blocks.block_ranges`); owners are planned per group. A matrix sharded
#   on all ``W = dp * tp`` ranks moves ``2 (W-1)/W^2 M_j`` elements per rank, as FSDP2 alone on ``W`` ranks.
#   Per-rank work is the FLOPs of the matrices the rank owns.
#
# For reference the engines' own traffic per step: DDP all-reduce (ring) ``2 (W-1)/W * P * b`` for ``P``
# parameters; FSDP2 all-gather of parameters in forward and again in backward ``2 (W-1)/W * P * b`` plus the
# gradient reduce-scatter ``(W-1)/W * P * b``.

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from spectrakit._checks import check_choice, check_int
from spectrakit.optim.sharding.assign import matrix_dims, plan_batches, rank_loads, spectral_flops
from spectrakit.optim.sharding.blocks import block_ranges, block_shape
from spectrakit.optim.sharding.layout import chunk_sizes

Shape = tuple[int, ...]


@dataclass(frozen=True)
class LlamaConfig:
    """Shapes of a LLaMA-style decoder (no biases, untied embeddings unless ``tied``)."""

    d_model: int
    n_layers: int
    d_ff: int
    n_heads: int
    n_kv_heads: int
    vocab: int
    tied: bool = False

    def matrix_shapes(self, include_embeddings: bool = True) -> list[tuple[str, Shape]]:
        """``(name, (out, in))`` of every matrix parameter (torch ``nn.Linear`` convention)."""
        d, hd = self.d_model, self.d_model // self.n_heads
        kv = self.n_kv_heads * hd
        per_layer = [("wq", (d, d)), ("wk", (kv, d)), ("wv", (kv, d)), ("wo", (d, d)),
                     ("w_gate", (self.d_ff, d)), ("w_up", (self.d_ff, d)), ("w_down", (d, self.d_ff))]
        out = [(f"layers.{i}.{n}", s) for i in range(self.n_layers) for n, s in per_layer]
        if include_embeddings:
            out.append(("embed", (self.vocab, d)))
            if not self.tied:
                out.append(("lm_head", (self.vocab, d)))
        return out

    def vector_numel(self) -> int:
        """Elements of the 1-D parameters (two RMSNorm weights per layer and the final norm)."""
        return (2 * self.n_layers + 1) * self.d_model


#: LLaMA-2-7B (Touvron et al. 2023) and a 1.1B LLaMA (TinyLlama's shapes: GQA with 4 KV heads).
LLAMA_CONFIGS: dict[str, LlamaConfig] = {
    "llama-1b": LlamaConfig(d_model=2048, n_layers=22, d_ff=5632, n_heads=32, n_kv_heads=4, vocab=32000),
    "llama-7b": LlamaConfig(d_model=4096, n_layers=32, d_ff=11008, n_heads=32, n_kv_heads=32, vocab=32000),
}


def _batches(shapes: Sequence[Shape]) -> tuple[list[tuple[int, Shape]], list[Shape]]:
    """Group shapes into same-shaped batches in first-seen order (as the optimizer does)."""
    order: dict[Shape, int] = {}
    for s in shapes:
        s = tuple(int(v) for v in s)
        order[s] = order.get(s, 0) + 1
    return [(k, s) for s, k in order.items()], list(order)


def flops_per_rank(shapes: Sequence[Shape], world_size: int,
                   cost: Callable[[Shape], float] = spectral_flops) -> dict:
    """Per-rank spectral FLOPs of the greedy plan for matrices of ``shapes`` on ``world_size`` ranks.

    Returns a dict with ``total`` (all matrices), ``max``/``min`` per rank, ``ideal = total / W``,
    ``speedup = total / max`` (the factor by which the critical path falls vs one rank) and ``largest``
    (cost of the largest single matrix: a lower bound on ``max`` since matrices are not split).

    Raises:
        ValueError: ``world_size < 1`` or a shape with fewer than 2 dims.
    """
    check_int(world_size, "world_size", low=1)
    batches, uniq = _batches(shapes)
    owners = plan_batches(batches, world_size, cost)
    costs = [cost(s) for (k, s) in batches for _ in range(k)]
    flat = [o for ob in owners for o in ob]
    loads = rank_loads(costs, flat, world_size)
    total = float(sum(costs))
    return {"total": total, "max": max(loads), "min": min(loads), "ideal": total / world_size,
            "speedup": total / max(loads) if max(loads) > 0 else 1.0,
            "largest": max(costs) if costs else 0.0}


def exchange_bytes(shapes: Sequence[Shape], world_size: int, mode: str = "ddp", elem_bytes: int = 4,
                   shard_dim: int = 0, cost: Callable[[Shape], float] = spectral_flops,
                   replicated_exchange: str = "auto") -> dict:
    """Bytes sent per rank per step by the sharded spectral exchange (see the module docstring).

    Args:
        shapes: matrix shapes (at least 2 dims each), in the order the optimizer meets them.
        world_size: number of ranks ``W >= 1``.
        mode: ``"ddp"`` (replicated matrices) or ``"fsdp2"`` (two all-to-alls, ``Shard(shard_dim)``).
        elem_bytes: bytes per element of the update (4 for fp32, 2 for bf16), in [1, 16].
        shard_dim: dim split by FSDP2 (0 by default), only for ``mode="fsdp2"``.
        cost: FLOP cost used to assign owners.
        replicated_exchange: DDP pattern per batch, ``"all_gather"`` (padded: ``(W-1) max_r E_r`` per
            rank), ``"broadcast"`` (one pipelined broadcast per owner: at most ``sum_r E_r`` per rank) or
            ``"auto"`` (the choice :class:`~spectrakit.optim.sharding.exchange.SpectralSharder` makes).

    Returns:
        dict with ``sent`` (bytes per rank, list), ``max_sent``, ``mean_sent``, ``method``, ``ideal``
        (``(W-1)/W sum M_j b`` for DDP, ``2 (W-1)/W^2 sum M_j b`` for FSDP2) and ``total_param_bytes``.

    Raises:
        ValueError: bad ``mode``, ``world_size``, ``elem_bytes``, ``replicated_exchange`` or ``shard_dim``.
    """
    check_choice(mode, "mode", {"ddp", "fsdp2"})
    check_choice(replicated_exchange, "replicated_exchange", {"auto", "all_gather", "broadcast"})
    check_int(world_size, "world_size", low=1)
    check_int(elem_bytes, "elem_bytes", low=1, high=16)
    batches, _ = _batches(shapes)
    owners = plan_batches(batches, world_size, cost)
    W = world_size
    total = sum(k * math.prod(s) for k, s in batches)
    sent = [0] * W
    method = "none" if W == 1 else ("all_to_all" if mode == "fsdp2" else replicated_exchange)
    if W > 1 and mode == "ddp":
        methods = set()
        for (_, s), ob in zip(batches, owners):  # one exchange per batch, as the optimizer calls it
            owned = [ob.count(r) * math.prod(s) for r in range(W)]
            how = replicated_exchange
            if how == "auto":
                how = "all_gather" if (W - 1) * max(owned) <= 1.25 * sum(owned) else "broadcast"
            methods.add(how)
            for r in range(W):
                sent[r] += (W - 1) * max(owned) if how == "all_gather" else sum(owned)
        method = "+".join(sorted(methods))
        ideal = (W - 1) / W * total
    elif W > 1:
        for (_, s), ob in zip(batches, owners):
            if len(s) <= shard_dim:
                raise ValueError(f"shard_dim must be < {len(s)} for shape {s}, got {shard_dim}")
            per = [c * math.prod(s) // s[shard_dim] for c in chunk_sizes(s[shard_dim], W)]
            for o in ob:
                for r in range(W):
                    if r != o:
                        sent[r] += per[r]          # phase 1: my chunk to the owner
                sent[o] += math.prod(s) - per[o]   # phase 2: the owner returns the other chunks
        ideal = 2 * (W - 1) / W ** 2 * total
    else:
        ideal = 0.0
    return {"sent": [v * elem_bytes for v in sent], "max_sent": max(sent) * elem_bytes,
            "mean_sent": sum(sent) / W * elem_bytes, "method": method, "ideal": ideal * elem_bytes,
            "total_param_bytes": total * elem_bytes}


def _groups(mesh_shape: Shape, dims: tuple[int, ...]) -> list[list[tuple[int, ...]]]:
    """Mesh coordinates of each flattened sharding group over ``dims`` (row-major, as global ranks)."""
    rest = [d for d in range(len(mesh_shape)) if d not in dims]
    groups = []
    for fixed in itertools.product(*(range(mesh_shape[d]) for d in rest)):
        members = []
        for var in itertools.product(*(range(mesh_shape[d]) for d in dims)):
            c = [0] * len(mesh_shape)
            for d, v in zip(rest, fixed):
                c[d] = v
            for d, v in zip(dims, var):
                c[d] = v
            members.append(tuple(c))
        groups.append(members)
    return groups


def mesh_exchange(layouts: Sequence[tuple[Shape, tuple]], mesh_shape: Sequence[int], elem_bytes: int = 4,
                  cost: Callable[[Shape], float] = spectral_flops) -> dict:
    """Per-rank bytes sent and spectral FLOPs of one step for matrices laid out on an N-d device mesh.

    Args:
        layouts: ``(global_shape, spec)`` per matrix, in the order the optimizer meets them; ``spec`` is
            :func:`~spectrakit.optim.sharding.blocks.placement_spec` of its placements (one entry per mesh
            dim: ``("r", -1, 1)``, ``("s", d, 1)`` or ``("ss", d, split_factor)``).
        mesh_shape: the device mesh's shape; ranks are numbered row-major over it (as ``init_device_mesh``).
        elem_bytes: bytes per element, in [1, 16].
        cost: FLOPs of one matrix (owners are balanced by it).

    Returns:
        dict with ``sent`` (bytes per rank, row-major), ``max_sent``, ``flops`` (per rank), ``max_flops``,
        ``total_flops`` (every matrix once) and ``ideal_flops`` (``total / W``). Matrices replicated on
        every sharding mesh dim are counted as the replicated (DDP) exchange over all ranks, with
        ``"auto"``'s choice of all-gather or broadcasts.

    Raises:
        ValueError: a spec of the wrong length, a shape with fewer than 2 dims, bad ``elem_bytes``.
    """
    mesh_shape = tuple(int(v) for v in mesh_shape)
    for n in mesh_shape:
        check_int(n, "mesh_shape entries", low=1)
    check_int(elem_bytes, "elem_bytes", low=1, high=16)
    W = math.prod(mesh_shape)
    strides = [math.prod(mesh_shape[d + 1:]) for d in range(len(mesh_shape))]

    def rank_of(c):
        return sum(v * s for v, s in zip(c, strides))

    by_dims: dict[tuple, list[tuple[Shape, tuple]]] = {}
    for shape, spec in layouts:
        shape = tuple(int(v) for v in shape)
        if len(spec) != len(mesh_shape):
            raise ValueError(f"spec {spec} must have one entry per mesh dim ({len(mesh_shape)})")
        matrix_dims(shape)
        dims = tuple(m for m, (kind, _, _) in enumerate(spec) if kind != "r" and mesh_shape[m] > 1)
        by_dims.setdefault(dims, []).append((shape, tuple(spec)))
    sent, flops = [0] * W, [0.0] * W
    for dims, mats in by_dims.items():
        for members in _groups(mesh_shape, dims) if dims else [[tuple(c) for c in itertools.product(
                *(range(n) for n in mesh_shape))]]:
            G = len(members)
            keys = list(dict.fromkeys(mats))  # same global shape and layout: one batch, first-seen order
            batches = [(sum(1 for m in mats if m == k), k[0]) for k in keys]
            owners = plan_batches(batches, G, cost)
            for (shape, spec), ob in zip(keys, owners):
                M = math.prod(shape)
                per = [math.prod(block_shape(block_ranges(shape, spec, mesh_shape, c))) for c in members]
                if not dims:  # replicated over the whole mesh: the DDP exchange of this batch
                    per = [M] * G
                for o in ob:
                    flops[rank_of(members[o])] += cost(shape)
                if not dims:
                    owned = [ob.count(r) * M for r in range(G)]
                    gather = (G - 1) * max(owned) <= 1.25 * sum(owned)
                    for r in range(G):
                        sent[rank_of(members[r])] += (G - 1) * max(owned) if gather else sum(owned)
                    continue
                for o in ob:
                    for r in range(G):
                        if r != o:
                            sent[rank_of(members[r])] += per[r]      # phase 1: my block to the owner
                    sent[rank_of(members[o])] += M - per[o]          # phase 2: the other blocks back
    # a group repeated over Replicate mesh dims repeats the work: the FLOPs of every matrix counted once
    total = float(sum(cost(tuple(int(v) for v in s)) for s, _ in layouts))
    sent = [v * elem_bytes for v in sent]
    return {"sent": sent, "max_sent": max(sent), "flops": flops, "max_flops": max(flops),
            "total_flops": total, "ideal_flops": total / W}


def tp_layouts(cfg: LlamaConfig, dp: int, tp: int, include_embeddings: bool = True) -> list[tuple[Shape, tuple]]:
    """``(shape, spec)`` of every matrix of ``cfg`` under the usual FSDP2 x TP plan on a ``(dp, tp)`` mesh:
    q, k, v, gate, up and the head Colwise (``(_StridedShard(0, tp), Shard(0))``), o and down Rowwise
    (``(Shard(0), Shard(1))``), the embedding Rowwise on the vocabulary (``(_StridedShard(0, tp), Shard(0))``).
    Raises ``ValueError`` for ``dp`` or ``tp`` below 1."""
    check_int(dp, "dp", low=1)
    check_int(tp, "tp", low=1)
    col, row = (("ss", 0, tp), ("s", 0, 1)), (("s", 0, 1), ("s", 1, 1))
    out = []
    for name, shape in cfg.matrix_shapes(include_embeddings):
        out.append((shape, row if name.endswith(("wo", "w_down")) else col))
    return out


def engine_bytes(num_params: int, world_size: int, mode: str = "ddp", elem_bytes: int = 4) -> float:
    """Bytes per rank per step of the data-parallel engine itself (for comparison with the exchange):
    DDP ``2 (W-1)/W P b`` (ring all-reduce); FSDP2 ``3 (W-1)/W P b`` (two parameter all-gathers and one
    gradient reduce-scatter, no prefetch reuse). Raises ``ValueError`` on bad arguments."""
    check_choice(mode, "mode", {"ddp", "fsdp2"})
    check_int(world_size, "world_size", low=1)
    check_int(num_params, "num_params", low=0)
    factor = 2 if mode == "ddp" else 3
    return factor * (world_size - 1) / world_size * num_params * elem_bytes


def simulate(config: str | LlamaConfig, world_sizes: Sequence[int] = (8, 64, 512), *,
             include_embeddings: bool = True, elem_bytes: int = 4) -> list[dict]:
    """Rows of the per-rank FLOP and traffic simulation for a LLaMA config (see ``LLAMA_CONFIGS``).

    Each row: model, ranks, matrices, total spectral GFLOP, max/ideal GFLOP per rank, speedup over one
    rank, the DDP and FSDP2 exchange MB per rank (max over ranks) and the engine's own MB per rank.
    Raises ``ValueError`` for an unknown config name or bad world sizes.
    """
    if isinstance(config, str):
        check_choice(config, "config", LLAMA_CONFIGS)
        name, cfg = config, LLAMA_CONFIGS[config]
    else:
        name, cfg = "custom", config
    shapes = [s for _, s in cfg.matrix_shapes(include_embeddings)]
    params = sum(math.prod(s) for s in shapes) + cfg.vector_numel()
    if not include_embeddings:
        params += cfg.vocab * cfg.d_model * (1 if cfg.tied else 2)
    rows = []
    for W in world_sizes:
        f = flops_per_rank(shapes, W)
        ddp = exchange_bytes(shapes, W, "ddp", elem_bytes)
        fsdp = exchange_bytes(shapes, W, "fsdp2", elem_bytes)
        rows.append({
            "model": name, "params (B)": round(params / 1e9, 3), "ranks": W, "matrices": len(shapes),
            "total GFLOP": round(f["total"] / 1e9, 1), "max GFLOP/rank": round(f["max"] / 1e9, 1),
            "ideal GFLOP/rank": round(f["ideal"] / 1e9, 1), "speedup": round(f["speedup"], 1),
            "DDP exch MB/rank": round(ddp["max_sent"] / 2 ** 20, 1), "DDP method": ddp["method"],
            "DDP allreduce MB/rank": round(engine_bytes(params, W, "ddp", elem_bytes) / 2 ** 20, 1),
            "FSDP2 exch MB/rank": round(fsdp["max_sent"] / 2 ** 20, 1),
            "FSDP2 engine MB/rank": round(engine_bytes(params, W, "fsdp2", elem_bytes) / 2 ** 20, 1),
        })
    return rows
