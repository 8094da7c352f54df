"""Coefficient schedules for odd-polynomial polar-factor iterations.

One step of an iteration maps every singular value ``x`` of the current iterate through an odd
polynomial ``p(x) = a x + b x^3 + c x^5``; in matrix form ``X <- a X + (b A + c A^2) X`` with
``A = X X^T``. A *schedule* is the list of ``(a, b, c)`` triples used step after step.

The Polar Express schedule (Amsel et al. 2025) picks, at each step, the minimax-optimal odd quintic
on the current interval ``[l, u]`` that contains every singular value,
``p* = argmin_p max_{x in [l, u]} |1 - p(x)|``, and then tracks the interval through it:
``l <- min p = 1 - E``, ``u <- max p = 1 + E`` (E the minimax error). The minimax polynomial is computed
here with a Remez exchange in float64 numpy (cached); numbers only, no torch and no scipy.
A safety factor widens each interval to ``[l, (1 + safety) u]`` so that rounding errors that push a
singular value slightly above ``u`` do not break the tracking. A cushion designs the polynomial on
``[max(l, cushion * u), u]`` only: for tiny ``l`` the exactly minimax quintic dips to ``1 - E ~ a l`` in the
middle of the interval, which sends many singular values back near 0 where low precision flips them;
with the cushion the dip stays >= ~0.1 at the cost of a slightly slower start (``l`` still grows by the
factor ``p'(0) = a`` per step).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

Coeffs = tuple[tuple[float, float, float], ...]

MUON_QUINTIC = (3.4445, -4.7750, 2.0315)
# Safety factors: 1% covers fp32 rounding; bf16 steps need more (a step's relative rounding error
# reaches several % when the coefficients are large: measured divergence with 1%, none with 3%).
SAFETY = 1e-2
BF16_SAFETY = 5e-2
NEWTON_SCHULZ_CUBIC = (1.5, -0.5, 0.0)


def _poly(coef, x):
    a, b, c = coef
    return a * x + b * x**3 + c * x**5


def _critical_points(coef, lo: float, hi: float) -> list[float]:
    """Positive roots of p'(x) = a + 3 b x^2 + 5 c x^4 inside (lo, hi), sorted."""
    a, b, c = coef
    if abs(c) < 1e-300:
        roots2 = [-a / (3 * b)] if b != 0 else []
    else:
        disc = 9 * b * b - 20 * a * c
        if disc < 0:
            return []
        sq = math.sqrt(disc)
        roots2 = [(-3 * b - sq) / (10 * c), (-3 * b + sq) / (10 * c)]
    pts = sorted(math.sqrt(r) for r in roots2 if r > 0)
    return [p for p in pts if lo < p < hi]


# Remez exchange: a move of the reference points below this fraction of the interval that is no smaller than
# the previous one is rounding noise (the exchange has converged)
_REMEZ_STALL = 1e-9


def minimax_quintic(lo: float, hi: float, *, iters: int = 100, tol: float = 1e-15):
    """Minimax odd quintic approximation of 1 on ``[lo, hi]`` (``0 < lo < hi``) by Remez exchange.

    Returns ``((a, b, c), E)`` with ``max_{x in [lo, hi]} |1 - p(x)| = E``; the error equioscillates at
    ``lo`` (p = 1 - E), an interior maximum (1 + E), an interior minimum (1 - E) and ``hi`` (1 + E).
    """
    if not 0 < lo < hi:
        raise ValueError(f"need 0 < lo < hi, got lo={lo}, hi={hi}")
    # Reference points: start from Chebyshev-like points on a log scale (works for tiny lo).
    ref = np.array([lo, lo + (hi - lo) * 0.25, lo + (hi - lo) * 0.75, hi])
    if lo / hi < 0.1:
        ref[1], ref[2] = hi * 0.35, hi * 0.8
    coef, err = (0.0, 0.0, 0.0), 1.0
    last_move = math.inf
    for _ in range(iters):
        signs = np.array([1.0, -1.0, 1.0, -1.0])  # e = 1 - p: +E, -E, +E, -E
        mat = np.stack([ref, ref**3, ref**5, signs], axis=1)
        sol = np.linalg.solve(mat, np.ones(4))
        coef, err = (float(sol[0]), float(sol[1]), float(sol[2])), abs(float(sol[3]))
        crit = _critical_points(coef, lo, hi)
        if len(crit) != 2:
            break
        new = np.array([lo, crit[0], crit[1], hi])
        move = float(np.max(np.abs(new - ref)))
        # converged, or stalled at rounding level: the exchange converges quadratically (a move of ~1e-12 hi
        # after 3-4 exchanges), then the reference points jitter by 1e-14..1e-12 hi without converging
        if move <= tol * hi or (move <= _REMEZ_STALL * hi and move >= last_move):
            ref = new
            break
        ref, last_move = new, move
    # true max error on the interval (exact from critical points and endpoints)
    pts = [lo, hi] + _critical_points(coef, lo, hi)
    err = max(abs(1.0 - _poly(coef, x)) for x in pts)
    return coef, err


@functools.lru_cache(maxsize=512)
def polar_express_coeffs(lower_bound: float, steps: int, safety: float = 1e-2,
                         cushion: float = 0.02) -> Coeffs:
    """Polar Express schedule: ``steps`` minimax quintics starting from the interval ``[lower_bound, 1]``.

    Args:
        lower_bound: lower bound ``l`` on ``sigma_min / sigma_upper`` of the (normalised) input, in (0, 1).
        steps: number of steps, >= 1.
        safety: relative widening of the upper end of each interval (>= 0).
        cushion: the polynomial is designed on ``[max(l, cushion u), u]`` (0 <= cushion < 1).

    Returns:
        tuple of ``(a, b, c)`` triples, one per step.
    """
    coeffs, _ = _schedule_with_error(float(lower_bound), int(steps), float(safety), float(cushion))
    return coeffs


@functools.lru_cache(maxsize=512)
def _schedule_with_error(lower_bound: float, steps: int, safety: float, cushion: float = 0.02,
                         ) -> tuple[Coeffs, float]:
    lo, hi = lower_bound, 1.0
    out = []
    err = 1.0
    for _ in range(steps):
        if hi - lo < 1e-12:  # converged to double precision: keep the identity-like fixed point
            coef = (1.875, -1.25, 0.375)  # Halley-type quintic with p(1) = 1, p'(1) = p''(1) = 0
            out.append(coef)
            continue
        top = hi * (1.0 + safety)
        coef, err = minimax_quintic(max(lo, cushion * hi), top)
        out.append(coef)
        vals = [_poly(coef, x) for x in [lo, top] + _critical_points(coef, lo, top)]
        lo, hi = min(vals), max(vals)
        err = max(1.0 - lo, hi - 1.0)
    return tuple(out), err


@functools.lru_cache(maxsize=512)
def schedule_intervals(lower_bound: float, steps: int, safety: float = 1e-2, cushion: float = 0.02,
                       ) -> tuple[tuple[float, float], ...]:
    """Interval ``[lo_t, hi_t]`` that contains every singular value after step ``t`` (exact arithmetic).

    Tracks ``[lower_bound, 1]`` through :func:`polar_express_coeffs` (same safety widening and cushion):
    ``lo_t = min p_t``, ``hi_t = max p_t`` over ``[lo_{t-1}, (1 + safety) hi_{t-1}]``. Every polynomial is
    increasing on ``[0, lo]``, so singular values below ``lower_bound`` end up in ``[0, lo_t]`` as well.
    ``hi_t`` exceeds 1 by the minimax error (up to ~0.85 while the iteration has not converged).
    """
    coeffs = polar_express_coeffs(lower_bound, steps, safety, cushion)
    lo, hi = float(lower_bound), 1.0
    out = []
    for coef in coeffs:
        top = hi * (1.0 + safety)
        vals = [_poly(coef, x) for x in [lo, top] + _critical_points(coef, lo, top)]
        lo, hi = min(vals), max(vals)
        out.append((lo, hi))
    return tuple(out)


def schedule_error(lower_bound: float, steps: int, safety: float = 1e-2, cushion: float = 0.02) -> float:
    """Worst ``|1 - sigma_out|`` guaranteed by :func:`polar_express_coeffs` on ``[lower_bound, 1]``."""
    return _schedule_with_error(float(lower_bound), int(steps), float(safety), float(cushion))[1]


def steps_for(lower_bound: float, tol: float, *, max_steps: int = 16, safety: float = 1e-2) -> int:
    """Smallest number of Polar Express steps whose worst error on ``[lower_bound, 1]`` is <= ``tol``."""
    for t in range(1, max_steps + 1):
        if schedule_error(lower_bound, t, safety) <= tol:
            return t
    return max_steps


# Mixed bf16 iterations switch from fp32 to bf16 storage once every singular value of interest is above
# this fraction of the largest. Measured (msign, 128x384, spectrum over 7 decades, lower bounds 1e-3..1e-6):
# worst deviation from 1 of the resolved singular values along the true singular vectors, by the tracked
# lower bound at the switch: 1e-3 -> 0.27, 2.5e-3 -> 0.063, 4e-3 -> 0.015..0.030, 6.4e-3 -> 0.010,
# >= 1e-2 -> <= 0.006.
BF16_SWITCH = 0.01


def bf16_fp32_steps(lower_bound: float, steps: int, safety: float, switch: float = BF16_SWITCH) -> int:
    """Leading steps of a Polar Express schedule that a mixed bf16 iteration keeps in float32: the fewest
    after which the tracked lower bound (:func:`schedule_intervals`) is ``>= switch``.

    bf16 rounding of an iterate of norm ~1 perturbs every direction by ~4e-3; a singular value still below
    ~``switch`` at that point loses its direction (the later steps restore its size, not its vector).
    """
    if lower_bound >= switch:
        return 0
    for k, (lo, _) in enumerate(schedule_intervals(float(lower_bound), int(steps), float(safety))):
        if lo >= switch:
            return k + 1
    return steps


# ---------------------------------------------------------------------------------------------------
# Registry of named schedules: name -> function(steps, lower_bound) -> Coeffs.
# Users may add their own: ``SCHEDULES["mine"] = lambda steps, lower_bound: ((a, b, c),) * steps``.

def _muon(steps: int | None, lower_bound: float | None) -> Coeffs:
    return (MUON_QUINTIC,) * (5 if steps is None else steps)


def _newton_schulz(steps: int | None, lower_bound: float | None) -> Coeffs:
    return (NEWTON_SCHULZ_CUBIC,) * (12 if steps is None else steps)


def _polar_express(steps: int | None, lower_bound: float | None) -> Coeffs:
    lb = 1e-3 if lower_bound is None else lower_bound
    if steps is None:
        steps = steps_for(lb, 1e-4)
    return polar_express_coeffs(lb, steps)


SCHEDULES: dict[str, Callable[[int | None, float | None], Coeffs]] = {
    "muon": _muon,
    "polar_express": _polar_express,
    "newton_schulz": _newton_schulz,
}


# ---------------------------------------------------------------------------------------------------
# A grid of Polar Express schedules indexed by the lower bound, for per-matrix lower bounds that are
# only known as tensors on the device (soft_clip): the matrix picks the grid point just below its l.

GRID_PER_DECADE = 4
GRID_MIN_EXP = -8


@functools.lru_cache(maxsize=64)
def lower_bound_grid(steps: int, safety: float = 1e-2) -> tuple[tuple[float, ...], tuple[Coeffs, ...]]:
    """Grid points ``l_k = 10^(k/4)`` for ``k = -32..-1`` and the ``steps``-step schedule for each."""
    exps = [e / GRID_PER_DECADE for e in range(GRID_MIN_EXP * GRID_PER_DECADE, 0)]
    grid = tuple(10.0**e for e in exps)
    return grid, tuple(polar_express_coeffs(g, steps, safety) for g in grid)
