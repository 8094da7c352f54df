"""Packaging: the wheel builds from a copy of the sources, carries ``py.typed`` and the version of
``spectrakit.__version__``, installs into a fresh virtual environment and imports from there (not from the
source tree), with a working ``spectrakit`` console script and a SPECTRA step."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

import spectrakit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHECK = """
import sys, torch, spectrakit
from spectrakit.optim import SpectraAdamW, param_groups
assert spectrakit.__file__.startswith(sys.prefix), spectrakit.__file__
m = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10))
opt = SpectraAdamW(param_groups(m), lr=1e-2)
m(torch.tensor([1, 2])).sum().backward()
opt.step()
print(spectrakit.__version__)
"""


@pytest.mark.slow
def test_wheel_builds_installs_and_imports(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), src / name)
    shutil.copytree(os.path.join(ROOT, "spectrakit"), src / "spectrakit",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(dist)], check=True, cwd=tmp_path)
    (wheel,) = dist.glob("spectrakit-*.whl")
    assert wheel.name.startswith(f"spectrakit-{spectrakit.__version__}-")
    names = zipfile.ZipFile(wheel).namelist()
    assert "spectrakit/py.typed" in names and "spectrakit/optim/groups.py" in names
    assert not any(n.startswith(("tests/", "examples/")) for n in names)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1"}
    subprocess.run([py, "-m", "pip", "install", "--no-deps", "-q", str(wheel)], check=True, env=env, cwd=tmp_path)
    out = subprocess.run([py, "-c", CHECK], check=True, env=env, cwd=tmp_path, capture_output=True, text=True)
    assert out.stdout.strip() == spectrakit.__version__
    help_out = subprocess.run([str(venv / "bin" / "spectrakit"), "--help"], env=env, cwd=tmp_path,
                              capture_output=True, text=True)
    assert help_out.returncode == 0 and "usage" in help_out.stdout.lower()
