"""Independent float64 numpy oracles and test-matrix generators for the tests of :mod:`spectrakit.linalg`.

The oracles use ``numpy.linalg.svd``/``eigh`` (not torch), so they check torch's ``"exact"`` paths too.
"""

from __future__ import annotations

import numpy as np
import torch


def np64(x: torch.Tensor) -> np.ndarray:
    return x.detach().to("cpu", torch.float64).numpy()


def svd_map(x: torch.Tensor, fn) -> np.ndarray:
    """``U fn(S) V^T`` in float64 numpy, batched over leading dims (thin SVD)."""
    a = np64(x)
    u, s, vh = np.linalg.svd(a, full_matrices=False)
    return (u * fn(s)[..., None, :]) @ vh


def eig_map(w: torch.Tensor, fn) -> np.ndarray:
    """``Q fn(Lambda) Q^T`` of ``sym(w)`` in float64 numpy."""
    a = np64(w)
    a = (a + np.swapaxes(a, -1, -2)) / 2
    lam, q = np.linalg.eigh(a)
    return (q * fn(lam)[..., None, :]) @ np.swapaxes(q, -1, -2)


def rel_err(out: torch.Tensor, ref: np.ndarray) -> float:
    """Relative Frobenius error over the whole tensor (0/0 -> 0)."""
    o = np64(out)
    den = np.linalg.norm(ref)
    num = np.linalg.norm(o - ref)
    return float(num / den) if den > 0 else float(num)


def matrix_with_spectrum(m: int, n: int, s, *, gen: torch.Generator | None = None) -> torch.Tensor:
    """float64 ``U diag(s) V^T`` with Haar-random ``U`` (m x k), ``V`` (n x k), ``k = len(s)``."""
    s = torch.as_tensor(s, dtype=torch.float64)
    k = s.numel()
    u, _ = torch.linalg.qr(torch.randn(m, k, dtype=torch.float64, generator=gen))
    v, _ = torch.linalg.qr(torch.randn(n, k, dtype=torch.float64, generator=gen))
    return (u * s) @ v.T


def spiked(m: int, n: int, spike: float = 1e4, *, gen: torch.Generator | None = None) -> torch.Tensor:
    """Gaussian bulk (sigma_max ~ 1) plus a rank-1 spike of ``spike`` times the bulk's sigma_max."""
    x = torch.randn(m, n, dtype=torch.float64, generator=gen) / (m**0.5 + n**0.5)
    u = torch.randn(m, 1, dtype=torch.float64, generator=gen)
    v = torch.randn(1, n, dtype=torch.float64, generator=gen)
    return x + spike * float(torch.linalg.matrix_norm(x, 2)) * (u / u.norm()) @ (v / v.norm())


def symmetric_with_eigs(n: int, lam, *, gen: torch.Generator | None = None) -> torch.Tensor:
    """float64 ``Q diag(lam) Q^T`` with Haar-random ``Q``."""
    lam = torch.as_tensor(lam, dtype=torch.float64)
    q, _ = torch.linalg.qr(torch.randn(n, n, dtype=torch.float64, generator=gen))
    w = (q * lam) @ q.T
    return (w + w.T) / 2
