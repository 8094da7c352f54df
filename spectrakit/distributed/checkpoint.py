"""Checkpoints of a model and its (sharded) spectral optimizer with ``torch.distributed.checkpoint``: the
distributed layer's names for :func:`spectrakit.checkpoint.save_dcp` / :func:`spectrakit.checkpoint.load_dcp`
(every rank writes its own shards, DTensors reshard onto another world size, the ``.metadata`` pickle and
non-tensor entries are read without running code; resuming is bit-identical, tested)."""

from __future__ import annotations

from spectrakit.checkpoint import check_metadata
from spectrakit.checkpoint import load_dcp as load_checkpoint
from spectrakit.checkpoint import save_dcp as save_checkpoint

__all__ = ["check_metadata", "load_checkpoint", "save_checkpoint"]
