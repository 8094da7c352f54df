"""GPU validation suite: every GPU check and benchmark of spectrakit in one command, one report.

Stages (each runnable alone, each writing its part of the report folder):

- ``tests``: the GPU-marked tests and the tests that take a device, on the device, in a pytest subprocess;
- ``linalg``: time and accuracy (against a float64 SVD/eigh on the same device) of the matrix functions on
  the matrix shapes of a ~124M LLaMA, bf16 and fp32, batched against one by one;
- ``optim``: optimizer-step time and peak extra memory on the ~124M LLaMA parameter set, eager and compiled;
- ``train``: full bf16 training step of the ~124M model, SpectraAdamW against AdamW;
- ``compare``: ``spectrakit compare`` at its GPU setting;
- ``conv``: TN bound, F4 bound and exact norms of the Table 2 kernels of Grishina, Gorbunov & Rakhuba (2024)
  and of ResNet-18's convolutions;
- ``scale``: SPECTRA at 124M/160M: optimizer and training steps beside torch, Muon and the paper's code, and
  the paper's large-LR result (``scale.json``).

A stage returns a :class:`StageResult`; :func:`run_suite` times it, records any exception (message and
traceback tail) and goes on with the next stage, then merges the stage into ``report.json`` and rewrites
``REPORT.md``. ``tiny=True`` runs the same code at toy sizes (seconds per stage on a CPU).
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import time
import traceback
from typing import TYPE_CHECKING, Any

from .report import environment_info, write_report

if TYPE_CHECKING:  # (imported where a stage runs: the command's options need no torch)
    import torch

# stage name -> module (in run order)
STAGES: dict[str, str] = {
    name: f"spectrakit.experiments.gpu_suite.stage_{name}"
    for name in ("tests", "linalg", "optim", "train", "compare", "conv", "scale")
}


@dataclasses.dataclass
class Context:
    """What every stage gets: the device, toy sizes or full, the report folder, the stage's time budget in
    seconds (stages with optional work skip it once the budget is spent), stage options (``compare_steps``)
    and the time the stage started."""

    device: torch.device
    tiny: bool
    out: str
    budget_s: float = 420.0
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    started: float = dataclasses.field(default_factory=time.perf_counter)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def over_budget(self) -> bool:
        return self.elapsed() > self.budget_s


@dataclasses.dataclass
class StageResult:
    """``tables``: title -> rows (list of dicts); ``notes``: lines shown above the tables; ``files``: paths
    (relative to the report folder) the stage wrote; ``ok=False`` marks a stage that ran to its end but
    whose checks failed (e.g. failing tests), with ``error`` saying why."""

    tables: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)
    files: list[str] = dataclasses.field(default_factory=list)
    ok: bool = True
    error: str = ""


def llama_config(tiny: bool, seq_len: int = 1024):
    """The model of the optim and train stages: the ``124m`` LLaMA preset with a 50304-token vocabulary, or
    (tiny) one block of width 16 over 64 tokens."""
    from spectrakit.models.llama import LlamaConfig, preset_config

    if tiny:
        return LlamaConfig(vocab_size=64, dim=16, n_layers=1, n_heads=2, max_seq_len=seq_len)
    return preset_config("124m", 50304, max_seq_len=seq_len)


def run_stage(name: str, ctx: Context) -> dict[str, Any]:
    """Run stage ``name`` and return its report entry (status, seconds, tables, notes, error)."""
    ctx.started = time.perf_counter()
    entry: dict[str, Any] = {"status": "ok", "error": "", "tables": {}, "notes": [], "files": []}
    try:
        module = importlib.import_module(STAGES[name])
        result: StageResult = module.run(ctx)
        entry.update(tables=result.tables, notes=result.notes, files=result.files)
        if not result.ok:
            entry.update(status="failed", error=result.error)
    except Exception as e:  # a failing stage is recorded, the next one still runs
        entry.update(status="failed", error=f"{type(e).__name__}: {e}".strip(),
                     traceback="".join(traceback.format_exc().splitlines(True)[-12:]))
    finally:
        if ctx.cuda:
            import torch

            torch.cuda.empty_cache()
    entry["seconds"] = round(ctx.elapsed(), 2)
    return entry


def run_suite(stages, *, device: str | torch.device, tiny: bool, out: str, budget_s: float = 420.0,
              options: dict[str, Any] | None = None, command: str = "", echo=print) -> dict[str, Any]:
    """Run ``stages`` (names of :data:`STAGES`, in the given order), writing ``out/report.json`` and
    ``out/REPORT.md`` after each; entries of stages not run now are kept from an earlier report. Returns
    the report."""
    import torch

    dev = torch.device(device)
    env = environment_info(dev)
    env["command"] = command
    env["size"] = "tiny" if tiny else "full"
    report: dict[str, Any] = {}
    for name in stages:
        echo(f"[gpu-suite] stage {name} ...")
        started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        entry = run_stage(name, Context(dev, tiny, out, budget_s, dict(options or {})))
        entry["started"] = started
        entry["env"] = env
        report = write_report(out, name, entry, env, order=list(STAGES))
        echo(f"[gpu-suite] stage {name}: {entry['status']} in {entry['seconds']:.1f} s"
             + (f" ({entry['error'].splitlines()[0]})" if entry["error"] else ""))
    return report
