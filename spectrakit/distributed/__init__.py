"""Spectral optimizers under DDP and FSDP2 with the spectral work sharded across ranks.

- :func:`sharded` / :class:`DistributedSpectra`: any ``spectrakit.optim`` preset with each matrix's
  post-transform computed once, on its owner rank (:mod:`.optimizer`).
- :class:`SpectralSharder`: the two exchange patterns (replicated / ``Shard(d)``) (:mod:`.exchange`).
- :func:`assign_owners`, :func:`spectral_flops`: greedy FLOP load balancing (:mod:`.assign`).
- :func:`layout_of`, :func:`chunk_sizes`: supported DTensor layouts (:mod:`.layout`).
- :func:`exchange_bytes`, :func:`flops_per_rank`, :func:`simulate`: cost model (:mod:`.cost_model`).
- :func:`wrap_model`: DDP / FSDP2 wrapping for the training loop (:mod:`.wrap`).
- :func:`save_checkpoint`, :func:`load_checkpoint`: ``torch.distributed.checkpoint`` (:mod:`.checkpoint`).
- :func:`run_workers`: run a function on N local processes (tests, benchmarks) (:mod:`.launch`).
"""

from spectrakit.distributed.assign import assign_owners, plan_batches, plan_sequential, spectral_flops
from spectrakit.distributed.checkpoint import load_checkpoint, save_checkpoint
from spectrakit.distributed.cost_model import LLAMA_CONFIGS, exchange_bytes, flops_per_rank, simulate
from spectrakit.distributed.exchange import SpectralSharder
from spectrakit.distributed.launch import run_workers
from spectrakit.distributed.layout import Layout, chunk_sizes, layout_of
from spectrakit.distributed.optimizer import DistributedSpectra, ShardedSpectraMixin, sharded
from spectrakit.distributed.wrap import wrap_model

__all__ = [
    "LLAMA_CONFIGS", "DistributedSpectra", "Layout", "ShardedSpectraMixin", "SpectralSharder",
    "assign_owners", "chunk_sizes", "exchange_bytes", "flops_per_rank", "layout_of", "load_checkpoint",
    "plan_batches", "plan_sequential", "run_workers", "save_checkpoint", "sharded", "simulate",
    "spectral_flops", "wrap_model",
]
