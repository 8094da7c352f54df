"""The suite's report folder: ``report.json`` (every stage's entry, merged across runs) and ``REPORT.md``
(rendered from it), plus the environment header (device, driver, CUDA, cuDNN, torch, date, command)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import subprocess
from typing import TYPE_CHECKING, Any

from spectrakit._files import read_regular, write_atomic
from spectrakit.experiments.io import environment, markdown_table

if TYPE_CHECKING:
    import torch


def _driver_version() -> str:
    """NVIDIA driver version from ``nvidia-smi``, or why it is unknown."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "n/a (no nvidia-smi)"
    try:
        out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"n/a ({type(e).__name__})"
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else "n/a (nvidia-smi failed)"


def environment_info(device: torch.device) -> dict[str, str]:
    """Device name (and memory on CUDA), driver/CUDA/cuDNN/torch/Python versions, host and UTC date."""
    import torch

    base = environment()
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        name = f"{props.name} ({props.total_memory / 2**30:.0f} GiB)"
    else:
        name = base["device"] if device.type == "cpu" else str(device)
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "device": name,
        "driver": _driver_version() if torch.cuda.is_available() else "n/a (no CUDA device)",
        "cuda": torch.version.cuda or "n/a (CPU build of torch)",
        "cudnn": str(cudnn) if cudnn else "n/a",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "host": f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
    }


def _load(path: str) -> dict[str, Any]:
    """An earlier report (a regular file of at most 64 MiB), else ``{}``."""
    try:
        data = json.loads(read_regular(path, what="report"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError, RecursionError):
        return {}


def _env_lines(env: dict[str, str]) -> list[str]:
    keys = ["device", "driver", "cuda", "cudnn", "torch", "python", "host", "date", "size"]
    lines = [f"- {k}: {env[k]}" for k in keys if k in env]
    if env.get("command"):
        lines.append(f"- command: `{env['command']}`")
    return lines


def render(report: dict[str, Any], order: list[str]) -> str:
    """``REPORT.md`` text: the environment of the latest run, a status table, then each stage (its own
    environment when it ran in another command, its error, notes and tables)."""
    env = report.get("env", {})
    stages = report.get("stages", {})
    names = [n for n in order if n in stages] + [n for n in stages if n not in order]
    parts = ["# spectrakit GPU validation report", "\n".join(_env_lines(env))]
    parts.append(markdown_table([{"stage": n, "status": stages[n]["status"], "seconds": stages[n].get("seconds"),
                                  "started": stages[n].get("started", "")} for n in names]))
    for n in names:
        e = stages[n]
        block = [f"## {n}: {e['status']} ({e.get('seconds', 0):.1f} s)"]
        if e.get("env") and e["env"] != env:
            block.append("\n".join(_env_lines(e["env"])))
        if e.get("error"):
            block.append("error: " + e["error"])
        if e.get("traceback"):
            block.append("```\n" + e["traceback"].rstrip() + "\n```")
        block += list(e.get("notes", []))
        for title, rows in e.get("tables", {}).items():
            block.append(f"### {title}\n\n" + markdown_table(rows))
        if e.get("files"):
            block.append("files: " + ", ".join(f"`{f}`" for f in e["files"]))
        parts.append("\n\n".join(block))
    return "\n\n".join(parts) + "\n"


def write_report(out: str, name: str, entry: dict[str, Any], env: dict[str, str], *,
                 order: list[str]) -> dict[str, Any]:
    """Merge stage ``name``'s ``entry`` into ``out/report.json`` (other stages' entries are kept), set the
    report's environment to ``env`` and rewrite ``out/REPORT.md``. Returns the merged report."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "report.json")
    report = _load(path)
    report["env"] = env
    report.setdefault("stages", {})[name] = entry
    write_atomic(path, json.dumps(report, indent=1, default=str))
    write_atomic(os.path.join(out, "REPORT.md"), render(report, order))
    return report
