"""``torch.distributed.checkpoint`` (DCP) folders, read without running code from them.

DCP reads its ``.metadata`` file with plain ``pickle.load`` and non-tensor entries with
``torch.load(weights_only=False)``: either can execute code from a crafted file. :func:`check_metadata`
unpickles ``.metadata`` first with an exact allow-list of ``(module, name)`` pairs, and :func:`load_dcp` reads
non-tensor entries with ``weights_only=True``.
"""

from __future__ import annotations

import functools
import importlib
import io
import os
import pathlib
import pickle

import torch

# (torch.distributed.checkpoint is imported by the functions that use it: it takes ~1.6 s, which every
# command-line start paid, ``spectrakit --help`` included)

METADATA = ".metadata"
# The classes and functions a DCP ``.metadata`` pickle may name, exactly: DCP's metadata dataclasses, the
# storage record of the file system writer, torch.Size, the layout look-up and paths. Each is checked to be
# defined in that module (never an attribute that module imported from elsewhere, such as ``os.system``).
METADATA_GLOBALS = frozenset({
    ("torch.distributed.checkpoint.metadata", "Metadata"),
    ("torch.distributed.checkpoint.metadata", "MetadataIndex"),
    ("torch.distributed.checkpoint.metadata", "StorageMeta"),
    ("torch.distributed.checkpoint.metadata", "TensorProperties"),
    ("torch.distributed.checkpoint.metadata", "TensorStorageMetadata"),
    ("torch.distributed.checkpoint.metadata", "BytesStorageMetadata"),
    ("torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"),
    ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    ("pathlib", "Path"), ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
})


def _allowed(module: str, name: str):
    """The object ``module.name`` if the pair may appear in DCP metadata, else None."""
    if module == "torch" and name.isidentifier() and isinstance(getattr(torch, name, None), torch.dtype):
        return getattr(torch, name)  # a dtype value (not callable)
    if (module, name) not in METADATA_GLOBALS:
        return None
    obj = getattr(importlib.import_module(module), name, None)
    if module == "pathlib":  # the path classes live in a private submodule on some Python versions
        return obj if isinstance(obj, type) and issubclass(obj, pathlib.PurePath) else None
    return obj if getattr(obj, "__module__", None) == module and callable(obj) else None


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        obj = _allowed(module, name) if isinstance(module, str) and isinstance(name, str) else None
        if obj is None:
            raise pickle.UnpicklingError(f"{str(module)[:80]}.{str(name)[:80]} is not allowed in checkpoint "
                                         "metadata")
        return obj

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("persistent references are not allowed in checkpoint metadata")


def check_metadata(path: str | os.PathLike) -> None:
    """Refuse a DCP folder whose ``.metadata`` names anything outside :data:`METADATA_GLOBALS` (or torch
    dtypes), or whose storage records point outside the folder.

    ``torch.distributed.checkpoint`` reads that file with plain ``pickle.load``; here it is read first with
    an unpickler that resolves only the allowed ``(module, name)`` pairs (nothing else is imported or
    called). Raises ``ValueError`` "cannot load <file>: ... (refused, never executed)"."""
    meta = os.path.join(os.fspath(path), METADATA)
    if not os.path.isfile(meta):
        return
    try:
        with open(meta, "rb") as f:
            md = _MetadataUnpickler(io.BytesIO(f.read())).load()
    except Exception as e:  # UnpicklingError, EOFError, TypeError from a bad constructor call, ...
        reason = (str(e).splitlines() or [type(e).__name__])[0][:200]
        raise ValueError(f"cannot load {meta}: {reason} (refused, never executed)") from None
    why = _storage_error(md)
    if why:
        raise ValueError(f"cannot load {meta}: {why} (refused)")


def _storage_error(md) -> str | None:
    """Why the unpickled metadata is not DCP metadata of files inside its folder (None if it is)."""
    from torch.distributed.checkpoint.metadata import Metadata

    if not isinstance(md, Metadata):
        return "it is not DCP metadata"
    records = md.storage_data
    if records is None:
        return None
    if not isinstance(records, dict):
        return "its storage records are not a dict"
    for info in records.values():
        rel = getattr(info, "relative_path", None)
        if not isinstance(rel, str) or not rel or rel in (".", "..") or "/" in rel or "\\" in rel or "\x00" in rel:
            return f"a storage record names {str(rel)[:100]!r}, not a file of the folder"
        for field in ("offset", "length"):
            v = getattr(info, field, 0)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                return f"a storage record has {field} {str(v)[:40]}"
    return None


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
    check_metadata(path)
    try:
        dcp.load(state, checkpoint_id=os.fspath(path), planner=_safe_load_planner()())
    except (Exception, CheckpointException) as e:  # DCP wraps every rank's error (a BaseException subclass)
        causes = [str(e), *(str(f) for f in getattr(e, "failures", {}).values())]
        if any("Weights only load failed" in c for c in causes):
            raise ValueError(f"cannot load {os.fspath(path)}: a non-tensor entry holds Python objects other than "
                             "plain containers (refused, never executed)") from None
        raise
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return state["extra"]
