"""Wrap a model for data parallelism: DDP or FSDP2 (``fully_shard``), one flag.

The training loop calls ``wrap_model(model, mode, device=...)`` after building the model on its device
and before building the optimizer (FSDP2 replaces the parameters by DTensors), and builds the optimizer
with :func:`spectrakit.distributed.sharded` so that the spectral post-transform is split across ranks.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist

from spectrakit._checks import check_choice

MODES = ("none", "ddp", "fsdp2")


def default_fsdp_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Sub-modules that get their own ``fully_shard`` call: the members of every ``nn.ModuleList``
    (transformer blocks), outermost lists only, skipping containers without ``forward``
    (``ModuleList``/``ModuleDict``; their parameters stay with the root). The root is sharded last by
    :func:`wrap_model`."""
    containers = (torch.nn.ModuleList, torch.nn.ModuleDict)
    units: list[torch.nn.Module] = []
    seen: set[int] = set()
    for _, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and id(mod) not in seen:
            for child in mod:
                if not isinstance(child, containers):
                    units.append(child)
                seen.update(id(m) for m in child.modules())
            seen.add(id(mod))
    return units


def wrap_model(model: torch.nn.Module, mode: str = "ddp", *, device: torch.device | str | None = None,
               mesh=None, units: Iterable[torch.nn.Module] | None = None,
               reshard_after_forward: bool = True) -> torch.nn.Module:
    """Wrap ``model`` for data-parallel training on the initialized default process group.

    - ``"ddp"``: ``DistributedDataParallel`` (``device_ids=[device]`` on CUDA); gradients all-reduced, every
      rank holds whole parameters. Unchanged when the world size is 1.
    - ``"fsdp2"``: ``torch.distributed.fsdp.fully_shard`` on each unit (default: every block of every
      ``nn.ModuleList``, see :func:`default_fsdp_units`) and then on the root, over ``mesh`` (default: a
      1-D mesh of all ranks; a 2-D ``(replicate, shard)`` mesh gives HSDP). Parameters become ``Shard(0)``
      DTensors; modified in place and returned.
    - ``"none"``: returned unchanged.

    Without an initialized process group the model is returned unchanged for every mode (single process).

    Args:
        model: the module, already on its device.
        mode: one of ``"none"``, ``"ddp"``, ``"fsdp2"``.
        device: the rank's device (default: the device of the first parameter).
        mesh: FSDP2 device mesh (default ``init_device_mesh(device type, (world_size,))``).
        units: FSDP2 sub-modules to shard separately (default :func:`default_fsdp_units`).
        reshard_after_forward: FSDP2 option (free gathered parameters after forward).

    Raises:
        ValueError: unknown ``mode``. TypeError: ``model`` is not a module.
    """
    check_choice(mode, "mode", MODES)
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if mode == "none" or not (dist.is_available() and dist.is_initialized()):
        return model
    if device is None:
        first = next(model.parameters(), None)
        device = first.device if first is not None else torch.device("cpu")
    device = torch.device(device)
    if mode == "ddp":
        if dist.get_world_size() == 1:
            return model
        ids = [device.index if device.index is not None else torch.cuda.current_device()] \
            if device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
    from torch.distributed.device_mesh import init_device_mesh

    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # public there since torch 2.6
        raise RuntimeError(f"mode='fsdp2' needs torch >= 2.6 (this is torch {torch.__version__}); use "
                           "mode='ddp' or a newer torch") from None

    if mesh is None:
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for unit in (default_fsdp_units(model) if units is None else list(units)):
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return model
