"""Study: spectrakit ``Muon``'s eager step against ``torch.optim.Muon`` on a GPU, and where they differ.

On the 2-D parameters of the 2-layer LLaMA sets of ``bench_optim.width_shapes`` (d = 256 and 1024): 25
interleaved rounds of torch.optim.Muon, ours (batched Newton-Schulz on the GPU), ours with the per-matrix loop
forced (torch's own calls, the CPU default) and ours with ``check_finite=False``; medians of the synchronised
step time and of the host-side time (until ``step()`` returns); then the GPU kernels of one profiled step and a
cProfile of 20 of our steps (d = 256).

Usage: ``python benchmarks/studies/study_muon_gpu.py`` (needs CUDA). Results: docs/BENCHMARKS.md ("H100 results").
"""
import cProfile
import io
import os
import pstats
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from bench_optim import width_shapes  # noqa: E402

import spectrakit.linalg.polar as polar  # noqa: E402
import spectrakit.optim as O  # noqa: E402

KINDS = ["torch", "ours", "ours per-matrix", "ours nocheck"]
_batched = polar._frobenius_iterate


def _per_matrix(x, coeffs, out_dtype=None, transposed=False, per_matrix=None):
    return _batched(x, coeffs, out_dtype, transposed, True)


def make(kind, d, dev):
    torch.manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(s, device=dev)) for s in width_shapes(d) if len(s) == 2]
    for p in ps:
        p.grad = torch.randn_like(p)
    if kind == "torch":
        return torch.optim.Muon(ps, lr=0.02)
    return O.Muon(ps, lr=0.02, check_finite=kind != "ours nocheck")


def step(kind, opt):
    polar._frobenius_iterate = _per_matrix if kind == "ours per-matrix" else _batched
    opt.step()


def profile_kernels(kind, opt, d):
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        step(kind, opt)
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    total = sum(e.self_device_time_total for e in kernels) / 1e3
    print(f"d={d} {kind}: {sum(e.count for e in kernels)} GPU kernels, {total:.3f} ms GPU time")
    for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:6]:
        print(f"     {e.count:4d} {e.self_device_time_total / 1e3:8.3f} ms {e.key[:90]}")


def main():
    if not torch.cuda.is_available():
        sys.exit("error: this study needs a CUDA device")
    dev = torch.device("cuda")
    for d in (256, 1024):
        opts = {k: make(k, d, dev) for k in KINDS}
        for k, opt in opts.items():
            for _ in range(3):
                step(k, opt)
        wall = {k: [] for k in KINDS}
        host = {k: [] for k in KINDS}
        for _ in range(25):
            for k, opt in opts.items():
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                step(k, opt)
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                wall[k].append(time.perf_counter() - t0)
                host[k].append(t1 - t0)
        for k in KINDS:
            print(f"d={d} {k:16s} step {statistics.median(wall[k]) * 1e3:8.3f} ms  "
                  f"host-side {statistics.median(host[k]) * 1e3:8.3f} ms")
        for k in KINDS[:3]:
            profile_kernels(k, opts[k], d)
        if d == 256:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(20):
                step("ours", opts["ours"])
            torch.cuda.synchronize()
            prof.disable()
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(22)
            print(out.getvalue()[:6000])


if __name__ == "__main__":
    main()
