"""spectral_clip / spectral_hardcap / spectral_relu against the float64 numpy SVD oracle."""

import numpy as np
import pytest
import torch

from spectrakit.linalg import spectral_clip, spectral_hardcap, spectral_relu
from spectrakit.linalg._testing import matrix_with_spectrum, rel_err, spiked, svd_map

SHAPES = [(64, 192), (96, 96), (128, 48)]


def _clip(x, lo, hi):
    return svd_map(x, lambda s: np.clip(s, lo, hi))


@pytest.mark.parametrize("method", ["polar", "dilation"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", ["gauss", "spike", "logspec"])
def test_hardcap_fp32_accuracy(shape, kind, method):
    m, n = shape
    if kind == "logspec":  # singular values spread over 6 decades
        x = matrix_with_spectrum(m, n, torch.logspace(0, -6, min(m, n)))
    else:
        x = spiked(m, n, 1e3) if kind == "spike" else torch.randn(m, n, dtype=torch.float64)
    x = x.float()
    smax = float(torch.linalg.matrix_norm(x.double(), 2))
    for ratio in [1e-2, 1.0, 10.0, 100.0, 1e3] + ([1e4] if method == "polar" else []):
        hi = smax / ratio
        assert rel_err(spectral_hardcap(x, hi, method=method), _clip(x, 0, hi)) <= 1e-3, ratio


def test_polar_and_dilation_routes_agree_and_threshold_above_norm_is_identity():
    x = torch.randn(3, 40, 72)
    hi = torch.tensor([0.5, 3.0, 1e3])  # the last one exceeds ||X||_F: X is returned untouched
    a = spectral_hardcap(x, hi)
    b = spectral_hardcap(x, hi, method="dilation")
    assert rel_err(a, b.double().numpy()) <= 2e-4
    assert torch.equal(a[2], x[2])
    assert torch.equal(spectral_hardcap(x, 1e30), x)
    band = spectral_clip(x, torch.tensor([0.1, 1.0, 2.0]), hi)
    band_d = spectral_clip(x, torch.tensor([0.1, 1.0, 2.0]), hi, method="dilation")
    assert rel_err(band, band_d.double().numpy()) <= 2e-4


@pytest.mark.parametrize("method", ["polar", "dilation"])
@pytest.mark.parametrize("shape", SHAPES)
def test_clip_band_fp32_accuracy(shape, method):
    m, n = shape
    x = matrix_with_spectrum(m, n, torch.logspace(0, -2, min(m, n))).float()
    for lo, hi in [(0.05, 0.5), (0.2, 0.2), (1e-3, 1e-2), (0.5, 2.0)]:
        assert rel_err(spectral_clip(x, lo, hi, method=method), _clip(x, lo, hi)) <= 1e-3, (lo, hi)
    assert rel_err(spectral_relu(x, 0.3, method=method), _clip(x, 0.3, np.inf)) <= 1e-3


@pytest.mark.parametrize("kind", ["gauss", "spike", "logspec"])
def test_polar_error_does_not_grow_with_the_ratio(kind):
    # (t I - A)_+ = P (t I - A) P: a sign error E costs E (t I - A) P (<= t) and E (t I - A) E, not E (t I - A)
    # (~ s_max). The old form (t I - A + |t I - A|) / 2 had fp32 errors 3e-4..4e-4 at s_max / t = 1e3 on these
    # inputs and bf16 errors 0.7 at 100, 7 at 1e3.
    m, n = 64, 192
    if kind == "logspec":
        x = matrix_with_spectrum(m, n, torch.logspace(0, -6, m))
    else:
        x = spiked(m, n, 1e3) if kind == "spike" else torch.randn(m, n, dtype=torch.float64)
    x = x.float()
    smax = float(torch.linalg.matrix_norm(x.double(), 2))
    for ratio in [1.0, 10.0, 100.0, 1e3]:
        t = smax / ratio
        if kind != "logspec":  # (its singular values below the sign's 1e-6 resolution cost ~3e-5)
            assert rel_err(spectral_hardcap(x, t), _clip(x, 0, t)) <= 1e-4, ratio
            assert rel_err(spectral_clip(x, t / 5, t), _clip(x, t / 5, t)) <= 1e-4, ratio
        # bf16 (issue 2: <= 3e-2): the sign iterations stay in fp32 until the tracked lower bound reaches
        # polar.CLIP_BF16_SWITCH, and the eigen-signs are symmetrised (measured <= 1e-2; with the old form,
        # a fixed 3 fp32 steps and unsymmetrised signs: 5e-2 at best, 0.1-9 at large ratios)
        out = spectral_hardcap(x, t, dtype=torch.bfloat16)
        assert out.dtype == torch.float32 and rel_err(out, _clip(x, 0, t)) <= 3e-2, ratio
        assert rel_err(spectral_clip(x, t / 5, t, dtype=torch.bfloat16), _clip(x, t / 5, t)) <= 3e-2, ratio
        assert rel_err(spectral_relu(x, t, dtype=torch.bfloat16), _clip(x, t, np.inf)) <= 3e-2, ratio


def test_bf16_moderate_ratio():
    x = torch.randn(64, 96)
    hi = float(torch.linalg.matrix_norm(x.double(), 2))
    out = spectral_hardcap(x, hi / 1.5, dtype=torch.bfloat16)
    assert out.dtype == torch.float32 and rel_err(out, _clip(x, 0, hi / 1.5)) <= 3e-2
    xb = x.bfloat16()  # bf16 input: bf16 output, the oracle sees the rounded input
    outb = spectral_hardcap(xb, hi / 1.5)
    assert outb.dtype == torch.bfloat16 and rel_err(outb, _clip(xb, 0, hi / 1.5)) <= 3e-2


def test_nested_method_matches_at_moderate_ratio():
    x = torch.randn(48, 80)
    hi = float(torch.linalg.matrix_norm(x.double(), 2)) / 3
    assert rel_err(spectral_hardcap(x, hi, method="nested"), _clip(x, 0, hi)) <= 1e-3


def test_exact_matches_numpy():
    x = torch.randn(2, 20, 30, dtype=torch.float64)
    assert rel_err(spectral_clip(x, 0.5, 2.0, method="exact"), _clip(x, 0.5, 2.0)) < 1e-12


def test_rank_deficient_relu_keeps_zero_singular_values():
    x = matrix_with_spectrum(30, 40, [2.0, 1.0, 0.05])  # rank 3
    out = spectral_relu(x.float(), 0.5)
    s = torch.linalg.svdvals(out.double())
    assert torch.allclose(s[:3], torch.tensor([2.0, 1.0, 0.5], dtype=torch.float64), atol=1e-3)
    # polar route: rounding-level singular values are raised only partly, never above lo (documented) ...
    assert s[3:].max() <= 0.5
    # ... and exactly zero singular values (zero rows) stay exactly zero
    xz = torch.cat([x.float(), torch.zeros(5, 40)])
    sz = torch.linalg.svdvals(spectral_relu(xz, 0.5).double())
    assert sz[30:].max() < 1e-6
    s_exact = torch.linalg.svdvals(spectral_relu(x, 0.5, method="exact"))
    assert torch.allclose(s_exact[3:], torch.full_like(s_exact[3:], 0.5))  # SVD route lifts them all


@pytest.mark.parametrize("method", ["polar", "dilation", "exact"])
def test_batched_per_matrix_thresholds_equal_loop(method):
    x = torch.randn(4, 24, 36)
    lo = torch.tensor([0.0, 0.5, 1.0, 2.0])
    hi = torch.tensor([1.0, 3.0, 4.0, 2.0])
    out = spectral_clip(x, lo, hi, method=method)
    for i in range(4):
        ref = spectral_clip(x[i], float(lo[i]), float(hi[i]), method=method)
        assert torch.allclose(out[i], ref, atol=1e-4)
        assert rel_err(out[i], _clip(x[i], float(lo[i]), float(hi[i]))) <= 1e-3


def test_noncontiguous_zero_identity():
    xt = torch.randn(2, 40, 24).transpose(-1, -2)
    assert rel_err(spectral_hardcap(xt, 1.0), _clip(xt, 0, 1.0)) <= 1e-3
    z = torch.zeros(3, 6, 9)
    for fn in (lambda a: spectral_hardcap(a, 1.0), lambda a: spectral_clip(a, 0.5, 1.0),
               lambda a: spectral_relu(a, 0.5)):
        out = fn(z)
        assert torch.isfinite(out).all() and torch.equal(out, torch.zeros_like(out))
    x = torch.randn(5, 7)
    assert torch.equal(spectral_clip(x), x)
    assert torch.equal(spectral_hardcap(x, float("inf")), x)


def test_gradient_exists():
    x = torch.randn(6, 9, dtype=torch.float64, requires_grad=True)
    spectral_hardcap(x, 1.0).pow(2).sum().backward()
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("kwargs,exc,name", [
    (dict(lo=-1.0), ValueError, "lo"),
    (dict(hi=0.0), ValueError, "hi"),
    (dict(lo=2.0, hi=1.0), ValueError, "lo"),
    (dict(lo=torch.tensor([2.0, 0.0]), hi=torch.tensor([1.0, 1.0])), ValueError, "lo"),
    (dict(lo=float("nan")), ValueError, "lo"),
    (dict(hi="x"), TypeError, "hi"),
    (dict(method="svd"), ValueError, "method"),
    (dict(hi=1.0, steps=0), ValueError, "steps"),
])
def test_invalid_arguments(kwargs, exc, name):
    with pytest.raises(exc, match=name):
        spectral_clip(torch.randn(2, 4, 5), **kwargs)
    with pytest.raises(ValueError, match="X"):
        spectral_hardcap(torch.tensor([[float("nan"), 1.0]]), 1.0)
