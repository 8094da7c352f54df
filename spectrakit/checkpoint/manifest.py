"""The manifest of a step folder: size and SHA-256 of every file in it, written last, checked before use.

``manifest.json`` is ``{"format": 1, "step": <int>, "files": {<relative path>: {"size": <int>, "sha256":
<64 hex digits>}}}``. :func:`verify` trusts nothing in it: the file is read only up to
:data:`MAX_MANIFEST_BYTES`, its schema is checked exactly, and it must list exactly the regular files of the
step folder (no more, no fewer, no path outside the folder, no duplicate, no symbolic link), so the work of
verifying is bounded by the size of the folder itself. Any deviation is a :class:`CheckpointError` "...
is corrupted: <why>", which makes resolution fall back to the previous checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import stat

from spectrakit.checkpoint.files import CheckpointError, is_regular, sha256, write_text

FORMAT = 1
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 1 << 20  # about 8000 files; a step folder holds 2 per rank plus 2
MAX_STEP = 10**8 - 1  # step folders are named step_XXXXXXXX
STEP_NAME = re.compile(r"step_(\d{8})")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def listing(step_dir: str) -> list[str]:
    """Relative paths (``/``-separated) of the files of a step folder, except the manifest, sorted. Raises
    :class:`CheckpointError` for a symbolic link or anything but regular files and folders in it."""
    out = []
    for base, dirs, names in os.walk(step_dir):
        for n in dirs + names:
            path = os.path.join(base, n)
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                raise CheckpointError(f"{path} is a symbolic link (refused in a checkpoint)")
            if n in names and not stat.S_ISREG(mode):
                raise CheckpointError(f"{path} is not a regular file (refused in a checkpoint)")
            rel = os.path.relpath(path, step_dir).replace(os.sep, "/")
            if n in names and rel != MANIFEST:
                out.append(rel)
    return sorted(out)


def write_manifest(step_dir: str, step: int) -> None:
    """Write ``step_dir/manifest.json`` (atomically) over every file of the folder."""
    files = {rel: {"size": os.path.getsize(os.path.join(step_dir, rel)),
                   "sha256": sha256(os.path.join(step_dir, rel))} for rel in listing(step_dir)}
    write_text(os.path.join(step_dir, MANIFEST), json.dumps({"format": FORMAT, "step": step, "files": files},
                                                            indent=1))


def _no_duplicates(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}"[:120])
        out[key] = value
    return out


def _no_constant(name):
    raise ValueError(f"{name} is not a number")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _bad_path(rel) -> str | None:
    """Why ``rel`` is not a plain relative path inside the folder (None if it is)."""
    if not isinstance(rel, str) or not rel or len(rel) > 4096:
        return "an entry is not a file name"
    if "\\" in rel or "\x00" in rel or rel.startswith("/"):
        return f"entry {rel[:100]!r} is not a relative path inside the folder"
    if any(part in ("", ".", "..") for part in rel.split("/")):
        return f"entry {rel[:100]!r} is not a relative path inside the folder"
    if rel == MANIFEST:
        return f"entry {rel!r} lists the manifest itself"
    return None


def _schema_error(manifest) -> str | None:
    """Why ``manifest`` (parsed JSON) is not a manifest of this format (None if it is)."""
    if not isinstance(manifest, dict) or set(manifest) != {"format", "step", "files"}:
        return "expected an object with exactly the keys format, step and files"
    if not _is_int(manifest["format"]) or manifest["format"] != FORMAT:
        return f"format must be {FORMAT}"
    if not _is_int(manifest["step"]) or not 0 <= manifest["step"] <= MAX_STEP:
        return f"step must be an int in [0, {MAX_STEP}]"
    if not isinstance(manifest["files"], dict):
        return "files must be an object"
    for rel, meta in manifest["files"].items():
        why = _bad_path(rel)
        if why:
            return why
        if not isinstance(meta, dict) or set(meta) != {"size", "sha256"}:
            return f"entry {rel[:100]!r} must have exactly the keys size and sha256"
        if not _is_int(meta["size"]) or meta["size"] < 0:
            return f"entry {rel[:100]!r}: size must be an int >= 0"
        if not isinstance(meta["sha256"], str) or not _SHA256.fullmatch(meta["sha256"]):
            return f"entry {rel[:100]!r}: sha256 must be 64 lowercase hex digits"
    return None


def read_manifest(step_dir: str) -> dict:
    """The parsed and schema-checked manifest of ``step_dir`` (files not checked; see :func:`verify`)."""
    mpath = os.path.join(step_dir, MANIFEST)
    if not os.path.lexists(mpath):
        raise CheckpointError(f"{step_dir} is incomplete: no {MANIFEST}")
    if not is_regular(mpath):
        raise CheckpointError(f"{mpath} is corrupted: not a regular file")
    with open(mpath, "rb") as f:
        raw = f.read(MAX_MANIFEST_BYTES + 1)
    if len(raw) > MAX_MANIFEST_BYTES:
        raise CheckpointError(f"{mpath} is corrupted: larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        manifest = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        reason = "nested too deeply" if isinstance(e, RecursionError) else str(e).splitlines()[0][:120]
        raise CheckpointError(f"{mpath} is corrupted: not valid JSON ({reason})") from None
    why = _schema_error(manifest)
    if why:
        raise CheckpointError(f"{mpath} is corrupted: {why}")
    match = STEP_NAME.fullmatch(os.path.basename(os.path.normpath(step_dir)))
    if match and int(match.group(1)) != manifest["step"]:
        raise CheckpointError(f"{mpath} is corrupted: step {manifest['step']} in a folder of step "
                              f"{int(match.group(1))}")
    return manifest


def verify(step_dir: str) -> dict:
    """Check a step folder against its manifest; returns the manifest.

    The manifest must be well formed and list exactly the regular files of the folder; each file's size,
    then each file's SHA-256, must match. Raises :class:`CheckpointError` naming the first missing,
    unlisted, truncated or altered file, or the manifest if it is corrupted."""
    manifest = read_manifest(step_dir)
    files = manifest["files"]
    present = set(listing(step_dir))
    for rel in sorted(set(files) - present):
        raise CheckpointError(f"{os.path.join(step_dir, rel)} is missing")
    for rel in sorted(present - set(files)):
        raise CheckpointError(f"{os.path.join(step_dir, rel)} is not listed in {MANIFEST} (refused)")
    for rel in sorted(files):  # sizes first: cheap, and catches truncation without hashing
        path, want = os.path.join(step_dir, rel), files[rel]["size"]
        if os.path.getsize(path) != want:
            raise CheckpointError(f"{path} is truncated or altered ({os.path.getsize(path)} bytes, expected {want})")
    for rel in sorted(files):
        if sha256(os.path.join(step_dir, rel)) != files[rel]["sha256"]:
            raise CheckpointError(f"{os.path.join(step_dir, rel)} is corrupted (sha256 differs from {MANIFEST})")
    return manifest
