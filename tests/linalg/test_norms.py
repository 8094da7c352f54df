"""spectral_norm (power iteration) and subspace_distance against float64 oracles."""

import pytest
import torch

from spectrakit.linalg import spectral_norm, subspace_distance
from spectrakit.linalg._testing import matrix_with_spectrum


@pytest.mark.parametrize("shape", [(64, 192), (96, 96), (128, 48)])
def test_power_iteration_converges(shape):
    spectrum = torch.cat([torch.tensor([2.0]), torch.linspace(1.5, 0.1, min(shape) - 1)])
    x = matrix_with_spectrum(*shape, spectrum)
    val, v = spectral_norm(x.float(), iters=60)
    assert abs(float(val) - 2.0) < 1e-3
    assert abs(float(v.norm()) - 1) < 1e-5
    # lower bound property (up to rounding) and warm start: 1 more step from v stays converged
    assert float(val) <= 2.0 * (1 + 1e-5)
    val2, _ = spectral_norm(x.float(), iters=1, v0=v)
    assert abs(float(val2) - 2.0) < 1e-3


def test_batched_equals_loop_and_exact():
    x = torch.randn(3, 2, 20, 30, dtype=torch.float64)
    val, v = spectral_norm(x, iters=300)
    assert val.shape == (3, 2) and v.shape == (3, 2, 30)
    assert torch.allclose(val, torch.linalg.matrix_norm(x, 2), rtol=1e-6)
    v0 = torch.randn(3, 2, 30, dtype=torch.float64)
    val_b, _ = spectral_norm(x, iters=5, v0=v0)
    for i in range(3):
        for j in range(2):
            vij, _ = spectral_norm(x[i, j], iters=5, v0=v0[i, j])
            assert torch.allclose(val_b[i, j], vij)


def test_warm_start_beats_cold_start():
    x = matrix_with_spectrum(50, 70, torch.linspace(1.0, 0.9, 50))  # small gap: slow convergence
    exact = 1.0
    _, v = spectral_norm(x, iters=200)
    warm, _ = spectral_norm(x + 1e-4 * torch.randn(50, 70, dtype=torch.float64), iters=1, v0=v)
    cold, _ = spectral_norm(x, iters=1)
    assert abs(float(warm) - exact) < abs(float(cold) - exact)


def test_zero_and_bf16():
    val, v = spectral_norm(torch.zeros(2, 5, 4))
    assert torch.equal(val, torch.zeros(2)) and torch.isfinite(v).all()
    xb = torch.randn(16, 24).bfloat16()
    val, _ = spectral_norm(xb, iters=100)
    assert val.dtype == torch.bfloat16
    assert abs(float(val) / float(torch.linalg.matrix_norm(xb.double(), 2)) - 1) < 1e-2


def test_spectral_norm_invalid():
    with pytest.raises(ValueError, match="iters"):
        spectral_norm(torch.randn(3, 3), iters=-1)
    with pytest.raises(ValueError, match="v0"):
        spectral_norm(torch.randn(3, 4), v0=torch.randn(3))
    with pytest.raises(ValueError, match="W"):
        spectral_norm(torch.randn(4))


@pytest.mark.parametrize("m,r", [(30, 4), (64, 10)])
def test_subspace_distance_vs_scipy_angles(m, r):
    import numpy as np
    import scipy.linalg  # ~1 s to import: only where this oracle runs

    u1, _ = torch.linalg.qr(torch.randn(m, r, dtype=torch.float64))
    u2, _ = torch.linalg.qr(torch.randn(m, r, dtype=torch.float64))
    ang = scipy.linalg.subspace_angles(u1.numpy(), u2.numpy())
    assert float(subspace_distance(u1, u2)) == pytest.approx(np.sin(ang.max()), abs=1e-10)
    assert float(subspace_distance(u1, u2, "chordal")) == pytest.approx(np.sqrt(np.mean(np.sin(ang) ** 2)),
                                                                        abs=1e-10)
    # same subspace, different basis -> 0; orthogonal complement -> 1
    q, _ = torch.linalg.qr(torch.randn(r, r, dtype=torch.float64))
    assert float(subspace_distance(u1, u1 @ q)) < 1e-7
    full, _ = torch.linalg.qr(torch.randn(m, m, dtype=torch.float64))
    assert float(subspace_distance(full[:, :r], full[:, r:2 * r])) == pytest.approx(1.0)
    # batched
    b = subspace_distance(torch.stack([u1, u1]), torch.stack([u2, u1 @ q]), "chordal")
    assert b.shape == (2,) and float(b[1]) < 1e-7


def test_subspace_distance_invalid():
    with pytest.raises(ValueError, match="U1"):
        subspace_distance(torch.randn(5, 2), torch.randn(5, 3))
    with pytest.raises(ValueError, match="kind"):
        subspace_distance(torch.randn(5, 2), torch.randn(5, 2), kind="frobenius")
