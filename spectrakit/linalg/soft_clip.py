"""SPECTRA's soft spectral clip ``H_c(X) = (I + X X^T / c^2)^(-1/2) X`` (Jiang, Semenov and Stich 2026 §5.1).

Every singular value maps through ``h_c(s) = s / sqrt(1 + s^2/c^2)`` (slope 1 at 0, saturates at c).

Three methods:"""

# - ``"polar"`` (default): ``H_c(X) = c * msign(B)[:n]^T`` with the stacked tall matrix
#   ``B = [X^T ; c I_m]``, whose singular values ``sqrt(s^2 + c^2)`` are bounded below by ``c``: the ratio
#   ``l = c / sqrt(s_up^2 + c^2)`` is known per matrix, and a Polar-Express schedule designed for the
#   grid point just below ``l`` is gathered on the device (no host sync). The first steps iterate on the
#   tall matrix itself (``B <- B p(B^T B)``, recomputing the Gram matrix from ``B`` so its errors are
#   multiplied by ``B`` and small singular values keep their relative accuracy); once the condition
#   number has dropped (``l >~ 0.03``), the remaining steps run on the ``m x m`` Gram matrix only.
#   Safety beyond the accurate range: the last polynomial of every grid schedule is divided by
#   the schedule's tracked maximum ``hi_final`` (up to 1.85 when the iteration has not converged, else
#   ``1 + ~1e-6``), so output singular values never exceed ``min(s, c)`` in exact arithmetic (observed:
#   ``<= c (1 + 1e-4)`` in fp32, ``(1 + 1.1e-2)`` in bf16, up to ``sigma_max/c = 1e30``); beyond the range
#   the result under-shoots. Grid points whose lower bound after the tall steps is below the Gram phase's
#   resolution get the Gram matrix shifted by ``delta I`` (a contraction, see ``GRAM_SHIFT``); bf16 never
#   uses the Gram phase; thresholds beyond the fp32 range are clamped to ``1e4 ||X||_F`` (no change).
#   ``tall_steps=0``: the fast Gram-only variant, every step on the fp32 ``m x m`` Gram matrix
#   ``X X^T + c^2 I`` (``FAST_STEPS`` = 6 steps, ``4 m^2 n + 42 m^3`` FLOPs, below the paper's Newton-Schulz),
#   accurate to 1e-3 for ``sigma_max/c <= FAST_MAX_RATIO`` (300), a safe under-shoot beyond.
# - ``"newton_schulz"``: the paper's Algorithm 1 + Algorithm 3 (coupled Newton–Schulz inverse square
#   root, 10 steps), kept as the reference baseline, without early exit as in the authors' code;
#   ``"newton_schulz_early_exit"`` adds Algorithm 1's ``if s_max <= c: return X`` (a ``torch.where``).
# - ``"exact"``: float64 SVD.

from __future__ import annotations

import functools
import math

import torch

from spectrakit._checks import check_choice, check_int, check_scalar, check_tensor

from ._util import (
    _flush_shift,
    compute_dtype,
    eye_like,
    flush_tiny,
    frob,
    from_unit,
    mT,
    pow2_scale,
    threshold,
    tiny_for,
    to_unit,
)
from .polar import safety_for, to_wide
from .schedules import lower_bound_grid, schedule_intervals

METHODS = ("polar", "newton_schulz", "newton_schulz_early_exit", "exact")
# Default steps of the polar method: enough for l down to ~3e-5 (sigma_max / c ~ 1e4 with the bound slack);
# with dtype=bfloat16 (accuracy target 3e-2 up to sigma_max / c = 1e3): 7.
DEFAULT_STEPS = 9
BF16_DEFAULT_STEPS = 7
# Number of leading steps iterated on the tall stacked matrix (the rest run on the m x m Gram matrix).
# bf16 iterates on the tall matrix throughout: the Gram-only steps are not self-correcting and were
# measured to diverge in bf16 (rounding errors of P G P exceed the schedule's safety margin).
# (measured: with steps=13 a bf16 Gram phase overflowed for a rank-1 input). ``None``: every step is tall.
TALL_STEPS = {torch.float64: 2, torch.float32: 3, torch.bfloat16: None}
# Fast Gram-only route (tall_steps=0): default steps, and the largest sigma_max / c it is specified for
# (fp32 relative Frobenius error <= 1e-3, tested): rounding of the fp32 Gram matrix X X^T + c^2 I is
# ~eps sigma_max^2, i.e. relative ~eps (sigma_max/c)^2 on its smallest eigenvalue c^2.
FAST_STEPS = 6
# Gram shift of the fast route: only grid points with l^2 < FAST_GRAM_MIN_EIG (sigma_max / c >~ 1e3, beyond
# the specified range) get G + GRAM_SHIFT I. With the default route's threshold (1e-5) the shift reached
# ratio 300 and cost 1.2e-2 accuracy there (measured); without any shift a rank-deficient input far beyond
# the range can overflow.
FAST_GRAM_MIN_EIG = 1e-7
FAST_MAX_RATIO = 300.0
# Leading steps computed in float32 when computing in bfloat16 (the tall iterate is stored in fp32 until the
# small singular values have grown; see schedules.BF16_SWITCH). Measured worst bf16 errors up to
# sigma_max / c = 1e3 on a spectrum over 6 decades (64x192, 96x96, 256x1024): 2 steps 3.1e-2..4.2e-2,
# 3 steps 1.3e-2..1.6e-2 (Gaussian and 1e3-spike inputs: <= 1.2e-2 either way).
BF16_FP32_STEPS = 3


# Gram-phase shift: at the switch to the Gram iteration, G <- G + delta I for grid points whose tracked
# lower bound after the tall steps is too small for the Gram matrix (l_t^2 < GRAM_MIN_EIG): rounding of G
# can leave eigenvalues slightly negative there, and the Gram iteration multiplies a negative eigenvalue
# by ~a^2 per step (measured: overflow to inf for a rank-1 fp32 input at sigma_max/c = 1e6). delta I is
# the Gram matrix of an extra block sqrt(delta) I stacked under B, so the result stays a contraction
# (singular values only shrink: a safe under-shoot outside the accurate range).
GRAM_MIN_EIG = {torch.float64: 1e-11, torch.float32: 1e-5}
GRAM_SHIFT = {torch.float64: 1e-13, torch.float32: 1e-6}


@functools.lru_cache(maxsize=32)
def _grid_tables(steps: int, safety: float, tall: int, cdt: torch.dtype,
                 ) -> tuple[list[float], list[list[list[float]]], list[float]]:
    """Grid of lower bounds, per-grid-point schedules (last step scaled by ``1 / hi_final``), Gram shifts."""
    grid, coeffs = lower_bound_grid(steps, safety)
    table, shifts = [], []
    for g, co in zip(grid, coeffs):
        iv = schedule_intervals(g, steps, safety)
        hi_final = iv[-1][1]
        # the last polynomial is scaled so that its tracked maximum is exactly 1: no output singular value
        # exceeds min(s, c), whatever the ratio (beyond the accurate range the iteration has not converged
        # and hi_final reaches ~1.85; in the accurate range hi_final - 1 is the tiny minimax error)
        rows = [list(t) for t in co]
        rows[-1] = [v / hi_final for v in rows[-1]]
        table.append(rows)
        # lower bound of the spectrum when the Gram phase starts (tall == 0: the input's own bound g)
        lo_switch = g if tall == 0 else (iv[tall - 1][0] if tall < steps else 1.0)
        floor = FAST_GRAM_MIN_EIG if (tall == 0 and cdt == torch.float32) else GRAM_MIN_EIG.get(cdt, 0.0)
        need = cdt in GRAM_SHIFT and lo_switch**2 < floor
        shifts.append(GRAM_SHIFT[cdt] if need else 0.0)
    return list(grid), table, shifts


def _grid_tensors(steps: int, device: torch.device, safety: float, tall: int, cdt: torch.dtype,
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The tables of :func:`_grid_tables` as tensors on ``device`` (cached per device)."""
    key = (steps, str(device), safety, tall, cdt)
    hit = _DEVICE_TABLES.get(key)
    if hit is None:
        grid, table, shifts = _grid_tables(steps, safety, tall, cdt)
        hit = (torch.tensor(grid, dtype=torch.float32, device=device),
               torch.tensor(table, dtype=torch.float64, device=device),
               torch.tensor(shifts, dtype=torch.float64, device=device))
        _DEVICE_TABLES[key] = hit
    return hit


_DEVICE_TABLES: dict = {}


def tall_steps(cdt: torch.dtype, steps: int) -> int:
    """Number of leading steps of the polar route that iterate on the tall stacked matrix."""
    t = TALL_STEPS[cdt]
    return steps if t is None else min(t, steps)


def _soft_clip_vector(x: torch.Tensor, c, cdt: torch.dtype) -> torch.Tensor:
    """``x c / sqrt(c^2 + ||x||^2)``, with every quantity scaled by ``max(max|x|, c)`` (no overflow)."""
    xc = x.to(cdt if cdt == torch.float64 else torch.float32)
    c_t = torch.as_tensor(c, dtype=torch.float64, device=x.device)
    # a threshold beyond the compute range (1e60 in fp32 was inf -> nan) is clamped to finfo.max / 4
    c_t = c_t.clamp_max(torch.finfo(xc.dtype).max / 4).to(xc.dtype)
    amax = xc.abs().amax()
    s = torch.maximum(amax, c_t)
    r = torch.linalg.vector_norm(xc / s)
    return (xc * ((c_t / s) / torch.hypot(c_t / s, r))).to(x.dtype)


def _exact(x: torch.Tensor, c) -> torch.Tensor:
    x64 = x.double()
    u, s, vh = torch.linalg.svd(x64, full_matrices=False)
    c64 = c.double()[..., 0] if isinstance(c, torch.Tensor) else c  # (..., 1)
    h = s * (c64 / torch.hypot(torch.as_tensor(c64, dtype=torch.float64, device=x.device), s))
    return ((u * h[..., None, :]) @ vh).to(x.dtype)


def _newton_schulz(x: torch.Tensor, c, steps: int, early_exit: bool = False) -> torch.Tensor:
    """Algorithm 1 with Algorithm 3 (MISR) of Jiang, Semenov & Stich (2026), in x's dtype, wide orientation:
    ``alpha = 1 + s^2/c^2`` from the bound ``s^2 = min(||G||_F, ||G||_inf) >= sigma_max^2`` of
    ``G = X X^T``, ``Y_0 = (I + G/c^2)/alpha``, ``Z_0 = I``, ``T = (3I - Z Y)/2, Y <- Y T, Z <- T Z``, then
    ``H_c(X) = Z X / sqrt(alpha)``. ``early_exit``: Algorithm 1's ``if s^2 <= c^2: return X`` (a
    ``torch.where``); the authors' code has none, and the soft clip shrinks every singular value."""
    g = x @ mT(x)
    eye = eye_like(g)
    s2 = torch.minimum(frob(g), g.abs().sum(-1, keepdim=True).amax(-2, keepdim=True))
    c2 = c * c
    alpha = 1 + s2 / c2
    y = (eye + g / c2) / alpha
    z = eye.expand_as(y)
    for _ in range(steps):
        t = (3 * eye - z @ y) / 2
        y = y @ t
        z = t @ z
    out = (z / alpha.sqrt()) @ x
    return torch.where(s2 <= c2, x, out) if early_exit else out


def _polar(x: torch.Tensor, c, steps: int, cdt: torch.dtype, tall: int | None = None) -> torch.Tensor:
    """Stacked polar route on wide x (m <= n), see the module docstring; ``tall``: leading tall steps
    (None: :func:`tall_steps`)."""
    work = torch.float32 if cdt == torch.bfloat16 else cdt
    xw = x.to(work)
    fx = frob(xw)
    if isinstance(c, torch.Tensor):
        c_t = c.to(work)
    else:  # a threshold beyond the dtype's range (e.g. 1e60 in fp32) is clamped below, not overflowed
        c_t = torch.full((1, 1), min(float(c), torch.finfo(work).max / 4), dtype=work, device=x.device)
    if work != torch.float64:
        # h_c(s) = s (1 - O(s^2/c^2)): any c >= 1e4 ||X||_F gives X to fp32 rounding; clamping keeps c and
        # c / ||X||_F finite for thresholds at the top of (or beyond) the fp32 range
        c_t = torch.minimum(c_t, (1e4 * fx).clamp_min(tiny_for(work)))
    tiny = tiny_for(work)
    # pre-scale by f = max(||X||_F, c): entries of the Gram matrix stay <= 2, zero input is safe
    f = torch.maximum(fx, c_t).clamp_min(tiny)
    y = mT(xw / f)  # (n, m) top block
    cp = c_t / f  # bottom block is cp * I
    eye = eye_like(y)
    tall = tall_steps(cdt, steps) if tall is None else min(tall, steps)
    g = mT(y) @ y + (cp * cp) * eye
    g2 = g @ g
    lam = frob(g2).sqrt()  # >= lambda_max(G) (within sqrt(m))
    sig = lam.sqrt()
    lower = (cp / sig).clamp(0, 1)  # lower bound of sigma_min / sigma_up of B
    grid, table, shifts = _grid_tensors(steps, x.device, safety_for(cdt), tall, cdt)
    idx = (torch.searchsorted(grid, lower[..., 0, 0].float().contiguous(), right=True) - 1).clamp_min(0)
    coeffs = table[idx].to(work)  # (..., steps, 3)
    # step 0 on the tall matrix re-uses G and G^2 (bottom block of B_0 is a multiple of I)
    y = y / sig
    z = None
    zs = cp / sig
    gn, g2n = g / lam, g2 / (lam * lam)
    if tall == 0:  # Gram-only: the shift of the grid point goes on the input Gram matrix (exact algebra)
        d = shifts[idx].to(work)[..., None, None]
        g2n = g2n + 2 * d * gn + (d * d) * eye
        gn = gn + d * eye
    r = None
    for t in range(steps):
        dt = work if (cdt != torch.bfloat16 or t < BF16_FP32_STEPS) else torch.bfloat16
        ct = coeffs[..., t, :].to(dt)
        a, b, cc = (ct[..., i, None, None] for i in range(3))
        if t > 0:
            y = y.to(dt)
            z = z.to(dt) if z is not None else None
            if t < tall:  # (t > 0 here)
                gn = flush_tiny(mT(y) @ y + mT(z) @ z)
                g2n = gn @ gn
            else:
                if t == tall:  # switch to the Gram iteration: G from the current tall matrix (+ shift)
                    gn = mT(y) @ y + mT(z) @ z + shifts[idx].to(y.dtype)[..., None, None] * eye.to(y.dtype)
                gn = flush_tiny(gn.to(dt))
                g2n = gn @ gn
        # p = a I + b G + c G^2: one fused pass for b G + c G^2, then a on the diagonal only
        p = torch.addcmul(cc * g2n.to(dt), b, gn.to(dt))
        p.diagonal(dim1=-2, dim2=-1).add_(a[..., 0])
        if t < tall:
            y = y.to(dt) @ p
            z = zs.to(dt) * p if t == 0 else z @ p
        else:
            p = flush_tiny(p)
            r = p if r is None else r.to(dt) @ p
            if t < steps - 1:
                gn = flush_tiny(p @ gn.to(dt)) @ p
    if r is not None:
        y = y.to(r.dtype) @ r
    if tall == 0 and work == torch.float32:  # the fp32 Gram route's rounding: keep ||Y|| <= c (FAST_SLACK)
        c_t = c_t * (1.0 - FAST_SLACK)
    return c_t * mT(y.to(work))  # in the work dtype: c near the fp32 maximum overflows bf16


# The fp32 Gram-only route (tall_steps=0, soft_clip_fast_) scales its output by 1 - FAST_SLACK: its rounding
# lifted the largest output singular value up to 5.4e-5 c (6 steps) and 1.3e-4 c (7 to 9 steps) above c; the
# accuracy target there is 1e-3
FAST_SLACK = 2e-4
# Final product of the in-place fast route: element budget of its block temporary, min(INPLACE_CHUNK,
# numel / 32), raised to the 3 B m^2 elements that the freed Gram buffers leave (so never above the
# iteration's own peak of 4 B m^2), at least one column.
INPLACE_CHUNK = 2**20


def _flush_tiny_(x: torch.Tensor) -> torch.Tensor:
    """In-place :func:`~._util.flush_tiny` (same rounding: ``(x + C) - C`` on CPU, no-op elsewhere)."""
    if x.device.type == "cpu":
        shift = _flush_shift(x.dtype)
        x.add_(shift).sub_(shift)
    return x


def _gram_fast_(x: torch.Tensor, c, steps: int, chunk: int | None) -> None:
    """:func:`_polar` with ``tall = 0`` on wide ``x`` (fp32/fp64), overwriting ``x`` with the result and
    allocating only ``m x m`` matrices (4 per matrix of the batch) and one chunk of at most ``chunk``
    elements: the scalars ``1/f``, ``c`` and ``1/sig`` are folded into ``x`` (scaled in place) and into
    the small ``m x m`` factor ``R = (c / sig) r^T``, and ``x <- R x`` runs column block by column block."""
    work = x.dtype
    tiny = tiny_for(work)
    # ||x||_F without a full-size temporary: scale x in place by a power of two near max|x| (exact)
    amax = torch.maximum(x.amax(dim=(-2, -1), keepdim=True), -x.amin(dim=(-2, -1), keepdim=True))
    p2 = torch.exp2(torch.floor(torch.log2(amax.clamp_min(tiny))))
    x.div_(p2)
    fx = p2 * torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True)
    if isinstance(c, torch.Tensor):
        c_t = c.to(work)
    else:
        c_t = torch.full((1, 1), min(float(c), torch.finfo(work).max / 4), dtype=work, device=x.device)
    if work != torch.float64:
        c_t = torch.minimum(c_t, (1e4 * fx).clamp_min(tiny))
    f = torch.maximum(fx, c_t).clamp_min(tiny)
    x.mul_(p2 / f)  # x <- x / f: Gram entries <= 2
    cp = c_t / f
    gn = torch.matmul(x, mT(x))
    gn.diagonal(dim1=-2, dim2=-1).add_((cp * cp)[..., 0])  # G = X X^T / f^2 + cp^2 I
    g2n = torch.matmul(gn, gn)
    lam = frob(g2n).sqrt()
    sig = lam.sqrt()
    lower = (cp / sig).clamp(0, 1)
    grid, table, shifts = _grid_tensors(steps, x.device, safety_for(work), 0, work)
    idx = (torch.searchsorted(grid, lower[..., 0, 0].float().contiguous(), right=True) - 1).clamp_min(0)
    coeffs = table[idx].to(work)
    gn.div_(lam)
    g2n.div_(lam * lam)
    d = shifts[idx].to(work)[..., None, None]  # Gram shift of the grid point (see _grid_tables)
    g2n.addcmul_(2 * d, gn)
    g2n.diagonal(dim1=-2, dim2=-1).add_((d * d)[..., 0])
    gn.diagonal(dim1=-2, dim2=-1).add_(d[..., 0])
    pool: list[torch.Tensor] = []

    def take() -> torch.Tensor:
        return pool.pop() if pool else torch.empty_like(gn)

    r = tmp = None
    for t in range(steps):
        ct = coeffs[..., t, :]
        a, b, cc = (ct[..., i, None, None] for i in range(3))
        if t > 0:
            _flush_tiny_(gn)
            g2n = torch.matmul(gn, gn, out=take())
        p = g2n.mul_(cc).addcmul_(b, gn)  # p = a I + b G + c G^2
        p.diagonal(dim1=-2, dim2=-1).add_(a[..., 0])
        _flush_tiny_(p)
        if r is None:
            r = p
        else:
            old, r = r, torch.matmul(r, p, out=take())
            pool.append(old)
            old = None
        if t < steps - 1:
            tmp = _flush_tiny_(torch.matmul(p, gn, out=take()))
            torch.matmul(tmp, p, out=gn)
            pool.append(tmp)
        if p is not r:
            pool.append(p)
    # x <- c * mT(mT(x) / sig @ r) = R x with R = (c / sig) r^T, one column block at a time
    # (the fp32 Gram iteration's rounding lifts the top output by up to ~1.3e-4 c: shrunk by FAST_SLACK)
    rf = torch.mul(mT(r), (c_t * (1.0 - FAST_SLACK) if work == torch.float32 else c_t) / sig, out=take())
    r = gn = g2n = p = tmp = None  # free the m x m buffers before the block temporary
    pool.clear()
    m, n = x.shape[-2], x.shape[-1]
    rows = m * math.prod(x.shape[:-2])
    if chunk is None:
        chunk = max(min(INPLACE_CHUNK, rows * n // 32), 3 * rows * m)
    k = max(1, min(n, chunk // max(rows, 1)))
    buf = torch.empty(rows * k, dtype=work, device=x.device)
    for j in range(0, n, k):
        kk = min(k, n - j)
        xs = x[..., j:j + kk]
        out = buf[:rows * kk].view(*x.shape[:-2], m, kk)
        torch.matmul(rf, xs, out=out)
        xs.copy_(out)


def soft_clip_fast_(X: torch.Tensor, c, *, steps: int | None = None, chunk: int | None = None) -> torch.Tensor:
    """In-place fast soft clip ``X <- H_c(X) = (I + X X^T / c^2)^(-1/2) X`` (Jiang, Semenov and Stich 2026 §5.1):
    the Gram-only route of :func:`soft_clip` (``tall_steps=0``, the optimizers' default post-transform),
    equal to ``soft_clip(X, c, tall_steps=0)`` up to rounding, with no full-size temporary. Not differentiable
    (in-place updates and ``out=`` products): the optimizers' route; :func:`soft_clip` keeps the
    differentiable out-of-place form of the same iteration (the two are tested equal).

    The Polar-Express iteration runs on the ``m x m`` Gram matrices (``m = min`` of the last two dims) as
    in :func:`soft_clip`; the scalars (``1 / max(||X||_F, c)``, ``c``, the spectral bound) are folded
    into ``X`` (scaled in place) and into the small factor ``R = c r^T / sig``, and the result
    ``R X`` is written back into ``X`` one block of columns (along the long dimension) at a time. Extra
    memory: 4 ``m x m`` matrices per matrix of the batch (freed before the product), then ``R`` plus one
    block of at most ``chunk`` elements (default ``max(min(2^20, numel / 32), 3 B m^2)`` for ``B``
    matrices: within the Gram phase's peak; at least one column).
    Accuracy as the fast route of :func:`soft_clip` (relative Frobenius error <= 1e-3 in fp32 for
    ``sigma_max / c <= FAST_MAX_RATIO``, a safe under-shoot beyond).

    Args:
        X: ``(..., m, n)`` float32/float64 tensor, finite; overwritten (a view, e.g. a transpose, is fine).
        c: threshold > 0, a float or a tensor broadcastable to the batch shape ``X.shape[:-2]``.
        steps: iterations (1..100), default :data:`FAST_STEPS`.
        chunk: int >= 1, element budget of the block temporary (None: the default above).

    Returns:
        ``X`` itself.

    Raises:
        TypeError: X not a float32/float64 tensor. ValueError: ``X.ndim < 2``, non-finite X, c <= 0 or
            non-finite, tensor c not broadcastable to the batch shape, steps or chunk out of range.
    """
    check_tensor(X, "X", min_ndim=2)
    if X.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"X must be float32 or float64 for the in-place soft clip, got {X.dtype}")
    steps = FAST_STEPS if steps is None else check_int(steps, "steps", low=1, high=100)
    if chunk is not None:
        check_int(chunk, "chunk", low=1)
    ct = threshold(c, "c", X, X.dtype, low=0.0, low_inclusive=False)
    if X.numel() == 0:
        return X
    x, _ = to_wide(X)
    _gram_fast_(x, ct, steps, chunk)
    return X


def soft_clip(X: torch.Tensor, c, *, method: str = "polar", steps: int | None = None,
              dtype: torch.dtype | None = None, tall_steps: int | None = None) -> torch.Tensor:
    """Soft spectral clip ``H_c(X) = (I + X X^T / c^2)^(-1/2) X`` (Jiang, Semenov and Stich 2026 §5.1, Alg. 1).

    Singular values map ``s -> s / sqrt(1 + s^2/c^2)`` (always ``<= min(s, c)``); singular vectors are kept.
    For 1-D ``X`` (a vector parameter) the same map acts on the norm: ``X c / sqrt(c^2 + ||X||^2)``.

    Methods: ``"polar"`` (stacked polar factor ``c * msign([X^T; c I])[:n]^T`` with the known lower bound
    ``c / sqrt(s_max^2 + c^2)``; relative Frobenius error <= 1e-3 in fp32 for ``sigma_max/c`` in
    [1e-2, 1e4], <= 3e-2 in bf16 up to 1e3), ``"newton_schulz"`` (the paper's Algorithm 1 + 3, 10 steps by
    default, as in the authors' code: no early exit; loses the bulk when ``sigma_max/c >~ 100``: documented
    baseline), ``"newton_schulz_early_exit"`` (the same with Algorithm 1's ``if bound <= c: return X``,
    which returns X unclipped below c, e.g. relative error 0.12 for all ``s = c/2``), ``"exact"`` (float64 SVD).

    Args:
        X: ``(..., m, n)`` or 1-D floating tensor, finite.
        c: threshold > 0, a float or a tensor broadcastable to the batch shape ``X.shape[:-2]``
            (e.g. shape ``(B,)`` for ``X`` of shape ``(B, m, n)``: one threshold per matrix).
        method: "polar", "newton_schulz", "newton_schulz_early_exit" or "exact".
        steps: iterations (1..100); default 9 (polar, enough for ``l >= ~3e-5``; 7 with bf16, enough for
            ``sigma_max / c <= 1e3``) or 10 (newton_schulz). Beyond the accurate range, or with fewer
            steps, the polar route under-shoots: output singular values stay ``<= min(s, c)`` up to
            rounding, whatever ``sigma_max / c`` (tested from 1e-30 to 1e30).
        tall_steps: polar only: number of leading steps iterated on the tall stacked matrix, 0..steps
            (None: 3 in fp32, 2 in fp64, all in bf16). ``0`` is the fast Gram-only route
            (:data:`FAST_STEPS` steps by default, see :data:`FAST_MAX_RATIO`): every step runs on the
            ``m x m`` Gram matrix ``X X^T + c^2 I``, the FLOPs drop below the paper's Newton-Schulz,
            and fp32 rounding of the Gram matrix limits the accuracy to ``sigma_max / c <= ~300``
            (measured table in docs/linalg.md). Values < ``steps`` need a float32/float64 compute dtype.
        dtype: compute dtype; bfloat16 runs the first three polar steps in float32 and the rest in bf16, all
            on the tall stacked matrix, whatever ``steps`` (fp32/fp64: 3/2 tall steps, the rest on the
            Gram matrix).
            Default: the input dtype. The output has the input dtype.

    Raises:
        TypeError: X not a floating tensor; c not a number/tensor; unsupported dtype.
        ValueError: non-finite X, c <= 0 or non-finite, tensor c not broadcastable to the batch shape,
            unknown method, steps out of range, tall_steps out of 0..steps, tall_steps < steps with a
            bfloat16 compute dtype (the bf16 Gram phase diverges).
    """
    check_tensor(X, "X", min_ndim=1)
    check_choice(method, "method", METHODS)
    if steps is not None:
        check_int(steps, "steps", low=1, high=100)
    cdt = compute_dtype(X, dtype)
    if X.ndim == 1:
        check_scalar(c, "c", low=0.0, low_inclusive=False)
        if isinstance(c, torch.Tensor) and c.numel() != 1:
            raise ValueError(f"c must be a float or a one-element tensor for 1-D X, "
                             f"got shape {tuple(c.shape)}")
        if not isinstance(c, torch.Tensor) and c == float("inf"):
            raise ValueError("c must be finite, got inf")
        if X.numel() == 0:
            return X.clone()
        return _soft_clip_vector(X, c.reshape(()) if isinstance(c, torch.Tensor) else c, cdt)
    ct = threshold(c, "c", X, torch.float64 if method == "exact" else cdt, low=0.0, low_inclusive=False)
    if X.numel() == 0:  # an empty matrix (a zero dimension) maps to itself
        return X.clone()
    if method == "exact":
        return _exact(X, ct)
    x, transposed = to_wide(X)
    # h_c(x) = s h_{c/s}(x / s) for a power of two s near max|x| (exact division): no norm overflows at the top
    # of the range (||X||_F > finfo.max) and nothing underflows for subnormal input; c / s is capped at a
    # quarter of the largest value (a larger c maps x / s <= 2 to itself anyway)
    sdt = torch.float64 if torch.float64 in (X.dtype, cdt) else torch.float32
    sc = pow2_scale(x.to(sdt))
    x = to_unit(x.to(sdt), sc).to(x.dtype)  # (to_unit/from_unit: gradients skip 1/sc and sc, product 1)
    ns = method in ("newton_schulz", "newton_schulz_early_exit")
    # (a tensor numerator: a Python float over a tensor is computed as c * (1 / s), and 1 / s overflows)
    # (a Python threshold becomes a device tensor by a fill, not a host-to-device copy: CUDA graphs allow fills)
    if not isinstance(ct, torch.Tensor):  # (beyond the dtype's range: inf, as a conversion gives; capped below)
        ct = torch.full((), ct if ct <= torch.finfo(sdt).max else float("inf"), dtype=sdt, device=X.device)
    ct = ct.to(sdt)
    ct = to_unit(ct, sc).clamp_max(torch.finfo(sdt).max / 4)
    ct = ct.to(cdt if ns or cdt == torch.float64 else torch.float32)
    if ns:
        out = _newton_schulz(x.to(cdt), ct, 10 if steps is None else steps, method == "newton_schulz_early_exit")
    else:
        if steps is None:
            steps = (BF16_DEFAULT_STEPS if cdt == torch.bfloat16
                     else FAST_STEPS if tall_steps == 0 else DEFAULT_STEPS)
        if tall_steps is not None:
            check_int(tall_steps, "tall_steps", low=0, high=steps)
            if cdt == torch.bfloat16 and tall_steps < steps:
                raise ValueError(f"tall_steps must equal steps ({steps}) with a bfloat16 compute dtype "
                                 f"(the bf16 Gram phase diverges), got {tall_steps}; use dtype=torch.float32")
        out = _polar(x, ct, steps, cdt, tall_steps)
    out = from_unit(out.to(sdt), sc)
    out = mT(out) if transposed else out
    return out.to(X.dtype)
