"""The loop state stored with every checkpoint (step, scheduler, data position, RNG states, extras), as
tensors and plain values, and its validation before anything of it is applied."""

from __future__ import annotations

import random

import numpy as np
import torch

from spectrakit.checkpoint.files import CheckpointError
from spectrakit.checkpoint.manifest import FORMAT

_MT_WORDS = 624  # Mersenne Twister state size (Python ``random`` and NumPy's ``MT19937``)


def rng_state() -> dict:
    """RNG states of Python ``random``, NumPy, torch CPU and every CUDA device, as tensors and plain numbers
    (loadable with ``weights_only=True``)."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": {"version": version, "state": torch.tensor(internal, dtype=torch.int64), "gauss": gauss},
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` returned."""
    py = state["python"]  # the tensors may have been loaded onto a GPU (map_location): generators take CPU ones
    random.setstate((py["version"], tuple(int(v) for v in py["state"].cpu().tolist()), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state((npy["kind"], npy["keys"].cpu().numpy().astype(np.uint32), npy["pos"], npy["has_gauss"],
                         npy["cached_gaussian"]))
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        for i, t in enumerate(state["cuda"][:torch.cuda.device_count()]):  # resumed on fewer devices: the first
            torch.cuda.set_rng_state(t.cpu(), i)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside DDP (``.module``) and/or ``torch.compile`` (``._orig_mod``) wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


def loop_state(step: int, scheduler=None, data_state: dict | None = None, extra: dict | None = None) -> dict:
    """The training loop's own state: step, scheduler, data position, RNG states, extras."""
    return {
        "format": FORMAT,
        "step": step,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "data": data_state,
        "rng": rng_state(),
        "extra": extra or {},
    }


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _words(t, n: int, high: int) -> bool:
    """``t`` is an int64 tensor of ``n`` values in [0, high)."""
    return (isinstance(t, torch.Tensor) and t.dtype == torch.int64 and tuple(t.shape) == (n,)
            and bool((t >= 0).all()) and bool((t < high).all()))


def _is_window(w) -> bool:
    """The training loop's partly accumulated logging window (saved by a graceful stop)."""
    scalar = lambda t: isinstance(t, torch.Tensor) and t.ndim == 0 and t.is_floating_point()
    return (isinstance(w, dict) and set(w) == {"loss", "gnorm", "steps"} and scalar(w["loss"])
            and scalar(w["gnorm"]) and _is_int(w["steps"]) and w["steps"] >= 0)


def _rng_error(rng) -> str | None:
    if not isinstance(rng, dict) or not {"python", "numpy", "torch"} <= set(rng) <= {"python", "numpy", "torch",
                                                                                      "cuda"}:
        return "rng must hold python, numpy and torch states"
    py, npy, tc = rng["python"], rng["numpy"], rng["torch"]
    if (not isinstance(py, dict) or set(py) != {"version", "state", "gauss"} or not _is_int(py["version"])
            or not _words(py["state"], _MT_WORDS + 1, 2**32) or int(py["state"][-1]) > _MT_WORDS
            or not (py["gauss"] is None or isinstance(py["gauss"], float))):
        return "rng.python is not a Python random state"
    if (not isinstance(npy, dict) or set(npy) != {"kind", "keys", "pos", "has_gauss", "cached_gaussian"}
            or npy["kind"] != "MT19937" or not _words(npy["keys"], _MT_WORDS, 2**32)
            or not _is_int(npy["pos"]) or not 0 <= npy["pos"] <= _MT_WORDS or npy["has_gauss"] not in (0, 1)
            or not isinstance(npy["cached_gaussian"], float)):
        return "rng.numpy is not a NumPy MT19937 state"
    ref = torch.get_rng_state()
    if not isinstance(tc, torch.Tensor) or tc.dtype != ref.dtype or tc.shape != ref.shape:
        return "rng.torch is not a torch CPU generator state"
    cuda = rng.get("cuda", [])
    if not isinstance(cuda, list) or not all(isinstance(t, torch.Tensor) and t.dtype == torch.uint8 for t in cuda):
        return "rng.cuda is not a list of CUDA generator states"
    return None


def check_loop_state(state, path: str, *, step: int | None = None, max_step: int | None = None,
                     keys: tuple[str, ...] = ()) -> dict:
    """Validate a loaded loop state (see :func:`loop_state`) before any of it is applied; returns it.

    ``step`` is the manifest's step (the state must hold the same one), ``max_step`` the run's number of
    steps (a checkpoint claiming a later step does not belong to this run), ``keys`` further entries that
    must be present (``"model"``, ``"optimizer"`` in ``state.pt``).

    Raises:
        CheckpointError: "<path> is corrupted: <why>" or "<path> does not belong to this run: <why>".
    """
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} is corrupted: not a dict of the loop state")
    missing = [k for k in ("format", "step", "scheduler", "data", "rng", "extra", *keys) if k not in state]
    if missing:
        raise CheckpointError(f"{path} is corrupted: no {', '.join(missing)}")
    if not _is_int(state["format"]) or state["format"] != FORMAT:
        raise CheckpointError(f"{path} is corrupted: format must be {FORMAT}")
    s = state["step"]
    if not _is_int(s) or s < 0:
        raise CheckpointError(f"{path} is corrupted: step must be an int >= 0, got {str(s)[:40]}")
    if step is not None and s != step:
        raise CheckpointError(f"{path} is corrupted: step {s}, but its manifest says {step}")
    if max_step is not None and s > max_step:
        raise CheckpointError(f"{path} does not belong to this run: step {s} is outside [0, {max_step}] "
                              "(the run's number of steps)")
    for k in ("scheduler", "data"):
        if state[k] is not None and not isinstance(state[k], dict):
            raise CheckpointError(f"{path} is corrupted: {k} must be a dict or None")
    if not isinstance(state["extra"], dict):
        raise CheckpointError(f"{path} is corrupted: extra must be a dict")
    data = state["data"]
    if data is not None and "position" in data and not (_is_int(data["position"]) and data["position"] >= 0):
        raise CheckpointError(f"{path} is corrupted: data position must be an int >= 0")
    window = state["extra"].get("window")
    if window is not None and not _is_window(window):
        raise CheckpointError(f"{path} is corrupted: extra.window must hold 0-d float tensors loss and gnorm and "
                              "an int steps >= 0")
    why = _rng_error(state["rng"])
    if why:
        raise CheckpointError(f"{path} is corrupted: {why}")
    if "model" in keys and not (isinstance(state["model"], dict)
                                and all(isinstance(k, str) for k in state["model"])):
        raise CheckpointError(f"{path} is corrupted: model must be a state_dict (a dict of named tensors)")
    if "optimizer" in keys and not (isinstance(state["optimizer"], dict)
                                    and {"state", "param_groups"} <= set(state["optimizer"])):
        raise CheckpointError(f"{path} is corrupted: optimizer must be an optimizer state_dict")
    return state


def restore_loop_state(state: dict, scheduler, path: str) -> None:
    """Load the scheduler state into ``scheduler`` and restore the RNG states of a checked loop state."""
    if scheduler is not None and state["scheduler"] is not None:
        ref = scheduler.state_dict()
        if set(state["scheduler"]) != set(ref):
            raise CheckpointError(f"{path}: the scheduler state does not fit this scheduler (keys "
                                  f"{sorted(state['scheduler'])[:8]}, expected {sorted(ref)[:8]})")
        scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
