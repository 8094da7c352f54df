"""Durable checkpoints for exact resume: model, optimizer, LR scheduler, data position and every RNG state.

Layout (one format for single-process, DDP and FSDP2 runs)::

    <root>/step_00000200/state.pt          single process / DDP (written by rank 0)
    <root>/step_00000200/<DCP files>        FSDP2: every rank's shards (torch.distributed.checkpoint)
    <root>/step_00000200/train_state_rank{r}.pt   FSDP2: each rank's loop state
    <root>/step_00000200/manifest.json      size and sha256 of every file above, written last
    <root>/latest                           name of the newest complete step directory

Guarantees:

- **Atomic**: a step is written into a temporary directory, every file fsynced, then the manifest, then
  the directory is renamed to ``step_XXXXXXXX`` and ``latest`` replaced (temporary file + fsync +
  ``os.replace``). A kill at any moment leaves the previous complete checkpoint current; the
  ``keep`` newest complete checkpoints (default 2) are kept, older ones removed only after the new one is
  current. Leftover temporary files are removed by the next save.
- **One unit**: model, optimizer, scheduler, data position and RNG states of a step live in one
  directory, so a resume can never mix steps.
- **Verified**: loading checks every file's size and sha256 against the manifest; a corrupted, truncated
  or incomplete checkpoint raises :class:`CheckpointError` (one line naming the file), and loading from
  the root falls back to the previous complete checkpoint, saying so on stderr.
- **No code execution**: every file is read with ``torch.load(weights_only=True)``, which only rebuilds
  tensors and plain containers; RNG states are stored as tensors and plain numbers.
- **Disk full**: a failed save removes its partial files, keeps the previous checkpoint and raises
  :class:`CheckpointError` saying "no space left on device" with the path.

Resuming from a checkpoint written after step ``k`` and training to step ``K`` gives bit-identical
parameters and losses to an uninterrupted run of ``K`` steps on CPU (tested), because the data stream is a
function of its position (:class:`spectrakit.data.batches.TokenBatches`) and the RNG states are restored.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import shutil
import sys

import numpy as np
import torch
import torch.distributed as dist

FORMAT = 1
KEEP = 2
STATE_FILE = "state.pt"
MANIFEST = "manifest.json"
LATEST = "latest"
_PREFIX = "step_"
_TMP = ".tmp-"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or used; the message is one line and names the file."""


# ------------------------------------------------------------------ RNG states as tensors / plain types
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
    py = state["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["state"].tolist()), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state((npy["kind"], npy["keys"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"],
                         npy["cached_gaussian"]))
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


# ------------------------------------------------------------------ files
def safe_load(path: str, map_location="cpu"):
    """``torch.load(path, weights_only=True)``: tensors and plain containers only, never arbitrary objects.
    Raises :class:`CheckpointError` naming ``path`` for a file that is refused or unreadable."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as e:  # pickle.UnpicklingError, RuntimeError (truncated zip), ...
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "weights_only" in str(e) or "Unsupported global" in str(e):
            reason = "it holds Python objects other than tensors and plain containers (refused, never executed)"
        raise CheckpointError(f"cannot load {path}: {reason[:300]}") from None


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover (platforms without directory fds)
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _save_file(obj, path: str) -> None:
    """``torch.save`` then fsync."""
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def _write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary file, fsync, ``os.replace``, fsync of the folder)."""
    tmp = os.path.join(os.path.dirname(path), f"{_TMP}{os.path.basename(path)}-{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    _fsync_dir(os.path.dirname(path) or ".")


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _files(step_dir: str) -> list[str]:
    out = []
    for base, _, names in os.walk(step_dir):
        for n in names:
            rel = os.path.relpath(os.path.join(base, n), step_dir)
            if rel != MANIFEST:
                out.append(rel)
    return sorted(out)


def _write_manifest(step_dir: str, step: int) -> None:
    files = {rel: {"size": os.path.getsize(os.path.join(step_dir, rel)),
                   "sha256": _sha256(os.path.join(step_dir, rel))} for rel in _files(step_dir)}
    _write_text(os.path.join(step_dir, MANIFEST), json.dumps({"format": FORMAT, "step": step, "files": files},
                                                             indent=1))


def verify(step_dir: str) -> dict:
    """Check every file of a step directory against its manifest; returns the manifest. Raises
    :class:`CheckpointError` naming the first missing, truncated or altered file."""
    mpath = os.path.join(step_dir, MANIFEST)
    try:
        with open(mpath) as f:
            manifest = json.load(f)
        files = manifest["files"]
    except FileNotFoundError:
        raise CheckpointError(f"{step_dir} is incomplete: no {MANIFEST}") from None
    except (ValueError, KeyError, TypeError):
        raise CheckpointError(f"{mpath} is corrupted") from None
    for rel, meta in files.items():
        path = os.path.join(step_dir, rel)
        if not os.path.isfile(path):
            raise CheckpointError(f"{path} is missing")
        if os.path.getsize(path) != meta["size"]:
            raise CheckpointError(f"{path} is truncated or altered ({os.path.getsize(path)} bytes, "
                                  f"expected {meta['size']})")
        if _sha256(path) != meta["sha256"]:
            raise CheckpointError(f"{path} is corrupted (sha256 differs from {MANIFEST})")
    return manifest


# ------------------------------------------------------------------ step directories
def step_dirs(root: str) -> list[str]:
    """Step directories under ``root`` (complete or not), newest first."""
    if not os.path.isdir(root):
        return []
    names = [n for n in os.listdir(root) if n.startswith(_PREFIX) and os.path.isdir(os.path.join(root, n))]
    return [os.path.join(root, n) for n in sorted(names, reverse=True)]


def latest(root: str) -> str | None:
    """The step directory ``root/latest`` names (None if there is none yet)."""
    try:
        with open(os.path.join(root, LATEST)) as f:
            name = f.read().strip()
    except FileNotFoundError:
        return None
    path = os.path.join(root, name)
    return path if name.startswith(_PREFIX) and os.path.isdir(path) else None


def candidates(root: str) -> list[str]:
    """Step directories to try when resuming from ``root``: the current one, then older ones, newest first."""
    cur = latest(root)
    rest = [d for d in step_dirs(root) if d != cur]
    return ([cur] if cur else []) + rest


def clean(root: str) -> None:
    """Remove what interrupted saves left under ``root``: temporary files and directories."""
    if not os.path.isdir(root):
        return
    for n in os.listdir(root):
        if n.startswith(_TMP):
            p = os.path.join(root, n)
            shutil.rmtree(p, ignore_errors=True) if os.path.isdir(p) else os.remove(p)


def _publish(root: str, tmp_dir: str, step: int, keep: int) -> str:
    """Manifest, rename ``tmp_dir`` to its step directory, point ``latest`` at it, prune to ``keep``."""
    _write_manifest(tmp_dir, step)
    _fsync_dir(tmp_dir)
    final = os.path.join(root, f"{_PREFIX}{step:08d}")
    if os.path.exists(final):  # e.g. a resumed run re-saving a step whose old copy was unusable
        trash = os.path.join(root, f"{_TMP}old-{os.path.basename(final)}-{os.getpid()}")
        os.rename(final, trash)
        os.rename(tmp_dir, final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.rename(tmp_dir, final)
    _fsync_dir(root)
    _write_text(os.path.join(root, LATEST), os.path.basename(final) + "\n")
    prune(root, keep)
    return final


def prune(root: str, keep: int) -> None:
    """Remove all but the current step directory and the ``keep - 1`` newest others."""
    cur = latest(root)
    for old in [d for d in step_dirs(root) if d != cur][max(keep, 1) - 1:]:
        shutil.rmtree(old, ignore_errors=True)


def _failed_save(root: str, tmp_dir: str, e: OSError) -> CheckpointError:
    shutil.rmtree(tmp_dir, ignore_errors=True)
    prev = latest(root)
    kept = f"; the previous checkpoint {prev} is kept" if prev else ""
    if e.errno == errno.ENOSPC:
        return CheckpointError(f"no space left on device while writing a checkpoint to {root}{kept}")
    return CheckpointError(f"could not write a checkpoint to {root}: {e.strerror or e}{kept}")


# ------------------------------------------------------------------ single process / DDP
def save_checkpoint(
    root: str,
    *,
    model,
    optimizer,
    scheduler=None,
    step: int,
    data_state: dict | None = None,
    extra: dict | None = None,
    keep: int = KEEP,
) -> str:
    """Write the checkpoint of ``step`` as ``root/step_XXXXXXXX/`` and make it current (see the module
    docstring); keeps the ``keep`` newest. Returns the step directory."""
    os.makedirs(root, exist_ok=True)
    clean(root)
    tmp_dir = os.path.join(root, f"{_TMP}{_PREFIX}{step:08d}-{os.getpid()}")
    try:
        os.makedirs(tmp_dir)
        state = _loop_state(step, scheduler, data_state, extra)
        state["model"] = unwrap(model).state_dict()
        state["optimizer"] = optimizer.state_dict()
        _save_file(state, os.path.join(tmp_dir, STATE_FILE))
        return _publish(root, tmp_dir, step, keep)
    except OSError as e:
        raise _failed_save(root, tmp_dir, e) from None
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise


def _resolve(path: str, load_one) -> tuple[str, object]:
    """Try ``path`` (a root with step directories, or one step directory), falling back to older complete
    checkpoints of a root; returns ``(step_dir, load_one(step_dir))``."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint path does not exist: {path}")
    if os.path.isfile(os.path.join(path, MANIFEST)) or os.path.basename(path.rstrip("/")).startswith(_PREFIX):
        verify(path)
        return path, load_one(path)
    tried = candidates(path)
    if not tried:
        raise CheckpointError(f"{path} holds no checkpoint (no {_PREFIX}* directory)")
    errors = []
    for d in tried:
        try:
            verify(d)
            result = load_one(d)
        except CheckpointError as e:
            errors.append(str(e))
            print(f"warning: {e}; trying the previous checkpoint", file=sys.stderr, flush=True)
            continue
        if errors:
            print(f"resuming from {d} (the newer checkpoint is unusable)", file=sys.stderr, flush=True)
        return d, result
    raise CheckpointError(f"no usable checkpoint in {path}: {errors[-1]}")


def load_checkpoint(path: str, *, model, optimizer=None, scheduler=None, map_location="cpu") -> dict:
    """Load the newest usable checkpoint under ``path`` (a root written by :func:`save_checkpoint`, or one of
    its step directories) into ``model``/``optimizer``/``scheduler`` and restore the RNG states; returns the
    state dict (``step``, ``data``, ``extra``, ``path``: the step directory used). Raises
    ``FileNotFoundError`` if ``path`` does not exist and :class:`CheckpointError` if no checkpoint is
    usable."""
    step_dir, state = _resolve(path, lambda d: safe_load(os.path.join(d, STATE_FILE), map_location))
    unwrap(model).load_state_dict(state["model"])
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    _restore_loop_state(state, scheduler)
    state["path"] = step_dir
    return state


def _loop_state(step: int, scheduler, data_state: dict | None, extra: dict | None) -> dict:
    """The training loop's own state: step, scheduler, data position, RNG states, extras."""
    return {
        "format": FORMAT,
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


# ------------------------------------------------------------------ FSDP2
def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def save_sharded_checkpoint(
    root: str,
    *,
    model,
    optimizer,
    scheduler=None,
    step: int,
    data_state: dict | None = None,
    extra: dict | None = None,
    keep: int = KEEP,
) -> str:
    """Write the FSDP2 checkpoint of ``step`` (collective: every rank calls it with the same ``root``).

    Every rank writes its shards (:func:`spectrakit.distributed.save_checkpoint`, DCP) and its loop state
    ``train_state_rank{r}.pt`` into one temporary step directory; after a barrier rank 0 writes the manifest
    over all ranks' files and makes the directory current (see the module docstring). Returns the step
    directory."""
    from spectrakit.distributed import save_checkpoint as save_distributed

    rank = _rank()
    tmp_dir = os.path.join(root, f"{_TMP}{_PREFIX}{step:08d}")
    if rank == 0:
        os.makedirs(root, exist_ok=True)
        clean(root)
        os.makedirs(tmp_dir)
    _barrier()
    failure = None
    try:
        save_distributed(tmp_dir, model, optimizer)
        _save_file(_loop_state(step, scheduler, data_state, extra),
                   os.path.join(tmp_dir, f"train_state_rank{rank}.pt"))
    except OSError as e:
        failure = e
    flags = [failure is not None]
    if dist.is_available() and dist.is_initialized():
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, failure is not None)
        flags = gathered
    final = None
    if rank == 0:
        if any(flags):
            err = failure or OSError(errno.EIO, "another rank failed to write its part")
            shutil.rmtree(tmp_dir, ignore_errors=True)
            final = str(_failed_save(root, tmp_dir, err))
        else:
            final = _publish(root, tmp_dir, step, keep)
    box = [final]
    if dist.is_available() and dist.is_initialized():
        dist.broadcast_object_list(box, src=0)
    if any(flags):
        raise CheckpointError(box[0])
    return box[0]


def load_sharded_checkpoint(root: str, *, model, optimizer, scheduler=None, map_location="cpu") -> dict:
    """Load the newest usable FSDP2 checkpoint under ``root`` (collective): rank 0 verifies the manifests and
    picks the step directory (falling back to older complete ones), every rank loads its shards and its
    loop state; returns the rank's loop state dict (``step``, ``data``, ``extra``, ``path``). Raises
    :class:`CheckpointError` if none is usable or the rank's file is missing (another world size)."""
    from spectrakit.distributed import load_checkpoint as load_distributed

    box: list = [None]
    if _rank() == 0:
        try:
            box[0] = _resolve(root, lambda d: d)[0]
        except (CheckpointError, FileNotFoundError) as e:
            box[0] = e
    if dist.is_available() and dist.is_initialized():
        dist.broadcast_object_list(box, src=0)
    if isinstance(box[0], BaseException):
        raise box[0]
    step_dir = box[0]
    target = os.path.join(step_dir, f"train_state_rank{_rank()}.pt")
    if not os.path.isfile(target):
        raise CheckpointError(f"{step_dir} has no {os.path.basename(target)} (written with another world size?)")
    load_distributed(step_dir, model, optimizer)
    state = safe_load(target, map_location)
    _restore_loop_state(state, scheduler)
    state["path"] = step_dir
    return state
