# ruff: noqa: B023  (the oracle lambdas are called inside the loop iteration that defines them)
"""Scale invariance and extreme thresholds of every public linalg function against float64 SVD/eigh.

A seeded grid over input scale (1e-30 .. 1e30), shape (wide, tall, batched), dtype (fp32, fp64) and
threshold (1e-8 .. 1e8 times the spectrum), plus one regression test per probed failure."""

import itertools

import pytest
import torch

from spectrakit import linalg as L

# the functions divide by a power of two near max|x| first, so a scale only matters near the ends of the
# dtype's range (subnormal thresholds, overflowing norms): 1e-30 and 1e30 (fp32's range ends, times the
# thresholds' 1e-8 .. 1e8) and 1; intermediate scales (1e-12, 1e12) took the same code path as 1
SCALES = [1e-30, 1.0, 1e30]
SHAPES = [(6, 10), (9, 5), (2, 4, 4)]
RATIOS = [1e-8, 1e-3, 0.5, 1e3, 1e8]
DTYPES = [torch.float32, torch.float64]


def _svd_matrix(shape, dtype, seed):
    """Random matrix with singular values log-spaced in [0.1, 1] (float64) and its factors."""
    g = torch.Generator().manual_seed(seed)
    *b, m, n = shape
    k = min(m, n)
    u, _ = torch.linalg.qr(torch.randn(*b, m, k, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(*b, n, k, generator=g, dtype=torch.float64))
    s = torch.logspace(-1, 0, k, dtype=torch.float64).flip(0)
    return (u * s) @ v.mT, u, s, v


def _sym_matrix(shape, seed):
    g = torch.Generator().manual_seed(seed)
    *b, n, _ = shape
    q, _ = torch.linalg.qr(torch.randn(*b, n, n, generator=g, dtype=torch.float64))
    lam = torch.logspace(-1, 0, n, dtype=torch.float64) * torch.tensor([(-1) ** i for i in range(n)])
    return (q * lam) @ q.mT, q, lam


def _rel(out, ref):
    ref = ref.double()
    return float((out.double() - ref).norm() / ref.norm().clamp_min(1e-300))


def _scaled(x64, k, dtype):
    return (x64 * k).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", SCALES)
def test_spectral_functions_scale_grid(scale, dtype):
    for i, (shape, ratio) in enumerate(itertools.product(SHAPES, RATIOS)):
        w64, u, s, v = _svd_matrix(shape, dtype, seed=i)
        x = _scaled(w64, scale, dtype)
        t = ratio * scale  # thresholds relative to s_max = 1 (times the scale)
        ref = lambda f: ((u * f(s)) @ v.mT) * scale  # noqa: E731
        cap = L.spectral_hardcap(x, t)
        assert _rel(cap, ref(lambda s: s.clamp_max(ratio))) < 1e-3, (shape, ratio)
        top = torch.linalg.matrix_norm(cap.double(), ord=2)
        assert bool((top <= t * (1 + 1e-3)).all()), (shape, ratio, top)  # the cap holds
        if ratio < 1:  # singular values within the resolved range of the polar route (>= 1e-6 s_max)
            relu = L.spectral_relu(x, t)
            assert _rel(relu, ref(lambda s: s.clamp_min(ratio))) < 1e-3, (shape, ratio)
            band = L.spectral_clip(x, t, 0.7 * scale)
            assert _rel(band, ref(lambda s: s.clamp(ratio, 0.7))) < 1e-3, (shape, ratio)
        sc = L.soft_clip(x, t)
        if ratio >= 1e-3:  # documented accurate range sigma_max / c <= 1e4; beyond it the output under-shoots
            assert _rel(sc, ref(lambda s: s / torch.sqrt(1 + (s / ratio) ** 2))) < 1e-3, (shape, ratio)
        assert bool((torch.linalg.matrix_norm(sc.double(), ord=2) <= t * (1 + 1e-3)).all()), (shape, ratio)
        assert torch.isfinite(cap).all() and torch.isfinite(sc).all()
        if ratio == RATIOS[0]:  # threshold-free functions once per shape
            assert _rel(L.msign(x), u @ v.mT) < 1e-3, shape
            val, _ = L.spectral_norm(x)
            assert torch.allclose(val.double() / scale, torch.ones(()).double(), rtol=1e-4), (shape, val)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", SCALES)
def test_eigenvalue_functions_scale_grid(scale, dtype):
    shapes = [(6, 6), (2, 5, 5)]
    signed = [r * sgn for r in RATIOS for sgn in (1, -1)]
    for i, (shape, ratio) in enumerate(itertools.product(shapes, signed)):
        w64, q, lam = _sym_matrix(shape, seed=i)
        w = _scaled(w64, scale, dtype)
        t = ratio * scale
        ref = lambda f: ((q * f(lam)) @ q.mT) * scale  # noqa: E731
        # documented: a one-sided cap holds to 1e-3 |t| + 1e-6 ||W||_F (the eigenvalues on the other side
        # keep the scale of the sign iteration at ||W||_F)
        slack = 1e-3 * abs(t) + 1e-6 * float(w64[..., :, :].norm(dim=(-2, -1)).max()) * scale
        hc = L.eig_hardcap(w, t)
        assert _rel(hc, ref(lambda x: x.clamp_max(ratio))) < 1e-3, (shape, ratio)
        assert bool((torch.linalg.eigvalsh(hc.double()) <= t + slack).all()), (shape, ratio)
        rl = L.eig_relu(w, t)
        assert _rel(rl, ref(lambda x: x.clamp_min(ratio))) < 1e-3, (shape, ratio)
        assert bool((torch.linalg.eigvalsh(rl.double()) >= t - slack).all()), (shape, ratio)
        lo, hi = -abs(t), abs(t)
        cl = L.eig_clip(w, lo, hi)
        if abs(ratio) >= 1e-6:  # documented: a band narrower than ~1e-6 ||W|| keeps only the caps
            assert _rel(cl, ref(lambda x: x.clamp(-abs(ratio), abs(ratio)))) < 1e-3, (shape, ratio)
        ev = torch.linalg.eigvalsh(cl.double())
        assert bool((ev <= hi + slack).all() and (ev >= lo - slack).all()), (shape, ratio)
        if ratio == RATIOS[0]:
            assert _rel(L.proj_psd(w), ref(lambda x: x.clamp_min(0))) < 1e-3
            assert _rel(L.proj_nsd(w), ref(lambda x: x.clamp_max(0))) < 1e-3
            assert _rel(L.eig_stepfun(w, 0.0), (q * (lam > 0).double()) @ q.mT) < 1e-3


# ---------------------------------------------------------------- regression rows (probed failures)
def _sym16():
    g = torch.Generator().manual_seed(0)
    q, _ = torch.linalg.qr(torch.randn(16, 16, generator=g))
    w = (q * torch.linspace(-1, 1, 16)) @ q.T
    return (w + w.T) / 2


@pytest.mark.parametrize("call", [lambda w: L.eig_hardcap(w, 1e6), lambda w: L.eig_relu(w, -1e6),
                                  lambda w: L.eig_clip(w, -1e6, 1e6), lambda w: L.eig_clip(w, -1e8, 1e8),
                                  lambda w: L.eig_relu(w, float("-inf")),
                                  lambda w: L.eig_relu(w, torch.tensor(float("-inf"))),
                                  lambda w: L.eig_hardcap(w, torch.tensor(float("inf")))])
def test_threshold_beyond_spectrum_returns_input(call):
    w = _sym16()
    assert torch.equal(call(w), w)


@pytest.mark.parametrize("k", [1e10, 1e-20, 1e30, 1e-30])
def test_spectral_norm_any_scale(k):
    x = torch.randn(16, 24, generator=torch.Generator().manual_seed(1))
    exact = torch.linalg.matrix_norm(x.double(), ord=2) * k
    val, v = L.spectral_norm(x * k, iters=100)
    assert abs(float(val) / float(exact) - 1) < 1e-4 and torch.isfinite(v).all()


@pytest.mark.parametrize("k", [1e12, 1e15, 1e30])
def test_hardcap_never_exceeds_cap(k):
    x = torch.randn(16, 24, generator=torch.Generator().manual_seed(2))
    top = torch.linalg.matrix_norm(L.spectral_hardcap(x * k, 1.0).double(), ord=2)
    assert float(top) <= 1 + 1e-3


@pytest.mark.parametrize("k", [1e8, 1e10, 1e12, 1e15])
def test_eig_clip_never_exceeds_cap(k):
    top = torch.linalg.matrix_norm(L.eig_clip(_sym16() * k, -1, 1).double(), ord=2)
    assert float(top) <= 1 + 1e-3


@pytest.mark.parametrize("name", ["spectral_hardcap", "spectral_relu", "spectral_clip", "msign", "soft_clip",
                                  "eig_hardcap", "eig_relu", "eig_clip", "proj_psd", "proj_nsd"])
@pytest.mark.parametrize("kind", ["zero", "repeated"])
def test_gradients_finite_at_zero_and_repeated_values(name, kind):
    """Documented subgradient at 0: the gradient of the norm floors is 0 there, so derivatives are finite."""
    f = getattr(L, name)
    args = {"spectral_hardcap": (1.0,), "spectral_relu": (1.0,), "spectral_clip": (0.5, 1.0), "soft_clip": (1.0,),
            "eig_hardcap": (1.0,), "eig_relu": (-1.0,), "eig_clip": (-1.0, 1.0)}.get(name, ())
    n = (6, 6) if name.startswith(("eig", "proj")) else (6, 8)
    x = torch.zeros(n) if kind == "zero" else 2 * torch.eye(*n)
    x.requires_grad_(True)
    f(x, *args).sum().backward()
    assert torch.isfinite(x.grad).all()


def test_msign_subnormal_input_is_orthogonal():
    x = torch.randn(8, 12, generator=torch.Generator().manual_seed(3)) * 1e-40  # subnormal in fp32
    s = torch.linalg.svdvals(L.msign(x).double())
    assert torch.allclose(s, torch.ones_like(s), atol=1e-2)


@pytest.mark.parametrize("k", [1e25, 1e30, 1e35, 3e37])
def test_six_passes_hold_the_caps_over_the_whole_fp32_range(k):
    """``passes=6``: eig_clip and spectral_hardcap stay within 1e-3 of the cap for spectrum/threshold
    ratios up to fp32's largest finite values (the default 3 passes cover ~1e20)."""
    top = torch.linalg.matrix_norm(L.eig_clip(_sym16() * k, -1, 1, passes=6).double(), ord=2)
    assert float(top) <= 1 + 1e-3
    x = torch.randn(16, 24, generator=torch.Generator().manual_seed(3))
    x = x / torch.linalg.matrix_norm(x, ord=2)
    top = torch.linalg.matrix_norm(L.spectral_hardcap(x * k, 1.0, passes=6).double(), ord=2)
    assert float(top) <= 1 + 1e-3


def test_default_passes_follow_the_spread_and_more_passes_refine():
    """Default passes: from the spread with value checks on (5 at 1e30: the cap holds), 3 without (no host
    read)."""
    from spectrakit._checks import no_value_checks

    w = _sym16() * 1e30
    assert torch.equal(L.eig_clip(w, -1, 1), L.eig_clip(w, -1, 1, passes=5))
    assert float(torch.linalg.matrix_norm(L.eig_clip(w, -1, 1).double(), ord=2)) <= 1 + 1e-3
    with no_value_checks():
        assert torch.equal(L.eig_clip(w, -1, 1), L.eig_clip(w, -1, 1, passes=3))
    tops = [float(torch.linalg.matrix_norm(L.eig_clip(w, -1, 1, passes=p).double(), ord=2)) for p in (3, 4, 5)]
    assert tops[0] > 10 and tops[0] > tops[1] > tops[2] and tops[2] <= 1 + 1e-3


@pytest.mark.parametrize("call", [lambda p: L.eig_clip(torch.eye(3), -1, 1, passes=p),
                                  lambda p: L.eig_hardcap(torch.eye(3), 1, passes=p),
                                  lambda p: L.spectral_hardcap(torch.eye(3), 1, passes=p)])
@pytest.mark.parametrize("bad", [0, 17, 2.5])
def test_passes_validated(call, bad):
    with pytest.raises((ValueError, TypeError), match="passes"):
        call(bad)


def test_one_sided_cap_error_is_at_fp32_eigh_level():
    """A one-sided cap far inside a wide spectrum (eigenvalues -1e6 and 1e6, cap at 1) cannot be resolved
    better than ``eps ||W||`` in fp32: the eigenvalues themselves are only known to that accuracy. Our error
    above the cap stays within the documented ``1e-3 |t| + 1e-6 ||W||_F`` and the same order as that of
    an fp32 ``eigh`` route."""
    g = torch.Generator().manual_seed(4)
    q, _ = torch.linalg.qr(torch.randn(16, 16, generator=g, dtype=torch.float64))
    lam = torch.cat([torch.full((8,), -1e6, dtype=torch.float64), torch.linspace(0.5, 1e6, 8, dtype=torch.float64)])
    w = ((q * lam) @ q.mT).float()
    top = float(torch.linalg.eigvalsh(L.eig_hardcap(w, 1.0).double()).max())
    e, v = torch.linalg.eigh(w)
    top_eigh = float(torch.linalg.eigvalsh(((v * e.clamp_max(1.0)) @ v.mT).double()).max())
    bound = 1e-3 + 1e-6 * float(torch.linalg.matrix_norm(w.double()))
    assert top - 1 <= bound
    assert top - 1 <= 30 * max(top_eigh - 1, 1e-7 * 1e6)
