"""Full training-step time (forward + backward + optimizer) of the LLaMA model per optimizer, and SPECTRA's
overhead over its base optimizer (Jiang, Semenov & Stich 2026, Table F.2: +18.7% at 160M on 4xH100; target here <= 5% at
~124M on one GPU).

    python benchmarks/bench_train.py                       # CPU: tiny preset
    python benchmarks/bench_train.py --preset 124m --batch-size 32 --seq-len 512   # on an H100 (bf16)

Random tokens (vocab 8192 unless --vocab) are used: the step time does not depend on the data. Each
optimizer gets a fresh model with the same seed; the median of --reps timed steps after --warmup steps
is reported, plus the optimizer step alone (``opt_ms``).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import command_line, sync, time_fn, write_section  # noqa: E402
from spectrakit.experiments.io import environment, markdown_table  # noqa: E402
from spectrakit.models.llama import Llama, preset_config  # noqa: E402
from spectrakit.train.loop import autocast_context  # noqa: E402
from spectrakit.train.optimizers import OPTIMIZERS, build_optimizer  # noqa: E402


def _time_one(name, preset, x, vocab, device, warmup, reps, compile_model) -> dict:
    torch.manual_seed(0)
    batch_size, seq_len = x.shape[0], x.shape[1] - 1
    model = Llama(preset_config(preset, vocab, max_seq_len=seq_len)).to(device)
    fwd = torch.compile(model) if compile_model else model
    opt = build_optimizer(name, model)

    def fwd_bwd():
        with autocast_context(torch.device(device)):
            _, loss = fwd(x[:, :-1], x[:, 1:])
        loss.backward()

    def step():
        fwd_bwd()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step_ms = time_fn(step, device, warmup=warmup, reps=reps)
    fwd_bwd()
    sync(device)
    opt_ms = time_fn(opt.step, device, warmup=1, reps=reps)
    return {"optimizer": name, "preset": preset, "params_M": model.num_parameters() / 1e6,
            "tokens/step": batch_size * seq_len, "step_ms": step_ms, "opt_ms": opt_ms,
            "tok_s": batch_size * seq_len / (step_ms / 1e3)}


def bench(names, preset, batch_size, seq_len, vocab, device, warmup, reps, compile_model):
    """One row per optimizer: median full-step and optimizer-step times, tokens/s, overhead over the base."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (batch_size, seq_len + 1), generator=gen).to(device)
    rows = [_time_one(n, preset, x, vocab, device, warmup, reps, compile_model) for n in names]
    by = {r["optimizer"]: r for r in rows}
    for r in rows:
        base = OPTIMIZERS[r["optimizer"]].base
        r["overhead_%"] = 100 * (r["step_ms"] / by[base]["step_ms"] - 1) if base in by else float("nan")
    return rows


def main() -> int:
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--optimizers", default="adamw,spectra-adamw,signum,spectra-signum,muon")
    p.add_argument("--preset", default="124m" if cuda else "tiny")
    p.add_argument("--batch-size", type=int, default=32 if cuda else 16)
    p.add_argument("--seq-len", type=int, default=512 if cuda else 128)
    p.add_argument("--vocab", type=int, default=8192 if not cuda else 50304)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=10 if cuda else 5)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--no-write", action="store_true", help="do not write docs/results/bench/KEY.md")
    args = p.parse_args()
    device = "cuda" if cuda else "cpu"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    rows = bench(args.optimizers.split(","), args.preset, args.batch_size, args.seq_len, args.vocab, device,
                 args.warmup, args.reps, args.compile)
    env = environment()
    text = (f"### Training step: {args.preset} model, {args.batch_size}x{args.seq_len} tokens"
            f"{' (bf16 autocast)' if cuda else ''}\n\ndevice: {env['device']} · torch {env['torch']} · "
            f"{env['date']}\n\ncommand: `{command_line()}`\n\n"
            + markdown_table(rows, ["optimizer", "preset", "params_M", "tokens/step", "step_ms", "opt_ms",
                                    "overhead_%", "tok_s"]) + "\n")
    print(text)
    if not args.no_write:
        write_section(f"train-{device}", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
