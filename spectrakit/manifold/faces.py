"""Active faces of a spectral set and the numerically stable subspace projectors that find them.

Cesista 2025 §3.2.1, §4.1.1, §5.1.3 and A1.1. At a boundary point ``W`` the tangent cone of every set in this
package is cut out by linear matrix inequalities on the eigen/singular subspaces where ``W`` touches a bound:

- symmetric sets (PSD cone, spectrahedron): ``P X̂ P ≽ 0`` on the ``lo``-eigenspace (projector ``P_lo``) and
  ``P X̂ P ≼ 0`` on the ``hi``-eigenspace, with ``X̂ = sym(X)``;
- rectangular sets (spectral ball/band, Stiefel): ``sym(J^T X P_V) ≽ 0`` on the ``lo``-singular subspace and
  ``≼ 0`` on the ``hi``-singular subspace, with ``P_V = V_r V_r^T`` and the partial isometry ``J = U_r
  V_r^T``.

A :class:`Face` stores ``(J, P, lower)``; the constraint map is ``L(X) = sym(J^T X P)`` (``J = P`` for
symmetric sets, where ``L(X) = P X̂ P``) with adjoint ``L*(S) = J S P``. All projectors come from
``eig_stepfun`` (one msign each), never from an eigendecomposition, so they are factorization-free.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from spectrakit.manifold import _ops


class Face(NamedTuple):
    """One active face: constraint ``L(X) = sym(J^T X P) ≽ 0`` (``lower=True``) or ``≼ 0`` (``lower=False``).

    ``J`` has the shape of the parameter ``(..., m, n)``, ``P`` is ``(..., n, n)``; for symmetric sets
    ``J`` is
    ``None`` and ``L(X) = P sym(X) P``. ``transposed=True`` means ``J, P`` describe ``W^T`` (wide
    parameters are
    handled in their tall orientation so that ``W^T W`` is the small Gram matrix): ``L(X) = sym(J^T X^T P)``.
    """

    J: torch.Tensor | None
    P: torch.Tensor
    lower: bool
    transposed: bool = False

    def constraint(self, X: torch.Tensor) -> torch.Tensor:
        """``L(X)``: ``P sym(X) P`` (symmetric sets) or ``sym(J^T X P)`` (rectangular sets)."""
        if self.J is None:
            return _ops.sym(self.P @ _ops.sym(X) @ self.P)
        X = X.mT if self.transposed else X
        return _ops.sym(self.J.mT @ X @ self.P)

    def adjoint(self, S: torch.Tensor) -> torch.Tensor:
        """``L*(S) = J S P`` (``P S P`` for symmetric sets), so that ``<L(X), S> = <X, L*(S)>``."""
        if self.J is None:
            return self.P @ S @ self.P
        out = self.J @ S @ self.P
        return out.mT if self.transposed else out

    def violation(self, S: torch.Tensor, method: str) -> torch.Tensor:
        """The part of symmetric ``S`` outside the allowed cone: ``proj_nsd(S)`` (lower) / ``proj_psd(S)``
        (upper)."""
        return _ops.proj_nsd(S, method) if self.lower else _ops.proj_psd(S, method)

    def correction(self, X: torch.Tensor, method: str) -> torch.Tensor:
        """Term the tangent projection subtracts: ``proj_nsd(P X̂ P)`` or ``J proj_±(sym(J^T X P))``."""
        V = self.violation(self.constraint(X), method)
        if self.J is None:
            return V
        return (self.J @ V).mT if self.transposed else self.J @ V


def eig_lower_projector(W: torch.Tensor, lo, tol: float, method: str) -> torch.Tensor:
    """``P_lo = I - eig_stepfun(W, lo + tol)``: projector onto eigenvectors of ``W`` with eigenvalue ``<=
    lo + tol``.

    Cesista 2025 §3.2.1 (``lo = 0``: null-space projector ``P_0`` of a PSD matrix) and §4.1.1. ``W`` symmetric
    ``(..., n, n)`` with all eigenvalues ``>= lo``; ``lo`` float or tensor of batch shape; ``tol > 0``.
    """
    return _ops.eye_like(W) - _ops.eig_stepfun(_shifted(W, lo), tol, method)


def eig_upper_projector(W: torch.Tensor, hi, tol: float, method: str) -> torch.Tensor:
    """``P_hi = eig_stepfun(W, hi - tol)``: projector onto eigenvectors with eigenvalue ``>= hi - tol``
    (§4.1.1)."""
    return _ops.eig_stepfun(_shifted(W, hi), -tol, method)


def singular_upper_face(W: torch.Tensor, hi, tol: float, method: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(J, P_V)`` of the top singular subspace: ``P_V = eig_stepfun(W^T W / hi^2, 1 - tol)``, ``J = W P_V
    / hi``.

    Cesista 2025 §5.1.3: with ``W = U S V^T`` and ``||W||_2 <= hi``, ``P_V = V_hi V_hi^T`` and ``J = U_hi V_hi^T``
    (singular values within a relative ``tol`` of ``hi`` count as on the boundary). ``hi > 0``.
    """
    hi_ = _ops.as_batch_scalar(hi, W)
    P = _ops.eig_stepfun(_ops.sym(W.mT @ W) / hi_**2, 1.0 - tol, method)
    return (W @ P) / hi_, P


def singular_lower_face(W: torch.Tensor, lo, tol: float, method: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(J, P_V)`` of the bottom singular subspace: ``P_V = I - eig_stepfun(W^T W / lo^2, 1 + tol)``, ``J
    = W P_V / lo``.

    Cesista 2025 A1.1 (band with inner radius ``lo > 0``). ``W`` must be tall (``m >= n``) so that ``W^T W``
    has no
    structural zero eigenvalues; callers transpose wide matrices.
    """
    lo_ = _ops.as_batch_scalar(lo, W)
    P = _ops.eye_like(W) - _ops.eig_stepfun(_ops.sym(W.mT @ W) / lo_**2, 1.0 + tol, method)
    return (W @ P) / lo_, P


def project_onto_faces(X: torch.Tensor, faces: list[Face], method: str) -> torch.Tensor:
    """``X - sum_f correction_f(X)``: the tangent-cone projection when the faces are mutually orthogonal
    (distinct eigen/singular values) or coincide as a pair lo = hi (Stiefel), which covers every set here."""
    out = X
    for f in faces:
        out = out - f.correction(X, method)
    return out


def _shifted(W: torch.Tensor, t) -> torch.Tensor:
    """``W - t I`` for a float or per-matrix tensor ``t`` (thresholds reach ``eig_stepfun`` as floats)."""
    if isinstance(t, torch.Tensor):
        return W - _ops.as_batch_scalar(t, W) * _ops.eye_like(W)
    return W - float(t) * _ops.eye_like(W) if t != 0 else W
