"""Reading and writing single checkpoint files: ``torch.load(weights_only=True)``, fsynced ``torch.save``,
atomic text files, SHA-256, and the one error type of the package."""

from __future__ import annotations

import errno
import hashlib
import os
import stat

import torch

from spectrakit._files import fsync_dir

TMP = ".tmp-"  # prefix of everything a save writes before it is published


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or used; the message is one line and names the file.

    ``errno`` is ``errno.ENOSPC`` when a save failed because the disk is full, else ``None``."""

    errno: int | None = None


def disk_full(path: str, detail: str = "") -> CheckpointError:
    """The error of a save that ran out of disk space: ``no space left on device: <path>``."""
    err = CheckpointError(f"no space left on device: {path}{detail}")
    err.errno = errno.ENOSPC
    return err


def safe_load(path: str, map_location="cpu"):
    """``torch.load(path, weights_only=True)``: tensors and plain containers only, never arbitrary objects.

    Raises ``FileNotFoundError`` if ``path`` does not exist and :class:`CheckpointError` naming ``path`` for
    a file that is refused or unreadable."""
    if os.path.lexists(path) and not is_regular(path):
        raise CheckpointError(f"cannot load {path}: not a regular file")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as e:  # pickle.UnpicklingError, RuntimeError (truncated zip), ...
        text = str(e).strip()
        reason = text.splitlines()[0] if text else type(e).__name__
        if "weights_only" in text or "Unsupported global" in text:
            reason = "it holds Python objects other than tensors and plain containers (refused, never executed)"
        raise CheckpointError(f"cannot load {path}: {reason[:300]}") from None


def is_regular(path: str) -> bool:
    """Whether ``path`` is a regular file itself (not a symbolic link, folder, FIFO or device)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


class _Writer:
    """A binary file for ``torch.save`` that remembers the ``OSError`` of a failed write: torch's zip writer
    replaces it by a ``RuntimeError`` ("file write failed") that no longer says why."""

    def __init__(self, f):
        self.f = f
        self.error: OSError | None = None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.f.flush()

    def __getattr__(self, name):  # tell, seek, fileno, ... of the real file
        return getattr(self.f, name)


def save_file(obj, path: str) -> None:
    """``torch.save(obj, path)`` then fsync. A failed write raises the ``OSError`` that caused it (e.g.
    ``errno.ENOSPC`` when the disk is full), also where torch reports only ``RuntimeError``."""
    with open(path, "wb") as f:
        writer = _Writer(f)
        try:
            torch.save(obj, writer)
        except RuntimeError:
            if writer.error is not None:
                raise writer.error from None
            raise
        f.flush()
        os.fsync(f.fileno())


def _new_file(path: str, flags: int) -> int:
    """``open``'s opener for a temporary file: created new, never through a symbolic link."""
    return os.open(path, flags | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)


def write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary file, fsync, ``os.replace``, fsync of the folder)."""
    tmp = os.path.join(os.path.dirname(path), f"{TMP}{os.path.basename(path)}-{os.getpid()}")
    try:
        if os.path.lexists(tmp):
            os.remove(tmp)
        with open(tmp, "w", opener=_new_file) as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.remove(tmp)
    fsync_dir(os.path.dirname(path) or ".")


def sha256(path: str) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
