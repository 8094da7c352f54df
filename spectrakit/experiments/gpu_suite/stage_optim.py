"""optim stage: optimizer-step time and peak extra memory on the parameter set of the ~124M LLaMA preset.

The model (``spectrakit.models.llama`` preset ``124m``, vocabulary 50304; tiny: one block of width 16) is
built on the device with random gradients (std 1e-2). Each optimizer, built as the training loop
builds it (:func:`spectrakit.train.optimizers.build_optimizer`: SpectraAdamW, SpectraSignum, the regularised
Frank-Wolfe posts of SpectraSignum (Jiang, Semenov & Stich 2026, §3.1), Muon (Jordan et al. 2024) with its
AdamW for the embedding, head and vectors, our AdamW), runs side by side in one process with
``torch.optim.AdamW(fused=True)`` and ``torch.optim.Muon`` (2-D parameters only; absent from older torch).

Per optimizer: one step to allocate the state, then the median step time after warm-up (CUDA events), the
peak memory of one step beyond the memory held before it (``peak_extra_MiB``; the ratio to the largest
parameter); then, for every optimizer while the stage's time budget lasts, the median step time of
``torch.compile(opt.step)`` on a fresh instance (compile time excluded: it happens in the warm-up; with
``tiny`` only ``torch.optim.AdamW`` is compiled, with ``backend="eager"`` on the CPU, where tracing and the
C++ compile would dominate).
"""

from __future__ import annotations

import gc

import torch

from spectrakit.models.llama import Llama
from spectrakit.train.optimizers import build_optimizer

from . import StageResult, llama_config
from ._measure import error_text, peak_extra_bytes, time_ms

OURS = ["adamw", "spectra-adamw", "spectra-signum", "lmo-nuclear-signum", "lmo-schatten3-signum",
        "lmo-entropy-signum", "muon"]


def make_model(ctx) -> torch.nn.Module:
    cfg = llama_config(ctx.tiny)
    torch.manual_seed(0)
    with torch.device(ctx.device):
        model = Llama(cfg)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-2
    return model


def makers(ctx) -> dict:
    """Label -> function(model) building the optimizer (``None`` where this torch lacks it)."""
    out = {"torch.optim.AdamW (fused)": lambda m: torch.optim.AdamW(m.parameters(), lr=3e-3, fused=True)}
    if hasattr(torch.optim, "Muon"):
        out["torch.optim.Muon (2-D params)"] = lambda m: torch.optim.Muon(
            [p for p in m.parameters() if p.ndim == 2], lr=0.02)
    else:
        out["torch.optim.Muon (2-D params)"] = None
    for name in OURS:
        out[name] = lambda m, name=name: build_optimizer(name, m)
    return out


def _compiled_ms(opt, ctx, reps: int) -> float:
    backend = "eager" if (ctx.tiny and not ctx.cuda) else "inductor"
    step = torch.compile(opt.step, backend=backend)
    return time_ms(step, ctx.device, warmup=2, reps=reps)


def _release(ctx) -> None:
    gc.collect()
    torch._dynamo.reset()
    if ctx.cuda:
        torch.cuda.empty_cache()


def run(ctx) -> StageResult:
    reps, warmup = (1, 1) if ctx.tiny else (20, 2)
    model = make_model(ctx)
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    n_params = sum(p.numel() for p in model.parameters())
    compile_for = {"torch.optim.AdamW (fused)"} if ctx.tiny else None
    built = makers(ctx)
    rows = []
    # eager first for every optimizer, then the compiled steps while the budget lasts (compiling is the slow part)
    for label, make in built.items():
        row: dict = {"optimizer": label}
        rows.append(row)
        if make is None:
            row["error"] = f"not in torch {torch.__version__}"
            continue
        if ctx.over_budget():
            row["error"] = "skipped: stage time budget spent"
            continue
        try:
            opt = make(model)
            opt.step()  # allocate the state
            row["step_ms"] = time_ms(opt.step, ctx.device, warmup=warmup, reps=reps)
            extra = peak_extra_bytes(opt.step, ctx.device)
            row["peak_extra_MiB"] = extra / 2**20
            row["extra / largest param"] = extra / largest
        except Exception as e:
            row["error"] = error_text(e)
        opt = None
        _release(ctx)
        with torch.no_grad():  # keep the weights bounded across the optimizers
            for p in model.parameters():
                p.normal_(0, 0.02)
    for row in rows:
        if "step_ms" not in row or (compile_for is not None and row["optimizer"] not in compile_for):
            continue
        if ctx.over_budget():
            row["compile_error"] = "skipped: stage time budget spent"
            continue
        try:
            opt = built[row["optimizer"]](model)
            opt.step()
            row["compiled_step_ms"] = _compiled_ms(opt, ctx, reps)
        except Exception as e:  # compile support varies with the torch version: recorded per row
            row["compile_error"] = error_text(e)
        opt = None
        _release(ctx)
    base = next((r.get("step_ms") for r in rows if r["optimizer"].startswith("torch.optim.AdamW")), None)
    for r in rows:
        if base and "step_ms" in r:
            r["step / torch AdamW"] = r["step_ms"] / base
    res = StageResult(tables={"optimizer step": rows}, notes=[
        f"{'tiny' if ctx.tiny else '124m'} LLaMA parameter set: {n_params / 1e6:.2f} M parameters, largest "
        f"{largest / 2**20:.1f} MiB; median of {reps} steps after {warmup} warm-up step(s); compiled: "
        f"torch.compile(opt.step){' (backend eager, tiny CPU run)' if ctx.tiny and not ctx.cuda else ''}."])
    no_compile = [r["optimizer"] for r in rows if r.get("compile_error", "skipped").split(":")[0] != "skipped"]
    if no_compile:
        res.notes.append("torch.compile failed for: " + ", ".join(no_compile) + " (compile_error column)")
    failed = [r["optimizer"] for r in rows if "error" in r and not r["error"].startswith(("not in", "skipped"))]
    if failed:
        res.ok, res.error = False, "step failed for: " + ", ".join(failed)
    return res
