"""spectral_lmo(method="exact") against a float64 numpy SVD oracle, the objective it minimises (brute force),
rank deficiency, bf16 and argument errors (the polar route: test_lmo.py)."""

import functools
import math

import numpy as np
import pytest
import torch

from spectrakit import linalg

spectral_lmo = functools.partial(linalg.spectral_lmo, method="exact")

MAPS = {
    "frobenius": lambda s, b, D, p: np.minimum(s / b, D),
    "nuclear": lambda s, b, D, p: np.where(s > b, D, 0.0),
    "schatten": lambda s, b, D, p: np.minimum((s / b) ** (1 / (p - 1)), D),
    "entropy": lambda s, b, D, p: np.minimum(np.exp(np.minimum(s / b, 50.0)), D),
}
PSI = {
    "frobenius": lambda s, b, p: b / 2 * np.sum(s**2),
    "nuclear": lambda s, b, p: b * np.sum(s),
    "schatten": lambda s, b, p: b / p * np.sum(s**p),
    "entropy": lambda s, b, p: b * np.sum(np.where(s > 0, s * np.log(np.maximum(s, 1e-300)), 0.0) - s),
}


def _oracle(G, reg, b, D, p):
    g = G.double().numpy()
    U, s, Vh = np.linalg.svd(g, full_matrices=False)
    return -(U * MAPS[reg](s, b, D, p)[..., None, :]) @ Vh


def _gen(shape, seed, spread=True):
    g = torch.Generator().manual_seed(seed)
    U, _ = torch.linalg.qr(torch.randn(*shape[:-1], shape[-2], generator=g, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(*shape[:-2], shape[-1], shape[-1], generator=g, dtype=torch.float64))
    k = min(shape[-2:])
    s = torch.logspace(-2, 1, k, dtype=torch.float64) if spread else torch.rand(k, generator=g, dtype=torch.float64)
    return (U[..., :, :k] * s) @ V[..., :, :k].transpose(-1, -2)


@pytest.mark.parametrize("shape", [(12, 20), (20, 12), (16, 16), (3, 8, 6)], ids=str)
@pytest.mark.parametrize("reg,p", [("frobenius", None), ("nuclear", None), ("schatten", 3.0), ("schatten", 1.5),
                                   ("entropy", None)])
@pytest.mark.parametrize("b,D", [(0.5, 1.0), (2.0, 3.0), (0.05, 0.2)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_matches_oracle(shape, reg, p, b, D, dtype):
    G = _gen(shape, seed=len(shape) * 7 + int(b * 100))
    s = torch.linalg.svdvals(G)
    if reg == "nuclear" and ((s - b).abs() < 0.025 * b).any():
        pytest.skip("a singular value within 2.5% of the step")
    X = spectral_lmo(G.to(dtype), reg, b=b, radius=D, p=p)
    assert X.dtype == dtype and X.shape == G.shape
    ref = _oracle(G.to(dtype), reg, b, D, p)
    err = np.linalg.norm((X.double().numpy() - ref).reshape(-1)) / max(np.linalg.norm(ref.reshape(-1)), 1e-30)
    assert err <= (1e-10 if dtype == torch.float64 else 1e-4), err
    assert torch.linalg.matrix_norm(X.double(), 2).max() <= D * (1 + 1e-6)


@pytest.mark.parametrize("reg,p", [("frobenius", None), ("nuclear", None), ("schatten", 3.0), ("entropy", None)])
def test_minimises_the_regularised_objective(reg, p):
    """Brute force: no random point of the ball does better than X*."""
    G = _gen((6, 9), seed=3, spread=False) * 3
    b, D = 0.7, 1.5
    X = spectral_lmo(G, reg, b=b, radius=D, p=p).numpy()

    def objective(Y):
        return float(np.sum(G.numpy() * Y) + PSI[reg](np.linalg.svd(Y, compute_uv=False), b, p))

    best = objective(X)
    rng = np.random.default_rng(0)
    for _ in range(2000):
        Y = rng.standard_normal((6, 9))
        Y *= D * rng.uniform() ** 0.5 / np.linalg.norm(Y, 2)
        assert best <= objective(Y) + 1e-9
    # and no better than small perturbations of itself that stay in the ball
    for _ in range(200):
        Y = X + 1e-3 * rng.standard_normal(X.shape)
        if np.linalg.norm(Y, 2) <= D:
            assert best <= objective(Y) + 1e-9


def test_rank_deficient_and_empty():
    G = torch.zeros(4, 6, dtype=torch.float64)
    G[0, 0] = 2.0
    for reg in ("frobenius", "nuclear", "schatten"):
        X = spectral_lmo(G, reg, b=1.0, radius=1.0, p=2.0 if reg == "schatten" else None)
        assert torch.allclose(X, -torch.where(G > 0, torch.ones_like(G), torch.zeros_like(G)))
    X = spectral_lmo(G, "entropy", b=1.0, radius=0.5)  # zero singular values map to min(1, D) = 0.5
    assert torch.allclose(torch.linalg.svdvals(X), torch.full((4,), 0.5, dtype=torch.float64))
    assert spectral_lmo(torch.zeros(0, 3), "nuclear", b=1.0, radius=1.0).shape == (0, 3)


def test_bf16_input():
    G = _gen((16, 24), seed=5).to(torch.bfloat16)
    X = spectral_lmo(G, "frobenius", b=0.5, radius=1.0)
    ref = torch.from_numpy(_oracle(G.float(), "frobenius", 0.5, 1.0, None))
    assert X.dtype == torch.bfloat16 and (X.double() - ref).norm() / ref.norm() < 1e-2


@pytest.mark.parametrize("kwargs,match", [
    (dict(regularizer="l1", b=1.0, radius=1.0), "regularizer"),
    (dict(regularizer="nuclear", b=0.0, radius=1.0), "b"),
    (dict(regularizer="nuclear", b=math.inf, radius=1.0), "b"),
    (dict(regularizer="nuclear", b=1.0, radius=-1.0), "radius"),
    (dict(regularizer="nuclear", b=1.0, radius=math.nan), "radius"),
    (dict(regularizer="schatten", b=1.0, radius=1.0), "p"),
    (dict(regularizer="schatten", b=1.0, radius=1.0, p=1.0), "p"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        spectral_lmo(torch.randn(3, 4), **kwargs)
    with pytest.raises(TypeError):
        spectral_lmo(torch.ones(3, 4, dtype=torch.int64), "nuclear", b=1.0, radius=1.0)
