"""Benchmark of convolution spectral-norm methods: time per call and ratio to the exact zero-padding norm.

Methods: TN (cold: 64 screened restarts x 100 sweeps; warm: 1 sweep from the previous vectors), LipBound
(certified sampled generating function), F4 (cold: exact
SVD of 4 unfoldings; warm: 1 power iteration each), Gram iteration (6 steps, zero-padding bound), exact circular
(FFT + batched SVD) and exact zero padding (power iteration, plane-wave start). Kernels: Grishina, Gorbunov &
Rakhuba (2024) Table 2 (Gaussian) and a ResNet-18-like layer list; input sizes 32, 64, 224 (exact methods
skipped where the FFT'd kernel would exceed --max-fft-gb).

    python benchmarks/bench_conv.py                       # GPU: full table
    python benchmarks/bench_conv.py --channels 64,128 --input-sizes 32,64 --resnet-max 128   # CPU-sized
    python benchmarks/bench_conv.py --threads 1 ...       # torch.set_num_threads(1) (CPU timings side by side)
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import command_line, time_fn, write_section  # noqa: E402

from spectrakit.conv import exact_circular, exact_zero_pad, f4_bound, gram_bound, lipbound, tn_bound  # noqa: E402
from spectrakit.conv.exact import LIPBOUND_ALPHA  # noqa: E402
from spectrakit.experiments.io import environment, markdown_table  # noqa: E402
from spectrakit.models.cnn import RESNET18_CONVS  # noqa: E402

RESNET18 = RESNET18_CONVS


def bench_kernel(K, stride, n, device, reps, max_fft_gb, exact_iters):
    co, ci, k, _ = K.shape
    rows = []
    fft_gb = n * n * co * ci * 8 / 2 / stride ** 2 / 1e9 * 3
    ex, st = exact_zero_pad(K, n, stride=stride, iters=exact_iters)
    ex = float(ex)
    t_ex = time_fn(lambda: exact_zero_pad(K, n, stride=stride, iters=exact_iters), device, warmup=1, reps=reps)
    tn, tst = tn_bound(K, stride=stride)
    f4, fst = f4_bound(K, stride=stride)
    _, fst = f4_bound(K, stride=stride, iters=100)
    res = {
        "TN cold": (float(tn), time_fn(lambda: tn_bound(K, stride=stride), device, warmup=1, reps=reps)),
        "TN warm (1 sweep)": (float(tn_bound(K, stride=stride, state=tst)[0]),
                              time_fn(lambda: tn_bound(K, stride=stride, state=tst), device, reps=reps)),
        "F4 (SVD)": (float(f4), time_fn(lambda: f4_bound(K, stride=stride), device, warmup=1, reps=reps)),
        "F4 warm (1 power it.)": (float(f4_bound(K, stride=stride, state=fst)[0]),
                                  time_fn(lambda: f4_bound(K, stride=stride, state=fst), device, reps=reps)),
        f"exact zero-pad ({exact_iters} it.)": (ex, t_ex),
    }
    if fft_gb <= max_fft_gb and n % stride == 0:
        res["Gram (6 it., zero-pad bound)"] = (
            float(gram_bound(K, n, stride=stride, padding="zero")),
            time_fn(lambda: gram_bound(K, n, stride=stride, padding="zero"), device, warmup=1, reps=reps))
        res["exact circular"] = (float(exact_circular(K, n, stride=stride)),
                                 time_fn(lambda: exact_circular(K, n, stride=stride), device, warmup=1, reps=reps))
    # LipBound: FFT of the kernel on its default S x S grid (S independent of n), one SVD per frequency
    S = max(k, math.ceil(math.pi * 2 * ((k + stride - 1) // stride - 1) / 2 / LIPBOUND_ALPHA))
    if S * S * co * ci * stride ** 2 * 8 / 2 / 1e9 * 3 <= max_fft_gb:
        res["LipBound (certified, alpha 0.1)"] = (float(lipbound(K, stride=stride)),
                                                  time_fn(lambda: lipbound(K, stride=stride), device, warmup=1,
                                                          reps=reps))
    for name, (val, ms) in res.items():
        rows.append({"kernel": f"{co},{ci},{k},{k}", "stride": stride, "n": n, "method": name, "value": val,
                     "ratio to exact": val / ex, "time_ms": ms})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--channels", default="64,128,256,512")
    p.add_argument("--kernel-sizes", default="3,5,7")
    p.add_argument("--input-sizes", default="32,64,224")
    p.add_argument("--resnet-max", type=int, default=512, help="largest channel count of the ResNet-18 list")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--exact-iters", type=int, default=50)
    p.add_argument("--max-fft-gb", type=float, default=4.0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N) (default: torch's choice)")
    p.add_argument("--no-write", action="store_true", help="do not write docs/results/bench/KEY.md")
    args = p.parse_args(argv)
    if args.threads is not None:
        if args.threads < 1:
            p.error(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    ints = lambda s: [int(x) for x in s.split(",")]
    dev = torch.device(args.device)
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for n in ints(args.input_sizes):
        for k in ints(args.kernel_sizes):
            for c in ints(args.channels):
                rows += bench_kernel(torch.randn(c, c, k, k, generator=gen, device=dev), 1, n, dev, args.reps,
                                     args.max_fft_gb, args.exact_iters)
                print(markdown_table(rows[-1:]), flush=True)
        for co, ci, k, s in RESNET18:
            if max(co, ci) <= args.resnet_max:
                K = torch.randn(co, ci, k, k, generator=gen, device=dev) * (2.0 / (ci * k * k)) ** 0.5
                rows += bench_kernel(K, s, n, dev, args.reps, args.max_fft_gb, args.exact_iters)
    env = environment()
    text = (f"## conv ({env['device']})\n\ndevice: {env['device']} · torch {env['torch']} · {env['date']} · "
            f"{torch.get_num_threads()} CPU threads\n\n"
            f"command: `{command_line()}`\n\n" + markdown_table(rows) + "\n")
    print(text)
    if not args.no_write:
        write_section(f"conv-{dev.type}", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
