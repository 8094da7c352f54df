"""Muon / D-Muon presets against the published update (Jordan et al. 2024; Liu et al. 2025), and the
linalg-backed post-transforms against exact SVD references."""

from __future__ import annotations

import math

import pytest
import torch

import spectrakit.optim as O
from spectrakit.linalg import bf16_matmul_override
from tests.optim._reference import newton_schulz5, polar_exact, svd_map

SHAPES = [(8, 5), (5, 8), (8, 5), (4, 3, 3, 3)]


def _keller_muon_step(p, buf, g, lr, wd, beta, ns):
    """Muon's published step: buf.lerp_(g, 1 - beta); U = g.lerp(buf, beta); U = NS(U) * max(1, m/n)^0.5."""
    buf.lerp_(g, 1 - beta)
    U = g.lerp(buf, beta)
    shape = U.shape
    U = ns(U.reshape(shape[0], -1)).reshape(shape)
    return p * (1 - lr * wd) - lr * max(1.0, shape[0] / U[0].numel()) ** 0.5 * U.to(p.dtype)


def _linalg_ns5(dtype):
    import spectrakit.linalg as L

    return lambda U: L.msign(U.float(), schedule="muon", dtype=dtype, normalize="frobenius").double()


@pytest.mark.parametrize(
    "post,post_dtype,ns,tol",
    [
        ("newton_schulz5", "float32", _linalg_ns5(torch.float32), 1e-4),
        ("newton_schulz5", "bfloat16", _linalg_ns5(torch.bfloat16), 3e-2),
        ("orthogonalize", "float32", polar_exact, 1e-2),
    ],
)
@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_muon_matches_published_update(post, post_dtype, ns, tol, wd):
    """Each step's update equals Muon's published rule (Nesterov EMA momentum, Keller's scale and decay)
    with the quintic (3.4445, -4.7750, 2.0315) x 5 of ``linalg.msign(schedule="muon", normalize="frobenius")``
    (bit-identical to torch.optim.Muon's, tests/optim/test_conformance.py), or with the
    exact SVD polar factor for post="orthogonalize"; error relative to the update's norm. bf16 is forced on
    (the optimizer would compute in fp32 where bf16 matmuls are emulated; the published rule is bf16)."""
    lr = 0.02
    init = [torch.randn(s, dtype=torch.float64) for s in SHAPES]
    params = [p.float().requires_grad_() for p in init]
    opt = O.Muon(params, lr=lr, weight_decay=wd, post=post, post_dtype=post_dtype)
    bufs = [torch.zeros(s, dtype=torch.float64) for s in SHAPES]
    for _ in range(10):
        grads = [torch.randn(s, dtype=torch.float64) for s in SHAPES]
        before = [p.detach().double().clone() for p in params]
        for p, g in zip(params, grads):
            p.grad = g.float()
        with bf16_matmul_override(True if post_dtype == "bfloat16" else None):
            opt.step()
        for p, b, buf, g in zip(params, before, bufs, grads):
            ref = _keller_muon_step(b, buf, g, lr, wd, 0.95, ns)
            delta, ref_delta = p.detach().double() - b, ref - b
            assert (delta - ref_delta).norm() <= tol * ref_delta.norm()


@pytest.mark.parametrize("shape", [(8, 5), (5, 8), (64, 16)])
def test_ns5_output_band(shape):
    """Keller's NS5 (Frobenius start, written in tests/optim/_reference.py) and linalg's muon schedule are
    both approximate polar factors: same singular vectors, singular values in [0.6, 1.25]."""
    import spectrakit.linalg as L

    G = torch.randn(shape, dtype=torch.float64)
    for out in (newton_schulz5(G.float()).double(), L.msign(G.float(), schedule="muon").double()):
        s = torch.linalg.svdvals(out)
        assert float(s.min()) > 0.6 and float(s.max()) < 1.25
        P = polar_exact(G)
        assert (out - P).norm() <= 0.4 * P.norm()


def test_dmuon_scale():
    """D-Muon: ||delta||_2 ~ lr * 0.2 sqrt(max(m, n)) (singular values of NS5 output in ~[0.7, 1.2])."""
    w = torch.nn.Parameter(torch.randn(64, 16))
    opt = O.DMuon([w], lr=0.01, weight_decay=0.0, post="orthogonalize", post_dtype="float32")
    w.grad = torch.randn(64, 16)
    before = w.detach().clone()
    opt.step()
    s = torch.linalg.svdvals((w.detach() - before).double())
    torch.testing.assert_close(s, torch.full_like(s, 0.01 * 0.2 * math.sqrt(64)), rtol=1e-2, atol=0)


@pytest.mark.parametrize("ratio", [1e-2, 1.0, 1e2, 1e3])
@pytest.mark.parametrize("post_dtype,tol", [("float32", 2e-3), ("bfloat16", 5e-2)])
def test_linalg_soft_clip_matches_exact(ratio, post_dtype, tol):
    """post="soft_clip_accurate" (linalg, polar route) vs the float64 SVD map s/sqrt(1+s^2/c^2), ill-conditioned U."""
    c = 0.5
    Ps = [torch.nn.Parameter(torch.zeros(16, 8)) for _ in range(3)]
    opt = O.SGD(Ps, post="soft_clip_accurate", lr=1.0, momentum=0.0, c=c, post_dtype=post_dtype, scale=1.0)
    grads = []
    for P in Ps:
        Q1, _ = torch.linalg.qr(torch.randn(16, 8))
        Q2, _ = torch.linalg.qr(torch.randn(8, 8))
        s = torch.logspace(0, -4, 8)
        g = (Q1 * s) @ Q2.T * (ratio * c)
        P.grad = g.clone()
        grads.append(g)
    opt.step()
    for P, g in zip(Ps, grads):
        ref = -svd_map(g, lambda s: s / torch.sqrt(1 + (s / c) ** 2))
        assert (P.detach().double() - ref).norm() <= tol * ref.norm()
