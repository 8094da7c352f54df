"""The optimizer step for parameters spread over ranks (DDP replicas, FSDP2 ``Shard(d)`` DTensors, FSDP2 x
tensor parallel blocks): each matrix's post-transform is computed once, on its owner rank, and the results
are exchanged.

It lives with the optimizer because a plain preset given FSDP2 (DTensor) parameters switches to it by itself
(DTensor is part of torch); :mod:`spectrakit.distributed` re-exports it beside launch, wrapping, checkpoints
and the cost model.

- :func:`~.optimizer.sharded` / :class:`~.optimizer.DistributedSpectra` / :class:`~.optimizer.ShardedSpectraMixin`:
  any ``spectrakit.optim`` preset with the post-transform sharded across ranks (:mod:`.optimizer`).
- :class:`~.exchange.SpectralSharder`: the two exchange patterns (replicated / ``Shard(d)``) (:mod:`.exchange`).
- :func:`~.assign.assign_owners`, :func:`~.assign.spectral_flops`: greedy FLOP load balancing (:mod:`.assign`).
- :func:`~.layout.layout_of`, :func:`~.layout.chunk_sizes`: supported DTensor layouts (:mod:`.layout`).
- :func:`~.blocks.block_ranges`, :func:`~.block_exchange.apply_blocks`: DTensors sharded on several mesh
  dims (FSDP2 x tensor parallel): each rank's block, and the exchange over the flattened sharding group.
"""

from spectrakit.optim.sharding.optimizer import DistributedSpectra, ShardedSpectraMixin, sharded

__all__ = ["DistributedSpectra", "ShardedSpectraMixin", "sharded"]
