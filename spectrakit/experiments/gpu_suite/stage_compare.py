"""compare stage: ``spectrakit compare`` (AdamW against SpectraAdamW on the same data and initialisation) at
its ``cuda`` setting, in a subprocess writing to ``compare/`` in the report folder (table, JSON, loss-curve and
weight-norm plots, per-run logs; its output in ``compare/compare.log``).

Steps: the setting's (or ``compare_steps``); tiny: the ``cpu`` setting cut to 3 steps of 2 x 32 byte tokens.
The run gets the stage's time budget: past it, it is interrupted (SIGINT: the runs save a checkpoint and
the finished runs stay in the table) and the stage is marked failed with the command that resumes it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from spectrakit._files import read_regular

from . import StageResult

TINY = ["--setting", "cpu", "--preset", "tiny", "--tokenizer", "bytes", "--steps", "3", "--batch-size", "2",
        "--seq-len", "32", "--eval-every", "3", "--eval-tokens", "512", "--threads", "1"]


def command(ctx, folder: str) -> list[str]:
    args = [sys.executable, "-m", "spectrakit", "compare", "--device", str(ctx.device), "--out", folder,
            "--force"]
    if ctx.tiny:
        return args + TINY
    args += ["--setting", "cuda" if ctx.cuda else "cpu"]
    steps = ctx.options.get("compare_steps")
    return args + (["--steps", str(steps)] if steps else [])


def _package_root() -> str:
    import spectrakit

    return os.path.dirname(os.path.dirname(os.path.abspath(spectrakit.__file__)))


def popen_interruptible(cmd: list[str], **kwargs) -> subprocess.Popen:
    """``subprocess.Popen(cmd, **kwargs)`` whose process takes SIGINT from its start. A process started with
    SIGINT ignored (a shell's background job, ``nohup``) passes that on to its children, and the command's
    handlers are installed only once its interpreter has started: a stop sent before that was dropped and the
    run went on until it was killed, without the checkpoint a stop writes (seen on a loaded 2-core machine).
    An ignored SIGINT is replaced by Python's default handler while the child starts (a caught signal is reset
    to its default at ``exec``) and restored after; in a thread other than the main one, where handlers cannot
    be changed, a plain ``Popen``."""
    try:
        ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        if ignored:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:  # not the main thread
        ignored = False
    try:
        return subprocess.Popen(cmd, **kwargs)
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def run(ctx) -> StageResult:
    folder = os.path.join(ctx.out, "compare")
    os.makedirs(folder, exist_ok=True)
    cmd = command(ctx, folder)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_root(), env.get("PYTHONPATH")) if p)
    log_path = os.path.join(ctx.out, "compare.log")  # (beside the folder: compare's --out is its own)
    res = StageResult(notes=["command: `" + " ".join(["spectrakit", *cmd[3:]]) + "`"])
    with open(log_path, "w") as log:
        proc = popen_interruptible(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            rc = proc.wait(timeout=max(1.0, ctx.budget_s - ctx.elapsed()))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            rc = None
    res.files = [os.path.relpath(os.path.join(folder, f), ctx.out)
                 for f in ("results.md", "results.json", "loss_curves.png", "weight_norms.png")
                 if os.path.exists(os.path.join(folder, f))] + ["compare.log"]
    try:
        data = json.loads(read_regular(os.path.join(folder, "results.json"), what="results"))
        rows, columns = data.get("rows", []), data.get("columns")
        if columns:  # the column order of compare's own table
            rows = [{c: r.get(c) for c in columns if c in r} for r in rows]
        res.tables[data.get("name", "compare")] = rows
    except (OSError, ValueError, AttributeError, RecursionError):  # (no table: the stage's error says why)
        pass
    if rc is None:
        res.ok = False
        res.error = (f"stopped at the stage's time budget ({ctx.budget_s:.0f} s); finished runs are in the table; "
                     f"continue with: spectrakit compare --out {folder} --resume (same options)")
    elif rc != 0:
        with open(log_path) as f:
            tail = f.read().strip().splitlines()[-5:]
        res.ok, res.error = False, f"spectrakit compare exited with status {rc}: " + " | ".join(tail)
    return res
