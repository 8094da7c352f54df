"""The package builds as a wheel that installs into a clean virtual environment, ships its type marker and
reports its version."""

import os
import subprocess
import sys
import zipfile

import pytest

import spectrakit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_wheel_installs_in_a_fresh_venv(tmp_path):
    wheels = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(wheels), ROOT], check=True, capture_output=True)
    (whl,) = wheels.glob("spectrakit-*.whl")
    assert f"spectrakit-{spectrakit.__version__}-" in whl.name
    names = zipfile.ZipFile(whl).namelist()
    assert "spectrakit/py.typed" in names and "spectrakit/cli.py" in names
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", str(whl)], check=True, capture_output=True)
    out = subprocess.run([py, "-c", "import spectrakit; print(spectrakit.__version__, spectrakit.__file__)"],
                         check=True, capture_output=True, text=True, cwd=tmp_path,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}).stdout.split()
    assert out[0] == spectrakit.__version__ and out[1].startswith(str(venv))
