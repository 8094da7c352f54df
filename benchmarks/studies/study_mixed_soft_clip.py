"""Mixed-precision soft clip: how much of the iteration can run in bf16 at fp32 accuracy?

Study of the design "bulk of the matmuls in bf16, finished by a cheap fp32 correction" for SPECTRA's soft
clip ``H_c(X) = (I + X X^T / c^2)^(-1/2) X`` (Jiang, Semenov and Stich 2026 §5.1), on the stacked polar
formulation ``H_c(X) = c msign([X^T; c I])[:n]^T`` of :mod:`spectrakit.linalg.soft_clip` with its
Polar-Express schedules (Amsel et al. 2025). The candidate (``mixed``), per wide matrix ``X`` (m <= n):

1. ``kg`` Polar-Express steps in fp32 on the ``m x m`` Gram matrix (as the fast route), accumulating the
   factor ``R`` (the iterate is ``B_0 R``);
2. the remaining ``steps - kg`` steps on the tall matrix in bf16 (``Y <- Y p(Y^T Y + Z^T Z)``, the bottom
   block ``Z = (c/sig) R`` kept in fp32, so ``R`` stays readable);
3. an fp32 correction anchored on the fp32 input: ``T = B_0 R`` recomputed in fp32 (top block from ``X``),
   one Newton-Schulz step ``R <- R (3I - T^T T)/2`` (Higham 2008, §8.3) with the Gram matrix of the tall
   ``T`` (so its rounding is relative to ``T``, not to ``X X^T``), and the output ``c (B_0 R)[:n]^T``.

The correction removes every error of ``R`` that is a symmetric perturbation of ``P R`` (``P`` the
symmetric factor of ``B_0``); what it cannot remove is the commutator part, which bf16 rounding produces
in proportion to the condition number left when bf16 starts. Hence the early, ill-conditioned steps must be
fp32: the study prints the worst relative Frobenius error against float64 SVD (Gaussian, six-decade and
1e3-spike spectra, 64x192 and 96x96) for ``kg`` = 3..5, and the FLOPs of each route split by dtype, with
a time model ``fp32 FLOPs + bf16 FLOPs / S`` for bf16 speed-ups S. The last row is the fp32 Gram
iteration with the same correction and no bf16 step.

Usage: ``python benchmarks/studies/study_mixed_soft_clip.py`` (CPU, about a minute; bf16 products are emulated
where the CPU has no bf16 units: accuracy is the same, speed is not measured here).
"""

from __future__ import annotations

import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from spectrakit.experiments.io import markdown_table  # noqa: E402
from spectrakit.linalg import soft_clip  # noqa: E402
from spectrakit.linalg.polar import safety_for  # noqa: E402
from spectrakit.linalg.soft_clip import _grid_tensors  # noqa: E402

B16, F32 = torch.bfloat16, torch.float32
RATIOS = (0.5, 3.0, 30.0, 300.0, 1e3, 1e4)


def mixed(x: torch.Tensor, c: float, steps: int = 8, kg: int = 5) -> torch.Tensor:
    """The candidate route on one wide fp32 matrix (see the module docstring)."""
    xw = x.float()
    fx = torch.linalg.matrix_norm(xw)
    f = torch.clamp(fx, min=c)
    y0 = xw.T / f
    cp = c / f
    eye = torch.eye(x.shape[0])
    g = y0.T @ y0 + cp * cp * eye
    g2 = g @ g
    lam = torch.linalg.matrix_norm(g2).sqrt()
    sig = lam.sqrt()
    grid, table, _ = _grid_tensors(steps, x.device, safety_for(B16), steps, B16)
    idx = (torch.searchsorted(grid, (cp / sig).clamp(0, 1).reshape(1).float(), right=True) - 1).clamp_min(0)
    co = table[idx[0]].float()
    y0, zs = y0 / sig, cp / sig
    gn, g2n, r = g / lam, g2 / (lam * lam), eye
    for t in range(kg):  # fp32, m x m
        a, b, cc = co[t]
        if t > 0:
            g2n = gn @ gn
        p = cc * g2n + b * gn + a * eye
        r = r @ p
        if t < kg - 1:
            gn = p @ gn @ p
    y, z = y0 @ r, zs * r
    for t in range(kg, steps):  # bf16 tall, bottom block in fp32
        a, b, cc = co[t]
        yb = y.to(B16)
        gn = (yb.T @ yb).float() + z.T @ z
        gb = gn.to(B16)
        p = cc * (gb @ gb).float() + b * gn + a * eye
        y, z = (yb @ p.to(B16)).float(), z @ p
    r = z / zs
    t_ = y0 @ r  # fp32 correction anchored on X
    zb = zs * r
    r = r @ (1.5 * eye - 0.5 * (t_.T @ t_ + zb.T @ zb))
    return c * (y0 @ r).T


def flops(route: str, m: int, n: int, kg: int = 5, steps: int = 8) -> tuple[float, float]:
    """(fp32, bf16) matmul FLOPs of one wide m x n matrix."""
    mn, m3 = m * m * n, m**3
    if route == "fast fp32 (default)":
        return 4 * mn + 42 * m3, 0.0
    if route == "NS10 bf16 (yardstick)":
        return 0.0, 4 * mn + 60 * m3
    if route == "polar bf16 (3 fp32 tall steps)":
        tall = 4 * mn + 6 * m3  # Gram of [Y; Z] (Y part 2mn), G^2, Y p, Z p
        return 2 * mn + 2 * m3 + 3 * tall, 4 * tall
    fp32 = 2 * mn + 2 * m3 + 4 * m3 + (kg - 1) * 8 * m3 - 4 * m3 + 2 * mn  # Gram phase, Y = Y0 R
    fp32 += (steps - kg) * 4 * m3 + 6 * mn + 4 * m3  # Z in fp32; correction and output
    return fp32, (steps - kg) * (4 * mn + 2 * m3)


def inputs(m: int, n: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(m, m, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(n, m, generator=g, dtype=torch.float64))
    spike = torch.randn(m, n, generator=g)
    spike[0] *= 1e3 / math.sqrt(n)
    return {"gaussian": torch.randn(m, n, generator=g),
            "six decades": ((u * torch.logspace(0, -6, m, dtype=torch.float64)) @ v.T).float(),
            "1e3 spike": spike}


def exact(x: torch.Tensor, c: float) -> torch.Tensor:
    u, s, vh = torch.linalg.svd(x.double(), full_matrices=False)
    return (u * (s * c / torch.sqrt(c * c + s * s))) @ vh


def main() -> None:
    torch.set_num_threads(1)
    routes = {
        "fast fp32 (default)": lambda x, c: soft_clip(x, c, tall_steps=0),
        "polar bf16 (3 fp32 tall steps)": lambda x, c: soft_clip(x, c, dtype=B16),
        "NS10 bf16 (yardstick)": lambda x, c: soft_clip(x, c, method="newton_schulz", dtype=B16),
        **{f"mixed, kg={k}": (lambda x, c, k=k: mixed(x, c, kg=k)) for k in (3, 4, 5)},
        # no bf16 step: the fast route's Gram iteration (7 steps) with the anchored fp32 correction
        "fp32 Gram + correction, kg=7": lambda x, c: mixed(x, c, steps=7, kg=7),
    }
    rows = []
    for name, fn in routes.items():
        worst = dict.fromkeys(RATIOS, 0.0)
        for m, n in ((64, 192), (96, 96)):
            for x in inputs(m, n, 0).values():
                smax = float(torch.linalg.matrix_norm(x.double(), 2))
                for r in RATIOS:
                    ref = exact(x, smax / r)
                    err = float(torch.linalg.norm(fn(x, smax / r).double() - ref) / torch.linalg.norm(ref))
                    worst[r] = max(worst[r], err)
        key = "mixed" if "kg=" in name else name
        kg = int(name[-1]) if key == "mixed" else 5
        f32, b16 = flops(key, 512, 512, kg=kg, steps=max(kg, 8) if kg != 7 else 7)
        row = {"route": name, **{f"s/c={r:g}": f"{e:.1e}" for r, e in worst.items()},
               "fp32 GFLOP (512x512)": f32 / 1e9, "bf16 GFLOP": b16 / 1e9}
        for s in (7, 15):
            row[f"model time, S={s}"] = (f32 + b16 / s) / 1e9
        rows.append(row)
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
