"""Constraint sets: tangent-cone projections against independent float64 oracles (seed 002 §3–§5, A1)."""

from __future__ import annotations

import math

import pytest
import torch

from spectrakit.manifold import PSDCone, Spectrahedron, SpectralBall, SpectralBand, Stiefel, dilation

from ._helpers import band_point, face_eigs, psd_point, random_tangent, spectrahedron_point, sym

METHODS = ["exact", "polar"]


def _inner(A, B):
    return (A * B).sum((-2, -1))


@pytest.mark.parametrize("method,dtype,atol", [("exact", torch.float64, 1e-10),
                                               ("polar", torch.float32, 2e-3)])
def test_seed_psd_sanity_check(method, dtype, atol):
    """Seed 002 §3.2.2 at 128x128 with nullity 16: P0 H P0 >= 0, P0 N P0 <= 0, <W,N> = 0, <W,H>/<W,X> = 1."""
    gen = torch.Generator().manual_seed(0)
    n, nullity = 128, 16
    W = torch.randn(n, n, dtype=torch.float64, generator=gen)
    X = torch.randn(n, n, dtype=torch.float64, generator=gen)
    lam, Q = torch.linalg.eigh(sym(W @ W.T))
    lam[:nullity] = 0
    W = (Q * lam) @ Q.T
    H = PSDCone(method=method).project_tangent(W.to(dtype), X.to(dtype)).double()
    N = X - H
    P0 = Q[:, :nullity] @ Q[:, :nullity].T
    # (N = X - H also holds the skew part of X, orthogonal to every symmetric matrix: compare sym parts)
    scale = torch.linalg.eigvalsh(sym(P0 @ X @ P0)).abs().max()
    assert torch.linalg.eigvalsh(sym(P0 @ H @ P0)).min() >= -atol * scale
    assert torch.linalg.eigvalsh(sym(P0 @ N @ P0)).max() <= atol * scale
    assert torch.linalg.eigvalsh(sym(P0 @ X @ P0)).min() < -1  # the check is not vacuous
    assert abs(_inner(W, N) / _inner(W, W)) <= atol
    assert abs(_inner(W, H) / _inner(W, X) - 1) <= atol


def _cases(gen):
    """(set, W, faces as (U, V, lower) from explicit bases, symmetric?) for every set, tall/wide/square."""
    cases = []
    W, U0 = psd_point(12, 3, gen=gen, batch=(2,))
    cases.append(("psd", lambda m: PSDCone(method=m), W, [(U0, U0, True)], True))
    W, Ulo, Uhi = spectrahedron_point(10, -0.5, 2.0, 2, 3, gen=gen, batch=(2,))
    cases.append(("spectrahedron", lambda m: Spectrahedron(-0.5, 2.0, method=m), W,
                  [(Ulo, Ulo, True), (Uhi, Uhi, False)], True))
    for m_, n_ in [(9, 6), (6, 9), (7, 7)]:
        W, _, (Uh, Vh) = band_point(m_, n_, 0.0, 1.5, 0, 2, gen=gen, batch=(2,))
        cases.append((f"ball{m_}x{n_}", lambda m: SpectralBall(1.5, method=m), W, [(Uh, Vh, False)], False))
        W, (Ul, Vl), (Uh, Vh) = band_point(m_, n_, 0.5, 1.5, 2, 1, gen=gen, batch=(2,))
        cases.append((f"band{m_}x{n_}", lambda m: SpectralBand(0.5, 1.5, method=m), W,
                      [(Ul, Vl, True), (Uh, Vh, False)], False))
    rms_scale = math.sqrt(8 / 5)
    W, _, (Uh, Vh) = band_point(8, 5, 0.0, 2.0 * rms_scale, 0, 2, gen=gen, batch=(2,))
    cases.append(("ball_rms", lambda m: SpectralBall(2.0, rms=True, method=m), W, [(Uh, Vh, False)], False))
    return cases


CASES = _cases(torch.Generator().manual_seed(1))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_projection_is_the_cone_projection(case, method):
    """Moreau characterisation with independently built cone elements: P(X) in T (face eigenvalues with the
    right sign), X - P(X) orthogonal to P(X), <X - P(X), H> <= 0 for random tangent H, idempotent."""
    _, make, W, faces_uv, symmetric = case
    dtype, tol = (torch.float64, 1e-9) if method == "exact" else (torch.float32, 3e-3)
    S = make(method)
    gen = torch.Generator().manual_seed(2)
    X = torch.randn(W.shape, dtype=torch.float64, generator=gen) * 3
    P = S.project_tangent(W.to(dtype), X.to(dtype)).double()
    Xs = sym(X) if symmetric else X
    scale = Xs.norm()
    for ev, lower in face_eigs(P, faces_uv):
        assert (ev.min() if lower else -ev.max()) >= -tol * scale
    assert _inner(Xs - P, P).abs().max() <= tol * scale**2
    for _ in range(3):
        H = random_tangent(torch.randn(W.shape, dtype=torch.float64, generator=gen), faces_uv, gen=gen)
        H = sym(H) if symmetric else H
        assert _inner(Xs - P, H).max() <= tol * scale * H.norm()
    PP = S.project_tangent(W.to(dtype), P.to(dtype)).double()
    assert (PP - P).norm() <= tol * scale
    # the projection did something: some face constraint was violated by X
    assert (Xs - P).norm() > 1e-2 * scale


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("make,symmetric", [
    (lambda m: PSDCone(method=m), True), (lambda m: Spectrahedron(-1, 1, method=m), True),
    (lambda m: SpectralBall(2.0, method=m), False), (lambda m: SpectralBand(0.5, 2.0, method=m), False)],
    ids=["psd", "spectrahedron", "ball", "band"])
def test_interior_point_gives_identity(make, symmetric, method):
    gen = torch.Generator().manual_seed(3)
    if symmetric:
        W, _, _ = spectrahedron_point(8, 0.2, 0.8, 0, 0, gen=gen, batch=(3,))
    else:
        W, _, _ = band_point(8, 6, 0.7, 1.6, 0, 0, gen=gen, batch=(3,))
    X = torch.randn(W.shape, dtype=torch.float64, generator=gen).mT.contiguous().mT  # non-contiguous
    dtype, tol = (torch.float64, 1e-10) if method == "exact" else (torch.float32, 1e-4)
    P = make(method).project_tangent(W.to(dtype), X.to(dtype)).double()
    expected = sym(X) if symmetric else X
    assert (P - expected).norm() <= tol * X.norm()


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("make", [
    lambda m: PSDCone(method=m), lambda m: Spectrahedron(-0.5, 0.5, method=m),
    lambda m: SpectralBall(0.7, method=m), lambda m: SpectralBall(0.7, rms=True, method=m),
    lambda m: SpectralBand(0.3, 0.7, method=m), lambda m: Stiefel(method=m),
    lambda m: Stiefel(rms=True, method=m)],
    ids=["psd", "spectrahedron", "ball", "ball_rms", "band", "stiefel", "stiefel_rms"])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_retraction_lands_in_set(make, method, scale):
    gen = torch.Generator().manual_seed(4)
    S = make(method)
    shape = (2, 9, 9) if S.symmetric else (2, 9, 6)
    W = torch.randn(shape, dtype=torch.float64, generator=gen) * scale
    dtype = torch.float64 if method == "exact" else torch.float32
    R = S.retract(W.to(dtype))
    assert R.dtype == dtype and R.shape == W.shape
    assert bool(S.contains(R, tol=1e-4 if method == "exact" else 5e-3).all())
    # a point already in the set is (nearly) left alone (the polar route is looser when every singular value
    # sits exactly on a bound, e.g. the band from scale 1e-3, where msign(s - lo) has no gap: 1.3% measured)
    R2 = S.retract(R)
    assert (R2 - R).norm() <= (1e-8 if method == "exact" else 2e-2) * R.norm().clamp_min(1.0)


def test_retraction_bf16_input():
    gen = torch.Generator().manual_seed(5)
    W = (torch.randn(2, 16, 12, generator=gen) * 4).bfloat16()
    R = SpectralBall(1.0).retract(W)
    assert R.dtype == torch.bfloat16
    assert float(torch.linalg.matrix_norm(R.double(), ord=2).max()) <= 1.05


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("shape", [(9, 5), (5, 9), (6, 6), (3, 7, 4)])
def test_band_1_1_is_textbook_stiefel(shape, method):
    """Seed 002 A1.1.1: the band [1, 1] reduces to X - W sym(W^T X) (tall) / X - sym(X W^T) W (wide)."""
    gen = torch.Generator().manual_seed(6)
    *b, m, n = shape
    W = torch.linalg.qr(torch.randn(*b, max(m, n), min(m, n), dtype=torch.float64, generator=gen))[0]
    W = W if m >= n else W.mT
    X = torch.randn(*b, m, n, dtype=torch.float64, generator=gen)
    expected = X - W @ sym(W.mT @ X) if m >= n else X - sym(X @ W.mT) @ W
    dtype, tol = (torch.float64, 1e-10) if method == "exact" else (torch.float32, 2e-3)
    for S in (SpectralBand(1.0, 1.0, method=method), Stiefel(method=method)):
        got = S.project_tangent(W.to(dtype), X.to(dtype)).double()
        assert (got - expected).norm() <= tol * X.norm()
    # tangent vectors satisfy sym(W^T H) = 0
    H = Stiefel(method=method).project_tangent(W.to(dtype), X.to(dtype)).double()
    G = sym(W.mT @ H) if m >= n else sym(H @ W.mT)
    assert G.norm() <= tol * X.norm()


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("shape,k", [((8, 5), 1), ((5, 8), 2), ((6, 6), 3), ((2, 7, 4), 2)])
def test_ball_direct_equals_dilation(shape, k, method):
    gen = torch.Generator().manual_seed(7)
    *b, m, n = shape
    W, _, (Uh, Vh) = band_point(m, n, 0.0, 1.3, 0, k, gen=gen, batch=tuple(b))
    X = torch.randn(*b, m, n, dtype=torch.float64, generator=gen) + 2 * Uh @ Vh.mT  # pushes outward
    dtype, tol = (torch.float64, 1e-10) if method == "exact" else (torch.float32, 2e-3)
    S = SpectralBall(1.3, method=method)
    direct = S.project_tangent(W.to(dtype), X.to(dtype)).double()
    dil = S.project_tangent(W.to(dtype), X.to(dtype), route="dilation").double()
    assert (direct - dil).norm() <= tol * X.norm()
    assert (direct - X).norm() > 1e-3 * X.norm()  # the boundary is active


def test_dilation_eigenvalues_are_plus_minus_singular_values():
    W = torch.randn(5, 3, dtype=torch.float64)
    ev = torch.linalg.eigvalsh(dilation(W))
    s = torch.linalg.svdvals(W)
    expected = torch.sort(torch.cat([s, -s, torch.zeros(2, dtype=torch.float64)])).values
    assert torch.allclose(ev, expected, atol=1e-12)


def test_spectrahedron_single_point_has_zero_tangent_cone():
    W = 0.5 * torch.eye(6, dtype=torch.float64)
    X = torch.randn(6, 6, dtype=torch.float64)
    assert Spectrahedron(0.5, 0.5, method="exact").project_tangent(W, X).norm() <= 1e-12


def test_contains_detects_outside_points():
    W = torch.diag(torch.tensor([1.0, -0.5, 0.2], dtype=torch.float64))
    assert not bool(PSDCone().contains(W))
    assert bool(PSDCone().contains(W.abs()))
    assert not bool(PSDCone().contains(torch.tensor([[1.0, 1.0], [0.0, 1.0]])))  # not symmetric
    assert not bool(SpectralBall(0.9).contains(W))
    assert bool(SpectralBall(1.0).contains(W))
    assert not bool(SpectralBand(0.3, 1.0).contains(W))


@pytest.mark.parametrize("make,match", [
    (lambda: Spectrahedron(1.0, 0.0), "lo must be <= hi"),
    (lambda: Spectrahedron(-math.inf, math.inf), "finite"),
    (lambda: SpectralBall(0.0), "radius"),
    (lambda: SpectralBall(-1.0), "radius"),
    (lambda: SpectralBand(2.0, 1.0), "lo must be <= hi"),
    (lambda: SpectralBand(-0.1, 1.0), "lo"),
    (lambda: SpectralBand(0.0, 0.0), "hi"),
    (lambda: PSDCone(tol=0.0), "tol"),
    (lambda: PSDCone(method="svd"), "method"),
])
def test_invalid_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_invalid_inputs():
    with pytest.raises(ValueError, match="square"):
        PSDCone().project_tangent(torch.zeros(3, 4), torch.zeros(3, 4))
    with pytest.raises(ValueError, match="square"):
        Spectrahedron().retract(torch.zeros(3, 4))
    with pytest.raises(ValueError, match="shape"):
        SpectralBall(1.0).project_tangent(torch.zeros(3, 4), torch.zeros(4, 3))
    with pytest.raises(TypeError, match="W"):
        SpectralBall(1.0).retract(torch.zeros(3, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="route"):
        SpectralBall(1.0).project_tangent(torch.zeros(3, 4), torch.zeros(3, 4), route="other")
    with pytest.raises(ValueError, match="at least 2"):
        SpectralBall(1.0).retract(torch.zeros(3))
