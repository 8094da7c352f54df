"""Grishina, Gorbunov and Rakhuba 2024 Table 2: TN and F4 bounds vs the exact zero-padding norm for Gaussian kernels
(32x32 input).

For every kernel ``(c, c, k, k)`` with ``K ~ N(0, 1)``: ``||T||_2`` of the zero-padded ("same") convolution by
power iteration on ``conv2d``/``conv_transpose2d``, the F4 bound, the TN bound (HOPM, screened restarts), their
ratios to ``||T||_2`` and the published ratios (Grishina, Gorbunov and Rakhuba 2024 Table 2) for comparison.
"""

from __future__ import annotations

import argparse
import time

import torch

from spectrakit.conv import exact_zero_pad, f4_bound, tn_bound
from spectrakit.experiments.io import invocation, report
from spectrakit.experiments.options import conv_bounds as add_arguments  # noqa: F401 (its options)

# (c, k) -> (||T||_2, F4, TN) from Grishina, Gorbunov and Rakhuba 2024 Table 2
PAPER = {(64, 3): (49.35, 81.26, 51.51), (128, 3): (67.14, 114.68, 69.99), (256, 3): (95.71, 164.44, 96.47),
         (512, 3): (135.62, 234.55, 136.99), (64, 5): (81.55, 175.74, 88.25), (128, 5): (113.5, 250.91, 119.29),
         (256, 5): (160.07, 354.46, 165.37), (512, 5): (227.1, 501.8, 229.66), (64, 7): (112.94, 293.34, 127.69),
         (128, 7): (158.36, 415.81, 170.99), (256, 7): (222.45, 587.98, 235.28), (512, 7): (315.25, 834.35, 326.2)}


def run(channels=(64, 128, 256, 512), kernel_sizes=(3, 5, 7), input_size: int = 32, iters: int = 100,
        exact_iters: int = 100, seed: int = 0, device: str = "cpu", samples: int = 1) -> list[dict]:
    """One row per kernel shape: exact, F4, TN (means over ``samples`` >= 1 Gaussian kernels), the mean ratios
    F4/exact, TN/exact (and their spread over samples), the paper's ratios and the mean run times (s).

    The exact value is a power iteration started from the top plane wave of the circular spectrum (converged
    to ~1e-5 within 30 iterations for these kernels)."""
    rows = []
    gen = torch.Generator(device=device).manual_seed(seed)
    for k in kernel_sizes:
        for c in channels:
            acc: dict[str, list[float]] = {}
            for _ in range(samples):
                K = torch.randn(c, c, k, k, generator=gen, device=device)
                t0 = time.perf_counter()
                ex = float(exact_zero_pad(K, input_size, iters=exact_iters, generator=gen)[0])
                t1 = time.perf_counter()
                f4 = float(f4_bound(K)[0])
                t2 = time.perf_counter()
                tn = float(tn_bound(K, iters=iters, generator=gen)[0])
                t3 = time.perf_counter()
                for key, v in (("exact", ex), ("F4", f4), ("TN", tn), ("F4/exact", f4 / ex), ("TN/exact", tn / ex),
                               ("t_exact_s", t1 - t0), ("t_F4_s", t2 - t1), ("t_TN_s", t3 - t2)):
                    acc.setdefault(key, []).append(v)
            row = {"kernel": f"{c},{c},{k},{k}", "samples": samples}
            row.update({key: sum(v) / len(v) for key, v in acc.items() if not key.startswith("t_")})
            row["TN/exact spread"] = max(acc["TN/exact"]) - min(acc["TN/exact"])
            if (c, k) in PAPER:
                pt, pf, ptn = PAPER[(c, k)]
                row.update({"paper F4/T": pf / pt, "paper TN/T": ptn / pt})
            row.update({key: sum(v) / len(v) for key, v in acc.items() if key.startswith("t_")})
            rows.append(row)
    return rows


def main(args: argparse.Namespace) -> int:
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    ints = lambda s: tuple(int(x) for x in s.split(","))
    rows = run(ints(args.channels), ints(args.kernel_sizes), args.input_size, args.iters, args.exact_iters,
               args.seed, args.device, args.samples)
    report("conv-bounds (Grishina, Gorbunov and Rakhuba 2024 Table 2)", rows, args.out,
           command=invocation("experiment", f"spectrakit experiment conv-bounds --channels {args.channels} "
                              f"--kernel-sizes {args.kernel_sizes} --samples {args.samples}"))
    return 0
