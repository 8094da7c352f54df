"""Spectral-norm estimation and subspace distances (Jiang, Semenov and Stich 2026 §F.2.2)."""

from __future__ import annotations

import torch

from spectrakit._checks import check_choice, check_int, check_tensor

from ._util import mT


def spectral_norm(W: torch.Tensor, *, iters: int = 20, v0: torch.Tensor | None = None,
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Largest singular value of ``W`` by batched power iteration on ``W^T W``.

    ``v <- W^T W v / ||W^T W v||`` for ``iters`` steps from ``v0`` (warm start) or a fixed pseudo-random
    start; returns ``(||W v||, v)``. The estimate is a lower bound of ``sigma_max`` that converges like
    ``(s_2 / s_1)^(2 iters)``; pass the returned ``v`` as ``v0`` next time (weights change slowly).
    Computed in at least float32 on ``W / max|W|`` (the value is rescaled), so the result is relative-accurate
    for every finite input scale, subnormal (1e-40 entries) to ~1e38; no host sync. Exact reference:
    ``torch.linalg.matrix_norm(W, ord=2)``.

    Args:
        W: ``(..., m, n)`` floating tensor (finite).
        iters: power iterations, int in [0, 10000] (0 returns ``||W v0||`` for the start vector).
        v0: optional start vectors of shape ``(..., n)`` (W's batch shape); need not be normalised.

    Returns:
        ``(value, v)``: ``value`` of shape ``W.shape[:-2]`` (W's dtype), ``v`` unit vectors ``(..., n)``.

    Raises:
        TypeError: W/v0 not floating tensors. ValueError: W with < 2 dims or non-finite, iters out of
        range, v0 of the wrong shape.
    """
    check_tensor(W, "W", min_ndim=2)
    check_int(iters, "iters", low=0, high=10000)
    work = torch.float64 if W.dtype == torch.float64 else torch.float32
    n = W.shape[-1]
    if W.numel() == 0:  # no entries: the norm is 0; v is a unit vector (e_1) when n > 0
        v = torch.zeros(*W.shape[:-2], n, dtype=W.dtype, device=W.device)
        if n:
            v[..., 0] = 1
        return W.new_zeros(W.shape[:-2]), v
    w = W.to(work)
    # scale-free: iterate on W / max|W| (no overflow of W^T W v, no underflow to 0), undo on the value
    amax = w.abs().amax(dim=(-2, -1), keepdim=True).clamp_min(torch.finfo(work).tiny)
    w = w / amax
    n = W.shape[-1]
    if v0 is None:
        gen = torch.Generator(device=W.device)
        gen.manual_seed(1234)
        v = torch.randn(*W.shape[:-2], n, generator=gen, device=W.device, dtype=work)
    else:
        check_tensor(v0, "v0", min_ndim=1)
        if tuple(v0.shape) != (*W.shape[:-2], n):
            raise ValueError(f"v0 must have shape {(*W.shape[:-2], n)} (batch shape + n), "
                             f"got {tuple(v0.shape)}")
        v = v0.to(device=W.device, dtype=work)
    tiny = torch.finfo(work).tiny * 1e3
    v = v / torch.linalg.vector_norm(v, dim=-1, keepdim=True).clamp_min(tiny)
    for _ in range(iters):
        u = (w @ v[..., None])
        v = (mT(w) @ u)[..., 0]
        v = v / torch.linalg.vector_norm(v, dim=-1, keepdim=True).clamp_min(tiny)
    value = torch.linalg.vector_norm((w @ v[..., None])[..., 0], dim=-1) * amax[..., 0, 0]
    return value.to(W.dtype), v.to(W.dtype)


def subspace_distance(U1: torch.Tensor, U2: torch.Tensor, kind: str = "spectral") -> torch.Tensor:
    """Distance between the column spans of orthonormal ``U1, U2`` of shape ``(..., m, r)`` (Jiang, Semenov and Stich
    2026 §F.2.2).

    With ``A = U1^T U2`` and ``B = I - A A^T``: ``"spectral"``: ``sqrt(lambda_max(B)) = sqrt(1 - s_min(A)^2)``
    (sine of the largest principal angle); ``"chordal"``: ``sqrt(trace(B) / r)`` (RMS sine of the angles).
    Both lie in [0, 1]. Computed in float64 from the singular values of ``A`` (``svdvals``; it may
    synchronise on CUDA: a diagnostic, not a hot-path function).

    Raises:
        TypeError: inputs not floating tensors. ValueError: shapes differ, fewer than 2 dims, r > m,
        non-finite values, unknown kind.
    """
    check_tensor(U1, "U1", min_ndim=2)
    check_tensor(U2, "U2", min_ndim=2)
    check_choice(kind, "kind", ("spectral", "chordal"))
    if U1.shape != U2.shape:
        raise ValueError(f"U1 and U2 must have the same shape (..., m, r), got {tuple(U1.shape)} and "
                         f"{tuple(U2.shape)}")
    m, r = U1.shape[-2:]
    if r > m:
        raise ValueError(f"U1, U2 must be (..., m, r) with r <= m (orthonormal columns), "
                         f"got shape {tuple(U1.shape)}")
    if r == 0:  # two 0-dimensional subspaces: no principal angle, distance 0
        return U1.new_zeros(U1.shape[:-2])
    a = mT(U1.double()) @ U2.double()
    if kind == "chordal":
        tr = r - torch.linalg.matrix_norm(a) ** 2
        out = (tr / r).clamp_min(0).sqrt()
    else:
        s = torch.linalg.svdvals(a)
        out = (1 - s[..., -1] ** 2).clamp_min(0).sqrt()
    return out.to(U1.dtype)
