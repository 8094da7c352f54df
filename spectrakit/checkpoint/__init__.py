"""Durable checkpoints for exact resume, in one place: the file format, the manifest, the ``latest`` pointer,
resolution of the newest usable checkpoint, pruning, atomic publication and safe DCP reading.

Layout (one format for single-process, DDP and FSDP2 runs)::

    <root>/step_00000200/state.pt          single process / DDP (written by rank 0)
    <root>/step_00000200/<DCP files>        FSDP2: every rank's shards (torch.distributed.checkpoint)
    <root>/step_00000200/train_state_rank{r}.pt   FSDP2: each rank's loop state
    <root>/step_00000200/manifest.json      size and sha256 of every file above, written last
    <root>/latest                           name of the newest complete step folder

Guarantees:"""

# - **Atomic**: a step is written into a temporary folder, every file fsynced, then the manifest, then the
#   folder is renamed to ``step_XXXXXXXX`` and ``latest`` replaced (temporary file + fsync + ``os.replace``).
#   A kill at any moment leaves the previous complete checkpoint current; the ``keep`` newest complete
#   checkpoints (default 2) are kept, older ones removed only after the new one is current. Leftover
#   temporary files are removed by the next save.
# - **One unit**: model, optimizer, scheduler, data position and RNG states of a step live in one folder, so
#   a resume can never mix steps.
# - **Verified**: the manifest must be well formed and list exactly the files of its folder; every file's
#   size and sha256 must match; the loaded loop state must be well formed, of the manifest's step and within
#   the run's number of steps. Anything else raises :class:`CheckpointError` (one line naming the file), and
#   loading from the run folder falls back to the previous complete checkpoint, saying so on stderr.
# - **Contained**: ``latest`` names exactly one step folder of the run folder; no path in a manifest or in DCP
#   metadata leads outside its step folder; symbolic links in a step folder are refused.
# - **No code execution**: every file is read with ``torch.load(weights_only=True)``, which only rebuilds
#   tensors and plain containers; DCP metadata is read once by our restricted unpickler and handed to DCP
#   through our own storage reader (:func:`~spectrakit.checkpoint.metadata.read_metadata`).
# - **Disk full**: a failed save removes its partial files, keeps the previous checkpoint and raises
#   :class:`CheckpointError` "no space left on device: <path> ..." (its ``errno`` is ``errno.ENOSPC``).
#
# Resuming from a checkpoint written after step ``k`` and training to step ``K`` gives bit-identical
# parameters and losses to an uninterrupted run of ``K`` steps on CPU, because the data stream is a function of
# its position and the RNG states are restored.

from spectrakit.checkpoint.dcp import METADATA_GLOBALS, check_metadata, load_dcp, save_dcp
from spectrakit.checkpoint.files import CheckpointError, safe_load
from spectrakit.checkpoint.folder import KEEP, LATEST, candidates, clean, latest, prune, publish, resolve, step_dirs
from spectrakit.checkpoint.manifest import FORMAT, MANIFEST, MAX_MANIFEST_BYTES, read_manifest, verify, write_manifest
from spectrakit.checkpoint.state import check_loop_state, rng_state, set_rng_state, unwrap
from spectrakit.checkpoint.store import STATE_FILE, load, load_sharded, model_mismatch, save, save_sharded

__all__ = [
    "FORMAT", "KEEP", "LATEST", "MANIFEST", "MAX_MANIFEST_BYTES", "METADATA_GLOBALS", "STATE_FILE",
    "CheckpointError", "candidates", "check_loop_state", "check_metadata", "clean", "latest", "load",
    "load_dcp", "load_sharded", "model_mismatch", "prune", "publish", "read_manifest", "resolve", "rng_state",
    "safe_load", "save",
    "save_dcp", "save_sharded", "set_rng_state", "step_dirs", "unwrap", "verify", "write_manifest",
]
