"""Saving and loading whole checkpoints: ``state.pt`` (single process, DDP) and sharded FSDP2 step folders."""

from __future__ import annotations

import errno
import os
import re
import shutil
import sys

import torch.distributed as dist

from spectrakit.checkpoint.dcp import check_metadata, load_dcp, save_dcp
from spectrakit.checkpoint.files import TMP, CheckpointError, disk_full, safe_load, save_file
from spectrakit.checkpoint.folder import KEEP, candidates, check_root, clean, latest, publish, resolve, step_name
from spectrakit.checkpoint.manifest import read_manifest
from spectrakit.checkpoint.state import check_loop_state, loop_state, restore_loop_state, unwrap

STATE_FILE = "state.pt"
RANK_FILE = "train_state_rank{}.pt"
_RANK_FILE = re.compile(r"train_state_rank(\d+)\.pt")


def _os_error(e: BaseException) -> OSError:
    """The ``OSError`` behind a failed sharded write (DCP wraps each rank's error), else an ``EIO`` one."""
    seen, todo = set(), [e, *getattr(e, "failures", {}).values()]
    while todo:
        x = todo.pop(0)
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, OSError):
            return x
        todo += [x.__cause__, x.__context__]
    return OSError(errno.EIO, (str(e).strip().splitlines() or [type(e).__name__])[0][:200])


def _check_step(step, keep) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 10**8:
        raise ValueError(f"step must be an int in [0, {10**8 - 1}], got {step!r}")
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be an int >= 1, got {keep!r}")


def failed_save(root: str, tmp_dir: str, e: OSError) -> CheckpointError:
    """Remove the partial ``tmp_dir`` and turn the write error ``e`` into one line; the previous checkpoint
    stays current. A full disk gives "no space left on device: <root> (...)"."""
    shutil.rmtree(tmp_dir, ignore_errors=True)
    prev = latest(root)
    kept = f"the previous checkpoint {prev} is kept" if prev else "there is no previous checkpoint"
    if e.errno == errno.ENOSPC:
        return disk_full(root, f" (the checkpoint was not written; {kept})")
    return CheckpointError(f"could not write a checkpoint to {root}: {e.strerror or e} ({kept})")


def save(root: str, *, model, optimizer, scheduler=None, step: int, data_state: dict | None = None,
         extra: dict | None = None, keep: int = KEEP) -> str:
    """Write the checkpoint of ``step`` as ``root/step_XXXXXXXX/state.pt`` (model, optimizer, scheduler,
    data position, RNG states, ``extra``) and make it current; keeps the ``keep`` newest. Returns the step
    folder.

    Atomic: everything is written into a temporary folder, fsynced, then the manifest, then the folder is
    renamed and ``latest`` replaced; a failure or a kill at any moment leaves the previous checkpoint
    current. Raises :class:`CheckpointError` ("no space left on device: <root> ..." on a full disk)."""
    _check_step(step, keep)
    check_root(root)
    tmp_dir = os.path.join(root, f"{TMP}{step_name(step)}-{os.getpid()}")
    try:
        os.makedirs(root, exist_ok=True)
        clean(root)
        os.makedirs(tmp_dir)
        state = loop_state(step, scheduler, data_state, extra)
        state["model"] = unwrap(model).state_dict()
        state["optimizer"] = optimizer.state_dict()
        save_file(state, os.path.join(tmp_dir, STATE_FILE))
        return publish(root, tmp_dir, step, keep)
    except OSError as e:
        raise failed_save(root, tmp_dir, e) from None
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise


def model_mismatch(model_sd: dict, saved: dict) -> str | None:
    """The first missing key, the first unexpected key and the first shape mismatch between a model's
    ``state_dict()`` and a saved one, as one phrase (None if keys and shapes agree)."""
    if not isinstance(saved, dict):
        return f"the saved model state is a {type(saved).__name__}, not a state dict"
    parts = []
    missing = [k for k in model_sd if k not in saved]
    unexpected = [k for k in saved if k not in model_sd]
    if missing:
        parts.append(f"missing key {missing[0]!r}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    if unexpected:
        parts.append(f"unexpected key {str(unexpected[0])[:80]!r}"
                     + (f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""))
    for k, v in model_sd.items():
        w = saved.get(k)
        if hasattr(v, "shape") and hasattr(w, "shape") and tuple(v.shape) != tuple(w.shape):
            parts.append(f"{k!r} has shape {tuple(w.shape)} in the checkpoint, {tuple(v.shape)} in the model")
            break
    return "; ".join(parts) or None


def _apply(what: str, path: str, fn, detail=None) -> None:
    """Run ``fn()`` (a ``load_state_dict``), turning a mismatch into a :class:`CheckpointError`
    (``detail()``: a better description of the mismatch than the exception's first line, if any)."""
    try:
        fn()
    except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as e:
        first = (detail() if detail is not None else None) or \
            (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise CheckpointError(f"{path} does not fit the {what}: {first}") from None


def load(path: str, *, model, optimizer=None, scheduler=None, map_location="cpu",
         max_step: int | None = None) -> dict:
    """Load the newest usable checkpoint under ``path`` (a folder written by :func:`save`, or one of its
    step folders) into ``model``/``optimizer``/``scheduler`` and restore the RNG states.

    Each candidate is verified against its manifest, its loop state validated (step equal to the
    manifest's and, with ``max_step``, in [0, ``max_step``]), then applied; an unusable one is reported and
    the previous one tried (:func:`~spectrakit.checkpoint.resolve`). Returns the state dict (``step``,
    ``data``, ``extra``, ``path``: the step folder used).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        CheckpointError: no checkpoint is usable.
    """

    def load_one(step_dir: str) -> dict:
        file = os.path.join(step_dir, STATE_FILE)
        if not os.path.isfile(file):
            raise CheckpointError(f"{step_dir} has no {STATE_FILE}")
        state = check_loop_state(safe_load(file, map_location), file, step=read_manifest(step_dir)["step"],
                                 max_step=max_step, keys=("model", "optimizer"))
        _apply("model", file, lambda: unwrap(model).load_state_dict(state["model"]),
               lambda: model_mismatch(unwrap(model).state_dict(), state["model"]))
        if optimizer is not None:
            _apply("optimizer", file, lambda: optimizer.load_state_dict(state["optimizer"]))
        _apply("scheduler", file, lambda: restore_loop_state(state, scheduler, file))
        return state

    step_dir, state = resolve(path, load_one)
    state["path"] = step_dir
    return state


# ------------------------------------------------------------------ FSDP2
def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def save_sharded(root: str, *, model, optimizer, scheduler=None, step: int, data_state: dict | None = None,
                 extra: dict | None = None, keep: int = KEEP) -> str:
    """Write the FSDP2 checkpoint of ``step`` (collective: every rank calls it with the same ``root``).

    Every rank writes its shards (:func:`~spectrakit.checkpoint.save_dcp`) and its loop state
    ``train_state_rank{r}.pt`` into one temporary step folder; after a barrier rank 0 writes the manifest
    over all ranks' files and makes the folder current (see :func:`save`). Returns the step folder; raises
    :class:`CheckpointError` on every rank if any rank failed to write."""
    _check_step(step, keep)
    check_root(root)
    rank = _rank()
    tmp_dir = os.path.join(root, f"{TMP}{step_name(step)}")
    if rank == 0:
        os.makedirs(root, exist_ok=True)
        clean(root)
        os.makedirs(tmp_dir)
    _barrier()
    failure = None
    from torch.distributed.checkpoint.api import CheckpointException  # (~1 s to import: only when used)

    try:
        save_dcp(tmp_dir, model, optimizer)
        save_file(loop_state(step, scheduler, data_state, extra), os.path.join(tmp_dir, RANK_FILE.format(rank)))
    except (Exception, CheckpointException) as e:  # every rank must reach the collectives below
        failure = _os_error(e)
    flags = [failure is not None]
    if dist.is_available() and dist.is_initialized():
        flags = [None] * dist.get_world_size()
        dist.all_gather_object(flags, failure is not None)
    final = None
    if rank == 0:
        if any(flags):
            err = failure or OSError(errno.EIO, "another rank failed to write its part")
            final = str(failed_save(root, tmp_dir, err))
        else:
            try:
                final = publish(root, tmp_dir, step, keep)
            except OSError as e:
                flags, final = [True], str(failed_save(root, tmp_dir, e))
    box = [final, any(flags)]
    if dist.is_available() and dist.is_initialized():
        dist.broadcast_object_list(box, src=0)
    if box[1]:
        err = CheckpointError(box[0])
        if box[0].startswith("no space left on device"):
            err.errno = errno.ENOSPC
        raise err
    return box[0]


def _check_sharded(step_dir: str, world: int, max_step: int | None) -> str:
    """Validate a sharded step folder on rank 0: DCP metadata, a loop state for each of ``world`` ranks."""
    step = read_manifest(step_dir)["step"]
    ranks = sorted(int(m.group(1)) for n in os.listdir(step_dir) if (m := _RANK_FILE.fullmatch(n)))
    for r in range(world):
        if r not in ranks:
            raise CheckpointError(f"{step_dir} has no {RANK_FILE.format(r)} (written with another world size?)")
    try:
        check_metadata(step_dir)
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    for r in ranks:
        file = os.path.join(step_dir, RANK_FILE.format(r))
        check_loop_state(safe_load(file), file, step=step, max_step=max_step)
    return step_dir


def _load_rank(step_dir: str, model, optimizer, map_location, max_step) -> dict:
    """This rank's loop state and shards of ``step_dir`` (a :class:`CheckpointError` for anything unusable)."""
    target = os.path.join(step_dir, RANK_FILE.format(_rank()))
    if not os.path.isfile(target):
        raise CheckpointError(f"{step_dir} has no {os.path.basename(target)} (written with another world size?)")
    state = check_loop_state(safe_load(target, map_location), target, max_step=max_step)
    try:
        load_dcp(step_dir, model, optimizer)
    except (ValueError, OSError) as e:
        raise CheckpointError((str(e).splitlines() or [type(e).__name__])[0][:300]) from None
    state["path"] = step_dir
    return state


def load_sharded(root: str, *, model, optimizer, scheduler=None, map_location="cpu",
                 max_step: int | None = None) -> dict:
    """Load the newest usable FSDP2 checkpoint under ``root`` (collective).

    Rank 0 verifies the manifests, the DCP metadata and every rank's loop state (as :func:`load`) and picks
    the step folder; every rank then loads its shards and its loop state. A step folder that fails on any
    rank (its checks or its load) is reported and the previous one tried, on every rank alike. Returns the
    rank's loop state dict (``step``, ``data``, ``extra``, ``path``). Raises :class:`CheckpointError` if none
    is usable."""
    refused: list[str] = []
    while True:
        box: list = [None]
        if _rank() == 0:
            try:
                box[0] = resolve(root, lambda d: _check_sharded(d, _world(), max_step), exclude=refused)[0]
            except (CheckpointError, FileNotFoundError) as e:
                box[0] = e
        if dist.is_available() and dist.is_initialized():
            dist.broadcast_object_list(box, src=0)
        if isinstance(box[0], BaseException):
            raise box[0]
        step_dir, error = box[0], None
        try:
            state = _load_rank(step_dir, model, optimizer, map_location, max_step)
        except CheckpointError as e:
            error = str(e)
        errors = [error]
        if dist.is_available() and dist.is_initialized():
            errors = [None] * dist.get_world_size()
            dist.all_gather_object(errors, error)
        first = next((e for e in errors if e), None)
        if first is None:
            restore_loop_state(state, scheduler, os.path.join(step_dir, RANK_FILE.format(_rank())))
            return state
        if os.path.normpath(step_dir) == os.path.normpath(root):  # one step folder given: no fallback
            raise CheckpointError(first)
        if _rank() == 0:
            print(f"warning: {first}; trying the previous checkpoint", file=sys.stderr, flush=True)
        tried = candidates(root)  # the folders resolve refused before this one, then this one
        refused += [(d, first) for d in tried[:tried.index(step_dir) + 1]] if step_dir in tried else [(step_dir, first)]
