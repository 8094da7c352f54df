"""Dualizers: the steepest direction inside the tangent cone (Cesista 2025 §3.3.2, §4.2.2, §5.2.2, A1.2).

Given a set ``M``, a point ``W`` in it, a gradient ``G``, a step size ``eta`` and a norm, each dualizer
approximates

    A* = argmin_A <G, A>   s.t.   ||A|| <= eta,   A in T_W(M).

- :func:`naive`: the unconstrained LMO ``dualize(-G)`` (off-tangent in general; the retraction then throws
  part of it away — the paper's baseline);
- :func:`alternating`: ``(LMO ∘ proj_T)^K (-G)``, K >= 1 (the heuristic of §3.3.2);
- :func:`pdhg`: primal–dual hybrid gradient (Chambolle–Pock) on ``<G, A> + i_ball(A) + i_T(A)``::

      A_{k+1} = proj_ball(A_k - tau (G + Y_k))
      Z       = Y_k + sigma (2 A_{k+1} - A_k)
      Y_{k+1} = Z - proj_T(Z)                  # prox of sigma i_T^*: projection onto the polar cone"""

#   with ``tau sigma < 1``, warm-started by one alternating step (``A_0``, and ``Y_0 = -G - proj_T(-G)``, the
#   polar-cone part of ``-G``, which makes ``A_0`` the PDHG fixed-point candidate);
# - :func:`dual_ascent`: projected supergradient ascent on the dual variables ``S_f`` of the face constraints
#   (Appendix A1.2): ``A = -LMO(G + sum_f L_f^*(S_f))``, ``S_f <- proj_{K_f}(S_f + sigma_k L_f(A))`` with
#   ``K_f`` the NSD cone for a lower face and the PSD cone for an upper face, ``sigma_k = sigma_0 / sqrt(k+1)``,
#   initialised at ``S_f = proj_{K_f}(L_f(-G))`` (equal to one alternating step).
#
# All dualizers run a fixed number of iterations on the whole batch; ``rtol > 0`` freezes the entries whose
# relative change fell below ``rtol`` (``torch.where``, no host synchronisation). Value checks are switched off
# inside the loops (:func:`spectrakit._checks.no_value_checks`).

from __future__ import annotations

import torch

from spectrakit._checks import check_choice, check_int, check_scalar, check_tensor, no_value_checks
from spectrakit.manifold.norms import get_norm

DUALIZERS = ("naive", "alternating", "pdhg", "dual_ascent")
_TINY = 1e-30


def _fro(X: torch.Tensor) -> torch.Tensor:
    return torch.linalg.matrix_norm(X, ord="fro", keepdim=True)


def _prepare(manifold, W, G, eta, norm):
    check_tensor(W, "W", min_ndim=2)
    check_tensor(G, "G", min_ndim=2)
    if G.shape != W.shape:
        raise ValueError(f"G must have the shape of W {tuple(W.shape)}, got {tuple(G.shape)}")
    check_scalar(eta, "eta", low=0.0)
    norm = get_norm(norm, method=getattr(manifold, "method", "polar"))
    G = manifold.prepare(G) if manifold is not None else G
    return norm, G


def _freeze(done, new, old, rtol):
    """Entries already converged keep ``old``; others take ``new``; ``done`` accumulates convergence."""
    if rtol <= 0:
        return done, new
    step = _fro(new - old)
    done = done | (step <= rtol * _fro(old))
    return done, torch.where(done, old, new)


def naive(manifold, W: torch.Tensor, G: torch.Tensor, eta, *, norm="rms") -> torch.Tensor:
    """``dualize(-G, eta)`` — the LMO ignoring the tangent cone (``G`` symmetrised for symmetric sets).

    Args: ``manifold`` a :class:`~spectrakit.manifold.sets.SpectralSet` or ``None``; ``W``, ``G``
    ``(..., m, n)``; ``eta >= 0`` float or tensor of batch shape; ``norm`` in {"rms", "spectral",
    "frobenius"}.
    """
    norm, G = _prepare(manifold, W, G, eta, norm)
    with no_value_checks():
        return norm.dualize(-G, eta)


def alternating(manifold, W, G, eta, *, norm="rms", steps: int = 1, rtol: float = 0.0, faces=None):
    """``(LMO ∘ proj_T)^K (-G)`` with ``K = steps >= 1`` (Cesista 2025 §3.3.2).

    ``faces`` may pass precomputed :meth:`SpectralSet.faces` of ``W``. Returns ``A`` with ``||A|| = eta``
    (or 0 when the projected gradient vanishes). Raises ``ValueError`` for ``steps < 1`` or mismatched shapes.
    """
    check_int(steps, "steps", low=1)
    norm, G = _prepare(manifold, W, G, eta, norm)
    with no_value_checks():
        faces = manifold.faces(W) if faces is None else faces
        A = norm.dualize(manifold.project_tangent(W, -G, faces), eta)
        done = torch.zeros(A.shape[:-2] + (1, 1), dtype=torch.bool, device=A.device)
        for _ in range(steps - 1):
            new = norm.dualize(manifold.project_tangent(W, A, faces), eta)
            done, A = _freeze(done, new, A, rtol)
    return A


def pdhg(manifold, W, G, eta, *, norm="rms", steps: int = 32, step_ratio: float = 1.0, rtol: float = 0.0,
         faces=None):
    """PDHG (Chambolle–Pock) for ``argmin <G, A>`` over ``{||A|| <= eta} ∩ T_W`` (see module docstring).

    Step sizes: ``tau = step_ratio * kappa``, ``sigma = 0.99 / (step_ratio * kappa)`` with the per-matrix
    scale ``kappa = ||A_0||_F / ||G||_F`` (units of A per unit of G), so ``tau sigma = 0.99 < 1``.
    Args: ``steps >= 0`` iterations after the warm start; ``step_ratio > 0``; ``rtol >= 0`` freezing
    threshold.
    Returns the last primal iterate, which lies in the norm ball (it is a ball projection) and converges to
    the tangent cone.
    """
    check_int(steps, "steps", low=0)
    check_scalar(step_ratio, "step_ratio", low=0.0, low_inclusive=False, allow_tensor=False)
    norm, G = _prepare(manifold, W, G, eta, norm)
    sym = manifold.symmetric
    with no_value_checks():
        faces = manifold.faces(W) if faces is None else faces
        T = manifold.project_tangent(W, -G, faces)
        x = norm.dualize(T, eta)
        y = -G - T
        kappa = _fro(x) / _fro(G).clamp_min(_TINY)
        tau = step_ratio * kappa
        sigma = 0.99 / (step_ratio * kappa).clamp_min(_TINY)
        done = torch.zeros(x.shape[:-2] + (1, 1), dtype=torch.bool, device=x.device)
        for _ in range(steps):
            x_new = norm.project_ball(x - tau * (G + y), eta, symmetric=sym)
            z = y + sigma * (2 * x_new - x)
            y_new = z - manifold.project_tangent(W, z, faces)
            if rtol > 0:  # converged when both the primal and the dual iterate stopped moving
                done = done | ((_fro(x_new - x) <= rtol * _fro(x)) & (_fro(y_new - y) <= rtol * _fro(y)))
                x, y = torch.where(done, x, x_new), torch.where(done, y, y_new)
            else:
                x, y = x_new, y_new
    return x


def dual_ascent(manifold, W, G, eta, *, norm="rms", steps: int = 64, sigma: float = 1.0, rtol: float = 0.0,
                average: bool = True, faces=None):
    """Projected dual (super)gradient ascent on the face multipliers (Cesista 2025 A1.2).

    ``A(S) = -LMO(G + sum_f L_f^*(S_f))``; ``S_f <- proj_{K_f}(S_f + sigma_k L_f(A))`` with
    ``sigma_k = sigma * (||G||_F / ||A_0||_F) / sqrt(k + 1)`` (the ratio makes ``sigma`` unit-free).
    Args: ``steps >= 0``; ``sigma > 0``; ``rtol >= 0``; ``average``: return the step-size-weighted average
    of the primal iterates ``A(S_k)`` over the second half of the run (ergodic primal recovery) instead of
    the last one. The last iterate has norm exactly ``eta`` but, when ``G + L^*(S^*)`` is (nearly) singular
    at the dual optimum, it can stall at a feasible but suboptimal point (the LMO is not unique there):
    measured on an 8x8 PSD problem, 3000 steps, -4.45 vs the optimum -4.758; the average converges.
    """
    check_int(steps, "steps", low=0)
    check_scalar(sigma, "sigma", low=0.0, low_inclusive=False, allow_tensor=False)
    norm, G = _prepare(manifold, W, G, eta, norm)
    with no_value_checks():
        faces = manifold.faces(W) if faces is None else faces

        def primal(S):
            M = G
            for f, s in zip(faces, S):
                M = M + f.adjoint(s)
            return norm.dualize(-M, eta)

        S = [f.violation(f.constraint(-G), manifold.method) for f in faces]
        A = primal(S)
        scale = sigma * _fro(G) / _fro(A).clamp_min(_TINY)
        done = torch.zeros(A.shape[:-2] + (1, 1), dtype=torch.bool, device=A.device)
        A_sum, w_sum = torch.zeros_like(A), 0.0
        for k in range(steps):
            step = scale / (k + 1) ** 0.5
            S_new = [f.violation(s + step * f.constraint(A), manifold.method) for f, s in zip(faces, S)]
            if rtol > 0:
                S = [torch.where(done, s, sn) for s, sn in zip(S, S_new)]
            else:
                S = S_new
            done, A = _freeze(done, primal(S), A, rtol)
            if average and k >= steps // 2:
                w = 1.0 / (k + 1) ** 0.5
                A_sum, w_sum = A_sum + w * A, w_sum + w
        if average and w_sum > 0:
            A = A_sum / w_sum
    return A


def steepest_direction(manifold, W, G, eta, *, norm="rms", dualizer="alternating", **options):
    """Dispatch to :func:`naive`, :func:`alternating`, :func:`pdhg` or :func:`dual_ascent` by name.

    ``manifold=None`` (unconstrained) always uses the plain LMO. Raises ``ValueError`` for an unknown name.
    """
    check_choice(dualizer, "dualizer", DUALIZERS)
    if manifold is None or dualizer == "naive":
        return naive(manifold, W, G, eta, norm=norm)
    fn = {"alternating": alternating, "pdhg": pdhg, "dual_ascent": dual_ascent}[dualizer]
    return fn(manifold, W, G, eta, norm=norm, **options)
