"""Spectral optimizers under DDP and FSDP2 with the spectral work sharded across ranks.

- :func:`sharded` / :class:`DistributedSpectra`: any ``spectrakit.optim`` preset with each matrix's
  post-transform computed once, on its owner rank; with :class:`SpectralSharder` (the two exchange patterns,
  replicated / ``Shard(d)``), :func:`assign_owners`, :func:`spectral_flops` (greedy FLOP load balancing) and
  :func:`layout_of`, :func:`chunk_sizes` (supported DTensor layouts) they live with the optimizer in
  :mod:`spectrakit.optim.sharding` (a plain preset given DTensor parameters takes that path by itself) and
  are re-exported here.
- :func:`apply_blocks`, :func:`block_ranges`: parameters sharded on several mesh dims (FSDP2 x tensor
  parallel, HSDP x TP): their blocks and the owner-compute exchange over the flattened sharding group.
- :func:`exchange_bytes`, :func:`mesh_exchange`, :func:`tp_layouts`, :func:`flops_per_rank`, :func:`simulate`:
  cost model (:mod:`.cost_model`).
- :func:`wrap_model`: DDP / FSDP2 wrapping for the training loop (:mod:`.wrap`).
- :func:`save_checkpoint`, :func:`load_checkpoint`: ``torch.distributed.checkpoint`` (:mod:`.checkpoint`).
- :func:`run_workers`: run a function on N local processes (tests, benchmarks) (:mod:`.launch`).
"""

from spectrakit.distributed.checkpoint import load_checkpoint, save_checkpoint
from spectrakit.distributed.cost_model import (
    LLAMA_CONFIGS,
    exchange_bytes,
    flops_per_rank,
    mesh_exchange,
    simulate,
    tp_layouts,
)
from spectrakit.distributed.launch import run_workers
from spectrakit.distributed.wrap import wrap_model
from spectrakit.optim.sharding.assign import assign_owners, plan_batches, plan_sequential, spectral_flops
from spectrakit.optim.sharding.block_exchange import apply_blocks
from spectrakit.optim.sharding.blocks import block_ranges
from spectrakit.optim.sharding.exchange import SpectralSharder
from spectrakit.optim.sharding.layout import Layout, chunk_sizes, layout_of
from spectrakit.optim.sharding.optimizer import DistributedSpectra, ShardedSpectraMixin, sharded

__all__ = [
    "LLAMA_CONFIGS", "DistributedSpectra", "Layout", "ShardedSpectraMixin", "SpectralSharder",
    "apply_blocks", "assign_owners", "block_ranges", "chunk_sizes", "exchange_bytes", "flops_per_rank",
    "layout_of", "load_checkpoint", "mesh_exchange", "plan_batches", "plan_sequential", "run_workers",
    "save_checkpoint", "sharded", "simulate", "spectral_flops", "tp_layouts", "wrap_model",
]
