"""Files the tool writes and files a user hands it, handled so that neither can be turned against the user.

- Writes are atomic: a temporary file in the target's folder, fsync, ``os.replace``; a failed write (a full
  disk, a file-size limit) leaves the previous file whole, and a symbolic link planted at the target is
  replaced, never written through.
- Appends and the temporary files never follow a symbolic link (``O_NOFOLLOW``).
- Reads of user-given files accept only a regular file of bounded size, opened without blocking (a FIFO or
  a device such as ``/dev/zero`` is refused at once).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator

MAX_JSON_BYTES = 64 << 20
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def fsync_dir(folder: str) -> None:
    """fsync a directory, so that a rename inside it survives a power loss (no-op where unsupported)."""
    try:
        fd = os.open(folder or ".", os.O_RDONLY)
    except OSError:  # pragma: no cover (platforms without directory fds)
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """Yield a new temporary path beside ``path``; when the block ends without an error, fsync it and rename
    it over ``path`` (replacing a link, never following it). On an error the temporary file is removed and
    ``path`` is left as it was."""
    folder = os.path.dirname(path)
    tmp = os.path.join(folder, f".tmp-{os.path.basename(path)}-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        os.remove(tmp)
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY | _NOFOLLOW)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
    fsync_dir(folder)


def write_atomic(path: str, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` atomically (see :func:`atomic_path`)."""
    raw = data.encode() if isinstance(data, str) else data
    with atomic_path(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(raw)


def save_figure(fig, path: str, **kwargs) -> None:
    """``fig.savefig`` to ``path`` atomically (the format from the extension)."""
    fmt = os.path.splitext(path)[1].lstrip(".") or "png"
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=fmt, **kwargs)


def open_append(path: str, newline: str | None = None):
    """``open(path, "a")`` that refuses a symbolic link (``OSError`` ELOOP) instead of writing through it."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW, 0o644)
    return os.fdopen(fd, "a", newline=newline)


def read_regular(path: str, limit: int = MAX_JSON_BYTES, what: str = "file") -> str:
    """The text of ``path`` if it is a regular file of at most ``limit`` bytes; else ``ValueError`` naming the
    path and the reason (not a regular file, larger than the cap). Never blocks on a FIFO."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{what} {path} is not a regular file")
        if st.st_size > limit:
            raise ValueError(f"{what} {path} is larger than {limit >> 20} MiB ({st.st_size >> 20} MiB)")
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{what} {path} is larger than {limit >> 20} MiB")
    return data.decode("utf-8", errors="replace")
