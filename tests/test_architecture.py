"""The package's import rules (docs/architecture.md), checked by reading every import with ``ast``.

Every ``import``/``from ... import`` of every module under ``spectrakit/`` counts: at module level, inside
functions, methods and ``if``/``try`` blocks, and relative imports (resolved against the importing module).
``SPECTRAKIT_ROOT`` points the checks at another tree (e.g. an older checkout) to see what they report there.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

ROOT = Path(os.environ.get("SPECTRAKIT_ROOT", Path(__file__).resolve().parents[1])) / "spectrakit"

# Layer of each top-level part of the package -> the layers it may import (besides itself). The ground
# modules are spectrakit/__init__.py and spectrakit/_*.py; cli.py and __main__.py are part of the command layer.
LAYERS: dict[str, set[str]] = {
    "ground": set(),
    "linalg": {"ground"},
    "optim": {"ground", "linalg"},
    "conv": {"ground", "linalg"},
    "manifold": {"ground", "linalg"},
    "models": {"ground", "linalg", "optim", "conv", "manifold"},
    "data": {"ground", "linalg", "optim", "conv", "manifold"},
    "checkpoint": {"ground"},
    "distributed": {"ground", "linalg", "optim", "conv", "manifold", "models", "data", "checkpoint"},
    # entry points for other frameworks (torchtitan); each imports its framework lazily
    "integrations": {"ground", "linalg", "optim", "conv", "manifold", "models", "data", "checkpoint",
                     "distributed"},
    "train": {"ground", "linalg", "optim", "conv", "manifold", "models", "data", "checkpoint", "distributed",
              "integrations"},
    "experiments": {"ground", "linalg", "optim", "conv", "manifold", "models", "data", "checkpoint",
                    "distributed", "integrations", "train"},
    "commands": {"ground", "linalg", "optim", "conv", "manifold", "models", "data", "checkpoint",
                 "distributed", "integrations", "train", "experiments"},
}


def layer_of(module: str) -> str:
    """``spectrakit.optim.spectra`` -> ``optim``; ground modules -> ``ground``; cli/__main__ -> ``commands``."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1].startswith("_") and parts[1] != "__main__":
        return "ground"
    if parts[1] in ("cli", "__main__"):
        return "commands"
    return parts[1]


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file of the package."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = module_files()


def _is_package(module: str) -> bool:
    return MODULES.get(module, Path()).name == "__init__.py"


def imports_of(module: str) -> list[tuple[int, str, str | None]]:
    """``(line, imported module, imported name or None)`` for every spectrakit import in ``module``."""
    tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, None) for a in node.names if a.name.split(".")[0] == "spectrakit"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if _is_package(module) else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "spectrakit":
                continue
            for a in node.names:
                # ``from pkg import submodule`` imports the submodule; ``from mod import name`` a name of mod
                if f"{target}.{a.name}" in MODULES:
                    out.append((node.lineno, f"{target}.{a.name}", None))
                else:
                    out.append((node.lineno, target, a.name))
    return out


def _where(module: str, line: int) -> str:
    return f"{MODULES[module].relative_to(ROOT.parent)}:{line}"


def layer_violations() -> list[str]:
    """One line per import statement that reaches a layer its layer may not import."""
    bad: dict[str, list[str]] = {}
    for module in MODULES:
        src = layer_of(module)
        for line, target, name in imports_of(module):
            dst = layer_of(target)
            if dst != src and dst not in LAYERS[src]:
                names = bad.setdefault(f"{_where(module, line)}: {src} imports {dst}: {target}", [])
                names += [name] if name else []
    return [k + (f" ({', '.join(v)})" if v else "") for k, v in bad.items()]


def private_violations() -> list[str]:
    """Private modules (``a/_b.py``) or names (``_x``) taken from another subpackage; the ground modules
    ``spectrakit/_*.py`` are shared by design."""
    bad = []
    for module in MODULES:
        src = layer_of(module)
        for line, target, name in imports_of(module):
            if layer_of(target) in (src, "ground"):
                continue
            private = [p for p in target.split(".")[2:] if p.startswith("_")]
            if name is not None and name.startswith("_"):
                private.append(name)
            if private:
                bad.append(f"{_where(module, line)}: private {', '.join(private)} of {target}")
    return bad


def module_cycles() -> list[str]:
    """Every strongly connected set of two or more modules in the import graph (Tarjan)."""
    graph = {m: sorted({t for _, t, _ in imports_of(m) if t in MODULES and t != m}) for m in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(" <-> ".join(sorted(comp)))

    for m in graph:
        if m not in index:
            visit(m)
    return sorted(found)


def test_the_package_is_found():
    assert {"spectrakit.linalg", "spectrakit.optim", "spectrakit.cli"} <= set(MODULES)
    assert all(layer_of(m) in LAYERS for m in MODULES), sorted({layer_of(m) for m in MODULES} - set(LAYERS))


def test_layers_import_only_downhill():
    bad = layer_violations()
    assert not bad, "imports against the layer order (docs/architecture.md):\n" + "\n".join(bad)


def test_no_private_names_across_subpackages():
    bad = private_violations()
    assert not bad, "private names taken from another subpackage:\n" + "\n".join(bad)


def test_no_import_cycles_between_modules():
    bad = module_cycles()
    assert not bad, "import cycles:\n" + "\n".join(bad)


def test_commands_live_in_the_command_layer():
    """Command-line options (``add_arguments``) only in spectrakit/commands/ and, for an experiment's own
    options next to the function that computes it, in spectrakit/experiments/; every ``spectrakit``
    sub-command is a module of spectrakit/commands/."""
    tree = ast.parse(MODULES["spectrakit.cli"].read_text())
    (table,) = [n.value for n in tree.body if isinstance(n, ast.AnnAssign) and n.target.id == "COMMANDS"]
    commands = ast.literal_eval(table)
    assert commands and all(module.startswith("spectrakit.commands.") for module, _ in commands.values()), commands
    bad = []
    for module, path in MODULES.items():
        if layer_of(module) in ("commands", "experiments"):
            continue
        defs = {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}
        if "add_arguments" in defs:
            bad.append(str(path.relative_to(ROOT.parent)))
    assert not bad, "command-line commands outside spectrakit/commands/:\n" + "\n".join(bad)


# --- the checks themselves must be able to fail ----------------------------------------------------------


@pytest.fixture
def fake_tree(tmp_path, monkeypatch):
    """A small package with one import of each kind the rules forbid."""
    files = {
        "__init__.py": "",
        "_ground.py": "",
        "linalg/__init__.py": "from . import polar\n",
        "linalg/polar.py": "def f():\n    from ..experiments.io import table  # inside a function, relative\n",
        "linalg/_util.py": "",
        "optim/__init__.py": "",
        "optim/a.py": "from spectrakit.linalg._util import x\nfrom spectrakit.optim import b\n",
        "optim/b.py": "import spectrakit.optim.a\n",
        "conv/__init__.py": "",
        "conv/report.py": "from spectrakit.train.checkpoint import _resolve\n",
        "train/__init__.py": "",
        "train/checkpoint.py": "",
        "experiments/__init__.py": "",
        "experiments/io.py": "",
    }
    for name, text in files.items():
        (tmp_path / "spectrakit" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "spectrakit" / name).write_text(text)
    monkeypatch.setitem(globals(), "ROOT", tmp_path / "spectrakit")
    monkeypatch.setitem(globals(), "MODULES", module_files())


def test_the_checks_find_each_kind_of_violation(fake_tree):
    layers = layer_violations()
    assert any("linalg/polar.py:2: linalg imports experiments: spectrakit.experiments.io" in b for b in layers)
    assert any("conv/report.py:1: conv imports train" in b for b in layers)
    private = private_violations()
    assert any("private _util of spectrakit.linalg._util" in b for b in private)
    assert any("private _resolve of spectrakit.train.checkpoint" in b for b in private)
    assert module_cycles() == ["spectrakit.optim.a <-> spectrakit.optim.b"]
