"""Checkpoints of a model and its (sharded) spectral optimizer with ``torch.distributed.checkpoint``.

``save_checkpoint`` writes one DCP directory: every rank writes its own shards of the parameters and of
the optimizer states (DTensors under FSDP2, so they can be loaded on another world size), plus the
replicated entries once. ``load_checkpoint`` reads it back into an already built (and sharded) model and
optimizer. Resuming is exact: the next steps are bit-identical to uninterrupted training (tested).
The model/optimizer state-dict conversion uses ``torch.distributed.checkpoint.state_dict``
(``get_state_dict``/``set_state_dict``), which handles FSDP2, DDP and plain modules.
"""

from __future__ import annotations

import os
import pickle

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._nested_dict import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

# What DCP's ``.metadata`` pickle may reference: DCP's own metadata classes and a few torch/pathlib types.
_METADATA_GLOBALS = {("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"),
                     ("torch", "Size"), ("torch.serialization", "_get_layout")}
_METADATA_MODULES = ("torch.distributed.checkpoint.",)


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if (module, name) in _METADATA_GLOBALS or module.startswith(_METADATA_MODULES) or dtype:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in checkpoint metadata")


def check_metadata(path: str | os.PathLike) -> None:
    """Refuse a DCP directory whose ``.metadata`` pickle references anything but DCP's metadata classes and
    torch sizes/dtypes: ``torch.distributed.checkpoint`` reads that file with plain ``pickle.load``, so it is
    checked first with a restricted unpickler (nothing outside the allow-list is imported or called)."""
    meta = os.path.join(os.fspath(path), ".metadata")
    if not os.path.isfile(meta):
        return
    try:
        with open(meta, "rb") as f:
            _MetadataUnpickler(f).load()
    except Exception as e:  # UnpicklingError, EOFError, ...
        raise ValueError(f"cannot load {meta}: {e} (refused, never executed)") from None


class _SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, but non-tensor entries are read with ``torch.load(weights_only=True)``
    (the default reads them with ``weights_only=False``, which can execute code)."""

    def load_bytes(self, read_item, value) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def _check(model, optimizer, path):
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")


def save_checkpoint(path: str | os.PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    extra: dict | None = None) -> None:
    """Save ``{"model", "optim", "extra"}`` to the DCP directory ``path`` (collective: all ranks call it).

    Args:
        path: directory (created if missing).
        model: the (DDP/FSDP2-wrapped or plain) model.
        optimizer: its optimizer (e.g. :func:`spectrakit.distributed.sharded` presets).
        extra: small picklable/tensor values to store alongside (step counter, RNG states, ...).

    Raises:
        TypeError: wrong argument types.
    """
    _check(model, optimizer, path)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "extra": dict(extra or {})}
    dcp.save(state, checkpoint_id=os.fspath(path))


def load_checkpoint(path: str | os.PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    extra: dict | None = None) -> dict:
    """Load a checkpoint written by :func:`save_checkpoint` in place (collective).

    Args:
        path: the DCP directory.
        model, optimizer: built the same way as when saving (the world size may differ under FSDP2).
        extra: a dict with the keys (and value types/shapes) to read back from the saved ``extra``.

    Returns:
        the loaded ``extra`` dict.

    Raises:
        TypeError: wrong argument types. FileNotFoundError: ``path`` does not exist. ValueError: the
        metadata references Python objects other than DCP's (refused, never executed); non-tensor entries
        are read with ``weights_only=True``.
    """
    _check(model, optimizer, path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"path {os.fspath(path)!r} is not a checkpoint directory")
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "extra": dict(extra or {})}
    check_metadata(path)
    try:
        dcp.load(state, checkpoint_id=os.fspath(path), planner=_SafeLoadPlanner())
    except (Exception, CheckpointException) as e:  # DCP wraps every rank's error (a BaseException subclass)
        causes = [str(e), *(str(f) for f in getattr(e, "failures", {}).values())]
        if any("Weights only load failed" in c for c in causes):
            raise ValueError(f"cannot load {os.fspath(path)}: a non-tensor entry holds Python objects other than "
                             "plain containers (refused, never executed)") from None
        raise
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return state["extra"]
