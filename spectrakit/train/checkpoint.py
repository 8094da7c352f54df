"""Checkpoints for exact resume: model, optimizer, LR scheduler, data position and every RNG state.

Two formats: :func:`save_checkpoint` (one ``torch.save`` file, written by rank 0; single process and DDP)
and :func:`save_sharded_checkpoint` (a directory, written by EVERY rank; FSDP2: the model and optimizer go
through ``torch.distributed.checkpoint`` via :func:`spectrakit.distributed.save_checkpoint`, the per-rank
loop state — step, scheduler, data position, RNG — into ``train_state_rank{r}.pt``).

Resuming from a checkpoint written after step ``k`` and training to step ``K`` gives bit-identical
parameters to an uninterrupted run of ``K`` steps (tested), because the data stream is a function of its
position (:class:`spectrakit.data.batches.TokenBatches`) and the torch/CUDA/Python/NumPy RNG states are
restored.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch
import torch.distributed as dist


def rng_state() -> dict:
    """RNG states of Python ``random``, NumPy, torch CPU and (if present) every CUDA device."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside DDP (``.module``) and/or ``torch.compile`` (``._orig_mod``) wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


def save_checkpoint(
    path: str,
    *,
    model,
    optimizer,
    scheduler=None,
    step: int,
    data_state: dict | None = None,
    extra: dict | None = None,
) -> None:
    """Write a checkpoint atomically (temporary file + rename) to ``path``."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    state = _loop_state(step, scheduler, data_state, extra)
    state["model"] = unwrap(model).state_dict()
    state["optimizer"] = optimizer.state_dict()
    _atomic_save(state, path)


def load_checkpoint(path: str, *, model, optimizer=None, scheduler=None, map_location="cpu") -> dict:
    """Load ``path`` into ``model``/``optimizer``/``scheduler``, restore RNG states; returns the checkpoint
    dict (``step``, ``data``, ``extra``). Raises ``FileNotFoundError`` if ``path`` does not exist."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint path does not exist: {path}")
    state = torch.load(path, map_location=map_location, weights_only=False)
    unwrap(model).load_state_dict(state["model"])
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    _restore_loop_state(state, scheduler)
    return state


def _loop_state(step: int, scheduler, data_state: dict | None, extra: dict | None) -> dict:
    """The training loop's own state: step, scheduler, data position, RNG states, extras."""
    return {
        "step": step,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "data": data_state,
        "rng": rng_state(),
        "extra": extra or {},
    }


def _restore_loop_state(state: dict, scheduler) -> None:
    if scheduler is not None and state["scheduler"] is not None:
        scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])


def _atomic_save(state: dict, path: str) -> None:
    """``torch.save`` to a temporary file, then rename (a crash never leaves a half-written checkpoint)."""
    tmp = f"{path}.tmp{os.getpid()}"
    torch.save(state, tmp)
    os.replace(tmp, path)


def _rank_file(path: str) -> str:
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    return os.path.join(path, f"train_state_rank{rank}.pt")


def save_sharded_checkpoint(
    path: str,
    *,
    model,
    optimizer,
    scheduler=None,
    step: int,
    data_state: dict | None = None,
    extra: dict | None = None,
) -> None:
    """Write a checkpoint DIRECTORY ``path`` for FSDP2 (collective: every rank calls it with the same path).

    ``model``/``optimizer`` (DTensor parameters and states) are saved with
    :func:`spectrakit.distributed.save_checkpoint` (each rank writes its shards); the rank's loop state
    (``step``, scheduler, ``data_state``, RNG states, ``extra``) goes to ``train_state_rank{r}.pt``
    (temporary file + rename).
    """
    from spectrakit.distributed import save_checkpoint as save_distributed

    os.makedirs(path, exist_ok=True)
    save_distributed(path, model, optimizer)
    _atomic_save(_loop_state(step, scheduler, data_state, extra), _rank_file(path))


def load_sharded_checkpoint(path: str, *, model, optimizer, scheduler=None, map_location="cpu") -> dict:
    """Load a directory written by :func:`save_sharded_checkpoint` (collective) into the already wrapped
    model and its optimizer, restore the scheduler and RNG states; returns the rank's loop state dict
    (``step``, ``data``, ``extra``). Raises ``FileNotFoundError`` if ``path`` or the rank's state file is
    missing (e.g. a different world size)."""
    from spectrakit.distributed import load_checkpoint as load_distributed

    target = _rank_file(path)
    if not os.path.isfile(target):
        raise FileNotFoundError(f"checkpoint path {path!r} has no {os.path.basename(target)}")
    load_distributed(path, model, optimizer)
    state = torch.load(target, map_location=map_location, weights_only=False)
    _restore_loop_state(state, scheduler)
    return state
