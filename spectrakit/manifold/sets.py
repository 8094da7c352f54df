"""Spectral constraint sets with one interface: ``retract``, ``faces``, ``project_tangent``, ``contains``.

Cesista 2025 §3–§5 and appendix A1:

| set | retraction | tangent-cone projection (``X̂ = sym(X)``) |
|---|---|---|
| ``PSDCone()`` | ``proj_psd`` | ``X̂ - proj_nsd(P_0 X̂ P_0)``, ``P_0 = I - eig_stepfun(W, tol)`` |
| ``Spectrahedron(lo, hi)`` | ``eig_clip(lo, hi)`` | ``X̂ - proj_nsd(P_lo X̂ P_lo) - proj_psd(P_hi X̂ P_hi)`` |
| ``SpectralBall(R)`` | ``spectral_hardcap(R)`` | ``X - J_R proj_psd(sym(J_R^T X P_V))`` (1) |
| ``SpectralBand(lo, hi)`` | ``spectral_clip(lo, hi)`` | ``X - J_lo proj_nsd(..) - J_hi proj_psd(..)`` (2) |
| ``Stiefel()`` | ``msign`` | ``X - W sym(W^T X)`` |

(1) ``P_V = eig_stepfun(W^T W / R^2, 1 - tol)``, ``J_R = W P_V / R``; (2) both faces, ``sym(J^T X P)`` inside.

Every method works on a batch ``(..., m, n)`` of same-shaped matrices, never synchronises the host (no test
of "is W an interior point": at an interior point the projectors vanish and the formulas reduce to the
identity), and takes ``method="polar"`` (msign-based, factorization-free) or ``"exact"`` (eigh/SVD).
"""

from __future__ import annotations

import math

import torch

from spectrakit._checks import check_choice, check_scalar, check_tensor
from spectrakit.manifold import _ops
from spectrakit.manifold.faces import (
    Face,
    eig_lower_projector,
    eig_upper_projector,
    project_onto_faces,
    singular_lower_face,
    singular_upper_face,
)


class SpectralSet:
    """Base class. Subclasses define ``symmetric``, ``retract`` and ``faces``.

    Args (shared): ``tol`` in (0, 1): width of the band of eigen/singular values treated as lying on a bound
    (absolute for the symmetric sets, relative to the bound for the rectangular ones); ``method`` in
    {"polar", "exact"}.
    """

    symmetric = False

    def __init__(self, *, tol: float = 1e-2, method: str = "polar"):
        self.tol = float(check_scalar(tol, "tol", low=0.0, high=1.0, low_inclusive=False, allow_tensor=False))
        self.method = check_choice(method, "method", _ops.METHODS)

    # -- interface ---------------------------------------------------------------------------------
    def retract(self, W: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def faces(self, W: torch.Tensor) -> list[Face]:  # pragma: no cover - abstract
        raise NotImplementedError

    def project_tangent(self, W: torch.Tensor, X: torch.Tensor,
                        faces: list[Face] | None = None) -> torch.Tensor:
        """Frobenius projection of ``X`` onto the tangent cone ``T_W`` of the set at ``W`` (``W`` in the set).

        ``faces`` (from :meth:`faces`) may be passed to reuse the projectors across several projections.
        Raises ``ValueError`` if shapes differ or (symmetric sets) ``W`` is not square.
        """
        self._check(W, "W")
        self._check(X, "X")
        if X.shape[-2:] != W.shape[-2:]:
            raise ValueError(f"X must have the matrix shape of W {tuple(W.shape[-2:])}, got {tuple(X.shape)}")
        faces = self.faces(W) if faces is None else faces
        if self.symmetric:
            return _ops.sym(project_onto_faces(_ops.sym(X), faces, self.method))
        return project_onto_faces(X, faces, self.method)

    def contains(self, W: torch.Tensor, tol: float = 1e-4) -> torch.Tensor:
        """Boolean tensor (batch shape): whether ``W`` lies in the set up to ``tol`` relative to its scale.

        Uses exact float64 eigenvalues/singular values (a diagnostic for tests and logs, syncs nothing
        itself).
        """
        self._check(W, "W")
        return self._contains(W.double(), float(tol))

    def prepare(self, W: torch.Tensor) -> torch.Tensor:
        """Input normalisation applied by the dualizers to the gradient (``sym`` for symmetric sets)."""
        return _ops.sym(W) if self.symmetric else W

    # -- helpers -----------------------------------------------------------------------------------
    def _check(self, W, name: str) -> None:
        check_tensor(W, name, min_ndim=2, square=self.symmetric)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._repr_args().items())
        return f"{type(self).__name__}({args})"

    def _repr_args(self) -> dict:
        return {"tol": self.tol, "method": self.method}


# ------------------------------------------------------------------------------------------------
# symmetric sets
# ------------------------------------------------------------------------------------------------
class Spectrahedron(SpectralSet):
    """Convex spectrahedron ``{W = W^T : lo I ≼ W ≼ hi I}`` (Cesista 2025 §4).

    ``retract = eig_clip(lo, hi)`` (or ``eig_relu`` / ``eig_hardcap`` for a one-sided set). Faces:
    ``P_lo = I - eig_stepfun(W, lo + tol)`` (constraint ``P_lo X̂ P_lo ≽ 0``) and
    ``P_hi = eig_stepfun(W, hi - tol)`` (``P_hi X̂ P_hi ≼ 0``). ``lo = hi`` is the single point ``lo I``,
    whose tangent cone is ``{0}``.

    Args: ``lo`` in [-inf, inf), ``hi`` in (-inf, inf] with ``lo <= hi``; ``tol``, ``method`` as in
    :class:`SpectralSet`. Raises ``ValueError`` if ``lo > hi`` or both are infinite.
    """

    symmetric = True

    def __init__(self, lo: float = -1.0, hi: float = 1.0, *, tol: float = 1e-2, method: str = "polar"):
        super().__init__(tol=tol, method=method)
        self.lo = float(check_scalar(lo, "lo", allow_tensor=False))
        self.hi = float(check_scalar(hi, "hi", allow_tensor=False))
        if self.lo > self.hi:
            raise ValueError(f"lo must be <= hi, got lo={self.lo}, hi={self.hi}")
        if math.isinf(self.lo) and math.isinf(self.hi):
            raise ValueError("at least one of lo, hi must be finite (the whole space has no boundary)")
        if self.lo == math.inf or self.hi == -math.inf:
            raise ValueError(f"lo must be < inf and hi > -inf, got lo={self.lo}, hi={self.hi}")

    def retract(self, W: torch.Tensor) -> torch.Tensor:
        """``eig_clip_[lo, hi](sym(W))`` (Cesista 2025 §2.1)."""
        self._check(W, "W")
        if math.isinf(self.hi):
            return _ops.eig_relu(W, self.lo, self.method)
        if math.isinf(self.lo):
            return _ops.eig_hardcap(W, self.hi, self.method)
        return _ops.eig_clip(W, self.lo, self.hi, self.method)

    def faces(self, W: torch.Tensor) -> list[Face]:
        """Active eigenspaces: lower ``(None, P_lo, True)`` and upper ``(None, P_hi, False)``."""
        self._check(W, "W")
        W = _ops.sym(W)
        out = []
        if not math.isinf(self.lo):
            out.append(Face(None, eig_lower_projector(W, self.lo, self.tol, self.method), True))
        if not math.isinf(self.hi):
            out.append(Face(None, eig_upper_projector(W, self.hi, self.tol, self.method), False))
        return out

    def _contains(self, W, tol):
        scale = 1.0 + torch.linalg.matrix_norm(W, ord=2)
        ev = torch.linalg.eigvalsh(_ops.sym(W))
        symmetric = torch.linalg.matrix_norm(W - W.mT) <= tol * scale
        ok_lo = ev[..., 0] >= self.lo - tol * scale
        ok_hi = ev[..., -1] <= self.hi + tol * scale
        return symmetric & ok_lo & ok_hi

    def _repr_args(self):
        return {"lo": self.lo, "hi": self.hi, **super()._repr_args()}


class PSDCone(Spectrahedron):
    """Positive semidefinite cone ``{W = W^T : W ≽ 0}`` (Cesista 2025 §3): ``retract = proj_psd``, one face
    ``P_0 = I - eig_stepfun(W, tol)`` (near-null space), tangent projection ``X̂ - proj_nsd(P_0 X̂ P_0)``."""

    def __init__(self, *, tol: float = 1e-2, method: str = "polar"):
        super().__init__(0.0, math.inf, tol=tol, method=method)

    def retract(self, W: torch.Tensor) -> torch.Tensor:
        """``proj_psd(W) = (Ŵ + Ŵ msign(Ŵ)) / 2`` with ``Ŵ = sym(W)`` (Cesista 2025 §2.2)."""
        self._check(W, "W")
        return _ops.proj_psd(W, self.method)

    def _repr_args(self):
        return SpectralSet._repr_args(self)


# ------------------------------------------------------------------------------------------------
# rectangular sets
# ------------------------------------------------------------------------------------------------
class SpectralBand(SpectralSet):
    """Spectral band ``{W : lo <= sigma_i(W) <= hi}`` (Cesista 2025 A1), radii optionally in the RMS→RMS scale.

    ``retract = spectral_clip(lo, hi)``. Faces (in the tall orientation, wide inputs are transposed):
    upper ``P_hi = eig_stepfun(W^T W / hi^2, 1 - tol)``, ``J_hi = W P_hi / hi`` (constraint
    ``sym(J_hi^T X P_hi) ≼ 0``) and, if ``lo > 0``, lower ``P_lo = I - eig_stepfun(W^T W / lo^2, 1 + tol)``,
    ``J_lo = W P_lo / lo`` (``≽ 0``). Tangent projection
    ``X - J_lo proj_nsd(sym(J_lo^T X P_lo)) - J_hi proj_psd(sym(J_hi^T X P_hi))``.

    Args: ``0 <= lo <= hi < inf``, ``hi > 0``; ``rms=True`` multiplies both radii by ``sqrt(m/n)`` of the
    matrix they are applied to (RMS→RMS operator norm ``sqrt(n/m) ||W||_2``); ``tol``, ``method`` as in
    :class:`SpectralSet`. Raises ``ValueError`` for ``lo > hi``, ``hi <= 0``, ``lo < 0`` or infinite radii.
    """

    def __init__(self, lo: float = 0.0, hi: float = 1.0, *, rms: bool = False, tol: float = 1e-2,
                 method: str = "polar"):
        super().__init__(tol=tol, method=method)
        self.hi = float(check_scalar(hi, "hi", low=0.0, high=math.inf, low_inclusive=False,
                                     high_inclusive=False, allow_tensor=False))
        self.lo = float(check_scalar(lo, "lo", low=0.0, high=math.inf, high_inclusive=False,
                                     allow_tensor=False))
        if self.lo > self.hi:
            raise ValueError(f"lo must be <= hi, got lo={self.lo}, hi={self.hi}")
        self.rms = bool(rms)

    def radii(self, W: torch.Tensor) -> tuple[float, float]:
        """``(lo, hi)`` in spectral-norm units for a matrix of the shape of ``W``."""
        s = math.sqrt(W.shape[-2] / W.shape[-1]) if self.rms else 1.0
        return self.lo * s, self.hi * s

    def retract(self, W: torch.Tensor) -> torch.Tensor:
        """``spectral_clip_[lo, hi](W)`` (``spectral_hardcap_hi`` when ``lo = 0``)."""
        self._check(W, "W")
        lo, hi = self.radii(W)
        if lo == 0.0:
            return _ops.spectral_hardcap(W, hi, self.method)
        return _ops.spectral_clip(W, lo, hi, self.method)

    def faces(self, W: torch.Tensor) -> list[Face]:
        """Active singular subspaces ``(J, P_V, lower, transposed)`` (Cesista 2025 §5.1.3, A1.1)."""
        self._check(W, "W")
        lo, hi = self.radii(W)
        transposed = W.shape[-2] < W.shape[-1]
        Wt = W.mT if transposed else W
        out = []
        if lo > 0.0:
            J, P = singular_lower_face(Wt, lo, self.tol, self.method)
            out.append(Face(J, P, True, transposed))
        J, P = singular_upper_face(Wt, hi, self.tol, self.method)
        out.append(Face(J, P, False, transposed))
        return out

    def _contains(self, W, tol):
        lo, hi = self.radii(W)
        s = torch.linalg.svdvals(W)
        return (s[..., 0] <= hi * (1 + tol)) & (s[..., -1] >= lo - tol * hi)

    def _repr_args(self):
        return {"lo": self.lo, "hi": self.hi, "rms": self.rms, **super()._repr_args()}


class SpectralBall(SpectralBand):
    """Spectral ball ``{W : ||W||_2 <= R}`` (Cesista 2025 §5), ``R = radius`` or ``radius * sqrt(m/n)``
    (``rms=True``).

    ``retract = spectral_hardcap(R)``; tangent projection ``X - J_R proj_psd(sym(J_R^T X P_V))`` with
    ``P_V = eig_stepfun(W^T W / R^2, 1 - tol)``, ``J_R = W P_V / R`` (§5.1.2–5.1.3), or, with
    ``route="dilation"``, via the spectrahedron ``[-R, R]`` at the dilation ``[[0, W], [W^T, 0]]`` (§5.1.1):
    ``[proj_T(Phi(X))]_12``. Both routes give the same result.

    Args: ``radius > 0``; ``rms``, ``tol``, ``method`` as in :class:`SpectralBand`.
    Raises ``ValueError`` for ``radius <= 0``.
    """

    def __init__(self, radius: float = 1.0, *, rms: bool = False, tol: float = 1e-2, method: str = "polar"):
        check_scalar(radius, "radius", low=0.0, high=math.inf, low_inclusive=False, high_inclusive=False,
                     allow_tensor=False)
        super().__init__(0.0, radius, rms=rms, tol=tol, method=method)
        self.radius = float(radius)

    def project_tangent(self, W, X, faces=None, *, route: str = "direct"):
        """Tangent-cone projection at ``W``; ``route`` in {"direct", "dilation"} (see class docstring)."""
        check_choice(route, "route", ("direct", "dilation"))
        if route == "direct":
            return super().project_tangent(W, X, faces)
        self._check(W, "W")
        self._check(X, "X")
        m = W.shape[-2]
        _, R = self.radii(W)
        # sigma^2 >= R^2 (1 - tol)  <=>  eigenvalue of Phi(W) >= R sqrt(1 - tol): same boundary band.
        eig_tol = R * (1.0 - math.sqrt(1.0 - self.tol))
        spec = Spectrahedron(-R, R, tol=min(eig_tol, 0.999), method=self.method)
        return spec.project_tangent(dilation(W), dilation(X))[..., :m, m:]

    def _repr_args(self):
        return {"radius": self.radius, "rms": self.rms, "tol": self.tol, "method": self.method}


class Stiefel(SpectralBand):
    """(Scaled) Stiefel manifold: all singular values equal ``s = 1`` (or ``sqrt(m/n)`` with ``rms=True``).

    The spectral band ``[s, s]`` (Cesista 2025 A1.1.1): ``retract(W) = s msign(W)``; tangent projection
    ``X - Q sym(Q^T X)`` with ``Q = W / s`` for tall ``W`` (``X - sym(X Q^T) Q`` for wide ``W``), which the
    band
    formula reduces to (checked in the tests). Args: ``rms``, ``tol``, ``method`` as in :class:`SpectralBand`.
    """

    def __init__(self, *, rms: bool = False, tol: float = 1e-2, method: str = "polar"):
        super().__init__(1.0, 1.0, rms=rms, tol=tol, method=method)

    def retract(self, W: torch.Tensor) -> torch.Tensor:
        """``s msign(W)``."""
        self._check(W, "W")
        return self.radii(W)[1] * _ops.msign(W, self.method)

    def faces(self, W: torch.Tensor) -> list[Face]:
        """Both faces are the whole space: ``J = Q = W / s``, ``P = I`` (tall orientation)."""
        self._check(W, "W")
        transposed = W.shape[-2] < W.shape[-1]
        Q = (W.mT if transposed else W) / self.radii(W)[1]
        I = _ops.eye_like(Q)
        return [Face(Q, I, True, transposed), Face(Q, I, False, transposed)]

    def project_tangent(self, W, X, faces=None):
        """Textbook ``X - Q sym(Q^T X)`` (tall) / ``X - sym(X Q^T) Q`` (wide), ``Q = W / s``."""
        self._check(W, "W")
        self._check(X, "X")
        if X.shape[-2:] != W.shape[-2:]:
            raise ValueError(f"X must have the matrix shape of W {tuple(W.shape[-2:])}, got {tuple(X.shape)}")
        Q = W / self.radii(W)[1]
        if W.shape[-2] >= W.shape[-1]:
            return X - Q @ _ops.sym(Q.mT @ X)
        return X - _ops.sym(X @ Q.mT) @ Q

    def _repr_args(self):
        return {"rms": self.rms, "tol": self.tol, "method": self.method}


def dilation(W: torch.Tensor) -> torch.Tensor:
    """``Phi(W) = [[0, W], [W^T, 0]]`` (shape ``(..., m+n, m+n)``); its eigenvalues are ``±sigma_i(W)``
    (and ``|m - n|`` zeros). Cesista 2025 §5.1.1."""
    m, n = W.shape[-2:]
    top = torch.cat([torch.zeros(*W.shape[:-2], m, m, dtype=W.dtype, device=W.device), W], dim=-1)
    bot = torch.cat([W.mT, torch.zeros(*W.shape[:-2], n, n, dtype=W.dtype, device=W.device)], dim=-1)
    return torch.cat([top, bot], dim=-2)
