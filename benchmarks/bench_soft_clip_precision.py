"""Precision mixes of the soft clip's Gram route on a GPU: accuracy against float64 SVD and batched speed.

The soft clip ``H_c(X) = (I + X X^T / c^2)^(-1/2) X`` (Jiang, Semenov and Stich 2026 §5.1) through the
Polar-Express Gram iteration of :func:`spectrakit.linalg.soft_clip` (``tall_steps=0``; Amsel et al. 2025),
with the products of each step in a chosen precision:

- ``fp64`` (the Gram matrix ``X X^T + c^2 I`` and the step in float64: full-rate on A100/H100 tensor cores),
- ``fp32``,
- ``bf16x3``: each fp32 operand split into bf16 ``hi + lo`` parts and ``hi hi + lo hi + hi lo`` summed from
  three bf16 products with fp32 output (``torch.mm(..., out_dtype=torch.float32)``, CUDA only; on CPU the
  products of the rounded parts are emulated in fp32, which rounds alike).

Rows: the library's fp32 fast route (6 steps), the same with TF32 allowed, all-fp64 8 and 10 steps, fp64
first steps then bf16x3, the paper's 10-step bf16 Newton-Schulz, and the accurate polar routes in fp32
and bf16. Accuracy: 128x512 Gaussian, 1e4-spike and six-decade spectra at ``sigma_max / c`` from 10 to 1e4;
speed: batches of the d = 512 and 1024 LLaMA shapes, median of 9 interleaved rounds.

Usage: ``python benchmarks/bench_soft_clip_precision.py [--device cuda] [--tiny]`` (``--tiny``: small sizes,
for checking the script on a CPU).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from spectrakit.linalg.polar import safety_for  # noqa: E402
from spectrakit.linalg.soft_clip import _grid_tables, soft_clip, soft_clip_fast_  # noqa: E402


def bf16x3(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a b`` from three bf16 products of the hi/lo parts, fp32 accumulation and output."""
    ah, bh = a.bfloat16(), b.bfloat16()
    al, bl = (a - ah.float()).bfloat16(), (b - bh.float()).bfloat16()
    if a.is_cuda:
        def f(x, y):
            return torch.bmm(x, y, out_dtype=torch.float32) if x.ndim == 3 else torch.mm(x, y, out_dtype=torch.float32)
    else:
        def f(x, y):
            return x.float() @ y.float()
    return f(ah, bh) + f(al, bh) + f(ah, bl)


def product(kind: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if kind == "fp64":
        return a.double() @ b.double()
    if kind == "fp32":
        return a.float() @ b.float()
    return bf16x3(a.float(), b.float())


_TABLES: dict = {}


def tables(steps: int, gdt: torch.dtype, device) -> tuple:
    key = (steps, gdt, str(device))
    if key not in _TABLES:
        grid, table, shifts = _grid_tables(steps, safety_for(torch.float32), 0, gdt)
        _TABLES[key] = (torch.tensor(grid, dtype=torch.float32, device=device),
                        torch.tensor(table, dtype=torch.float64, device=device),
                        torch.tensor(shifts, dtype=torch.float64, device=device))
    return _TABLES[key]


def gram_route(x: torch.Tensor, c: float, plan: list[str]) -> torch.Tensor:
    """The Gram iteration on wide ``x`` (B, m, n), step ``t`` in precision ``plan[t]``."""
    steps, dev = len(plan), x.device
    gdt = torch.float64 if plan[0] == "fp64" else torch.float32
    m = x.shape[-2]
    f = torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True).clamp_min(c)
    xs, cp = x / f, c / f
    eye = torch.eye(m, device=dev, dtype=gdt)
    xd = xs.to(gdt)
    g = xd @ xd.mT + (cp * cp).to(gdt) * eye
    g2 = g @ g
    lam = torch.linalg.matrix_norm(g2).sqrt()[..., None, None]
    sig = lam.sqrt()
    lower = (cp.to(gdt) / sig).clamp(0, 1)
    grid, table, shifts = tables(steps, gdt, dev)
    idx = (torch.searchsorted(grid, lower[:, 0, 0].float().contiguous(), right=True) - 1).clamp_min(0)
    co, d = table[idx], shifts[idx].to(gdt)[:, None, None]
    gn, g2n = g / lam, g2 / (lam * lam)
    g2n, gn = g2n + 2 * d * gn + d * d * eye, gn + d * eye
    r = None
    for t, kind in enumerate(plan):
        dt = torch.float64 if kind == "fp64" else torch.float32
        gn = gn.to(dt)
        if t > 0:
            g2n = product(kind, gn, gn).to(dt)
        a, b, cc = (co[:, t, i].to(dt)[:, None, None] for i in range(3))
        p = cc * g2n.to(dt) + b * gn
        p.diagonal(dim1=-2, dim2=-1).add_(a[..., 0])
        r = p if r is None else product(kind, r.to(dt), p).to(dt)
        if t < steps - 1:
            gn = product(kind, product(kind, p, gn).to(dt), p).to(dt)
    return c * ((r.mT / sig.to(r.dtype)).float() @ xs)


PLANS = {"fp64 x8": ["fp64"] * 8, "fp64 x10": ["fp64"] * 10, "fp64 x3 + bf16x3 x5": ["fp64"] * 3 + ["bf16x3"] * 5,
         "fp64 x2 + bf16x3 x6": ["fp64"] * 2 + ["bf16x3"] * 6, "fp32 x8": ["fp32"] * 8}


def run(name: str, x: torch.Tensor, c: float) -> torch.Tensor:
    if name in PLANS:
        return gram_route(x, c, PLANS[name])
    if name == "fp32 x6 (library fast route)":
        return soft_clip_fast_(x.clone(), c)
    if name == "fp32 x6, TF32 allowed":
        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            return soft_clip_fast_(x.clone(), c)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old
    if name == "NS10 bf16 (paper)":
        return soft_clip(x, c, method="newton_schulz", dtype=torch.bfloat16)
    if name == "accurate fp32":
        return soft_clip(x, c)
    return soft_clip(x, c, dtype=torch.bfloat16)  # "accurate bf16"


NAMES = ["fp32 x6 (library fast route)", *PLANS, "fp32 x6, TF32 allowed", "NS10 bf16 (paper)", "accurate fp32",
         "accurate bf16"]


def inputs(m: int, n: int) -> dict:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(m, n, generator=g, dtype=torch.float64)
    u, _, vh = torch.linalg.svd(a, full_matrices=False)
    s = torch.ones(m, dtype=torch.float64)
    s[0] = 1e4
    return {"random": a, "spike": (u * s) @ vh, "logspec": (u * torch.logspace(0, -6, m, dtype=torch.float64)) @ vh}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="small sizes (checks the script, e.g. on a CPU)")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    print(f"## accuracy (relative Frobenius error against float64 SVD), {dev}")
    print("| input | sigma_max/c | " + " | ".join(NAMES) + " |")
    print("|---|---|" + "---|" * len(NAMES))
    for kind, a in inputs(*((32, 64) if args.tiny else (128, 512))).items():
        u, s, vh = torch.linalg.svd(a, full_matrices=False)
        for ratio in (10, 100, 300, 1e3, 3e3, 1e4):
            c = float(s[0]) / ratio
            ref = (u * (s * c / torch.hypot(torch.tensor(c, dtype=torch.float64), s))) @ vh
            errs = [float((run(nm, a.float().to(dev)[None], c)[0].double().cpu() - ref).norm() / ref.norm())
                    for nm in NAMES]
            print(f"| {kind} | {ratio:.0e} | " + " | ".join(f"{e:.1e}" for e in errs) + " |", flush=True)
    shapes = ((2, 32, 64),) if args.tiny else ((8, 1024, 1024), (6, 1024, 2752), (12, 512, 1376))
    for shape in shapes:
        x = torch.randn(shape, device=dev) * 0.02
        c = float(torch.linalg.matrix_norm(x[0], 2)) / 30
        fns = {nm: (lambda nm=nm, x=x, c=c: run(nm, x, c)) for nm in NAMES}
        for fn in fns.values():
            fn()
        times: dict = {k: [] for k in fns}
        for rnd in range(9):
            for k in (NAMES if rnd % 2 == 0 else NAMES[::-1]):
                sync()
                t0 = time.perf_counter()
                fns[k]()
                sync()
                times[k].append((time.perf_counter() - t0) * 1e3)
        med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
        print(f"\n| batch {shape} | ms | / NS10 bf16 |\n|---|---|---|")
        for k, v in med.items():
            print(f"| {k} | {v:.3f} | {v / med['NS10 bf16 (paper)']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
