"""Study: does the compiled step (``torch.compile(opt.step, backend=...)``) equal the eager step bit for bit?

Five parameters ((64, 32) twice, (32, 64), (48, 48), (32,)), four steps with fresh gradients, one of them with a
NaN (a skipped step); prints, per optimizer and backend, whether the parameters are bit-identical and the
largest difference relative to the largest entry.

Usage: ``python benchmarks/study_compile_equal.py [--device cuda] [--names SpectraAdamW,Muon]
[--backends aot_eager] [--post-dtype float32]``. Results: docs/BENCHMARKS.md ("H100 results", fourth run).
"""
import argparse
import time

import torch

import spectrakit.optim as O

SHAPES = [(64, 32), (64, 32), (32, 64), (48, 48), (32,)]


def compare(name: str, backend: str, dev: str, post_dtype: str | None = None) -> str:
    torch._dynamo.reset()
    gen = torch.Generator(device=dev).manual_seed(0)
    init = [torch.randn(s, device=dev, generator=gen) for s in SHAPES]
    grads = [[torch.randn(s, device=dev, generator=gen) for s in SHAPES] for _ in range(4)]
    grads[2][0][0, 0] = float("nan")
    eager_ps = [torch.nn.Parameter(t.clone()) for t in init]
    traced_ps = [torch.nn.Parameter(t.clone()) for t in init]
    kw = dict(lr=0.02) if "Muon" in name else dict(lr=1e-2)
    if post_dtype is not None and "Muon" in name:
        kw["post_dtype"] = post_dtype
    eager, traced = getattr(O, name)(eager_ps, **kw), getattr(O, name)(traced_ps, **kw)
    step = torch.compile(traced.step, backend=backend)
    for gs in grads:
        for pa, pb, g in zip(eager_ps, traced_ps, gs):
            pa.grad, pb.grad = g.clone(), g.clone()
        eager.step()
        step()
    rel = max(((a - b).abs().max() / a.abs().max().clamp_min(1e-30)).item() for a, b in zip(eager_ps, traced_ps))
    same = all(torch.equal(a, b) for a, b in zip(eager_ps, traced_ps))
    return f"bit-identical={same} max rel diff {rel:.2e}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--names", default="SpectraAdamW,SpectraSignum,Muon,Lion,AdamW")
    ap.add_argument("--backends", default="aot_eager")
    ap.add_argument("--post-dtype", default=None,
                    help="the Muons' Newton-Schulz dtype (post_dtype), e.g. float32; default: the optimizer's")
    a = ap.parse_args()
    for name in a.names.split(","):
        for backend in a.backends.split(","):
            t0 = time.time()
            try:
                out = compare(name, backend, a.device, a.post_dtype)
            except Exception as e:  # a backend that fails to compile is a result here
                out = f"FAILED {type(e).__name__}: {str(e)[:300]}"
            print(f"{name:14s} {backend:10s} {out} ({time.time() - t0:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
