"""linalg stage: time and accuracy of the matrix functions on the matrix shapes of a ~124M LLaMA.

Shapes (full size): 768x768 (attention), 768x3072 and 3072x768 (MLP), 50304x768 (the embedding); tiny:
16x16, 16x48, 48x16, 256x16. Input ``X = G / (sqrt(m) + sqrt(n))`` with Gaussian ``G`` (``sigma_max ~ 1``),
made in float64 on the device and cast to bf16/fp32. The reference is a float64 SVD (``eigh`` for the
eigenvalue clip) of the same cast input on the same device, mapped by the function's scalar formula:

- ``msign``: ``s -> 1`` (Amsel et al. 2025, Polar Express schedule);
- ``soft_clip`` (Jiang, Semenov & Stich 2026, Alg. 1): ``s -> s / sqrt(1 + s^2/c^2)``, ``c = 0.1``, on the
  fast Gram route (``tall_steps=0``, fp32 only) and the accurate polar route;
- ``spectral_hardcap`` ``s -> min(s, 0.5)`` and ``spectral_clip`` ``s -> clip(s, 0.2, 0.5)`` (Cesista 2025);
- ``eig_clip`` on ``sym(X)`` (square shapes): ``lambda -> clip(lambda, -0.3, 0.3)``;
- ``spectral_lmo`` (Jiang, Semenov & Stich 2026, §3.1), radius 1, ``b = 0.5``: nuclear ``s -> -[s > b]``,
  Schatten-3 ``s -> -min(sqrt(s / b), 1)``.

Columns: median time (ms), relative Frobenius error ``||f(X) - f_ref(X)||_F / ||f_ref(X)||_F`` and the time of
the float64 SVD. A second table times 12 (tiny: 4) same-shaped matrices in one batched call against a Python
loop of single calls.
"""

from __future__ import annotations

import torch

import spectrakit.linalg as L
from spectrakit._checks import no_value_checks

from . import StageResult
from ._measure import error_text, time_ms

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
C, HI, LO, B = 0.1, 0.5, 0.2, 0.5


def shapes(tiny: bool) -> list[tuple[int, int]]:
    return [(16, 16), (16, 48), (48, 16), (256, 16)] if tiny else [(768, 768), (768, 3072), (3072, 768), (50304, 768)]


def cases():
    """(name, fn(x, dtype), reference singular/eigen-value map or None, kind): ``kind`` ``"svd"`` (any
    shape) or ``"eig"`` (square, symmetrised input); ``fn`` returns ``None`` where the route does not take
    that dtype."""
    return [
        ("msign", lambda x, d: L.msign(x), lambda s: torch.ones_like(s), "svd"),
        ("soft_clip fast", lambda x, d: L.soft_clip(x, C, tall_steps=0) if d == torch.float32 else None,
         lambda s: s / torch.sqrt(1 + (s / C) ** 2), "svd"),
        ("soft_clip accurate", lambda x, d: L.soft_clip(x, C), lambda s: s / torch.sqrt(1 + (s / C) ** 2), "svd"),
        ("spectral_hardcap", lambda x, d: L.spectral_hardcap(x, HI), lambda s: s.clamp(max=HI), "svd"),
        ("spectral_clip", lambda x, d: L.spectral_clip(x, LO, HI), lambda s: s.clamp(LO, HI), "svd"),
        ("eig_clip", lambda w, d: L.eig_clip(w, -0.3, 0.3), lambda lam: lam.clamp(-0.3, 0.3), "eig"),
        ("spectral_lmo nuclear", lambda x, d: L.spectral_lmo(x, "nuclear", b=B, radius=1.0),
         lambda s: -(s > B).to(s.dtype), "svd"),
        ("spectral_lmo schatten-3", lambda x, d: L.spectral_lmo(x, "schatten", b=B, radius=1.0, p=3.0),
         lambda s: -torch.sqrt(s / B).clamp(max=1.0), "svd"),
    ]


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    den = torch.linalg.norm(ref)
    return float(torch.linalg.norm(out.double() - ref) / den) if float(den) > 0 else float(torch.linalg.norm(out))


def _svd_ref(x64: torch.Tensor, fmap) -> torch.Tensor:
    u, s, vh = torch.linalg.svd(x64, full_matrices=False)
    return (u * fmap(s)[..., None, :]) @ vh


def _eig_ref(w64: torch.Tensor, fmap) -> torch.Tensor:
    lam, q = torch.linalg.eigh(w64)
    return (q * fmap(lam)[..., None, :]) @ q.mT


def accuracy_rows(ctx, reps: int) -> list[dict]:
    dev = ctx.device
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for m, n in shapes(ctx.tiny):
        base = torch.randn(m, n, generator=gen, device=dev, dtype=torch.float64) / (m**0.5 + n**0.5)
        for dname, dtype in DTYPES.items():
            x = base.to(dtype)
            x64 = x.double()
            w = ((x + x.mT) / 2) if m == n else None
            svd_ms = time_ms(lambda x64=x64: torch.linalg.svd(x64, full_matrices=False), dev, warmup=1, reps=1)
            for name, fn, fmap, kind in cases():
                if kind == "eig" and w is None:
                    continue
                inp = w if kind == "eig" else x
                row = {"function": name, "shape": f"{m}x{n}", "dtype": dname}
                try:
                    with no_value_checks():
                        out = fn(inp, dtype)
                        if out is None:
                            continue
                        row["time_ms"] = time_ms(lambda fn=fn, inp=inp, d=dtype: fn(inp, d), dev,
                                                 warmup=int(not ctx.tiny), reps=reps)
                    ref = _eig_ref(inp.double(), fmap) if kind == "eig" else _svd_ref(x64, fmap)
                    row["rel_err"] = _rel_err(out, ref)
                    row["svd64_ms"] = svd_ms
                except Exception as e:  # one function failing does not hide the others
                    row["error"] = error_text(e)
                rows.append(row)
            if ctx.over_budget():
                return rows
    return rows


def batch_rows(ctx, reps: int) -> list[dict]:
    dev = ctx.device
    count = 4 if ctx.tiny else 12
    sizes = [(16, 16), (16, 48)] if ctx.tiny else [(768, 768), (768, 3072)]
    fns = {"msign": lambda x: L.msign(x), "soft_clip accurate": lambda x: L.soft_clip(x, C),
           "spectral_hardcap": lambda x: L.spectral_hardcap(x, HI)}
    rows = []
    for m, n in sizes:
        for dname, dtype in DTYPES.items():
            x = (torch.randn(count, m, n, device=dev) / (m**0.5 + n**0.5)).to(dtype)
            for name, fn in fns.items():
                row = {"function": name, "shape": f"{count}x{m}x{n}", "dtype": dname}
                try:
                    with no_value_checks():
                        row["batched_ms"] = time_ms(lambda fn=fn, x=x: fn(x), dev, warmup=1, reps=reps)
                        row["loop_ms"] = time_ms(lambda fn=fn, x=x: [fn(x[i]) for i in range(count)], dev,
                                                 warmup=1, reps=reps)
                    row["loop / batched"] = row["loop_ms"] / row["batched_ms"]
                except Exception as e:
                    row["error"] = error_text(e)
                rows.append(row)
    return rows


def run(ctx) -> StageResult:
    reps = 1 if ctx.tiny else 10
    acc = accuracy_rows(ctx, reps)
    res = StageResult(notes=[
        f"Input X = G/(sqrt(m)+sqrt(n)), Gaussian G; c = {C}, hardcap {HI}, clip [{LO}, {HI}], eig_clip "
        f"[-0.3, 0.3], lmo b = {B}, radius 1. rel_err: against a float64 SVD/eigh of the same input on the "
        f"same device; times: median of {reps} calls after warm-up (value checks off)."])
    res.tables["accuracy and time per function"] = acc
    if ctx.over_budget():
        res.notes.append("time budget spent: the batched-vs-loop table was skipped")
    else:
        res.tables["batched call vs a loop of single calls"] = batch_rows(ctx, reps)
    failed = [r for t in res.tables.values() for r in t if "error" in r]
    if failed:
        res.ok, res.error = False, f"{len(failed)} call(s) raised (see the error column)"
    return res
