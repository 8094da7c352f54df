"""Linear minimisation over the spectral ball with a unitarily invariant regularizer.

Jiang, Semenov and Stich (2026), §3.1 and Appendix E.3: the composite Frank-Wolfe subproblem

    X* = argmin_{||X||_2 <= D}  <G, X> + psi(X)

with ``psi`` a function of the singular values keeps the singular vectors of ``G = U diag(s) V^T`` and maps
each singular value on its own: ``X* = -U diag(s*) V^T`` with

- ``"frobenius"``, ``psi = b/2 ||X||_F^2``:          ``s* = min(s / b, D)`` (the clipping behind SPECTRA);
- ``"nuclear"``,   ``psi = b sum_i s_i``:             ``s* = D`` if ``s > b`` else ``0``;
- ``"schatten"``,  ``psi = b/p sum_i s_i^p``, p > 1: ``s* = min((s / b)^(1 / (p - 1)), D)``;
- ``"entropy"``,   ``psi = b sum_i (s_i log s_i - s_i)``: ``s* = min(exp(s / b), D) = exp(min(s / b, log D))``.
"""

from __future__ import annotations

import math

import torch

from spectrakit._checks import check_choice, check_scalar, check_tensor

REGULARIZERS = ("frobenius", "nuclear", "schatten", "entropy")


def singular_value_map(s: torch.Tensor, regularizer: str, b: float, radius: float,
                       p: float | None = None) -> torch.Tensor:
    """The scalar map ``s -> s*`` of :func:`spectral_lmo` applied to singular values ``s >= 0``."""
    if regularizer == "frobenius":
        return (s / b).clamp(max=radius)
    if regularizer == "nuclear":
        return torch.where(s > b, torch.full_like(s, radius), torch.zeros_like(s))
    if regularizer == "schatten":
        return (s / b).pow(1.0 / (p - 1.0)).clamp(max=radius)
    return torch.exp((s / b).clamp(max=math.log(radius)))


def spectral_lmo(G: torch.Tensor, regularizer: str, *, b: float, radius: float,
                 p: float | None = None) -> torch.Tensor:
    r"""Solution ``X*`` of ``min_{||X||_2 <= radius} <G, X> + psi(X)`` (see the module docstring for the four
    regularizers and their singular-value maps; Jiang, Semenov and Stich 2026, §3.1, Appendix E.3).

    ``G``: a real floating tensor ``(..., m, n)`` (batched). The map is applied to the singular values of a
    float64 SVD for float64 input and a float32 SVD otherwise; the result has ``G``'s dtype and shape and
    ``||X*||_2 <= radius``. Only this exact (SVD) route exists; an iterative route on the polar core is not
    provided yet.

    Discontinuity and null space: the nuclear map is a step at ``s = b`` (``s == b`` maps to 0, and a
    singular value within rounding of ``b`` may fall on either side). Zero singular values map to 0 for
    ``"frobenius"``, ``"nuclear"`` and ``"schatten"``, so ``X*`` is unique; for ``"entropy"`` they map to
    ``min(1, radius) > 0``, and ``X*`` then uses the null-space singular vectors that the SVD returns (one
    of many minimisers when ``G`` is rank-deficient).

    Raises ``ValueError`` for an unknown ``regularizer``, ``b`` or ``radius`` not finite and > 0, or ``p``
    not finite and > 1 for ``"schatten"`` (``p`` is ignored otherwise); ``TypeError``/``ValueError`` for a
    ``G`` that is not a real floating tensor with at least 2 dims.
    """
    check_tensor(G, "G", min_ndim=2)
    check_choice(regularizer, "regularizer", REGULARIZERS)
    check_scalar(b, "b", low=0.0, low_inclusive=False, high=math.inf, high_inclusive=False, allow_tensor=False)
    check_scalar(radius, "radius", low=0.0, low_inclusive=False, high=math.inf, high_inclusive=False,
                 allow_tensor=False)
    if regularizer == "schatten":
        if p is None:
            raise ValueError("p is required for regularizer='schatten' (a finite number > 1)")
        check_scalar(p, "p", low=1.0, low_inclusive=False, high=math.inf, high_inclusive=False, allow_tensor=False)
    work = torch.float64 if G.dtype == torch.float64 else torch.float32
    if G.numel() == 0:
        return torch.zeros_like(G)
    U, s, Vh = torch.linalg.svd(G.to(work), full_matrices=False)
    s_star = singular_value_map(s, regularizer, float(b), float(radius), p)
    return (-(U * s_star.unsqueeze(-2)) @ Vh).to(G.dtype)
