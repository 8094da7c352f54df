"""Result tables shared by the commands, experiments and benchmarks: markdown rendering, the environment
header (device, torch version, date) and saving (JSON + markdown).

A ground module (imports only other ground modules; torch when the header is made), so that every layer's
commands can format tables the same way; :mod:`spectrakit.experiments.io` re-exports it.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from spectrakit._files import write_atomic


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
            return f"{v:.3e}"
        return f"{v:.4g}"
    return str(v)


def invocation(subcommand: str, fallback: str) -> str:
    """The command line that is running, as ``spectrakit <args>``, when it is the ``spectrakit`` command with
    ``subcommand`` (e.g. ``"experiment"``); else ``fallback`` (a programmatic call)."""
    if sys.argv[1:2] == [subcommand]:
        return "spectrakit " + shlex.join(sys.argv[1:])
    return fallback


def table_row(row: dict[str, Any], first: bool = False) -> str:
    """One markdown table row of ``row`` (preceded by the header lines when ``first``), for progress output
    of experiments that report row by row."""
    cols = list(row)
    line = "| " + " | ".join(_fmt(row[c]) for c in cols) + " |"
    if first:
        return "| " + " | ".join(cols) + " |\n|" + "|".join("---" for _ in cols) + "|\n" + line
    return line


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Render a list of dicts as a GitHub markdown table (columns default to the union of keys, in order)."""
    if not rows:
        return "(no rows)"
    if columns is None:
        columns = list(dict.fromkeys(k for r in rows for k in r))
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c, "")) for c in columns) + " |")
    return "\n".join(lines)


def environment() -> dict[str, str]:
    """Device, versions and date, for the header of every result table."""
    import torch  # (here: formatting a table needs no heavy library)

    if torch.cuda.is_available():
        device = torch.cuda.get_device_name()
    else:
        n = torch.get_num_threads()
        from spectrakit import _threads

        why = f": {_threads.CHOICE}" if _threads.CHOICE else ""
        device = f"CPU ({platform.processor() or platform.machine()}, {n} thread{'s' if n != 1 else ''}{why})"
    return {
        "device": device,
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def report(name: str, rows: list[dict[str, Any]], out_dir: str | None, *, command: str = "",
           extra: dict[str, Any] | None = None, columns: Sequence[str] | None = None, echo: bool = True) -> str:
    """Print (unless ``echo=False``) a result table with its environment header and save
    ``results.json``/``results.md``."""
    env = environment()
    header = f"## {name}\n\ndevice: {env['device']} · torch {env['torch']} · {env['date']}"
    if command:
        header += f"\n\ncommand: `{command}`"
    text = header + "\n\n" + markdown_table(rows, columns) + "\n"
    if echo:
        print(text)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        write_atomic(os.path.join(out_dir, "results.json"),
                     json.dumps({"name": name, "env": env, "command": command, "rows": rows,
                                 "columns": list(columns) if columns else None, **(extra or {})},
                                indent=1, default=str))
        write_atomic(os.path.join(out_dir, "results.md"), text)
    return text
