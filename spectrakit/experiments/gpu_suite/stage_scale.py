"""scale stage: SPECTRA at the scale people train (the 124M and 160M LLaMA presets of Jiang, Semenov and Stich
2026, Table F.1), in one process.

Part A, speed: the optimizer step of torch's fused AdamW, spectrakit's AdamW, SpectraAdamW, SpectraAdamW
under ``torch.compile(mode="reduce-overhead")`` (CUDA graphs; CUDA only), ``torch.optim.Muon`` (2-D
parameters), the paper's algorithm as our preset (SpectraAdamW with the paper's bf16 Newton-Schulz soft clip,
``post="soft_clip_ns"``) and, given a local checkout of the authors' code (``reference``), their
SPECTRA-AdamW itself, imported from that folder, never copied. Medians of interleaved rounds, synchronised
on CUDA; the peak memory of a step beyond the memory held before it; the operators a step runs (CUDA: kernel
launches; CPU: top-level ``aten`` calls, from the profiler). Then the training step (forward, backward, step;
bf16 autocast on CUDA) of AdamW, SpectraAdamW and Muon at the paper's per-GPU batch (64 x 512 at 160M).
Part B, the paper's large-LR result (Fig. 2): Signum and Spectra-Signum at 32 x 512 tokens a step on the
offline corpus, validation loss about every 10% of the run.

``scale.json`` (keys ``opt_step_ms``, ``train_step_ms``, ``overhead_pct``, ``peak_extra_mib``,
``launches_per_step``, ``repro``), ``scale.md`` and ``scale_loss.png`` go into the report folder. ``tiny``:
the same code on a one-block model and a few steps (seconds on a CPU).
"""

from __future__ import annotations

import gc
import json
import os
import random
import statistics
import sys
import time
import types

import torch

from spectrakit._files import save_figure, write_atomic
from spectrakit.experiments.io import markdown_table
from spectrakit.linalg.timing import quiet_profiler
from spectrakit.models.llama import Llama, LlamaConfig, preset_config
from spectrakit.train.optimizers import build_optimizer

from . import StageResult
from ._measure import error_text, peak_extra_bytes

MODELS = ("124m", "160m")
VOCAB = 50304


def model_config(name: str, tiny: bool, seq_len: int = 1024) -> LlamaConfig:
    """The preset ``name`` at the paper's vocabulary, or (tiny) one block of width 32."""
    if tiny:
        return LlamaConfig(vocab_size=96, dim=32, n_layers=1, n_heads=2, max_seq_len=seq_len,
                           tie_embeddings=preset_config(name, VOCAB).tie_embeddings)
    return preset_config(name, VOCAB, max_seq_len=seq_len)


def load_reference(path: str):
    """The authors' ``SPECTRA`` class from a checkout of their repository at ``path``
    (``src/optim/spectra.py`` and ``post_process.py``), imported as a package of its own without running
    ``src/optim/__init__.py``. Raises ``FileNotFoundError`` if the files are missing."""
    folder = os.path.join(path, "src", "optim")
    for name in ("spectra.py", "post_process.py"):
        if not os.path.isfile(os.path.join(folder, name)):
            raise FileNotFoundError(f"reference {path}: no src/optim/{name} (a checkout of the authors' code)")
    package = types.ModuleType("spectrakit_reference_optim")
    package.__path__ = [folder]
    sys.modules[package.__name__] = package
    import importlib

    return importlib.import_module(f"{package.__name__}.spectra").SPECTRA


def optimizers(ctx) -> dict:
    """Label -> function(model) building the optimizer, or a string saying why it is not measured."""
    lr = 3e-3
    out: dict = {
        "torch AdamW (fused)": lambda m: torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=0.1, fused=True),
        "AdamW": lambda m: build_optimizer("adamw", m, lr=lr),
        "SpectraAdamW": lambda m: build_optimizer("spectra-adamw", m, lr=lr),
        "SpectraAdamW (paper's NS10 bf16)": lambda m: build_optimizer("spectra-adamw", m, lr=lr,
                                                                      post="soft_clip_ns", post_dtype="bfloat16"),
    }
    if ctx.cuda:
        def graphed(m):
            opt = build_optimizer("spectra-adamw", m, lr=torch.tensor(lr, device=ctx.device))
            return opt, torch.compile(opt.step, mode="reduce-overhead")
        out["SpectraAdamW (CUDA graph)"] = graphed
    else:
        out["SpectraAdamW (CUDA graph)"] = "CUDA only"
    if hasattr(torch.optim, "Muon"):
        out["torch.optim.Muon"] = lambda m: torch.optim.Muon([p for p in m.parameters() if p.ndim == 2], lr=0.02)
    reference = ctx.options.get("reference")
    if reference:
        spectra_cls = load_reference(reference)
        out["paper SPECTRA-AdamW"] = lambda m: spectra_cls(
            torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=0.1), post_process="clip", clip_c=10.0,
            ns_steps=10, base_lr=lr)
    else:
        out["paper SPECTRA-AdamW"] = "no --reference checkout: the NS10 bf16 preset stands in"
    return out


def _sync(ctx) -> None:
    if ctx.cuda:
        torch.cuda.synchronize(ctx.device)


def launches(step, ctx) -> int:
    """Kernels one call of ``step`` launches on CUDA, or, on a CPU, the top-level ``aten`` operators it runs
    with spectrakit's optimizers on the GPU's code path (multi-tensor ``_foreach`` kernels instead of the
    CPU's per-tensor loop), each of which is one launch or more on a GPU."""
    from torch.profiler import ProfilerActivity, profile

    from spectrakit.optim import Spectra

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.cuda else [])
    saved = Spectra.__dict__.get("_per_tensor")  # (None: inherited from its mixin)
    if not ctx.cuda:
        Spectra._per_tensor = staticmethod(lambda device: False)
    try:
        with quiet_profiler(), profile(activities=acts) as prof:
            step()
            _sync(ctx)
    finally:
        if saved is not None:
            Spectra._per_tensor = saved
        elif "_per_tensor" in Spectra.__dict__:
            del Spectra._per_tensor
    events = prof.events()
    if ctx.cuda:
        return sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA)

    def nested(e) -> bool:
        p = e.cpu_parent
        while p is not None:
            if p.name.startswith("aten::"):
                return True
            p = p.cpu_parent
        return False

    return sum(1 for e in events if e.name.startswith("aten::") and not nested(e))


def step_times(ctx, model_name: str, rounds: int) -> list[dict]:
    """Part A's optimizer rows for one model: interleaved rounds (a random order each), medians."""
    cfg = model_config(model_name, ctx.tiny)
    torch.manual_seed(0)
    with torch.device(ctx.device):
        model = Llama(cfg)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-2
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    rows, steps = [], {}
    for label, make in optimizers(ctx).items():
        row = {"model": model_name, "optimizer": label}
        rows.append(row)
        if isinstance(make, str):
            row["note"] = make
            continue
        try:
            built = make(model)
            opt, step = built if isinstance(built, tuple) else (built, built.step)
            for _ in range(2 if ctx.tiny else 3):  # state, warm-up (and the CUDA graph's capture)
                step()
            _sync(ctx)
            extra = peak_extra_bytes(step, ctx.device)
            row.update(peak_extra_mib=extra / 2**20, extra_over_largest=extra / largest,
                       launches_per_step=launches(step, ctx))
            steps[label] = (step, [])
        except Exception as e:
            row["error"] = error_text(e)
    gen = random.Random(0)
    for _ in range(rounds):
        order = list(steps)
        gen.shuffle(order)
        for label in order:
            step, times = steps[label]
            _sync(ctx)
            t0 = time.perf_counter()
            step()
            _sync(ctx)
            times.append(1e3 * (time.perf_counter() - t0))
    for row in rows:
        if row["optimizer"] in steps:
            row["opt_step_ms"] = statistics.median(steps[row["optimizer"]][1])
    steps.clear()
    del model
    gc.collect()
    return rows


def train_times(ctx, reps: int) -> list[dict]:
    """The training step at the paper's per-GPU batch (160M: 64 x 512; tiny: 2 x 16), per optimizer."""
    batch, seq_len = (2, 16) if ctx.tiny else (64, 512)
    cfg = model_config("160m", ctx.tiny, seq_len)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq_len + 1), generator=gen).to(ctx.device)
    rows = []
    for name in ("adamw", "spectra-adamw", "muon"):
        row = {"model": "160m", "optimizer": name, "tokens_per_step": batch * seq_len}
        rows.append(row)
        try:
            row["train_step_ms"] = _train_ms(name, cfg, tokens, ctx, reps)
        except Exception as e:
            row["error"] = error_text(e)
        gc.collect()
    return rows


def _train_ms(name: str, cfg: LlamaConfig, tokens: torch.Tensor, ctx, reps: int) -> float:
    from spectrakit.train.loop import autocast_context

    torch.manual_seed(0)
    with torch.device(ctx.device):
        model = Llama(cfg)
    opt = build_optimizer(name, model)

    def step():
        with autocast_context(ctx.device):
            _, loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(1 if ctx.tiny else 3):
        step()
    times = []
    for _ in range(reps):
        _sync(ctx)
        t0 = time.perf_counter()
        step()
        _sync(ctx)
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def large_lr(ctx) -> dict:
    """Part B: Signum and Spectra-Signum at the large LR(s), validation loss about every 10% of the run."""
    from spectrakit.experiments.compare import compare

    lrs = tuple(ctx.options.get("scale_lrs") or ((3e-3,) if ctx.tiny else (3e-3, 1e-2)))
    steps = int(ctx.options.get("scale_steps") or (6 if ctx.tiny else 600))
    opts = dict(preset="nano" if ctx.tiny else "124m", tokenizer="bytes" if ctx.tiny else None, steps=steps,
                batch_size=2 if ctx.tiny else 32, seq_len=16 if ctx.tiny else 512, eval_every=max(1, steps // 10),
                eval_tokens=256 if ctx.tiny else 65536, diag_every=steps, device=str(ctx.device), out=None,
                progress=False, resource_check=False, warmup=max(1, steps // 20))
    runs, curves = [], {}
    for lr in lrs:
        for name in ("signum", "spectra-signum"):
            if ctx.over_budget():
                runs.append({"optimizer": name, "lr": lr, "error": "skipped: stage time budget spent"})
                continue
            try:
                (row,) = compare(optimizers=(name,), lr=lr, **opts)
            except Exception as e:
                runs.append({"optimizer": name, "lr": lr, "error": error_text(e)})
                continue
            evals = [(e["step"], e["val_loss"]) for e in row.get("_evals", [])]
            finite = [v for _, v in evals if v == v]
            runs.append({"optimizer": name, "lr": lr, "final_val_loss": row["val_loss"],
                         "min_val_loss": min(finite) if finite else float("nan"), "diverged": bool(row["diverged"])})
            curves[f"{name} lr {lr:g}"] = evals
    return {"steps": steps, "tokens": steps * opts["batch_size"] * opts["seq_len"], "runs": runs, "curves": curves}


def _plot(curves: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for label, pts in curves.items():
        if pts:
            ax.plot(*zip(*pts), "o-", label=label, alpha=0.85)
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (nats)")
    ax.set_title("Signum vs Spectra-Signum at a large LR")
    ax.legend(fontsize="small")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


def run(ctx) -> StageResult:
    rounds = 2 if ctx.tiny else 15
    opt_rows = []
    for name in MODELS:
        opt_rows += step_times(ctx, name, rounds)
    train_rows = [] if ctx.over_budget() else train_times(ctx, 1 if ctx.tiny else 8)
    repro = large_lr(ctx)
    by = {(r["model"], r["optimizer"]): r for r in opt_rows}
    data = {
        "opt_step_ms": {m: {r["optimizer"]: r["opt_step_ms"] for r in opt_rows
                            if r["model"] == m and "opt_step_ms" in r} for m in MODELS},
        "peak_extra_mib": {m: {r["optimizer"]: r["peak_extra_mib"] for r in opt_rows
                               if r["model"] == m and "peak_extra_mib" in r} for m in MODELS},
        "launches_per_step": {m: {r["optimizer"]: r["launches_per_step"] for r in opt_rows
                                  if r["model"] == m and "launches_per_step" in r} for m in MODELS},
        "train_step_ms": {r["optimizer"]: r["train_step_ms"] for r in train_rows if "train_step_ms" in r},
        "overhead_pct": {},
        "repro": {k: v for k, v in repro.items() if k != "curves"},
        "device": str(ctx.device), "tiny": ctx.tiny,
    }
    for m in MODELS:
        ours, base = by.get((m, "SpectraAdamW"), {}), by.get((m, "AdamW"), {})
        if ours.get("opt_step_ms") and base.get("opt_step_ms"):
            data["overhead_pct"][f"opt_step_{m}"] = 100 * (ours["opt_step_ms"] / base["opt_step_ms"] - 1)
    t = data["train_step_ms"]
    if t.get("spectra-adamw") and t.get("adamw"):
        data["overhead_pct"]["train_step_160m"] = 100 * (t["spectra-adamw"] / t["adamw"] - 1)
    write_atomic(os.path.join(ctx.out, "scale.json"), json.dumps(data, indent=1, default=str))
    _plot(repro["curves"], os.path.join(ctx.out, "scale_loss.png"))
    tables = {"optimizer step": opt_rows, "training step (160m, paper's per-GPU batch)": train_rows,
              "large LR (Signum vs Spectra-Signum)": repro["runs"]}
    text = "## scale\n\n" + "".join(f"### {k}\n\n{markdown_table(v)}\n\n" for k, v in tables.items() if v)
    write_atomic(os.path.join(ctx.out, "scale.md"), text)
    res = StageResult(tables=tables, files=["scale.json", "scale.md", "scale_loss.png"], notes=[
        f"{'tiny models' if ctx.tiny else '124m / 160m presets, vocabulary 50304'}; optimizer step: median of "
        f"{rounds} interleaved rounds; overhead_pct: SpectraAdamW over spectrakit AdamW."])
    failed = [f"{r.get('model', '')} {r['optimizer']}".strip() for r in (*opt_rows, *train_rows, *repro["runs"])
              if "error" in r and not r["error"].startswith("skipped")]
    if failed:
        res.ok, res.error = False, "failed: " + ", ".join(failed)
    return res
