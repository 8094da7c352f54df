"""spectrakit.checkpoint is the one checkpoint module: it imports only torch, NumPy, the standard library and
the ground modules ``spectrakit/_*.py`` (every import, also inside functions), and the other packages use it
instead of keeping their own copy of the manifest or resolution logic."""

from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG = os.path.join(ROOT, "spectrakit")


def _imports(path: str) -> list[str]:
    tree = ast.parse(open(path).read(), path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
    return out


def _py_files(folder: str):
    for base, _, names in os.walk(folder):
        for n in names:
            if n.endswith(".py"):
                yield os.path.join(base, n)


def test_checkpoint_imports_nothing_above_it():
    bad = []
    for path in _py_files(os.path.join(PKG, "checkpoint")):
        for mod in _imports(path):
            top = mod.split(".")
            if top[0] == "spectrakit" and len(top) > 1 and top[1] != "checkpoint" and not top[1].startswith("_"):
                bad.append((os.path.relpath(path, ROOT), mod))
            elif top[0] not in ("spectrakit", "torch", "numpy", "__future__") and top[0] not in _stdlib():
                bad.append((os.path.relpath(path, ROOT), mod))
    assert bad == []


def _stdlib() -> frozenset:
    import sys

    return frozenset(sys.stdlib_module_names)


def test_no_second_copy_of_manifest_or_resolution_logic():
    """Outside spectrakit/checkpoint nothing names manifest.json or defines verification, resolution, the
    `latest` pointer, pruning or the DCP metadata check; and no module takes a private name from a
    checkpoint module."""
    for path in _py_files(PKG):
        rel = os.path.relpath(path, ROOT)
        if rel.startswith(os.path.join("spectrakit", "checkpoint")):
            continue
        text = open(path).read()
        for needle in ("manifest.json", "def verify(", "def resolve(", "def latest(",
                       "def candidates(", "def prune(", "def _publish(", "def check_metadata("):
            assert needle not in text, (rel, needle)
        tree = ast.parse(text, path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and "checkpoint" in node.module:
                assert not [a.name for a in node.names if a.name.startswith("_")], (rel, node.module)
