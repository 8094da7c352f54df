"""``torch.distributed.checkpoint`` (DCP) folders, read without running code from them.

DCP reads its ``.metadata`` file with plain ``pickle.load`` and non-tensor entries with
``torch.load(weights_only=False)``: either can execute code from a crafted file. :func:`load_dcp` reads
``.metadata`` once with our restricted reader (:func:`~spectrakit.checkpoint.metadata.read_metadata`) and
hands DCP that object through its own storage reader, so DCP never unpickles the file; non-tensor entries
are read with ``weights_only=True``.
"""

from __future__ import annotations

import functools
import os

import torch

from spectrakit.checkpoint.metadata import METADATA, METADATA_GLOBALS, read_metadata

# (torch.distributed.checkpoint is imported by the functions that use it: it takes ~1.6 s, which every
# command-line start paid, ``spectrakit --help`` included)
__all__ = ["METADATA", "METADATA_GLOBALS", "check_metadata", "load_dcp", "save_dcp"]


def check_metadata(path: str | os.PathLike) -> None:
    """Refuse a DCP folder whose ``.metadata`` is not DCP metadata of files inside the folder (see
    :func:`~spectrakit.checkpoint.metadata.read_metadata`); a folder without one passes.

    Raises ``ValueError`` "cannot load <file>: ... (refused, never executed)"."""
    try:
        read_metadata(path)
    except FileNotFoundError:
        return


@functools.cache
def _reader_class() -> type:
    """DCP's file-system reader, given the metadata we read instead of unpickling ``.metadata`` itself."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class CheckedReader(FileSystemReader):
        def __init__(self, path, metadata):
            super().__init__(path)
            self._metadata = metadata

        def read_metadata(self, *args, **kwargs):
            if kwargs.get("rank") is not None:  # per-rank metadata files: not written by save_dcp
                raise ValueError("per-rank DCP metadata is not supported")
            md = self._metadata
            if md.storage_meta is None:
                md.storage_meta = StorageMeta()
            md.storage_meta.load_id = self.load_id
            return md

    return CheckedReader


@functools.cache
def _safe_load_planner() -> type:
    """DCP's default load planner, but non-tensor entries are read with ``torch.load(weights_only=True)``
    (the default reads them with ``weights_only=False``, which can execute code)."""
    from torch.distributed.checkpoint._nested_dict import set_element
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    class SafeLoadPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value) -> None:
            obj = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj

    return SafeLoadPlanner


def _check(model, optimizer, path):
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")


def save_dcp(path: str | os.PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             extra: dict | None = None) -> None:
    """Save ``{"model", "optim", "extra"}`` to the DCP folder ``path`` (collective: all ranks call it).

    Every rank writes its own shards of the parameters and optimizer states (DTensors under FSDP2, so they
    can be loaded on another world size), plus the replicated entries once; the state-dict conversion is
    ``torch.distributed.checkpoint.state_dict.get_state_dict`` (FSDP2, DDP and plain modules).

    Args:
        path: folder (created if missing).
        model: the (DDP/FSDP2-wrapped or plain) model.
        optimizer: its optimizer (e.g. :func:`spectrakit.distributed.sharded` presets).
        extra: small tensor/plain values to store alongside (step counter, scheduler state, ...).

    Raises:
        TypeError: wrong argument types.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    _check(model, optimizer, path)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "extra": dict(extra or {})}
    dcp.save(state, checkpoint_id=os.fspath(path))


def load_dcp(path: str | os.PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             extra: dict | None = None) -> dict:
    """Load a folder written by :func:`save_dcp` into ``model`` and ``optimizer`` in place (collective).

    Args:
        path: the DCP folder.
        model, optimizer: built the same way as when saving (the world size may differ under FSDP2).
        extra: a dict with the keys (and value types/shapes) to read back from the saved ``extra``.

    Returns:
        the loaded ``extra`` dict.

    Raises:
        TypeError: wrong argument types. FileNotFoundError: ``path`` does not exist. ValueError: the
        metadata names Python objects other than DCP's or files outside the folder, or a non-tensor entry
        holds Python objects other than plain containers (refused, never executed; see
        :func:`check_metadata`).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    _check(model, optimizer, path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"path {os.fspath(path)!r} is not a checkpoint directory")
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "extra": dict(extra or {})}
    md = read_metadata(path)
    try:
        dcp.load(state, storage_reader=_reader_class()(os.fspath(path), md), planner=_safe_load_planner()())
    except (Exception, CheckpointException) as e:  # DCP wraps every rank's error (a BaseException subclass)
        causes = [*(str(f) for f in getattr(e, "failures", {}).values()), str(e)]
        if any("Weights only load failed" in c for c in causes):
            raise ValueError(f"cannot load {os.fspath(path)}: a non-tensor entry holds Python objects other than "
                             "plain containers (refused, never executed)") from None
        first = next((line.strip() for c in causes for line in c.splitlines() if line.strip()), type(e).__name__)
        raise ValueError(f"cannot load {os.fspath(path)}: {first[:200]}") from None
    try:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    except (RuntimeError, ValueError, KeyError, TypeError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ValueError(f"cannot load {os.fspath(path)}: it does not fit the model or optimizer: {first}") from None
    return state["extra"]
