"""The ``--out`` folder of ``compare`` and ``sweep``: who may write it, what it holds, what its runs were started
with.

- :func:`locked`: an exclusive ``flock`` on ``<out>/.spectrakit.lock`` for the whole command, so that two
  commands never write one folder (the second stops with one line naming the first one's process id);
  the lock ends with the process, even when it is killed.
- Ownership: ``--out`` holds :data:`OUT_MARKER` (the command that made it) and each run folder
  :data:`RUN_MARKER`, written inside it when the tool created it. ``--out`` must be new, empty or made by
  the same command (:func:`claim_out`); ``--force`` deletes only marked run folders and regular result
  files (:func:`remove_runs`); no symbolic link is followed or written through.
- :data:`INDEX` (``<out>/.spectrakit-runs.json``): the options the runs were started with; a resumed command
  must use the same options (:func:`check_options`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import stat
from collections.abc import Iterator

from spectrakit._cliargs import UsageError
from spectrakit._files import read_regular, write_atomic

LOCK = ".spectrakit.lock"
INDEX = ".spectrakit-runs.json"
OUT_MARKER = ".spectrakit-out.json"
RUN_MARKER = ".spectrakit-run"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
MAX_INDEX_BYTES = 1 << 20  # an index is a few kB; a larger one is not ours


@contextlib.contextmanager
def locked(out: str, *, shared: bool = False, name: str = LOCK, flag: str = "--out") -> Iterator[None]:
    """Hold ``flock`` on ``<out>/<name>`` (exclusive, or ``shared`` with other holders of a shared lock)
    while the block runs; the holder's process id is written into the file. Raises :class:`UsageError`
    naming the process that holds it (no waiting), or if ``out`` or the lock file is a symbolic link."""
    check_out_path(out, flag)
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, name)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
    except FileExistsError:  # left by an earlier command: reused if it is a plain file
        try:
            fd = os.open(path, os.O_RDWR | _NOFOLLOW)
        except OSError:
            raise UsageError(f"{flag} {out}: {name} is a symbolic link or not a file; remove it") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UsageError(f"{flag} {out}: {name} is not a regular file; remove it")
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise UsageError(f"{flag} {out} is in use by process {pid} (another compare or sweep writing it); "
                             f"wait until it ends or choose another {flag}") from None
        if not shared:
            os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def main_process() -> bool:
    """Whether this process is rank 0 of a ``torchrun`` job (or not under one): the only process that checks,
    claims, cleans or writes ``--out``, so that ranks never race on it."""
    return os.environ.get("RANK", "0") == "0"


def lock_out(out: str | None, *, shared: bool = False, name: str = LOCK):
    """:func:`locked` for a command's ``--out``: in rank 0 of a ``torchrun`` job only (the other ranks write
    nothing there), and not at all without ``--out``."""
    if not out or not main_process():
        return contextlib.nullcontext()
    return locked(out, shared=shared, name=name)


def read_index(out: str) -> dict | None:
    """The index of ``out`` (``{"command", "options", "runs"}``), or None when there is none or it is not a
    well-formed index (then nothing is deleted by it and no options are compared)."""
    path = os.path.join(out, INDEX)
    if not _is(path, stat.S_ISREG):  # a link or anything else is not the tool's index
        return None
    try:
        data = json.loads(read_regular(path, MAX_INDEX_BYTES, "index"))
    except (OSError, ValueError, RecursionError):
        return None
    ok = (isinstance(data, dict) and isinstance(data.get("command"), str) and isinstance(data.get("options"), dict)
          and isinstance(data.get("runs"), list) and all(isinstance(r, str) for r in data["runs"]))
    if not ok:
        return None
    data["runs"] = [r for r in data["runs"] if _plain_name(r)]  # informational: deletion never reads it
    return data


def _plain_name(name: str) -> bool:
    """A folder directly inside ``out``: no separator, not ``.``/``..``, not hidden."""
    return bool(name) and os.sep not in name and "/" not in name and not name.startswith(".") and "\0" not in name


def write_index(out: str, command: str, options: dict, runs: list[str]) -> None:
    """Write the index atomically (``runs``: folder names inside ``out``)."""
    bad = [r for r in runs if not _plain_name(r)]
    if bad:
        raise ValueError(f"runs must be folder names inside out, got {bad[0]!r}")
    write_atomic(os.path.join(out, INDEX),
                 json.dumps({"command": command, "options": options, "runs": list(dict.fromkeys(runs))}, indent=1))


def start(out: str, command: str, options: dict, *, resume: bool, write: bool = True) -> None:
    """Before any run of ``command`` in ``out``: with ``resume``, check the options against the index
    (:func:`check_options`); then (``write``: one process of a distributed job) record ``options`` in the
    index, keeping the run folders listed so far."""
    index = read_index(out) if os.path.isdir(out) else None
    options = json.loads(json.dumps(options, default=str))  # tuples as lists, as they are stored
    if resume and index is not None:
        check_options(out, index, options)
    if write:
        os.makedirs(out, exist_ok=True)
        write_index(out, command, options, index["runs"] if index else [])


def add_run(out: str, name: str) -> None:
    """Record the run folder ``name`` (created next, inside ``out``) in the index."""
    index = read_index(out) or {"command": "compare", "options": {}, "runs": []}
    if name not in index["runs"]:
        write_index(out, index["command"], index["options"], [*index["runs"], name])


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _shown(value) -> str:
    if value is None:
        return "default"
    if isinstance(value, list):
        return ",".join(map(str, value)) or "none"
    return str(value)


def check_options(out: str, index: dict, options: dict) -> None:
    """Raise :class:`UsageError` naming every option whose value differs from the one the runs in ``out``
    were started with (``index["options"]``); options missing on either side are not compared."""
    old = index["options"]
    changed = [f"{_flag(k)} {_shown(old[k])} (now {_shown(v)})" for k, v in options.items()
               if k in old and old[k] != v]
    if changed:
        raise UsageError(f"--out {out} holds runs started with other options: {', '.join(changed)}; resume with "
                         "the options they were started with, or start over with --force or another --out")


def remove_runs(out: str, files: tuple[str, ...] = ()) -> list[str]:
    """Delete the run folders of ``out`` that the tool made (:func:`owned_runs`), the result ``files`` that
    are regular files (or real folders, never links) and the index; returns what was deleted."""
    bad = [f for f in files if not _plain_name(f)]
    if bad:
        raise ValueError(f"files must be names of files directly inside out, got {bad[0]!r}")
    gone = []
    for name in owned_runs(out):
        shutil.rmtree(os.path.join(out, name))
        gone.append(name)
    for name in (*files, INDEX):
        path = os.path.join(out, name)
        if _is(path, stat.S_ISREG):
            os.remove(path)
            gone.append(name)
        elif name in files and _is(path, stat.S_ISDIR):
            shutil.rmtree(path)
            gone.append(name)
    return gone


def _is(path: str, test) -> bool:
    """``test(mode)`` of ``path`` itself (a symbolic link is never a file or folder here)."""
    try:
        return bool(test(os.lstat(path).st_mode))
    except OSError:
        return False


def check_out_path(out: str, flag: str = "--out") -> None:
    """Refuse (:class:`UsageError`) an output folder that is a symbolic link, the file system's root, or not a
    folder."""
    if os.path.islink(out):
        raise UsageError(f"{flag} {out} is a symbolic link; give the folder it points to, or another folder")
    if os.path.realpath(out) == os.path.realpath(os.sep):
        raise UsageError(f"{flag} {out} is the root folder; choose a folder of its own, such as runs/compare")
    if os.path.lexists(out) and not os.path.isdir(out):
        raise UsageError(f"{flag} {out} exists and is not a folder")


def _marker_command(out: str) -> str | None:
    path = os.path.join(out, OUT_MARKER)
    if not _is(path, stat.S_ISREG) or os.path.getsize(path) > 4096:
        return None
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data.get("command") if isinstance(data, dict) and isinstance(data.get("command"), str) else None


def claim_out(out: str, command: str, flag: str = "--out") -> None:
    """Make ``out`` the output folder of ``command``: it must be new, empty (but for the lock) or already
    marked as made by ``command``; else :class:`UsageError` naming it. Writes :data:`OUT_MARKER`."""
    check_out_path(out, flag)
    if os.path.isdir(out):
        owner = _marker_command(out)
        if owner is not None and owner != command:
            raise UsageError(f"{flag} {out} holds the output of 'spectrakit {owner}'; choose another {flag} for "
                             f"'spectrakit {command}'")
        if owner is None:
            other = sorted(n for n in os.listdir(out) if not n.startswith(LOCK))
            if other:
                raise UsageError(f"{flag} {out} is not empty ({other[0]}{' ...' if len(other) > 1 else ''}) and was "
                                 f"not made by 'spectrakit {command}'; choose a new or empty folder")
    os.makedirs(out, exist_ok=True)
    if _marker_command(out) != command:
        write_atomic(os.path.join(out, OUT_MARKER), json.dumps({"command": command}) + "\n")


def make_run(out: str, name: str) -> str:
    """The run folder ``out/name``, created with :data:`RUN_MARKER` inside it, or reused if it holds the
    marker. A folder of that name that the tool did not make, or a link, is refused (:class:`UsageError`)."""
    if not _plain_name(name):
        raise ValueError(f"name must be a folder name inside out, got {name!r}")
    path = os.path.join(out, name)
    if _is(path, stat.S_ISDIR) and not os.listdir(path):  # an empty folder (made by another rank): claimed
        pass
    elif os.path.lexists(path):
        if not owned(path):
            raise UsageError(f"{path} exists and was not made by spectrakit (no {RUN_MARKER} in it, or a link); "
                             "move it away or choose another --out")
        return path
    os.makedirs(path, exist_ok=True)
    fd = os.open(os.path.join(path, RUN_MARKER), os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
    os.close(fd)
    add_run(out, name)
    return path


def owned(path: str) -> bool:
    """Whether ``path`` is a real folder (not a link) holding the tool's :data:`RUN_MARKER` file."""
    return _is(path, stat.S_ISDIR) and _is(os.path.join(path, RUN_MARKER), stat.S_ISREG)


def owned_runs(out: str) -> list[str]:
    """The run folders directly inside ``out`` that the tool made, sorted."""
    if not _is(out, stat.S_ISDIR):
        return []
    return sorted(n for n in os.listdir(out) if _plain_name(n) and owned(os.path.join(out, n)))
