"""scripts/installed.py: the check that lets a second run of scripts/install.sh skip pip. It must say "installed"
only for an editable install of the checkout it is asked about, with every requirement of pyproject.toml met."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

tomllib = pytest.importorskip("tomllib")  # (Python >= 3.11, as the script: older ones always run pip)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def check(load_module):
    return load_module("spectrakit_installed_check", os.path.join(ROOT, "scripts", "installed.py"))


def test_requirements_are_checked_by_version_and_marker(check):
    import numpy
    import torch

    torch_v, numpy_v = torch.__version__.split("+")[0], numpy.__version__
    ok = {"dependencies": [f"torch>={torch_v}", f"numpy=={numpy_v}"], "optional-dependencies": {"test": ["pytest"]}}
    assert check.requirements_met(ok)
    assert not check.requirements_met({"dependencies": [f"torch>{torch_v}"]})  # too old
    assert not check.requirements_met({"dependencies": ["numpy<1.0"]})
    assert not check.requirements_met({"dependencies": ["spectrakit-no-such-package-xyz>=0"]})
    assert not check.requirements_met({"optional-dependencies": {"examples": ["spectrakit-no-such-package-xyz"]}})
    # a requirement whose marker does not apply here is not needed; an extra not asked for is not checked
    assert check.requirements_met({"dependencies": ['spectrakit-no-such-package-xyz; python_version < "3"']})
    assert check.requirements_met({"optional-dependencies": {"docs": ["spectrakit-no-such-package-xyz"]}})


def test_another_folder_is_not_installed_here(check, tmp_path):
    """A checkout elsewhere (or a version, or console scripts, other than the installed ones) needs pip."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    (tmp_path / "spectrakit").mkdir()
    (tmp_path / "spectrakit" / "__init__.py").write_text('__version__ = "0.1.0"\n')
    assert not check.installed_here(project, str(tmp_path))
    assert not check.installed_here({**project, "name": "spectrakit-no-such-package-xyz"}, ROOT)
    assert not check.installed_here({**project, "scripts": {"other": "spectrakit.cli:main"}}, ROOT)


def test_this_checkout(check):
    """Here: installed (exit 0) exactly when pip shows an editable install of this folder whose requirements are
    met; the script runs in an isolated interpreter (``-I``), as install.sh runs it."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    expected = check.installed_here(project, ROOT) and check.requirements_met(project)
    rc = subprocess.run([sys.executable, "-I", os.path.join(ROOT, "scripts", "installed.py")]).returncode
    assert rc == (0 if expected else 1)
