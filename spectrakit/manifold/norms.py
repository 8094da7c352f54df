"""Norms that measure the update ``A`` of steepest descent (Cesista 2025 §3.1, §6 and A1.2).

Each norm provides the three maps the dualizers need, for a matrix of shape ``(..., m, n)``:

- ``value(A)``: the norm itself;
- ``dualize(X, eta) = argmax_{||A|| <= eta} <X, A>`` (the paper's LMO, up to the sign convention:
  the steepest-descent step for gradient ``G`` is ``dualize(-G, eta)``);
- ``project_ball(X, eta)``: the Frobenius-orthogonal projection onto ``{||A|| <= eta}``.

| norm | value | dualize | project_ball |
|---|---|---|---|
| ``rms`` | ``sqrt(n/m) ||A||_2`` | ``sqrt(m/n) eta msign(X)`` | ``spectral_hardcap(X, sqrt(m/n) eta)`` |
| ``spectral`` | ``||A||_2`` | ``eta msign(X)`` | ``spectral_hardcap(X, eta)`` |
| ``frobenius`` | ``||A||_F`` | ``eta X / ||X||_F`` | ``X min(1, eta / ||X||_F)`` |

For symmetric sets (square ``X``) ``project_ball`` of the operator norms uses ``eig_clip(X, -r, r)``, which
keeps the result exactly symmetric (Cesista 2025 §6 table).
"""

from __future__ import annotations

import math

import torch

from spectrakit._checks import check_choice
from spectrakit.manifold import _ops

_TINY = 1e-30


class OperatorNorm:
    """Spectral norm ``||A||_2`` (``rms=False``) or RMS→RMS norm ``sqrt(n/m) ||A||_2`` (``rms=True``).

    The RMS→RMS norm (Yang et al. 2024) is the operator norm between RMS-normalised spaces; its LMO is
    ``-sqrt(m/n) eta msign(G)`` (Cesista 2025 §6, A1.2). ``method`` selects the msign route (``"polar"``) or the
    SVD/eigh reference (``"exact"``).
    """

    def __init__(self, rms: bool = True, *, method: str = "polar"):
        self.rms = bool(rms)
        self.method = check_choice(method, "method", _ops.METHODS)
        self.name = "rms" if self.rms else "spectral"

    def scale(self, A: torch.Tensor) -> float:
        """``sqrt(m/n)`` for the RMS→RMS norm, 1 for the spectral norm."""
        return math.sqrt(A.shape[-2] / A.shape[-1]) if self.rms else 1.0

    def value(self, A: torch.Tensor) -> torch.Tensor:
        """``||A||_2 / scale`` (exact, via singular values; a diagnostic, not used in hot paths)."""
        return torch.linalg.matrix_norm(A.double(), ord=2).to(A.dtype) / self.scale(A)

    def dualize(self, X: torch.Tensor, eta) -> torch.Tensor:
        """``argmax_{||A|| <= eta} <X, A> = scale * eta * msign(X)``."""
        return (self.scale(X) * _ops.as_batch_scalar(eta, X)) * _ops.msign(X, self.method)

    def project_ball(self, X: torch.Tensor, eta, *, symmetric: bool = False) -> torch.Tensor:
        """Nearest point (Frobenius) of ``{||A|| <= eta}``: singular values capped at ``scale * eta``."""
        r = self.scale(X) * _ops.as_batch_scalar(eta, X)
        if isinstance(r, torch.Tensor):  # per-matrix radius: cap X / r at 1 and scale back (exact identity)
            return r * self.project_ball(X / r, 1.0 / self.scale(X), symmetric=symmetric)
        if symmetric:
            return _ops.eig_clip(X, -r, r, self.method)
        return _ops.spectral_hardcap(X, r, self.method)

    def __repr__(self) -> str:
        return f"OperatorNorm(rms={self.rms}, method={self.method!r})"


class FrobeniusNorm:
    """Frobenius norm ``||A||_F``; LMO ``-eta G / ||G||_F`` and the radial ball projection (Cesista 2025 §3.1)."""

    name = "frobenius"

    def __init__(self, *, method: str = "polar"):
        self.method = check_choice(method, "method", _ops.METHODS)

    def value(self, A: torch.Tensor) -> torch.Tensor:
        return torch.linalg.matrix_norm(A, ord="fro")

    def dualize(self, X: torch.Tensor, eta) -> torch.Tensor:
        """``eta X / ||X||_F`` (0 for ``X = 0``)."""
        nrm = torch.linalg.matrix_norm(X, ord="fro", keepdim=True).clamp_min(_TINY)
        return (_ops.as_batch_scalar(eta, X) / nrm) * X

    def project_ball(self, X: torch.Tensor, eta, *, symmetric: bool = False) -> torch.Tensor:
        """``X * min(1, eta / ||X||_F)``."""
        nrm = torch.linalg.matrix_norm(X, ord="fro", keepdim=True).clamp_min(_TINY)
        return X * torch.clamp(_ops.as_batch_scalar(eta, X) / nrm, max=1.0)

    def __repr__(self) -> str:
        return f"FrobeniusNorm(method={self.method!r})"


NORMS = ("rms", "spectral", "frobenius")


def get_norm(norm, *, method: str = "polar"):
    """Return a norm object for ``"rms"``, ``"spectral"`` or ``"frobenius"`` (objects pass through).

    Raises ``ValueError`` for any other name.
    """
    if isinstance(norm, (OperatorNorm, FrobeniusNorm)):
        return norm
    check_choice(norm, "norm", NORMS)
    if norm == "frobenius":
        return FrobeniusNorm(method=method)
    return OperatorNorm(rms=(norm == "rms"), method=method)
