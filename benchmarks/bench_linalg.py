"""Speed of the matrix functions of ``spectrakit.linalg``: one table per device.

Columns per shape, all in the compute dtype (default bf16): bare Gram matmul ``X X^T``; exact SVD path
(``torch.linalg.svd`` in fp32, the soft-clip map applied to the singular values); the paper's soft clip
(Alg. 1 + 3, 10 coupled Newton-Schulz steps); our ``soft_clip`` (polar route, default steps); hard clip
(``spectral_hardcap``: the default route, ``msign(X)`` then the eigen-sign of the ``m x m`` absolute value, and
where ``m + n <= --dilation-max`` the dense ``(m+n)`` dilation route for comparison); ``msign`` (Polar Express,
default lower bound). For each: time and
achieved fraction of the bare matmul FLOP throughput (FLOPs from :mod:`spectrakit.linalg.flops`, counting
the products each algorithm issues). A second table: 12 same-shaped matrices in one batched call vs a
Python loop. On CUDA, a third line checks ``torch.cuda.set_sync_debug_mode("error")`` for every function.

Usage: ``python benchmarks/bench_linalg.py`` (GPU: LLM-sized shapes; CPU: small shapes that finish in a
few minutes), ``--shapes 768x768,768x3072 --dtype bf16 --no-hardcap``.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import command_line, time_fn, write_section  # noqa: E402
from spectrakit._checks import no_value_checks  # noqa: E402
from spectrakit.experiments.io import environment, markdown_table  # noqa: E402
from spectrakit.linalg import flops as F  # noqa: E402
from spectrakit.linalg import msign, soft_clip, spectral_hardcap  # noqa: E402

GPU_SHAPES = "768x768,768x3072,1024x4096,2048x8192,4096x4096,4096x14336"
CPU_SHAPES = "128x128,128x512,256x1024,512x512"
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def _svd_soft_clip(x: torch.Tensor, c: float) -> torch.Tensor:
    u, s, vh = torch.linalg.svd(x.float(), full_matrices=False)
    return ((u * (s / torch.sqrt(1 + (s / c) ** 2))[..., None, :]) @ vh).to(x.dtype)


def bench_shape(m: int, n: int, dtype: torch.dtype, device: torch.device, *, hardcap: bool,
                reps: int, dilation_max: int = 0) -> dict:
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = (torch.randn(m, n, generator=gen) / (m**0.5 + n**0.5)).to(device=device, dtype=dtype)
    c = 0.1  # sigma_max ~ 1: ratio ~ 10 (a typical clipped update)
    with no_value_checks():
        runs = {
            "gram": (lambda: x @ x.mT, F.gram_flops(m, n)),
            "svd": (lambda: _svd_soft_clip(x, c), None),
            "paper_ns10": (lambda: soft_clip(x, c, method="newton_schulz"),
                           F.soft_clip_newton_schulz_flops(m, n)),
            "soft_clip": (lambda: soft_clip(x, c), F.soft_clip_polar_flops(m, n, dtype)),
            "msign": (lambda: msign(x), F.msign_flops(m, n, F.msign_default_steps(m, n, dtype))),
        }
        if hardcap:
            runs["hardcap"] = (lambda: spectral_hardcap(x, 0.5), F.hardcap_flops(m, n, dtype))
            if m + n <= dilation_max:
                runs["hardcap_dilation"] = (lambda: spectral_hardcap(x, 0.5, method="dilation"),
                                            F.hardcap_dilation_flops(m, n, dtype))
        row: dict = {"shape": f"{m}x{n}", "dtype": str(dtype).replace("torch.", "")}
        times = {k: time_fn(fn, device, warmup=1, reps=reps) for k, (fn, _) in runs.items()}
    rate = runs["gram"][1] / times["gram"]  # FLOP per ms of the bare matmul
    for k, (_, fl) in runs.items():
        row[f"{k}_ms"] = times[k]
        if fl is not None and k != "gram":
            row[f"{k}_mm%"] = 100.0 * (fl / times[k]) / rate
    row["gram_TFLOPs"] = rate / 1e9
    row["soft_clip/paper"] = times["soft_clip"] / times["paper_ns10"]
    row["flops soft_clip/paper"] = (F.soft_clip_polar_flops(m, n, dtype)
                                    / F.soft_clip_newton_schulz_flops(m, n))
    return row


def bench_batch(m: int, n: int, dtype: torch.dtype, device: torch.device, reps: int) -> dict:
    x = torch.randn(12, m, n, device=device).to(dtype)
    c = torch.full((12,), 0.5 * float(m**0.5 + n**0.5), device=device)
    with no_value_checks():
        t_batch = time_fn(lambda: soft_clip(x, c), device, warmup=1, reps=reps)
        t_loop = time_fn(lambda: [soft_clip(x[i], c[i]) for i in range(12)], device, warmup=1, reps=reps)
    return {"shape": f"12x{m}x{n}", "dtype": str(dtype).replace("torch.", ""), "batched_ms": t_batch,
            "loop_ms": t_loop, "speedup": t_loop / t_batch}


def sync_check(device: torch.device) -> str:
    if device.type != "cuda":
        return "sync check: skipped (no CUDA)"
    x = torch.randn(4, 256, 512, device=device)
    c = torch.rand(4, device=device) + 0.5
    w = torch.randn(4, 128, 128, device=device)
    calls = [lambda: msign(x), lambda: soft_clip(x, c), lambda: spectral_hardcap(x, c)]
    from spectrakit.linalg import eig_clip, proj_psd, spectral_norm

    calls += [lambda: eig_clip(w, -c, c), lambda: proj_psd(w), lambda: spectral_norm(x)]
    for fn in calls:
        fn()
    torch.cuda.synchronize()
    with no_value_checks():
        torch.cuda.set_sync_debug_mode("error")
        try:
            for fn in calls:
                fn()
            ok = "passed"
        except RuntimeError as e:
            ok = f"FAILED ({e})"
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return f"sync check (`torch.cuda.set_sync_debug_mode('error')`, value checks off): {ok}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--shapes", default=None, help=f"default: GPU {GPU_SHAPES}; CPU {CPU_SHAPES}")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--no-hardcap", action="store_true", help="skip the hard clip columns")
    p.add_argument("--dilation-max", type=int, default=4096,
                   help="also time the (m+n)^3 dilation hard clip where m + n <= this (0: never)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--no-write", action="store_true", help="do not write docs/results/bench/KEY.md")
    p.add_argument("--threads", type=int, default=0,
                   help="torch intra-op threads (0: torch's default); 1 avoids OpenMP over-subscription "
                        "on a shared, loaded CPU")
    args = p.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                          else ("cpu" if args.device == "auto" else args.device))
    shapes = args.shapes or (GPU_SHAPES if device.type == "cuda" else CPU_SHAPES)
    dtype = DTYPES[args.dtype]
    rows = []
    for s in shapes.split(","):
        m, n = (int(v) for v in s.split("x"))
        rows.append(bench_shape(m, n, dtype, device, hardcap=not args.no_hardcap, reps=args.reps,
                                dilation_max=args.dilation_max))
        print(markdown_table(rows[-1:]), flush=True)
    bm, bn = (768, 768) if device.type == "cuda" else (128, 128)
    batch = [bench_batch(bm, bn, dtype, device, args.reps)]
    env = environment()
    load = ""
    if device.type == "cpu" and hasattr(os, "getloadavg"):
        la, cores = os.getloadavg()[0], os.cpu_count() or 1
        load = f" · load average {la:.1f} on {cores} cores" + (" (shared: noisy times)" if la > cores else "")
    text = "\n\n".join([
        f"### linalg ({device.type})",
        f"device: {env['device']} · torch {env['torch']} · {env['date']}{load}",
        f"command: `{command_line()}`",
        "Times in ms (median). `*_mm%`: achieved fraction of the bare Gram-matmul FLOP throughput "
        "(`gram_TFLOPs`), counting the products each algorithm issues (`spectrakit.linalg.flops`). "
        "`svd`: fp32 SVD + map. `paper_ns10`: Jiang, Semenov & Stich (2026) Alg. 1+3, 10 steps. "
        "`soft_clip/paper`: time ratio.",
        markdown_table(rows),
        "12 same-shaped matrices, one batched `soft_clip` call vs a Python loop:",
        markdown_table(batch),
        sync_check(device),
    ])
    print(text)
    if not args.no_write:
        write_section(f"linalg-{device.type}", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
