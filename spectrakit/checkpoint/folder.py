"""The run folder of checkpoints: step folders ``step_XXXXXXXX``, the ``latest`` pointer, atomic publication,
pruning, and resolution of the newest usable checkpoint with fallback to older ones.

Nothing in a run folder is followed outside it: step folders are real folders (not symbolic links) named
exactly ``step_`` and 8 digits, and ``latest`` must hold exactly one such name (a pointer such as
``step_00000045/../../x`` is ignored with a warning, and the step folders themselves are tried instead).
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
from collections.abc import Callable, Sequence

from spectrakit.checkpoint.files import TMP, CheckpointError, fsync_dir, write_text
from spectrakit.checkpoint.manifest import MANIFEST, STEP_NAME, verify, write_manifest

KEEP = 2
LATEST = "latest"
PREFIX = "step_"


def step_name(step: int) -> str:
    """``step_XXXXXXXX``: the folder name of ``step``."""
    return f"{PREFIX}{step:08d}"


def _is_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def step_dirs(root: str) -> list[str]:
    """Step folders directly under ``root`` (complete or not), newest first; symbolic links are skipped, and a
    ``root`` that is itself a link holds none."""
    if not _is_dir(root):
        return []
    names = [n for n in os.listdir(root) if STEP_NAME.fullmatch(n) and _is_dir(os.path.join(root, n))]
    return [os.path.join(root, n) for n in sorted(names, reverse=True)]


def _pointer(root: str) -> tuple[str | None, str | None]:
    """``(step folder named by root/latest, None)``, ``(None, None)`` without a pointer, or ``(None, why)``
    for a pointer that does not name exactly one step folder of ``root``."""
    path = os.path.join(root, LATEST)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None, None
    if not stat.S_ISREG(mode):
        return None, f"{path} is not a regular file"
    with open(path, "rb") as f:
        raw = f.read(64)
    name = raw.decode("ascii", errors="replace").removesuffix("\n")
    if not STEP_NAME.fullmatch(name):
        return None, f"{path} does not hold a step folder name ({PREFIX} and 8 digits)"
    if not _is_dir(os.path.join(root, name)):
        return None, f"{path} names {name}, which is not a folder of {root}"
    return os.path.join(root, name), None


def latest(root: str) -> str | None:
    """The step folder ``root/latest`` names (None if there is none, or if the pointer is invalid)."""
    return _pointer(root)[0]


def candidates(root: str) -> list[str]:
    """Step folders to try when resuming from ``root``: the current one, then older ones, newest first."""
    cur = latest(root)
    return ([cur] if cur else []) + [d for d in step_dirs(root) if d != cur]


def clean(root: str) -> None:
    """Remove what interrupted saves left under ``root``: temporary files and folders (never through a link)."""
    if not _is_dir(root):
        return
    for n in os.listdir(root):
        if n.startswith(TMP):
            p = os.path.join(root, n)
            if _is_dir(p):
                shutil.rmtree(p, ignore_errors=True)
            else:
                os.remove(p)


def prune(root: str, keep: int) -> None:
    """Remove all but the current step folder and the ``keep - 1`` newest others. Only step folders a save
    wrote are removed (real folders holding a regular ``manifest.json``); a folder the user put there, or a
    link, is left alone."""
    cur = latest(root)
    for old in [d for d in step_dirs(root) if d != cur][max(keep, 1) - 1:]:
        try:
            ours = stat.S_ISREG(os.lstat(os.path.join(old, MANIFEST)).st_mode)
        except OSError:
            ours = False
        if ours:
            shutil.rmtree(old, ignore_errors=True)


def check_root(root: str) -> None:
    """Raise :class:`CheckpointError` if the checkpoint folder ``root`` is a symbolic link (its saves, loads
    and pruning would act on a folder elsewhere)."""
    if os.path.islink(root):
        raise CheckpointError(f"{root} is a symbolic link; checkpoints are only written to and read from a "
                              "folder of the run itself")


def publish(root: str, tmp_dir: str, step: int, keep: int = KEEP) -> str:
    """Make the finished temporary folder ``tmp_dir`` the current checkpoint of ``step``: write its manifest,
    rename it to ``root/step_XXXXXXXX``, point ``latest`` at it (atomically), prune to ``keep``. Returns the
    step folder."""
    write_manifest(tmp_dir, step)
    fsync_dir(tmp_dir)
    final = os.path.join(root, step_name(step))
    if os.path.lexists(final):  # e.g. a resumed run re-saving a step whose old copy was unusable
        trash = os.path.join(root, f"{TMP}old-{os.path.basename(final)}-{os.getpid()}")
        os.rename(final, trash)
        os.rename(tmp_dir, final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.rename(tmp_dir, final)
    fsync_dir(root)
    write_text(os.path.join(root, LATEST), os.path.basename(final) + "\n")
    prune(root, keep)
    return final


def _warn(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _try(step_dir: str, load: Callable[[str], object] | None):
    manifest = verify(step_dir)
    try:
        return load(step_dir) if load is not None else manifest
    except OSError as e:  # unreadable file: as unusable as a corrupted one
        raise CheckpointError(f"cannot read {e.filename or step_dir}: {e.strerror or e}") from None


def resolve(path: str, load: Callable[[str], object] | None = None, *,
            exclude: Sequence[tuple[str, str]] = ()) -> tuple[str, object]:
    """The newest usable checkpoint under ``path``: returns ``(step folder, load(step folder))`` (the
    manifest when ``load`` is None).

    ``path`` is a run folder (its ``latest`` step folder is tried first, then the others, newest first; each
    unusable one is reported on stderr) or one step folder (used as given, no fallback). ``exclude`` lists
    ``(step folder, why)`` pairs already found unusable: they are skipped silently. A step folder is
    usable when :func:`~spectrakit.checkpoint.verify` accepts it and ``load`` raises no
    :class:`CheckpointError` (``load`` validates and reads the contents).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        CheckpointError: no usable checkpoint (the message ends with the last reason).
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint path does not exist: {path}")
    check_root(path)
    if os.path.isfile(os.path.join(path, MANIFEST)) or os.path.basename(os.path.normpath(path)).startswith(PREFIX):
        return path, _try(path, load)
    _, problem = _pointer(path)
    if problem:
        _warn(f"warning: {problem}; ignoring it")
    skipped = {d for d, _ in exclude}
    tried = [d for d in candidates(path) if d not in skipped]
    if not tried and exclude:
        raise CheckpointError(f"no usable checkpoint in {path}: {exclude[-1][1]}")
    if not tried:
        raise CheckpointError(f"{path} holds no checkpoint (no {PREFIX}* folder)")
    errors = []
    for d in tried:
        try:
            result = _try(d, load)
        except CheckpointError as e:
            errors.append(str(e))
            _warn(f"warning: {e}; trying the previous checkpoint")
            continue
        if errors:
            _warn(f"resuming from {d} (the newer checkpoint is unusable)")
        return d, result
    raise CheckpointError(f"no usable checkpoint in {path}: {errors[-1]}")
