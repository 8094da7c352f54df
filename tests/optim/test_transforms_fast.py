"""The fast soft clip ``post="soft_clip_fast"`` (linalg.soft_clip(tall_steps=0)): against the float64 SVD
map, inside SpectraAdamW against the hand-written AdamW reference, its bf16 fallback, and the accurate
route (``post="soft_clip"``, alias ``"soft_clip_accurate"``)."""

from __future__ import annotations

import math

import pytest
import torch

import spectrakit.optim as O
from spectrakit.optim.transforms import POST_TRANSFORMS, PRE_TRANSFORMS
from tests.optim._reference import REFERENCES, svd_map


def _soft(U, c):
    return svd_map(U, lambda s: s / torch.sqrt(1 + (s / c) ** 2))


def _rel(a, b):
    return float(torch.linalg.norm(a.double() - b.double()) / torch.linalg.norm(b.double()))


@pytest.mark.parametrize("shape", [(6, 40, 120), (3, 64, 64), (4, 90, 30)])
@pytest.mark.parametrize("ratio", [0.1, 10.0, 40.0])
def test_fast_transform_matches_svd_on_a_batch(shape, ratio):
    g = torch.Generator().manual_seed(0)
    U = torch.randn(*shape, generator=g)
    U[0] *= 1e-3  # matrices of very different norms in one batch, one threshold
    U[-1, 0] *= 10  # a spike row (sigma_max / c of that matrix stays <= 300)
    c = float(torch.linalg.matrix_norm(U[1].double(), 2)) / ratio
    out = POST_TRANSFORMS["soft_clip_fast"](U, c)
    assert out.shape == U.shape and out.dtype == U.dtype
    for i in range(shape[0]):
        assert _rel(out[i], _soft(U[i].double(), c)) <= 1e-3, i


def test_fast_transform_bf16_compute_on_cpu_is_the_fp32_route():
    """On CPU a bf16 request computes in fp32 (the bf16 route is slower there): the same result as the
    fp32 call, and fp32 accuracy; the bf16 accurate route stays available as ``soft_clip_accurate``."""
    U = torch.randn(4, 32, 96, generator=torch.Generator().manual_seed(11))
    c = float(torch.linalg.matrix_norm(U[0].double(), 2)) / 30
    out = POST_TRANSFORMS["soft_clip_fast"](U, c, dtype=torch.bfloat16)
    ref = POST_TRANSFORMS["soft_clip_fast"](U, c)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    acc = POST_TRANSFORMS["soft_clip_accurate"](U, c, dtype=torch.bfloat16)
    for i in range(4):
        assert _rel(out[i], _soft(U[i].double(), c)) <= 1e-3
        assert _rel(acc[i], _soft(U[i].double(), c)) <= 3e-2


def test_accurate_name_is_registered_and_differs_beyond_300():
    for name in ("soft_clip_accurate", "soft_clip_fast"):
        assert name in POST_TRANSFORMS and name in PRE_TRANSFORMS
    # the optimizers' default post-transform is the fast route; the default pre-transform the accurate one
    assert POST_TRANSFORMS["soft_clip"] is POST_TRANSFORMS["soft_clip_fast"]
    assert O.SpectraAdamW([torch.zeros(3, 3, requires_grad=True)]).defaults["pre"] == "soft_clip_accurate"
    with pytest.raises(ValueError, match="post"):
        O.SpectraAdamW([torch.zeros(3, 3, requires_grad=True)], post="soft_clip_acurate")
    # beside a 1e4 spike at sigma_max/c = 1e4 only the accurate route keeps the bulk; the fast one
    # under-shoots (never above c)
    g = torch.Generator().manual_seed(5)
    U = torch.randn(1, 48, 144, generator=g)
    U[0, 0] *= 1e4
    c = float(torch.linalg.matrix_norm(U[0].double(), 2)) / 1e4
    ref = _soft(U[0].double(), c)
    assert _rel(POST_TRANSFORMS["soft_clip_accurate"](U, c)[0], ref) <= 1e-3
    fast = POST_TRANSFORMS["soft_clip_fast"](U, c)[0]
    assert _rel(fast, ref) > 1e-2
    assert float(torch.linalg.matrix_norm(fast.double(), 2)) <= c * (1 + 1e-4)


def test_accurate_route_in_the_optimizer():
    p = torch.randn(20, 30, requires_grad=True)
    q = p.detach().clone().requires_grad_()
    a = O.SpectraAdamW([p], post="soft_clip_accurate", c=0.5, lr=0.1)
    b = O.SpectraAdamW([q], post="soft_clip_exact", c=0.5, lr=0.1)
    g = torch.randn(20, 30)
    p.grad, q.grad = g.clone(), g.clone()
    a.step()
    b.step()
    torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shapes", [[(24, 40), (24, 40), (40, 24)], [(16, 4, 3, 3), (33, 17)]])
def test_spectra_adamw_with_fast_post_matches_reference(shapes):
    lr, wd, c = 1e-2, 0.1, 0.5
    init = [torch.randn(s, dtype=torch.float64) for s in shapes]
    params = [p.float().requires_grad_() for p in init]
    opt = O.SpectraAdamW(params, post="soft_clip_fast", lr=lr, weight_decay=wd, c=c)
    hp = dict(betas=opt.param_groups[0]["betas"], eps=opt.param_groups[0]["eps"])
    refs = [REFERENCES["adamw"](p, lr, wd, **hp) for p in init]
    for _ in range(5):
        grads = [torch.randn(p.shape, dtype=torch.float64) * 3 for p in params]
        for p, g in zip(params, grads):
            p.grad = g.float()
        before = [p.detach().double().clone() for p in params]
        ref_before = [r.p.clone() for r in refs]
        opt.step()
        for p, r, g, b, rb in zip(params, refs, grads, before, ref_before):
            m, n = p.shape[0], p[0].numel()
            f = lambda U, m=m, n=n, shape=p.shape: _soft(U.reshape(m, n), c).reshape(shape)
            r.step(g.float().double(), post=f, alpha=max(1.0, math.sqrt(m / n)))
            # the update (not the parameter, which barely moves) against the reference update
            assert _rel(p.detach().double() - b, r.p - rb) <= 2e-3
