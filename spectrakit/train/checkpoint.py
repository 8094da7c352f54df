"""The training loop's names for :mod:`spectrakit.checkpoint` (the one checkpoint module): durable step
folders for exact resume of single-process, DDP and FSDP2 runs. See that module for the format and its
guarantees; this module only keeps the names the loop has always used."""

from __future__ import annotations

from spectrakit.checkpoint import (
    FORMAT,
    KEEP,
    LATEST,
    MANIFEST,
    STATE_FILE,
    CheckpointError,
    candidates,
    clean,
    latest,
    prune,
    resolve,
    rng_state,
    safe_load,
    set_rng_state,
    step_dirs,
    unwrap,
    verify,
    write_manifest,
)
from spectrakit.checkpoint import load as load_checkpoint
from spectrakit.checkpoint import load_sharded as load_sharded_checkpoint
from spectrakit.checkpoint import save as save_checkpoint
from spectrakit.checkpoint import save_sharded as save_sharded_checkpoint

__all__ = [
    "FORMAT", "KEEP", "LATEST", "MANIFEST", "STATE_FILE", "CheckpointError", "candidates", "clean", "latest",
    "load_checkpoint", "load_sharded_checkpoint", "prune", "resolve", "rng_state", "safe_load", "save_checkpoint",
    "save_sharded_checkpoint", "set_rng_state", "step_dirs", "unwrap", "verify", "write_manifest",
]
