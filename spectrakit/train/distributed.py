"""Data parallelism under ``torchrun``: process-group set-up and model wrapping (DDP or FSDP2).

The wrapping lives in one function, :func:`wrap_model`, with a ``mode`` argument (``"ddp"``, ``"fsdp2"``);
it delegates to :func:`spectrakit.distributed.wrap_model`.
"""

from __future__ import annotations

import dataclasses
import datetime
import os

import torch
import torch.distributed as dist

from spectrakit._checks import check_choice


@dataclasses.dataclass(frozen=True)
class DistInfo:
    """``rank``/``world_size``/``local_rank`` of this process and the device it trains on."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


DEFAULT_TIMEOUT_S = 300.0


def setup(device: str | None = None, timeout_s: float | None = None) -> DistInfo:
    """Initialise the default process group when launched by ``torchrun`` (``WORLD_SIZE > 1``): NCCL on
    CUDA, Gloo on CPU; each process takes ``cuda:LOCAL_RANK``. Without ``torchrun`` returns a
    single-process :class:`DistInfo` on ``device`` (default: CUDA if available, else CPU).

    ``timeout_s``: collective timeout (default :data:`DEFAULT_TIMEOUT_S` = 5 minutes, or
    ``$SPECTRAKIT_DIST_TIMEOUT``); a stalled or dead rank then ends the job with an error instead of a
    silent hang (PyTorch's own default is 30 minutes)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", local if world > 1 else (dev.index or 0))
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        if timeout_s is None:
            timeout_s = float(os.environ.get("SPECTRAKIT_DIST_TIMEOUT", DEFAULT_TIMEOUT_S))
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo",
                                timeout=datetime.timedelta(seconds=timeout_s))
    return DistInfo(rank, world, local, dev)


PARALLEL_MODES = ("ddp", "fsdp2")


def wrap_model(model: torch.nn.Module, info: DistInfo, mode: str = "ddp") -> torch.nn.Module:
    """Wrap ``model`` (already on ``info.device``) for data parallelism when ``world_size > 1``:

    - ``"ddp"``: ``DistributedDataParallel`` (gradients all-reduced, whole parameters on every rank);
    - ``"fsdp2"``: ``fully_shard`` on every transformer block and the root (parameters become ``Shard(0)``
      DTensors; build the optimizer AFTER wrapping, with ``world_size=info.world_size`` in
      :func:`spectrakit.train.optimizers.build_optimizer` so that SPECTRA presets are sharded);
    - ``"none"``: never wraps.

    Both modes go through :func:`spectrakit.distributed.wrap_model` (``mode``, ``device=info.device``).
    In a single process the model is returned unchanged.

    Raises:
        ValueError: ``mode`` not one of ``"ddp"``, ``"fsdp2"``, ``"none"``.
    """
    check_choice(mode, "mode", (*PARALLEL_MODES, "none"))
    if mode == "none" or not info.enabled:
        return model
    from spectrakit.distributed import wrap_model as distributed_wrap

    return distributed_wrap(model, mode, device=info.device)


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds FSDP2 (DTensor) parameters, i.e. needs the distributed checkpoint format."""
    return any(hasattr(p, "device_mesh") and hasattr(p, "placements") for p in model.parameters())


def all_reduce_mean(x: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Mean of ``x`` over ranks (identity in a single process)."""
    if info.enabled:
        x = x.clone()
        dist.all_reduce(x, op=dist.ReduceOp.AVG if info.device.type == "cuda" else dist.ReduceOp.SUM)
        if info.device.type != "cuda":
            x /= info.world_size
    return x


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def teardown(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()
