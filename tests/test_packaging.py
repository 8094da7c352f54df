"""Packaging: the wheel builds from a copy of the sources, carries ``py.typed`` and the version of
``spectrakit.__version__``, installs into a fresh virtual environment and imports from there (not from the
source tree), with a working ``spectrakit`` console script and a SPECTRA step; importing the package leaves
torch's thread count alone (that fresh interpreter is the one that checks it).

The fresh environment sees the dependencies (torch, numpy, ...) of the interpreter running the tests, whatever
it is (the system's, or a user's own virtual environment): a ``.pth`` file lists that interpreter's
site-packages folders. ``venv --system-site-packages`` would instead show the *base* interpreter's packages,
which a user's virtual environment does not have."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

import spectrakit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHECK = """
import os, runpy, sys, torch
# importing spectrakit leaves torch's thread count alone (the command line sets it, a library never does)
torch.set_num_threads(3)
import spectrakit, spectrakit.optim, spectrakit.linalg, spectrakit.train
assert torch.get_num_threads() == 3, torch.get_num_threads()
torch.set_num_threads(1)
from spectrakit.optim import SpectraAdamW, param_groups
assert spectrakit.__file__.startswith(sys.prefix), spectrakit.__file__
m = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10))
opt = SpectraAdamW(param_groups(m), lr=1e-2)
m(torch.tensor([1, 2])).sum().backward()
opt.step()
print(spectrakit.__version__)
# the installed console script, run by this interpreter (torch and spectrakit are already imported: one
# interpreter start instead of two); its start must name the environment's interpreter (the first line, or
# the next one in pip's /bin/sh form for long paths)
script = os.path.join(sys.prefix, "bin", "spectrakit")
with open(script) as f:
    head = f.readline() + f.readline()
assert head.startswith("#!") and os.path.join(sys.prefix, "bin", "python") in head, head
sys.argv = [script, "--help"]
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit as e:
    assert not e.code, e.code
"""

BUILD = """
import importlib, sys
print(importlib.import_module(sys.argv[1]).build_wheel(sys.argv[2]))
"""


def _site_dirs():
    """The running interpreter's package folders (its own venv's, the user site, the system's), not the source
    tree: ``spectrakit`` must come from the installed wheel."""
    dirs = [p for p in sys.path if os.path.basename(p.rstrip("/")) in ("site-packages", "dist-packages")]
    return [p for p in dict.fromkeys(dirs) if os.path.isdir(p)]


def _see_running_site_packages(py):
    purelib = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], check=True,
                             capture_output=True, text=True).stdout.strip()
    os.makedirs(purelib, exist_ok=True)
    # plain path lines: appended after the venv's own site-packages, and the .pth files in them (an editable
    # install of the source tree) are not run
    with open(os.path.join(purelib, "_running_interpreter.pth"), "w") as f:
        f.write("\n".join(_site_dirs()) + "\n")


@pytest.mark.soak  # (30-60 s on 2 cores; .ci/run's newcomer path runs it in a fresh virtual environment)
def test_wheel_builds_installs_and_imports(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(os.path.join(ROOT, name), src / name)
    shutil.copytree(os.path.join(ROOT, "spectrakit"), src / "spectrakit",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp_path / "dist"
    # the build backend that pyproject.toml names, called as pip calls it without build isolation (PEP 517
    # build_wheel in a fresh interpreter, in the source folder), without pip's own start-up and resolver
    backend = re.search(r'^build-backend = "(.+)"', (src / "pyproject.toml").read_text(), re.M).group(1)
    subprocess.run([sys.executable, "-c", BUILD, backend, str(dist)], check=True, cwd=src, capture_output=True)
    (wheel,) = dist.glob("spectrakit-*.whl")
    assert wheel.name.startswith(f"spectrakit-{spectrakit.__version__}-")
    names = zipfile.ZipFile(wheel).namelist()
    assert "spectrakit/py.typed" in names and "spectrakit/optim/groups.py" in names
    assert not any(n.startswith(("tests/", "examples/")) for n in names)
    assert any(n.endswith(".dist-info/LICENSE") or "/licenses/LICENSE" in n for n in names), names
    meta = next(zipfile.ZipFile(wheel).read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
    assert "Requires-Dist: torch>=2.5" in meta and "Classifier: License :: OSI Approved" in meta

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    _see_running_site_packages(py)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1"}
    # the running interpreter's pip (the environment has none: --without-pip; the .pth above shows it), run by
    # the new environment's interpreter, installs into it: what ``pip --python`` does after a first start of
    # its own (--no-compile: the check below imports the installed modules once; no index or resolver is
    # consulted)
    quiet = ["-q", "--disable-pip-version-check", "--no-input", "--no-compile", "--no-deps", "--no-index"]
    subprocess.run([py, "-m", "pip", "install", *quiet, str(wheel)], check=True, env=env, cwd=tmp_path)
    out = subprocess.run([py, "-c", CHECK], check=True, env=env, cwd=tmp_path, capture_output=True, text=True)
    version, help_text = out.stdout.split("\n", 1)
    assert version == spectrakit.__version__
    assert "usage" in help_text.lower() and "compare" in help_text
