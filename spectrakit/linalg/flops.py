"""Matmul FLOP counts (2 per multiply-add) of the algorithms in :mod:`spectrakit.linalg`, per matrix.

They count exactly the matrix products the implementations issue (element-wise work is ignored), so
``flops / time`` is the achieved matmul throughput. ``m x n`` is the input shape; tall inputs are
transposed to wide first, so only ``(min, max)`` matters.
"""

from __future__ import annotations

import torch

from .hard_clip import LOWER_BOUND as HARD_LOWER_BOUND
from .hard_clip import TOL as HARD_TOL
from .polar import DEFAULT_TOL, safety_for
from .schedules import steps_for
from .soft_clip import BF16_DEFAULT_STEPS, DEFAULT_STEPS, tall_steps


def _wide(m: int, n: int) -> tuple[int, int]:
    return (m, n) if m <= n else (n, m)


def gram_flops(m: int, n: int) -> float:
    """``G = X X^T`` in the wide orientation: ``2 m^2 n``."""
    m, n = _wide(m, n)
    return 2.0 * m * m * n


def msign_flops(m: int, n: int, steps: int) -> float:
    """Quintic iteration ``X <- a X + (b A + c A^2) X``: per step ``A`` (2m^2n), ``A^2`` (2m^3),
    ``(.) X`` (2m^2n)."""
    m, n = _wide(m, n)
    return steps * (4.0 * m * m * n + 2.0 * m**3)


def msign_default_steps(m: int, n: int, dtype: torch.dtype, lower_bound: float = 1e-3) -> int:
    """Steps :func:`spectrakit.linalg.msign` uses by default (polar_express schedule)."""
    m, _ = _wide(m, n)
    return steps_for(lower_bound * m ** (-1 / 8), DEFAULT_TOL[dtype], safety=safety_for(dtype))


def soft_clip_newton_schulz_flops(m: int, n: int, steps: int = 10) -> float:
    """Seed 000 Alg. 1 + 3: ``G`` (2m^2n), ``steps x 3`` products ``m^3`` (2m^3 each), final ``Z X``
    (2m^2n)."""
    m, n = _wide(m, n)
    return 4.0 * m * m * n + steps * 6.0 * m**3


def soft_clip_polar_flops(m: int, n: int, dtype: torch.dtype = torch.float32,
                          steps: int | None = None) -> float:
    """Stacked polar route of :func:`spectrakit.linalg.soft_clip` (tall steps, then Gram steps).

    Step 0: ``G`` (2m^2n), ``G^2`` (2m^3), ``Y P`` (2m^2n). Tall steps: ``Y^T Y`` (2m^2n), ``Z^T Z``, ``G^2``,
    ``Z P`` (2m^3 each), ``Y P`` (2m^2n). Switch: ``G`` from the tall matrix (2m^2n + 2m^3). Gram steps:
    ``G^2`` (2m^3), ``R P`` (2m^3, not on the first), ``P G P`` (4m^3, not on the last). Output ``Y R``
    (2m^2n). Default steps: 9 (7 with bf16).
    """
    m, n = _wide(m, n)
    if steps is None:
        steps = BF16_DEFAULT_STEPS if dtype == torch.bfloat16 else DEFAULT_STEPS
    mmn, m3 = 2.0 * m * m * n, 2.0 * m**3
    tall = tall_steps(dtype, steps)
    f = 2 * mmn + m3  # step 0
    f += (tall - 1) * (2 * mmn + 3 * m3)
    gram = steps - tall
    if gram > 0:
        f += mmn + m3  # switch
        f += gram * m3 + (gram - 1) * m3 + (gram - 1) * 2 * m3
        f += mmn  # output Y R
    return f  # (all-tall: the output is the top block itself, no extra product)


def hardcap_flops(m: int, n: int, dtype: torch.dtype = torch.float32, steps: int | None = None) -> float:
    """Dense dilation route of :func:`spectrakit.linalg.spectral_hardcap`: ``msign`` of a symmetric
    ``(m+n)`` matrix (3 products of ``(m+n)^3`` per step) plus ``P W`` (2m^2n)."""
    m, n = _wide(m, n)
    big = m + n
    if steps is None:
        steps = steps_for(HARD_LOWER_BOUND * big ** (-1 / 8), HARD_TOL[dtype], safety=safety_for(dtype))
    return steps * 6.0 * big**3 + 2.0 * m * m * n
