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

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


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
        TypeError: wrong argument types. FileNotFoundError: ``path`` does not exist.
    """
    _check(model, optimizer, path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"path {os.fspath(path)!r} is not a checkpoint directory")
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "extra": dict(extra or {})}
    dcp.load(state, checkpoint_id=os.fspath(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return state["extra"]
