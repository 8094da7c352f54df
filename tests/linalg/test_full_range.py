"""Every public matrix function over the whole floating-point range of each dtype, against float64 oracles.

Seeded grid (explicit integer seeds): input scales from subnormal numbers to the top of each dtype (where the
Frobenius norm of a finite input is not representable), thresholds scaled with the input and extreme ones on
both sides, empty and 1xN / Nx1 shapes, and gradients at each scale (homogeneous functions: the gradient
does not depend on the scale). Errors: relative Frobenius error against ``numpy.linalg.svd``/``eigh`` on the
very same input, plus the rounding of an output that is itself subnormal (``sqrt(numel)`` times the
dtype's subnormal spacing).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import spectrakit.linalg as L
from spectrakit.linalg._testing import eig_map, np64, svd_map

# (dtype, scales of max|X|, relative tolerance). The top scale (finfo.max / 3.5) has sigma_max < finfo.max but
# ||X||_F > finfo.max for these 12x20 matrices.
GRID = {
    torch.float32: ([1e-44, 1e-40, 1e-30, 1.0, 1e30, 1e37, 9.7e37], 1e-3),
    torch.float64: ([1e-320, 1e-300, 1.0, 1e300, 5.1e307], 1e-5),
    torch.bfloat16: ([1e-39, 1e-30, 1.0, 1e30, 9.7e37], 3e-2),
    torch.float16: ([1e-6, 1e-3, 1.0, 1.8e4], 3e-3),
}


def _sub(dtype) -> float:
    fi = torch.finfo(dtype)
    return fi.tiny * fi.eps


def _x(seed: int, m: int = 12, n: int = 20) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, n, dtype=torch.float64, generator=g)
    return x / x.abs().max()


def _w(seed: int, n: int = 12) -> torch.Tensor:
    x = _x(seed, n, n)
    return (x + x.T) / 2 / ((x + x.T) / 2).abs().max()


def _unit(x: torch.Tensor) -> tuple[float, torch.Tensor]:
    """``(p, x / p)`` in float64 with ``p`` a power of two near ``max|x|`` (exact): the oracles run on ``x / p``
    (numpy's SVD overflows for entries near 1e308)."""
    a = float(x.detach().abs().max().double())
    p = 2.0 ** math.floor(math.log2(a)) if a > 0 else 1.0
    return p, x.detach().double() / p


def _check(out: torch.Tensor, ref: np.ndarray, tol: float, dtype, what, p: float = 1.0) -> None:
    """``out / p`` against ``ref`` (the oracle of ``x / p``): relative Frobenius error <= tol, plus the rounding
    of subnormal output entries."""
    assert out.dtype == dtype and torch.isfinite(out).all(), what
    o = np64(out) / p
    err = np.linalg.norm(o - ref)
    bound = tol * np.linalg.norm(ref) + math.sqrt(out.numel()) * _sub(dtype) / p * 2
    assert err <= bound, (what, err / max(np.linalg.norm(ref), 1e-300))


def _soft(c):
    return lambda s: s * c / np.hypot(c, s)


MATRIX_CASES = {
    # name: (function of (x, smax), oracle map on singular values given smax)
    "msign": (lambda x, sm: L.msign(x), lambda sm: lambda s: (s > 1e-5 * sm).astype(float)),
    "orthogonalize": (lambda x, sm: L.orthogonalize(x), lambda sm: lambda s: (s > 1e-5 * sm).astype(float)),
    "soft_clip": (lambda x, sm: L.soft_clip(x, 0.3 * sm), lambda sm: _soft(0.3 * sm)),
    "spectral_hardcap": (lambda x, sm: L.spectral_hardcap(x, 0.5 * sm), lambda sm: lambda s: np.minimum(s, 0.5 * sm)),
    "spectral_clip": (lambda x, sm: L.spectral_clip(x, 0.2 * sm, 0.5 * sm),
                      lambda sm: lambda s: np.clip(s, 0.2 * sm, 0.5 * sm)),
    "spectral_relu": (lambda x, sm: L.spectral_relu(x, 0.4 * sm), lambda sm: lambda s: np.maximum(s, 0.4 * sm)),
    "spectral_lmo": (lambda x, sm: L.spectral_lmo(x, "frobenius", b=0.25 * sm, radius=2.0),
                     lambda sm: lambda s: -np.minimum(s / (0.25 * sm), 2.0)),
}

EIG_CASES = {
    "eig_clip": (lambda w, lm: L.eig_clip(w, -0.3 * lm, 0.5 * lm),
                 lambda lm: lambda x: np.clip(x, -0.3 * lm, 0.5 * lm)),
    "eig_relu": (lambda w, lm: L.eig_relu(w, 0.1 * lm), lambda lm: lambda x: np.maximum(x, 0.1 * lm)),
    "eig_hardcap": (lambda w, lm: L.eig_hardcap(w, 0.2 * lm), lambda lm: lambda x: np.minimum(x, 0.2 * lm)),
    "proj_psd": (lambda w, lm: L.proj_psd(w), lambda lm: lambda x: np.maximum(x, 0.0)),
    "proj_nsd": (lambda w, lm: L.proj_nsd(w), lambda lm: lambda x: np.minimum(x, 0.0)),
    "eig_stepfun": (lambda w, lm: L.eig_stepfun(w, 0.1 * lm) * lm, lambda lm: lambda x: (x > 0.1 * lm) * lm),
    "sym": (lambda w, lm: L.sym(w), lambda lm: lambda x: x),
}


def _ok_scale(scale, dtype) -> bool:
    return scale * 2 < torch.finfo(dtype).max and scale > _sub(dtype) * 64


@pytest.mark.parametrize("dtype", list(GRID), ids=str)
@pytest.mark.parametrize("name", list(MATRIX_CASES))
def test_matrix_functions_whole_range(name, dtype):
    fn, oracle = MATRIX_CASES[name]
    scales, tol = GRID[dtype]
    for i, scale in enumerate(scales):
        for shape in (((12, 20), (20, 12))[i % 2],):  # wide and tall on alternate scales
            x = (_x(10 * i + len(name), *shape) * scale).to(dtype)
            p, xu = _unit(x)
            smu = float(np.linalg.svd(xu.numpy(), compute_uv=False)[0])
            out = fn(x, smu * p)  # thresholds relative to sigma_max (absolute for spectral_lmo's b)
            ref = svd_map(xu, oracle(smu))
            if name == "spectral_lmo":  # the b actually passed (a subnormal Python float is rounded)
                b_unit = (0.25 * smu * p) / p
                ref = svd_map(xu, lambda s, b_unit=b_unit: -np.minimum(s / b_unit, 2.0))
            if name in ("spectral_lmo", "msign", "orthogonalize"):  # scale-free outputs
                p = 1.0
            t = tol * (3 if dtype == torch.float16 and name in ("msign", "orthogonalize") else 1)
            _check(out, ref, t, dtype, (name, scale, shape), p)


@pytest.mark.parametrize("dtype", list(GRID), ids=str)
@pytest.mark.parametrize("name", list(EIG_CASES))
def test_eigenvalue_functions_whole_range(name, dtype):
    fn, oracle = EIG_CASES[name]
    scales, tol = GRID[dtype]
    for i, scale in enumerate(scales):
        w = (_w(50 + i) * scale).to(dtype)
        p, wu = _unit(w)
        lmu = float(np.abs(np.linalg.eigvalsh(wu.numpy())).max())
        out = fn(w, lmu * p)
        _check(out, eig_map(wu, oracle(lmu)), tol, dtype, (name, scale), p)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_spectral_norm_whole_range(dtype):
    scales, _ = GRID[dtype]
    for i, scale in enumerate(scales):
        x = (_x(70 + i) * scale).to(dtype)
        ref = float(np.linalg.svd(np64(x), compute_uv=False)[0])
        val, _ = L.spectral_norm(x, iters=200)
        assert math.isfinite(float(val)) and abs(float(val) - ref) <= 1e-4 * ref + _sub(dtype) * 4, scale


def test_extreme_thresholds_on_both_sides():
    x = _x(1).float()
    sv = np.linalg.svd(np64(x), compute_uv=False)
    for scale in (1e-40, 1e-20, 1.0, 1e20):
        xs = x * scale
        smax = float(sv[0]) * scale
        for lo in (2.0, 1e38, 1e-38):  # absolute: far above or below the spectrum
            out = L.spectral_relu(xs, lo)
            _check(out, svd_map(xs, lambda s, lo=lo: np.maximum(s, lo)), 1e-3, torch.float32, ("relu", scale, lo))
        for ratio in (1e-8, 1e-12, 1e-16, 1e4, 1e30):
            out = L.spectral_hardcap(xs, smax * ratio)
            assert float(torch.linalg.matrix_norm(out.double(), 2)) <= smax * min(ratio, 1) * (1 + 1e-3)
            _check(out, svd_map(xs, lambda s, t=smax * ratio: np.minimum(s, t)), 1e-3, torch.float32, ("cap", ratio))
    w = _w(2).float()
    lam = np.linalg.eigvalsh(np64(w))
    for t in (1e38, -1e38, 3e38, 1e-30):  # a projector: absolute error (it may be 0)
        out = L.eig_stepfun(w, t)
        ref = eig_map(w, lambda v, t=t: (v > t).astype(float))
        assert np.linalg.norm(np64(out) - ref) <= 1e-3 * max(1.0, np.linalg.norm(ref)), t
    for t in (1e38, 2.0, -1e38):
        _check(L.eig_relu(w * 1e-40, t), eig_map(w * 1e-40, lambda v, t=t: np.maximum(v, t)), 1e-3, torch.float32,
               ("eig_relu", t))
        _check(L.eig_hardcap(w * 1e-40, -t), eig_map(w * 1e-40, lambda v, t=t: np.minimum(v, -t)), 1e-3,
               torch.float32, ("eig_hardcap", t))
    assert lam.max() > 0 > lam.min()


def test_spectral_relu_of_subnormal_input_regression():
    """``spectral_relu(randn(12, 20) * 1e-40, 2.0)`` was nan: every singular value is below 2, so the result is
    ``2 U V^T``."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(12, 20, generator=g) * 1e-40
    out = L.spectral_relu(x, 2.0)
    _check(out, svd_map(x, lambda s: np.maximum(s, 2.0)), 1e-3, torch.float32, "relu 1e-40")


def test_top_of_fp32_regression():
    """Entries up to 9.7e37 (sigma_max finite, ||X||_F > 3.4e38): msign and soft_clip returned zeros, the hard
    clips, eig functions and projections nan."""
    x = (_x(4) * 9.7e37).float()
    assert not torch.isfinite(torch.linalg.matrix_norm(x.double()).float())
    sm = float(np.linalg.svd(np64(x), compute_uv=False)[0])
    _check(L.msign(x), svd_map(x, lambda s: np.ones_like(s)), 1e-3, torch.float32, "msign")
    _check(L.soft_clip(x, sm), svd_map(x, _soft(sm)), 1e-3, torch.float32, "soft_clip")
    w = (_w(5) * 9.7e37).float()
    _check(L.proj_psd(w), eig_map(w, lambda v: np.maximum(v, 0)), 1e-3, torch.float32, "proj_psd")
    _check(L.eig_stepfun(w, 1e38), eig_map(w, lambda v: (v > 1e38).astype(float)), 1e-3, torch.float32, "step")


EMPTY_CALLS = {
    "msign": lambda x: L.msign(x),
    "soft_clip": lambda x: L.soft_clip(x, 1.0),
    "spectral_clip": lambda x: L.spectral_clip(x, 0.1, 1.0),
    "spectral_hardcap": lambda x: L.spectral_hardcap(x, 1.0),
    "spectral_relu": lambda x: L.spectral_relu(x, 0.5),
    "spectral_lmo": lambda x: L.spectral_lmo(x, "nuclear", b=0.1, radius=1.0),
    "spectral_norm": lambda x: L.spectral_norm(x)[0],
}
SQUARE_CALLS = {
    "eig_clip": lambda w: L.eig_clip(w, -1.0, 1.0),
    "eig_relu": lambda w: L.eig_relu(w, 0.5),
    "eig_hardcap": lambda w: L.eig_hardcap(w, 0.5),
    "eig_stepfun": lambda w: L.eig_stepfun(w, 0.5),
    "proj_psd": lambda w: L.proj_psd(w),
    "proj_nsd": lambda w: L.proj_nsd(w),
    "sym": lambda w: L.sym(w),
}


@pytest.mark.parametrize("name", list(EMPTY_CALLS))
def test_empty_and_vector_shaped_matrices(name):
    fn = EMPTY_CALLS[name]
    for shape in ((5, 0), (0, 5), (0, 0), (2, 0, 3)):
        out = fn(torch.zeros(shape))
        assert torch.isfinite(out).all() and out.numel() == 0 or out.abs().sum() == 0
    g = torch.Generator().manual_seed(9)
    for shape in ((1, 7), (7, 1), (1, 1)):
        x = torch.randn(shape, generator=g)
        out = fn(x)
        assert torch.isfinite(out).all(), shape
    s = float(torch.linalg.matrix_norm(x := torch.randn(1, 7, generator=g)))
    assert torch.allclose(L.spectral_hardcap(x, s / 2), x / 2, rtol=1e-4, atol=0)
    assert torch.allclose(L.spectral_norm(x.T)[0], torch.tensor(s), rtol=1e-5)


@pytest.mark.parametrize("name", list(SQUARE_CALLS))
def test_empty_and_1x1_symmetric(name):
    fn = SQUARE_CALLS[name]
    assert fn(torch.zeros(0, 0)).shape == (0, 0)
    assert fn(torch.zeros(3, 0, 0)).shape == (3, 0, 0)
    for v in (-2.0, 0.25, 3.0):
        w = torch.tensor([[v]])
        out = fn(w)
        ref = {"eig_clip": min(max(v, -1), 1), "eig_relu": max(v, 0.5), "eig_hardcap": min(v, 0.5),
               "eig_stepfun": float(v > 0.5), "proj_psd": max(v, 0), "proj_nsd": min(v, 0), "sym": v}[name]
        assert abs(float(out) - ref) <= 1e-4 * max(1, abs(ref)), (name, v)


GRAD_CASES = {  # thresholds: powers of two times the scale (exact in subnormal numbers too)
    "soft_clip": lambda x, a: L.soft_clip(x, 0.25 * a),
    "spectral_hardcap": lambda x, a: L.spectral_hardcap(x, 0.5 * a),
    "spectral_clip": lambda x, a: L.spectral_clip(x, 0.25 * a, 0.5 * a),
    "spectral_relu": lambda x, a: L.spectral_relu(x, 0.5 * a),
    "eig_clip": lambda x, a: L.eig_clip(x[:, :12], -0.25 * a, 0.5 * a),
    "eig_relu": lambda x, a: L.eig_relu(x[:, :12], 0.125 * a),
    "eig_hardcap": lambda x, a: L.eig_hardcap(x[:, :12], 0.25 * a),
    "proj_psd": lambda x, a: L.proj_psd(x[:, :12]),
    "proj_nsd": lambda x, a: L.proj_nsd(x[:, :12]),
    "spectral_lmo": None,
}


@pytest.mark.parametrize("name", list(GRAD_CASES))
def test_gradients_do_not_depend_on_the_scale(name):
    """Each case is homogeneous of degree 1 in (X, thresholds) (``spectral_lmo``: degree 0 in (G, b)), so its
    gradient at ``a X`` with thresholds times ``a`` equals the gradient at ``X`` (times ``1/a``). With ``a`` a
    power of two the scaled problem is the same one, bit for bit, after the internal power-of-two scaling:
    the gradients agree to rounding from a subnormal ``a X`` (2^-130 ~ 7e-40, compared with the gradient at
    the input's rounded entries) up to 2^123 ~ 1e37 (fp32), where no intermediate of the backward pass may
    overflow."""
    fn = GRAD_CASES[name]
    x0 = _x(11).float()
    r = torch.randn(12, 20, generator=torch.Generator().manual_seed(12))
    r = r if not name.startswith(("eig", "proj")) else r[:, :12]
    degree0 = name == "spectral_lmo"

    def grad(a, base=x0):
        x = (base * a).requires_grad_()
        out = L.spectral_lmo(x, "frobenius", b=0.5 * a, radius=1.0) if degree0 else fn(x, a)
        (out * r).sum().backward()
        return x.grad * a if degree0 else x.grad

    ref = grad(1.0)
    assert torch.isfinite(ref).all() and ref.norm() > 0
    for k in ((-60, 60, 100) if degree0 else (-130, -100, 100, 123)):
        g = grad(2.0 ** k)
        assert torch.isfinite(g).all(), (name, k)
        want = ref
        if k < -126:  # subnormal: compare with the gradient at the rounded input, scaled back exactly
            want = grad(1.0, (x0 * 2.0**k) * 2.0 ** (-k // 2) * 2.0 ** (-k - (-k // 2)))
        assert (g - want).norm() <= 1e-5 * want.norm(), (name, k, float((g - want).norm() / want.norm()))


def test_eig_clip_default_passes_follow_the_spread():
    """``eig_clip`` with the default passes held its caps only to a spread of ~1e20 (48x the cap at 1e25,
    2.7e6 at 1e30): with value checks on, the passes now follow ``||W||_F / |t|`` (3 up to 1e20, then 4..6)."""
    from spectrakit.linalg._testing import symmetric_with_eigs

    g = torch.Generator().manual_seed(17)
    for k in (1e8, 1e20, 1e25, 1e30, 1e35, 3e37):
        w = symmetric_with_eigs(16, torch.linspace(-1, 1, 16, dtype=torch.float64) * k, gen=g).float()
        for out in (L.eig_clip(w, -1.0, 1.0), L.spectral_hardcap(w, 1.0), L.spectral_clip(w, 0.5, 1.0)):
            assert float(torch.linalg.matrix_norm(out.double(), 2)) <= 1 + 1e-3, k
