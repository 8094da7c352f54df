"""Exit 0 when this checkout is already installed as install.sh installs it, so that install.sh can skip pip.

Run by ``scripts/install.sh`` as ``python -I scripts/installed.py`` (isolated: the checkout's own
``spectrakit.egg-info`` is not on the path). True when: the installed ``spectrakit`` distribution is an editable
install of this folder, of the version in ``spectrakit/__init__.py``, with the console scripts of
``pyproject.toml``; and every requirement of ``pyproject.toml`` (dependencies, extras ``test`` and ``examples``)
is installed at a version its specifier allows. Anything else (or any error) exits 1 and install.sh runs pip.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import sys
from urllib.parse import unquote, urlparse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def requirements_met(project: dict, extras=("test", "examples")) -> bool:
    """Every requirement of ``project`` (pyproject's ``[project]`` table: dependencies and ``extras``) whose
    marker applies here is installed at a version its specifier allows."""
    from pip._vendor.packaging.requirements import Requirement  # (pip's own copy: any machine with pip has it)

    wanted = list(project.get("dependencies", [])) + [
        r for x in extras for r in project.get("optional-dependencies", {}).get(x, [])]
    for text in wanted:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            have = md.version(req.name)
        except md.PackageNotFoundError:
            return False
        if not req.specifier.contains(have, prereleases=True):
            return False
    return True


def installed_here(project: dict, root: str) -> bool:
    """The installed distribution of ``project`` is an editable install of ``root``, of the version in
    ``root/spectrakit/__init__.py``, with ``project``'s console scripts."""
    with open(os.path.join(root, "spectrakit", "__init__.py")) as f:
        version = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)
    for dist in md.distributions(name=project["name"]):  # (a build's egg-info on the path has no direct_url)
        url = json.loads(dist.read_text("direct_url.json") or "{}")
        if not url.get("dir_info", {}).get("editable") or dist.version != version:
            continue
        if os.path.realpath(unquote(urlparse(url["url"]).path)) != os.path.realpath(root):
            continue
        scripts = {e.name: e.value for e in dist.entry_points if e.group == "console_scripts"}
        if scripts == project.get("scripts", {}):
            return True
    return False


def main() -> int:
    import tomllib  # (Python >= 3.11; older ones exit 1 below and install.sh runs pip)

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    return 0 if installed_here(project, ROOT) and requirements_met(project) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # (a Python without tomllib, a pip without packaging, a broken install: let pip decide)
        sys.exit(1)
