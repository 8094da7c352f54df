"""The ``--out`` folder of ``compare`` and ``sweep``: who may write it, what it holds, what its runs were started
with.

- :func:`locked`: an exclusive ``flock`` on ``<out>/.spectrakit.lock`` for the whole command, so that two
  commands never write one folder (the second stops with one line naming the first one's process id);
  the lock ends with the process, even when it is killed.
- :data:`INDEX` (``<out>/.spectrakit-runs.json``): the command that owns the folder, the options its runs
  were started with and the run folders it created. ``--force`` deletes only those folders
  (:func:`remove_runs`), never another folder that happens to sit in ``--out``; a resumed command must
  use the same options (:func:`check_options`), so that no row mixes two settings or carries the wrong one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Iterator

from spectrakit._cliargs import UsageError

LOCK = ".spectrakit.lock"
INDEX = ".spectrakit-runs.json"
MAX_INDEX_BYTES = 1 << 20  # an index is a few kB; a larger one is not ours


@contextlib.contextmanager
def locked(out: str, *, shared: bool = False, name: str = LOCK, flag: str = "--out") -> Iterator[None]:
    """Hold ``flock`` on ``<out>/<name>`` (exclusive, or ``shared`` with other holders of a shared lock)
    while the block runs; the holder's process id is written into the file. Raises :class:`UsageError`
    naming the process that holds it (no waiting)."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
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


def lock_out(out: str | None, *, shared: bool = False, name: str = LOCK):
    """:func:`locked` for a command's ``--out``: in rank 0 of a ``torchrun`` job only (the other ranks write
    nothing there), and not at all without ``--out``."""
    if not out or os.environ.get("RANK", "0") != "0":
        return contextlib.nullcontext()
    return locked(out, shared=shared, name=name)


def read_index(out: str) -> dict | None:
    """The index of ``out`` (``{"command", "options", "runs"}``), or None when there is none or it is not a
    well-formed index (then nothing is deleted by it and no options are compared)."""
    path = os.path.join(out, INDEX)
    try:
        if os.path.getsize(path) > MAX_INDEX_BYTES:
            return None
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError, RecursionError):
        return None
    ok = (isinstance(data, dict) and isinstance(data.get("command"), str) and isinstance(data.get("options"), dict)
          and isinstance(data.get("runs"), list) and all(isinstance(r, str) for r in data["runs"]))
    return data if ok else None


def _plain_name(name: str) -> bool:
    """A folder directly inside ``out``: no separator, not ``.``/``..``, not hidden."""
    return bool(name) and os.sep not in name and "/" not in name and not name.startswith(".") and "\0" not in name


def write_index(out: str, command: str, options: dict, runs: list[str]) -> None:
    """Write the index atomically (``runs``: folder names inside ``out``)."""
    bad = [r for r in runs if not _plain_name(r)]
    if bad:
        raise ValueError(f"runs must be folder names inside out, got {bad[0]!r}")
    path = os.path.join(out, INDEX)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"command": command, "options": options, "runs": list(dict.fromkeys(runs))}, f, indent=1)
    os.replace(tmp, path)


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


def remove_runs(out: str, names: list[str], files: tuple[str, ...] = ()) -> list[str]:
    """Delete the run folders ``names`` (plain folder names inside ``out``; links and anything else are left
    alone), the result ``files`` and the index; returns what was deleted."""
    gone = []
    for name in dict.fromkeys(names):
        path = os.path.join(out, name)
        if _plain_name(name) and os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
            gone.append(name)
    for name in (*files, INDEX):
        path = os.path.join(out, name)
        if os.path.isfile(path) and not os.path.islink(path):
            os.remove(path)
            gone.append(name)
        elif os.path.isdir(path) and not os.path.islink(path) and name in files:
            shutil.rmtree(path)
            gone.append(name)
    return gone
