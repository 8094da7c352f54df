"""Time the README's two commands on this machine and rewrite the README's "What they take" table.

Runs ``bash scripts/install.sh``, then ``spectrakit compare`` (into a temporary folder), then
``python3 -m pytest -q``, each as a user would, and writes one row per command (machine, threads, load average
at the start, date, wall time) between the ``<!-- timings -->`` markers of README.md. Usage:
``python3 scripts/readme_timings.py`` (about 5 minutes on a 2-core machine).
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def machine() -> str:
    name = platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{name}, {os.cpu_count()} cores"


def timed(cmd: list[str]) -> tuple[float, float]:
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0, load


def main() -> int:
    out = tempfile.mkdtemp(prefix="spectrakit-compare-")
    rows = []
    for label, cmd in (("install (already installed)", ["bash", "scripts/install.sh"]),
                       ("`spectrakit compare`", ["spectrakit", "compare", "--out", os.path.join(out, "run"),
                                                 "--quiet"]),
                       ("tests: `python3 -m pytest -q`", [sys.executable, "-m", "pytest", "-q"])):
        wall, load = timed(cmd)
        rows.append(f"| {label} | {wall / 60:.0f} min {wall % 60:02.0f} s | load {load:.1f} at the start |")
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    block = (f"Measured {date} on {machine()} (no GPU), `python3 scripts/readme_timings.py`:\n\n"
             "| command | wall time | machine load |\n|---|---|---|\n" + "\n".join(rows) + "\n")
    path = os.path.join(ROOT, "README.md")
    text = open(path, encoding="utf-8").read()
    new = re.sub(r"(<!-- timings -->\n).*?(<!-- /timings -->)", lambda m: m.group(1) + block + m.group(2), text,
                 flags=re.S)
    if new == text and "<!-- timings -->" not in text:
        print("README.md has no <!-- timings --> markers", file=sys.stderr)
        return 1
    with open(path, "w", encoding="utf-8") as f:
        f.write(new)
    print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
