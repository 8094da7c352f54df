"""Eigenvalue functions against the float64 numpy eigh oracle."""

import numpy as np
import pytest
import torch

from spectrakit.linalg import eig_clip, eig_hardcap, eig_relu, eig_stepfun, proj_nsd, proj_psd, sym
from spectrakit.linalg._testing import eig_map, rel_err, symmetric_with_eigs


def _spectra(n):
    g = torch.Generator().manual_seed(1)
    return {
        "gauss": torch.randn(n, generator=g, dtype=torch.float64) * 3,
        "clustered": torch.cat([torch.full((n // 2,), 1.0), torch.full((n - n // 2,), -1.0)])
        + 1e-4 * torch.randn(n, generator=g, dtype=torch.float64),
        "repeated_zero": torch.cat([torch.zeros(n // 3), torch.full((n // 3,), 2.0),
                                    torch.full((n - 2 * (n // 3),), -0.5)]).double(),
        "wide_range": torch.logspace(-4, 2, n, dtype=torch.float64)
        * torch.where(torch.arange(n) % 2 == 0, 1, -1),
    }


CASES = [
    ("eig_clip", lambda w, **k: eig_clip(w, -1.5, 0.7, **k), lambda l: np.clip(l, -1.5, 0.7)),
    ("eig_relu", lambda w, **k: eig_relu(w, 0.3, **k), lambda l: np.maximum(l, 0.3)),
    ("eig_hardcap", lambda w, **k: eig_hardcap(w, -0.2, **k), lambda l: np.minimum(l, -0.2)),
    ("proj_psd", lambda w, **k: proj_psd(w, **k), lambda l: np.maximum(l, 0)),
    ("proj_nsd", lambda w, **k: proj_nsd(w, **k), lambda l: np.minimum(l, 0)),
]


@pytest.mark.parametrize("n", [48, 96])
@pytest.mark.parametrize("spectrum", ["gauss", "clustered", "repeated_zero", "wide_range"])
@pytest.mark.parametrize("name,fn,ref", CASES, ids=[c[0] for c in CASES])
def test_fp32_accuracy(n, spectrum, name, fn, ref):
    w = symmetric_with_eigs(n, _spectra(n)[spectrum]).float()
    assert rel_err(fn(w), eig_map(w, ref)) <= 1e-3
    assert rel_err(fn(w.double(), method="exact"), eig_map(w, ref)) <= 1e-10


def test_stepfun_projector_away_from_threshold():
    lam = torch.cat([torch.linspace(-3, -0.1, 30), torch.linspace(0.1, 3, 34)]).double()
    w = symmetric_with_eigs(64, lam).float()
    p = eig_stepfun(w, 0.0)
    ref = eig_map(w, lambda l: (l > 0).astype(float))
    assert rel_err(p, ref) <= 1e-3
    assert torch.allclose(p @ p, p, atol=1e-3)  # a projector
    assert abs(float(torch.trace(p)) - 34) < 1e-2
    # threshold exactly at a (repeated, exactly representable) eigenvalue: sign(0) = 0 gives 1/2 there
    w2 = torch.diag(torch.tensor([1.0] * 5 + [3.0] * 5 + [-2.0] * 5))
    expected = torch.diag(torch.tensor([0.5] * 5 + [1.0] * 5 + [0.0] * 5))
    for method in ("polar", "exact"):
        assert torch.allclose(eig_stepfun(w2, 1.0, method=method), expected, atol=1e-5)


def test_identities():
    w = symmetric_with_eigs(40, torch.randn(40, dtype=torch.float64)).float()
    assert torch.allclose(proj_psd(w) + proj_nsd(w), w, atol=1e-4)
    assert torch.allclose(eig_clip(w, -10.0, 0.5), eig_hardcap(w, 0.5), atol=1e-4)
    a = torch.randn(5, 5)
    assert torch.allclose(sym(a), (a + a.T) / 2) and torch.allclose(sym(a), sym(a).T)


@pytest.mark.parametrize("method", ["polar", "exact"])
def test_batched_per_matrix_thresholds_equal_loop(method):
    w = torch.stack([symmetric_with_eigs(32, torch.randn(32, dtype=torch.float64)) for _ in range(3)]).float()
    lo = torch.tensor([-1.0, 0.0, 0.5])
    hi = torch.tensor([1.0, 0.2, 2.0])
    out = eig_clip(w, lo, hi, method=method)
    t_out = eig_stepfun(w, lo, method=method)
    for i in range(3):
        assert torch.allclose(out[i], eig_clip(w[i], float(lo[i]), float(hi[i]), method=method), atol=1e-4)
        assert torch.allclose(t_out[i], eig_stepfun(w[i], float(lo[i]), method=method), atol=1e-4)


def test_nonsymmetric_input_is_symmetrised_and_noncontiguous():
    a = torch.randn(24, 24)
    at = a.T  # non-contiguous
    assert rel_err(proj_psd(at), eig_map(at, lambda l: np.maximum(l, 0))) <= 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_zero_input(dtype):
    z = torch.zeros(2, 8, 8, dtype=dtype)
    for out in (proj_psd(z), proj_nsd(z), eig_relu(z, 0.0), eig_clip(z, 0.0, 0.0)):
        assert out.dtype == dtype and torch.equal(out, torch.zeros_like(out))
    assert torch.allclose(eig_relu(z, 1.0).float(), torch.eye(8).expand(2, 8, 8))


def test_bf16_compute():
    w = symmetric_with_eigs(48, torch.randn(48, dtype=torch.float64) * 2).float()
    out = eig_relu(w, 0.1, dtype=torch.bfloat16)
    assert out.dtype == torch.float32 and rel_err(out, eig_map(w, lambda l: np.maximum(l, 0.1))) <= 3e-2


def test_far_clipped_eigenvalues_cost_no_first_order_error():
    # A cluster at 1e3 capped near 0, and a clip band inside a +-[1e-3, 1e3] spectrum: in the old identity
    # form ((t I - W) sign(t I - W) etc.) a sign error cost eps |lambda|: measured fp32 2.5e-4..2.1e-3,
    # bf16 5..40. The shifted-sandwich form keeps only second-order terms there; in bf16 it also needs the
    # sign's eigenvectors (fp32 steps up to polar.CLIP_BF16_SWITCH, symmetrised signs): measured <= 1.4e-2.
    g = torch.Generator().manual_seed(3)
    cluster = torch.cat([torch.full((10,), 1e3), torch.full((40,), 0.5), torch.zeros(20), torch.full((26,), -2.0)])
    wide = torch.cat([torch.logspace(-3, 3, 48), -torch.logspace(-3, 3, 48)])
    for lam in (cluster, wide):
        w = symmetric_with_eigs(96, lam.double(), gen=g).float()
        for t in (0.0, 1.0):
            ref = eig_map(w, lambda x, t=t: np.minimum(x, t))
            assert rel_err(eig_hardcap(w, t), ref) <= 1e-4, t
            assert rel_err(eig_hardcap(w, t, dtype=torch.bfloat16), ref) <= 3e-2, t
        for lo, hi in ((-1.0, 1.0), (0.1, 0.2)):
            ref = eig_map(w, lambda x, lo=lo, hi=hi: np.clip(x, lo, hi))
            assert rel_err(eig_clip(w, lo, hi), ref) <= 1e-4, (lo, hi)
            assert rel_err(eig_clip(w, lo, hi, dtype=torch.bfloat16), ref) <= 3e-2, (lo, hi)
    # relu of large negative eigenvalues: max(lambda, lo) = lo exactly up to second-order terms
    w = symmetric_with_eigs(96, -wide.double().abs() - 1.0, gen=g).float()
    assert rel_err(eig_relu(w, 0.5), eig_map(w, lambda x: np.maximum(x, 0.5))) <= 1e-4


def test_gradient_exists():
    w = torch.randn(6, 6, dtype=torch.float64, requires_grad=True)
    eig_relu(w, 0.1).sum().backward()
    assert torch.isfinite(w.grad).all()


@pytest.mark.parametrize("call,exc,name", [
    (lambda: eig_clip(torch.randn(3, 4), 0.0, 1.0), ValueError, "W"),
    (lambda: eig_clip(torch.randn(3, 3), 1.0, 0.0), ValueError, "lo"),
    (lambda: eig_clip(torch.randn(3, 3), float("nan"), 1.0), ValueError, "lo"),
    (lambda: eig_relu(torch.randn(3, 3), float("inf")), ValueError, "lo"),
    (lambda: eig_hardcap(torch.randn(2, 3, 3), torch.ones(3)), ValueError, "hi"),
    (lambda: eig_stepfun(torch.tensor([[1.0, float("nan")], [0.0, 1.0]])), ValueError, "W"),
    (lambda: proj_psd(torch.randn(3, 3), method="eig"), ValueError, "method"),
    (lambda: proj_psd(torch.ones(3, 3, dtype=torch.int32)), TypeError, "W"),
    (lambda: sym(torch.randn(3, 4)), ValueError, "W"),
])
def test_invalid_arguments(call, exc, name):
    with pytest.raises(exc, match=name):
        call()
