"""Safety of every clip beyond its accurate range (issue 2, problem 1): finite output, no overshoot.

Regression tests: ``soft_clip(method="polar")`` returned 1.04 c at ``sigma_max/c = 1e5``, 1.85 c at 1e7
and inf/nan for a finite rank-1 fp32 input at 1e6-1e7 with ``steps=13``; hard clips overflowed to inf for
a threshold below the compute dtype's range. Oracles: float64 ``torch.linalg.svdvals``/``eigvalsh``.
"""

import pytest
import torch

from spectrakit.linalg import (
    eig_clip,
    eig_hardcap,
    eig_relu,
    eig_stepfun,
    msign,
    soft_clip,
    spectral_clip,
    spectral_hardcap,
)

RATIOS = [1e-30, 1e-3, 1.0, 1e3, 1e4, 1e5, 1e6, 2e7, 1e9, 1e15, 1e30]
SCALES = [1e-30, 1.0, 1e30]
# relative overshoot allowed on top of c: rounding of the output (bf16 ulp is 2^-8 ~ 4e-3)
OVER = {torch.float64: 1e-6, torch.float32: 1e-3, torch.bfloat16: 2e-2}


def _matrix(kind: str, m: int, n: int, gen: torch.Generator) -> torch.Tensor:
    if kind == "rank1":
        return torch.randn(m, 1, dtype=torch.float64, generator=gen) @ torch.randn(1, n, dtype=torch.float64,
                                                                                   generator=gen)
    x = torch.randn(m, n, dtype=torch.float64, generator=gen)
    if kind == "zero_rows":
        x[::2] = 0
    if kind == "spike":
        u = torch.randn(m, 1, dtype=torch.float64, generator=gen)
        v = torch.randn(1, n, dtype=torch.float64, generator=gen)
        x = x + 1e4 * (u / u.norm()) @ (v / v.norm()) * float(torch.linalg.matrix_norm(x, 2))
    return x


def _svals(t: torch.Tensor) -> torch.Tensor:
    return torch.linalg.svdvals(t.double())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("kind,shape", [("gauss", (6, 24)), ("rank1", (6, 24)), ("rank1", (48, 48)),
                                        ("zero_rows", (24, 16)), ("spike", (16, 40))])
@pytest.mark.parametrize("steps", [None, 13])
def test_soft_clip_never_exceeds_c_nor_s(dtype, kind, shape, steps):
    gen = torch.Generator().manual_seed(sum(shape) * 7 + len(kind))  # explicit integers (hash() varies per run)
    x64 = _matrix(kind, *shape, gen)
    for scale in SCALES:
        x = (x64 * scale).to(torch.float32 if dtype == torch.bfloat16 else dtype)
        s_in = _svals(x)
        smax = float(s_in[0])
        for ratio in RATIOS:
            c = smax / ratio
            out = soft_clip(x, c, steps=steps, dtype=dtype)
            assert torch.isfinite(out).all(), (scale, ratio)
            s_out = _svals(out)
            # + a few of the smallest normal numbers: c below the dtype's range is not representable
            tiny = 4 * torch.finfo(x.dtype).tiny
            assert float(s_out[0]) <= c * (1 + OVER[dtype]) + tiny, (scale, ratio, float(s_out[0]) / c)
            # s_out <= s_in (1 + tol): the largest singular values exactly; rounding noise in the null
            # directions of rank-deficient input is amplified by the iteration (documented floor)
            assert float(s_out[0]) <= smax * (1 + OVER[dtype]) + tiny
            if dtype != torch.bfloat16 and ratio <= 1e4:
                floor = (1e-2 if dtype == torch.float32 else 1e-8) * min(c, smax)
                assert bool((s_out <= s_in * (1 + OVER[dtype]) + floor + tiny).all()), (scale, ratio)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_soft_clip_beyond_range_undershoots(dtype):
    """Outside the accurate range every singular value comes out in [0, c] (an under-shoot: the last
    polynomial is scaled by the tracked maximum of the schedule) and the singular vectors are kept."""
    gen = torch.Generator().manual_seed(3)
    s = torch.logspace(0, -2, 20, dtype=torch.float64)
    u, _ = torch.linalg.qr(torch.randn(20, 20, dtype=torch.float64, generator=gen))
    v, _ = torch.linalg.qr(torch.randn(40, 20, dtype=torch.float64, generator=gen))
    x = ((u * s) @ v.T).float()
    for ratio in (1e6, 1e9, 1e20):
        c = 1.0 / ratio
        out = soft_clip(x, c, dtype=dtype).double()
        d = torch.einsum("mi,mn,ni->i", u, out, v)  # out = U diag(d) V^T up to rounding
        assert float(d.max()) <= c * (1 + OVER[dtype]) and float(d.min()) >= 0
        resid = out - (u * d) @ v.T
        assert float(torch.linalg.matrix_norm(resid)) <= (0.05 if dtype == torch.float32 else 0.3) * c


def test_soft_clip_gram_phase_rank1_regression():
    """The exact failing case class: rank-1 fp32, steps=13, sigma_max/c = 2e7 gave inf/nan."""
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(6, 1, generator=gen) @ torch.randn(1, 24, generator=gen))
    c = float(_svals(x)[0]) / 2e7
    for steps in (9, 13, 20):
        out = soft_clip(x, c, steps=steps)
        assert torch.isfinite(out).all()
        assert float(_svals(out)[0]) <= c * 1.001


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("schedule", ["polar_express", "muon", "newton_schulz"])
def test_msign_finite_and_bounded_at_any_scale(dtype, schedule):
    gen = torch.Generator().manual_seed(1)
    for kind in ("gauss", "rank1", "zero_rows"):
        x64 = _matrix(kind, 24, 40, gen)
        for scale in (1e-30, 1e-10, 1.0, 1e10, 1e30):
            out = msign((x64 * scale).to(dtype), schedule=schedule)
            assert torch.isfinite(out).all(), (kind, scale)
            bound = 1.25 if schedule == "muon" else 1 + 3 * OVER[dtype] + 1e-2
            assert float(_svals(out)[0]) <= bound, (kind, scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_hard_clips_finite_and_bounded(dtype):
    """Finite for thresholds far outside the dtype's range (was inf: W / t overflowed); output norm
    <= hi + the documented absolute error ~ lower_bound * (||W|| + hi)."""
    gen = torch.Generator().manual_seed(2)
    for kind in ("gauss", "rank1", "zero_rows"):
        x64 = _matrix(kind, 12, 20, gen)
        for scale in (1e-30, 1.0, 1e30):
            x = (x64 * scale).to(dtype)
            smax = float(_svals(x)[0])
            for ratio in (1e-3, 1.0, 1e3, 1e6, 1e20, 1e60):
                hi = smax / ratio
                for out in (spectral_hardcap(x, hi), spectral_clip(x, hi / 2, hi)):
                    assert torch.isfinite(out).all(), (kind, scale, ratio)
                    assert float(_svals(out)[0]) <= hi * (1 + 1e-3) + 1e-5 * (smax + hi), (kind, scale, ratio)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_eig_functions_finite_at_any_scale(dtype):
    gen = torch.Generator().manual_seed(4)
    a = torch.randn(16, 16, dtype=torch.float64, generator=gen)
    w64 = (a + a.T) / 2
    for scale in (1e-30, 1.0, 1e30):
        w = (w64 * scale).to(dtype)
        lmax = float(torch.linalg.eigvalsh(w.double()).abs().max())
        for ratio in (1e-3, 1.0, 1e3, 1e20):
            t = lmax / ratio
            outs = [eig_clip(w, -t, t), eig_hardcap(w, t), eig_relu(w, -t), eig_stepfun(w, t)]
            for o in outs:
                assert torch.isfinite(o).all(), (scale, ratio)
            if dtype != torch.bfloat16 and ratio <= 1e3:
                ev = torch.linalg.eigvalsh(outs[0].double())
                assert float(ev.abs().max()) <= t * (1 + 1e-3) + 1e-5 * lmax


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_soft_clip_vector_and_thresholds_beyond_dtype_range(dtype):
    """c = 1e60 overflowed to inf in fp32 (nan output); now h_c is the identity there."""
    g = torch.randn(7, dtype=torch.float64, generator=torch.Generator().manual_seed(5)).to(dtype)
    for c in (1e-60, 1e-30, 1.0, 1e39, 1e60, 1e300):
        out = soft_clip(g, c)
        assert torch.isfinite(out).all() and out.dtype == dtype
        n = float(g.double().norm())
        assert float(out.double().norm()) <= min(c, n) * (1 + OVER[dtype]) + 4 * torch.finfo(dtype).tiny
    assert torch.equal(soft_clip(g, 1e60), g)
    x = torch.randn(6, 9, dtype=torch.float64).to(dtype)
    out = soft_clip(x, 1e60)
    assert torch.isfinite(out).all()
    assert float((out.double() - x.double()).norm()) <= OVER[dtype] * float(x.double().norm())


@pytest.mark.parametrize("shape", [(0, 3), (3, 0), (0, 0), (2, 0, 4), (0, 2, 3)])
def test_empty_matrices_map_to_themselves(shape):
    # a zero dimension used to crash inside the norms (0 ** negative power, amax over an empty dim)
    from spectrakit.linalg import orthogonalize, proj_psd, spectral_relu, subspace_distance

    x = torch.randn(*shape)
    for f in (lambda a: soft_clip(a, 0.5), lambda a: soft_clip(a, 0.5, method="newton_schulz"),
              lambda a: soft_clip(a, 0.5, dtype=torch.bfloat16), lambda a: spectral_hardcap(a, 0.5),
              lambda a: spectral_relu(a, 0.5), lambda a: spectral_clip(a, 0.2, 0.5, dtype=torch.bfloat16),
              msign, orthogonalize, lambda a: msign(a, schedule="muon", dtype=torch.bfloat16)):
        out = f(x)
        assert out.shape == x.shape and out.dtype == x.dtype
    w = torch.randn(*shape[:-2], 0, 0)
    for f in (lambda a: eig_clip(a, -1.0, 1.0), lambda a: eig_relu(a, 0.1), lambda a: eig_hardcap(a, 0.1),
              proj_psd, lambda a: eig_stepfun(a, 0.2)):
        assert f(w).shape == w.shape
    # arguments are still checked
    with pytest.raises(ValueError, match="c must be"):
        soft_clip(x, -1.0)
    assert soft_clip(torch.randn(0), 1.0).shape == (0,)
    d = subspace_distance(torch.randn(2, 5, 0), torch.randn(2, 5, 0))
    assert d.shape == (2,) and torch.equal(d, torch.zeros(2))
