"""The "fantastic four" (F4) bound of Singla & Feizi 2020, as stated in Grishina, Gorbunov and Rakhuba 2024 eq. (8):

    ||T||_2 <= sqrt(h w) min(||K_(co h; ci w)||_2, ||K_(co w; ci h)||_2, ||K_(co; ci h w)||_2, ||K_(ci; co h w)||_2).

Each unfolding bounds ``||K||_sigma`` (Lemma 1), so F4 >= TN always. For ``d`` spatial axes we use
``(co; rest)``, ``(ci; rest)`` and ``(co A; ci B)`` for every split of the spatial axes into non-empty ``A, B``
(for d = 2 exactly the four above; for d = 1 the first two). Strided layers use the kernel ``Q`` of Thm 4.3 and
its factor ``sqrt(prod ceil(k_i/s_i))``, like :func:`~spectrakit.conv.tn_bound`.
"""

from __future__ import annotations

import itertools
import math

import torch

from spectrakit.conv.kernel import effective_kernel
from spectrakit.conv.power import top_singular


def unfoldings(Q: torch.Tensor, d: int) -> list[torch.Tensor]:
    """The F4 family of unfolding matrices of ``Q (..., co, ci, k_1..k_d)`` (see module doc)."""
    nb = Q.ndim - d - 2
    lead = Q.shape[:nb]
    co, ci, sp = nb, nb + 1, list(range(nb + 2, nb + 2 + d))
    base = list(range(nb))

    def unf(rows: list[int], cols: list[int]) -> torch.Tensor:
        m = math.prod(Q.shape[a] for a in rows)
        return Q.permute(base + rows + cols).reshape(*lead, m, -1)

    mats = [unf([co], [ci] + sp), unf([ci], [co] + sp)]
    for r in range(1, d):
        for A in itertools.combinations(sp, r):
            mats.append(unf([co] + list(A), [ci] + [a for a in sp if a not in A]))
    return mats


def f4_bound(weight, *, stride=1, dilation=1, groups: int = 1, spatial_dims: int = 2, iters: int | None = None,
             state: list[torch.Tensor] | None = None, reduce_groups: bool = True,
             finite: bool = True) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """F4 bound ``sqrt(k'_1..k'_d) min_j ||R_j||_2`` over the unfoldings ``R_j`` of ``Q`` (module doc).

    Same calling convention as :func:`~spectrakit.conv.tn_bound` (kernel tensor or ``nn.ConvNd``; stride,
    dilation, groups, spatial_dims). Default (``iters=None``, no ``state``): exact unfolding norms by SVD, state
    ``None``. Otherwise ``iters`` >= 1 warm-started power iterations per unfolding (default 1 with ``state``);
    ``state``: the list of right vectors returned by the previous call.
    Returns ``(bound, state)``; ``bound`` is differentiable (gradient ``u v^T`` of the minimal
    unfolding). Raises ``TypeError``/``ValueError`` like :func:`~spectrakit.conv.tn_bound`.
    """
    Q, geo = effective_kernel(weight, stride=stride, dilation=dilation, groups=groups, spatial_dims=spatial_dims,
                              finite=finite)
    mats = unfoldings(Q, geo.spatial_dims)
    if iters is None and state is None:     # cold call: exact spectral norms (batched SVD)
        cdt = torch.float64 if Q.dtype == torch.float64 else torch.float32
        sig = [torch.linalg.matrix_norm(A.to(cdt), ord=2).to(Q.dtype) for A in mats]
        bound = torch.stack(sig, -1).amin(-1) * math.sqrt(math.prod(Q.shape[-geo.spatial_dims:]))
        return (bound.amax(-1) if reduce_groups else bound), None
    if iters is None:
        iters = 1
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 1:
        raise ValueError(f"iters must be an int >= 1, got {iters!r}")
    if state is not None and (len(state) != len(mats) or any(s.shape != m.shape[:-2] + m.shape[-1:]
                                                              for s, m in zip(state, mats))):
        raise ValueError("state does not match the unfoldings of this kernel (pass the state of the same layer)")
    sig, vecs = [], []
    for j, A in enumerate(mats):
        s, v = top_singular(A, iters=iters, v0=None if state is None else state[j])
        sig.append(s)
        vecs.append(v)
    bound = torch.stack(sig, -1).amin(-1) * math.sqrt(math.prod(Q.shape[-geo.spatial_dims:]))
    if reduce_groups:
        bound = bound.amax(-1)
    return bound, vecs
