"""Independent float64 oracles for the manifold tests: random points on each set's boundary with known
active subspaces (built from explicit eigen/singular bases, not from the code under test)."""

from __future__ import annotations

import torch


def sym(A):
    return (A + A.mT) / 2


def orth(m, n, *, gen=None, batch=()):
    """Random ``(..., m, n)`` matrix with orthonormal columns (``m >= n``)."""
    q, _ = torch.linalg.qr(torch.randn(*batch, m, n, dtype=torch.float64, generator=gen))
    return q


def psd_point(n, nullity, *, batch=(), gen=None):
    """PSD matrix with an exact null space of dimension ``nullity``; returns ``(W, U0)``."""
    Q = orth(n, n, gen=gen, batch=batch)
    lam = torch.rand(*batch, n, dtype=torch.float64, generator=gen) * 2 + 0.5
    lam[..., :nullity] = 0
    return (Q * lam.unsqueeze(-2)) @ Q.mT, Q[..., :nullity]


def spectrahedron_point(n, lo, hi, k_lo, k_hi, *, batch=(), gen=None):
    """Symmetric matrix with ``k_lo`` eigenvalues equal to lo, ``k_hi`` equal to hi, the rest strictly
    inside."""
    Q = orth(n, n, gen=gen, batch=batch)
    lam = lo + (hi - lo) * (0.15 + 0.7 * torch.rand(*batch, n, dtype=torch.float64, generator=gen))
    lam[..., :k_lo] = lo
    lam[..., n - k_hi:] = hi
    return (Q * lam.unsqueeze(-2)) @ Q.mT, Q[..., :k_lo], Q[..., n - k_hi:]


def band_point(m, n, lo, hi, k_lo, k_hi, *, batch=(), gen=None):
    """``W = U diag(s) V^T`` with ``k_lo`` singular values = lo, ``k_hi`` = hi, others inside; returns the
    bases."""
    r = min(m, n)
    U = orth(m, r, gen=gen, batch=batch)
    V = orth(n, r, gen=gen, batch=batch)
    s = lo + (hi - lo) * (0.15 + 0.7 * torch.rand(*batch, r, dtype=torch.float64, generator=gen))
    s[..., :k_lo] = lo
    s[..., r - k_hi:] = hi
    W = (U * s.unsqueeze(-2)) @ V.mT
    return W, (U[..., :k_lo], V[..., :k_lo]), (U[..., r - k_hi:], V[..., r - k_hi:])


def random_tangent(X, faces_uv, *, gen=None):
    """A tangent-cone element built independently: replace the face block ``sym(U^T X V)`` by a random
    PSD (lower face) / NSD (upper face) matrix. ``faces_uv``: list of ``(U, V, lower)``; faces orthogonal."""
    H = X.clone()
    for U, V, lower in faces_uv:
        k = U.shape[-1]
        if k == 0:
            continue
        B = torch.randn(*X.shape[:-2], k, k, dtype=X.dtype, generator=gen)
        C = B @ B.mT if lower else -(B @ B.mT)
        H = H - U @ sym(U.mT @ H @ V) @ V.mT + U @ C @ V.mT
    return H


def face_eigs(H, faces_uv):
    """For each face, the eigenvalues of ``sym(U^T H V)`` (>= 0 required for lower faces, <= 0 for upper)."""
    return [(torch.linalg.eigvalsh(sym(U.mT @ H @ V)), lower) for U, V, lower in faces_uv if U.shape[-1]]
