"""The same accuracy targets on CUDA (skipped without a GPU): fp32 and bf16 against float64 oracles."""

import numpy as np
import pytest
import torch

import spectrakit.linalg as L
from spectrakit.linalg._testing import eig_map, rel_err, spiked, svd_map, symmetric_with_eigs

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("shape", [(256, 768), (512, 512), (768, 256)])
def test_soft_clip_cuda(shape):
    x = spiked(*shape, 1e3).float()
    smax = float(torch.linalg.matrix_norm(x.double(), 2))
    xc = x.cuda()
    for ratio in (1e-2, 1.0, 30.0, 1e3):
        c = smax / ratio
        ref = svd_map(x, lambda s, c=c: s / np.sqrt(1 + (s / c) ** 2))
        assert rel_err(L.soft_clip(xc, c), ref) <= 1e-3
        assert rel_err(L.soft_clip(xc, c, dtype=torch.bfloat16), ref) <= 3e-2


def test_msign_hardcap_eig_cuda():
    x = torch.randn(128, 384)
    xc = x.cuda()
    s = torch.linalg.svdvals(L.msign(xc).double().cpu())
    assert (s - 1).abs().max() < 1e-3
    hi = float(torch.linalg.matrix_norm(x.double(), 2)) / 10
    assert rel_err(L.spectral_hardcap(xc, hi), svd_map(x, lambda v: np.minimum(v, hi))) <= 1e-3
    w = symmetric_with_eigs(128, torch.randn(128, dtype=torch.float64)).float()
    assert rel_err(L.eig_clip(w.cuda(), -0.5, 0.5), eig_map(w, lambda v: np.clip(v, -0.5, 0.5))) <= 1e-3
    val, _ = L.spectral_norm(xc, iters=200)
    assert abs(float(val) / float(torch.linalg.matrix_norm(x.double(), 2)) - 1) < 1e-3


def test_batched_per_matrix_threshold_cuda():
    x = torch.randn(6, 64, 96, device="cuda")
    c = torch.logspace(-1, 1, 6, device="cuda")
    out = L.soft_clip(x, c)
    for i in range(6):
        assert torch.allclose(out[i], L.soft_clip(x[i], float(c[i])), atol=1e-4)


@pytest.mark.parametrize("reg,p", [("frobenius", None), ("nuclear", None), ("schatten", 3.0), ("entropy", None)])
def test_spectral_lmo_cuda_no_sync(reg, p):
    """spectral_lmo on CUDA: fp32/bf16 against the float64 SVD map, with host syncs turned into errors."""
    x = spiked(256, 768, 1e2).float()
    b, d = 0.05 * float(torch.linalg.matrix_norm(x.double(), 2)), 3.0
    fn = {"frobenius": lambda s: np.minimum(s / b, d), "nuclear": lambda s: np.where(s > b, d, 0.0),
          "schatten": lambda s: np.minimum(np.sqrt(s / b), d), "entropy": lambda s: np.minimum(np.exp(s / b), d)}[reg]
    ref = -svd_map(x, fn)
    xc = x.cuda()
    L.spectral_lmo(xc, reg, b=b, radius=d, p=p)  # warm the host-side schedule caches
    torch.cuda.synchronize()
    from spectrakit._checks import no_value_checks

    torch.cuda.set_sync_debug_mode("error")
    try:
        with no_value_checks():
            out = L.spectral_lmo(xc, reg, b=b, radius=d, p=p)
            out16 = L.spectral_lmo(xc, reg, b=b, radius=d, p=p, dtype=torch.bfloat16)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert rel_err(out, ref) <= 1e-3 and rel_err(out16, ref) <= 3e-2
