"""Batched power iteration for the largest singular value of matrices (used by the F4 bound and Linear layers).

``sigma_1(A) = max_{||v|| = 1} ||A v||``; iterate ``v <- A^T A v / ||A^T A v||`` from ``v0`` (warm start) and
return ``u^T A v`` with ``u = A v / ||A v||`` held fixed, whose autograd gradient is ``u v^T`` (the gradient of
``sigma_1`` at a simple top singular value). No host synchronisation.
"""

from __future__ import annotations

import torch

from spectrakit._checks import check_int

_TINY = 1e-30


def top_singular(A: torch.Tensor, *, iters: int = 100, v0: torch.Tensor | None = None,
                 generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Largest singular value of ``A (..., m, n)`` by ``iters`` >= 0 warm-started power iterations.

    ``v0``: start vector ``(..., n)`` (default random). Returns ``(sigma, v)``; ``sigma`` is differentiable
    w.r.t. ``A`` (vectors detached). Computes in float32 (float64 for float64 input); returns ``A.dtype``.
    """
    check_int(iters, "iters", low=0)
    cdt = torch.float64 if A.dtype == torch.float64 else torch.float32
    Ac = A.to(cdt)
    with torch.no_grad():
        Ad = Ac.detach()
        if v0 is None:
            v = torch.randn(*A.shape[:-2], A.shape[-1], dtype=cdt, device=A.device, generator=generator)
        else:
            v = v0.to(device=A.device, dtype=cdt).expand(*A.shape[:-2], A.shape[-1]).clone()
        v = v / torch.linalg.vector_norm(v, dim=-1, keepdim=True).clamp_min(_TINY)
        for _ in range(iters):
            v = (Ad.mT @ (Ad @ v[..., None]))[..., 0]
            v = v / torch.linalg.vector_norm(v, dim=-1, keepdim=True).clamp_min(_TINY)
        u = (Ad @ v[..., None])[..., 0]
        u = u / torch.linalg.vector_norm(u, dim=-1, keepdim=True).clamp_min(_TINY)
    sigma = (u[..., None, :] @ Ac @ v[..., None])[..., 0, 0]
    return sigma.to(A.dtype), v
