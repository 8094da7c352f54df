"""train stage: the full training step (forward, backward, optimizer step) of the ~124M LLaMA preset,
SpectraAdamW against AdamW, as the training loop runs it (bf16 autocast on CUDA, fp32 on the CPU).

Full size: preset ``124m``, vocabulary 50304, 32 sequences x 512 tokens of random tokens (the step time does
not depend on the data); tiny: one block of width 16, vocabulary 64, 2 x 16. Each optimizer gets a fresh model with
the same initialisation. Reported: the median step time after warm-up (CUDA events), the optimizer step
alone, tokens per second, SpectraAdamW's overhead over AdamW in percent, and the peak memory of a step
(``torch.cuda.max_memory_allocated``; on the CPU the peak beyond the memory held before it).
"""

from __future__ import annotations

import gc

import torch

from spectrakit.models.llama import Llama
from spectrakit.train.loop import autocast_context
from spectrakit.train.optimizers import build_optimizer

from . import StageResult, llama_config
from ._measure import error_text, peak_extra_bytes, time_ms

NAMES = ("adamw", "spectra-adamw")


def _one(name: str, ctx, tokens: torch.Tensor, reps: int) -> dict:
    torch.manual_seed(0)
    seq_len = tokens.shape[1] - 1
    cfg = llama_config(ctx.tiny, seq_len)
    with torch.device(ctx.device):
        model = Llama(cfg)
    opt = build_optimizer(name, model)

    def fwd_bwd():
        with autocast_context(ctx.device):
            _, loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()

    def step():
        fwd_bwd()
        opt.step()
        opt.zero_grad(set_to_none=True)

    row = {"optimizer": name, "params_M": sum(p.numel() for p in model.parameters()) / 1e6,
           "tokens/step": tokens.shape[0] * seq_len}
    row["step_ms"] = time_ms(step, ctx.device, warmup=3 if not ctx.tiny else 1, reps=reps)
    if ctx.cuda:
        torch.cuda.reset_peak_memory_stats(ctx.device)
        step()
        torch.cuda.synchronize(ctx.device)
        row["peak_MiB"] = torch.cuda.max_memory_allocated(ctx.device) / 2**20
    else:
        row["peak_extra_MiB"] = peak_extra_bytes(step, ctx.device) / 2**20
    fwd_bwd()
    row["opt_ms"] = time_ms(opt.step, ctx.device, warmup=1, reps=reps)
    row["tokens/s"] = row["tokens/step"] / (row["step_ms"] / 1e3)
    return row


def run(ctx) -> StageResult:
    batch, seq_len = (2, 16) if ctx.tiny else (32, 512)
    vocab = llama_config(ctx.tiny).vocab_size
    reps = 1 if ctx.tiny else 10
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (batch, seq_len + 1), generator=gen).to(ctx.device)
    rows, errors = [], []
    for name in NAMES:
        try:
            rows.append(_one(name, ctx, tokens, reps))
            gc.collect()
            if ctx.cuda:
                torch.cuda.empty_cache()
        except Exception as e:
            rows.append({"optimizer": name, "error": error_text(e)})
            errors.append(name)
    by = {r["optimizer"]: r for r in rows if "step_ms" in r}
    if len(by) == 2:
        base, spectra = by["adamw"], by["spectra-adamw"]
        spectra["overhead_%"] = 100 * (spectra["step_ms"] / base["step_ms"] - 1)
        spectra["opt_overhead_ms"] = spectra["opt_ms"] - base["opt_ms"]
    res = StageResult(tables={"training step": rows}, notes=[
        f"{'tiny model' if ctx.tiny else '124m preset'}, {batch} x {seq_len} random tokens, vocabulary {vocab}, "
        f"{'bf16 autocast' if ctx.cuda else 'fp32'}; median of {reps} steps. For reference (not measured "
        "here): Jiang, Semenov & Stich (2026) report +18.7% for SPECTRA at 160M on 4 GPUs."])
    if errors:
        res.ok, res.error = False, "training step failed for: " + ", ".join(errors)
    return res
