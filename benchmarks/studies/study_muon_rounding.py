"""Study: can a one-rounding difference in Muon's momentum explain a compiled step that differs from the eager one?

Two eager ``Muon`` optimizers on the parameters of ``study_compile_equal.py`` (four matrices, four steps with the
same gradients); after every step half the entries of the second one's momentum buffers move by one ulp (float32),
as a compiled graph that rounds the momentum's ``lerp`` differently would. Prints the largest parameter difference
relative to the largest entry (``study_compile_equal.py``'s measure), for the bf16 Newton-Schulz (Muon's) and with
``post_dtype="float32"``, over three random choices of the moved entries.

Usage: ``python benchmarks/studies/study_muon_rounding.py``. Results: docs/BENCHMARKS.md ("H100 results (2026-11-26,
evening)").
"""
import torch

import spectrakit.optim as O

SHAPES = [(64, 32), (64, 32), (32, 64), (48, 48)]


def run(post_dtype: str | None, seed: int) -> float:
    gen = torch.Generator().manual_seed(0)
    init = [torch.randn(s, generator=gen) for s in SHAPES]
    grads = [[torch.randn(s, generator=gen) for s in SHAPES] for _ in range(4)]
    a = [torch.nn.Parameter(t.clone()) for t in init]
    b = [torch.nn.Parameter(t.clone()) for t in init]
    kw = dict(lr=0.02) if post_dtype is None else dict(lr=0.02, post_dtype=post_dtype)
    oa, ob = O.Muon(a, **kw), O.Muon(b, **kw)
    pick = torch.Generator().manual_seed(seed + 1)
    for gs in grads:
        for pa, pb, g in zip(a, b, gs):
            pa.grad, pb.grad = g.clone(), g.clone()
        oa.step()
        ob.step()
        for p in b:
            m = ob.state[p]["momentum_buffer"]
            up = torch.nextafter(m, torch.full_like(m, float("inf")))
            m.copy_(torch.where(torch.rand(m.shape, generator=pick) < 0.5, up, m))
    return max(((x - y).abs().max() / x.abs().max()).item() for x, y in zip(a, b))


def main():
    torch.set_num_threads(1)
    for post_dtype in (None, "float32"):
        diffs = ", ".join(f"{run(post_dtype, s):.1e}" for s in range(3))
        print(f"post_dtype={post_dtype or 'bfloat16 (Muon)'}: max rel diff {diffs}")


if __name__ == "__main__":
    main()
