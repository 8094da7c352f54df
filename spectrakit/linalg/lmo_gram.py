"""Gram-level route of the spectral maps of :mod:`spectrakit.linalg.lmo` (``method="gram"``).

A map that keeps the singular vectors of ``G = U diag(s) V^T`` (``m <= n``, else on ``G^T``) and sends every
singular value to ``s*(s)`` is a matrix function of the Gram matrix applied to ``G``:

    U diag(s*) V^T = U diag(s* / s) U^T G = W G,   W = Q diag(w) Q^T,  w = s*(sqrt(lambda)) / sqrt(lambda)

with ``A = G G^T = Q diag(lambda) Q^T`` (``m x m``). The route forms ``A`` in float64 (one product), takes a
float64 eigendecomposition of it (on CPU LAPACK's ``dsyevr`` through SciPy, ``W`` written into ``A``'s storage;
elsewhere ``torch.linalg.eigh`` in place: ``Q`` overwrites ``A``, then ``W`` overwrites ``Q``), and
multiplies ``W G`` in float64 (one more product), block by block along the long dimension, written back into
the work tensor: extra memory is ``A`` plus ``m^2`` float64 for the eigenvectors of LAPACK's ``dsyevr`` on
CPU (elsewhere ``2 m^2`` of divide-and-conquer workspace), or one ``m x m`` product, or two blocks, never a
full-size temporary. The input is scaled by a power of two near
``max|G|`` first (exact), so no norm overflows in any dtype."""

# Singular values are read off as ``sqrt(lambda)``: eigenvalues below ``RESOLVE m eps_64 lambda_max`` are not
# resolved (``w = 0``: a rank-deficient ``G``'s null space maps to 0, as on the polar route), and those just
# above it are off by up to ~1/16. A matrix where that matters (:func:`_needs_svd`) takes an SVD of ``Q^T G``
# accurate to ``eps_64 s_max`` absolute (:func:`_svd_weights`), so ``s*(s) <= D`` holds for every input and
# entropy or Schatten maps see the directions below the cut-off. A non-finite input matrix gives a non-finite
# output (its ``A`` is replaced by 0 before ``eigh``, whose LAPACK call would fail on it).
#
# On CPU the SVD is chosen per matrix from CPU values; elsewhere every matrix takes it (no value is read), but
# ``torch.linalg.eigh`` itself synchronises CUDA devices with the host, so this route is the default on CPU
# only (:data:`GRAM_DEVICE_TYPES`).

from __future__ import annotations

import math

import torch

from ._util import mT

# device types on which spectral_lmo's default method is "gram" (eigh does not block a CPU "device")
GRAM_DEVICE_TYPES = ("cpu",)
# eigenvalues of A below RESOLVE * m * eps_64 * lambda_max are treated as 0 (not resolved by float64 eigh)
RESOLVE = 16.0
# resolved eigenvalues below NEAR * m * eps_64 * lambda_max: sqrt(lambda) may be off by more than ~1e-7 and the
# eigenvectors of nearby ones mix; a matrix with such eigenvalues takes the accurate SVD (_svd_weights)
NEAR = 1e7
# singular values of the accurate SVD below NOISE * eps_64 * sqrt(k n) * s_max are rounding: zeros
NOISE = 8.0
# ... and below INPUT_NOISE * eps * s_max of the input's dtype (a float32 matrix's own rounding): zeros
INPUT_NOISE = 4.0
# element budget of the float64 block temporaries (the work tensor is transformed block by block)
BLOCK_NUMEL = 2**20


def _blocks(long: int, rows: int, numel: int) -> list[tuple[int, int]]:
    """Slices along the long dimension, each a block of at most ``max(min(BLOCK_NUMEL, numel / 64), 64 rows)``
    float64 elements (``rows``: batch size times the short dimension)."""
    budget = max(min(BLOCK_NUMEL, numel // 64), 64 * rows)
    step = max(1, budget // max(1, rows))
    return [(j, min(long, j + step)) for j in range(0, long, step)]


def _pow2_scale(x: torch.Tensor) -> torch.Tensor:
    """float64 power of two within a factor 2 of ``max|x|`` per matrix (``(B, 1, 1)``; 1 for a zero or
    non-finite matrix), by a reduction without a full-size ``|x|`` temporary (``linalg._util.pow2_scale``'s
    value)."""
    amax = torch.linalg.vector_norm(x.detach(), math.inf, dim=(-2, -1), keepdim=True).to(torch.float64)
    s = torch.exp2(torch.floor(torch.log2(amax)))
    return torch.where((amax > 0) & torch.isfinite(s), s, torch.ones_like(s))


def _gram(x: torch.Tensor, s64: torch.Tensor, wide: bool) -> torch.Tensor:
    """float64 Gram matrix of ``x / s`` on its short side, accumulated block by block."""
    b, m, n = x.shape
    k = m if wide else n
    a = torch.zeros(b, k, k, dtype=torch.float64, device=x.device)
    for j0, j1 in _blocks(n if wide else m, b * k, x.numel()):
        blk = (x[:, :, j0:j1] if wide else x[:, j0:j1, :]).to(torch.float64, copy=True).div_(s64)
        a.baddbmm_(blk, mT(blk)) if wide else a.baddbmm_(mT(blk), blk)
        del blk
    return a


def _eigh_(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 ``torch.linalg.eigh`` of the symmetric batch ``a`` (``(B, k, k)``, contiguous), the eigenvectors
    written into ``a``'s own storage: ``a.mT`` is the same symmetric matrix in LAPACK's column-major layout, so
    ``torch.linalg.eigh(a.mT, out=(lam, a.mT))`` runs in place and allocates only LAPACK's workspace
    (``2 k^2 + 6 k + 1`` float64 for divide and conquer) and the eigenvalues. Returns ``(lam, q)`` with ``q``
    the column-major view (eigenvectors in its columns). Under autograd (``out=`` has no backward) and while
    ``torch.compile`` traces (dynamo takes no strided ``out=``) the out-of-place call."""
    if a.requires_grad or torch.compiler.is_compiling():
        return torch.linalg.eigh(a.mT)  # (the same triangle as the in-place call)
    lam = torch.empty(a.shape[:-1], dtype=a.dtype, device=a.device)
    q = a.mT
    torch.linalg.eigh(q, out=(lam, q))
    return lam, q


def _use_syevr(a: torch.Tensor) -> bool:
    """The CPU route of :func:`gram_map_`: LAPACK's ``dsyevr`` through SciPy, one matrix at a time (not under
    autograd or while traced)."""
    return a.device.type == "cpu" and not a.requires_grad and not torch.compiler.is_compiling()


def _spectrum(lam: torch.Tensor, k: int, scale: torch.Tensor, s_star):
    """``(ok, sig, target)`` per eigenvalue (``(B, k)``): resolved or not, ``sqrt(lam)`` (1 where unresolved)
    and ``s*(sqrt(lam))``; ``scale`` = ``p / b`` per matrix (``(B,)``)."""
    lam_max = lam[:, -1:].clamp_min(0)
    ok = lam > (RESOLVE * k * torch.finfo(torch.float64).eps) * lam_max
    sig = torch.sqrt(torch.where(ok, lam, torch.ones_like(lam)))  # singular values of x / s
    target = s_star(sig * scale[:, None])  # (p / b may overflow to inf: r = inf, s* = its limit)
    return ok, sig, target


def _weights(lam: torch.Tensor, k: int, scale: torch.Tensor, finite: torch.Tensor, s_star) -> torch.Tensor:
    """``w = s*(sqrt(lam)) / sqrt(lam)`` per eigenvalue (``(B, k)``; 0 for unresolved eigenvalues, nan for a
    non-finite matrix); ``scale`` = ``p / b`` per matrix (``(B,)``)."""
    ok, sig, target = _spectrum(lam, k, scale, s_star)
    w = torch.where(ok, target / sig, torch.zeros_like(sig))
    return torch.where(finite[:, None], w, torch.full_like(w, math.nan))


def _needs_svd(lam: torch.Tensor, k: int, scale: torch.Tensor, s_star) -> torch.Tensor:
    """``(B,)``: whether a matrix needs :func:`_svd_weights`: the map is not linear at a resolved eigenvalue
    below ``NEAR k eps_64 lambda_max`` (there ``sqrt(lambda)`` may be off by more than ~1e-7 relative and such
    eigenvectors mix: ``s*(s) s_true / s`` would be wrong, above ``D`` when ``s*`` saturates; where
    ``s*(s) = s / b`` the Gram route is exact whatever ``s``), or it has unresolved eigenvalues while the map
    gives directions at the cut-off more than ``1e-5`` of its largest output (entropy, Schatten ``p > 2``:
    tiny directions carry the answer; for the Frobenius map they are below ``~2e-6`` of it)."""
    eps = torch.finfo(torch.float64).eps
    lam_max = lam[:, -1:].clamp_min(0)
    cut = RESOLVE * k * eps * lam_max
    near = (lam > cut) & (lam < NEAR * k * eps * lam_max)
    r = torch.sqrt(torch.where(near, lam, lam_max)) * scale[:, None]
    bent = (s_star(1.01 * r) - 1.01 * s_star(r)).abs() > 1e-6 * s_star(1.01 * r)
    top = s_star(torch.sqrt(lam_max) * scale[:, None])[:, 0]
    at_cut = s_star(torch.sqrt(cut) * scale[:, None])[:, 0]
    weighted = (lam <= cut).any(-1) & (at_cut > 1e-5 * top)
    return ((near & bent).any(-1) | weighted) & (lam_max[:, 0] > 0)


def _svd_weights(q, lam, k, scale, finite, s_star, x, s64, wide) -> torch.Tensor:
    """``W`` (``(B, k, k)``, symmetric) from an SVD of ``Y = Q^T G`` accurate to ``eps_64 s_max`` *absolute*
    (so singular values below the Gram cut-off are resolved): ``C = Y Y^T`` from ``G`` block by block (each
    entry accurate relative to its rows' norms ``rho``), ``C = D S D`` with ``D = diag(rho)``, ``B = D S^(1/2)``
    (``B B^T = C``: the singular values and left vectors of ``B`` are those of ``Y``; ``S`` is near the
    identity, so ``B`` carries ``Y``'s scales exactly), ``B = U diag(s) V^T`` (LAPACK), then
    ``W = (Q U) diag(s*(s) / s) (Q U)^T``. Singular values at rounding level (below ``NOISE eps_64 sqrt(k n)
    s_max`` and ``INPUT_NOISE eps s_max`` of the input's dtype) are zeros: a rank-deficient ``G``'s null space,
    rounded to float32, maps to 0."""
    bsz, m, n = x.shape
    c = torch.zeros_like(q)
    for j0, j1 in _blocks(n if wide else m, bsz * k, x.numel()):
        blk = (x[:, :, j0:j1] if wide else mT(x[:, j0:j1, :])).to(torch.float64, copy=True).div_(s64)
        y = mT(q) @ blk  # (B, k, block): rows of Q^T G
        c.baddbmm_(y, mT(y))
        del blk, y
    rho = torch.sqrt(torch.diagonal(c, dim1=-2, dim2=-1).clamp_min(0))
    dinv = torch.where(rho > 0, 1.0 / rho, torch.zeros_like(rho))
    s_mat = c * dinv[:, :, None] * dinv[:, None, :] + torch.diag_embed((rho == 0).to(c.dtype))
    mu, p = torch.linalg.eigh(s_mat)
    half = (p * mu.clamp_min(0).sqrt()[:, None, :]) @ mT(p)
    u, sig, _ = torch.linalg.svd(rho[:, :, None] * half)
    eps = torch.finfo(torch.float64).eps
    floor = max(NOISE * eps * math.sqrt(k * max(m, n)), INPUT_NOISE * torch.finfo(x.dtype).eps)
    ok = sig > floor * sig[:, :1]
    sig1 = torch.where(ok, sig, torch.ones_like(sig))
    w = torch.where(ok, s_star(sig1 * scale[:, None]) / sig1, torch.zeros_like(sig))
    v = q @ u
    wm = (v * w[:, None, :]) @ mT(v)
    return torch.where(finite[:, None, None], wm, torch.full_like(wm, math.nan))


def _w_syevr_(a: torch.Tensor, k: int, scale: torch.Tensor, finite: torch.Tensor, s_star, sign: float,
              x: torch.Tensor, s64: torch.Tensor, wide: bool) -> None:
    """Overwrite each ``A_i`` of the batch with ``W_i = sign Q diag(w) Q^T``: LAPACK's relatively robust
    representations driver ``dsyevr`` (Dhillon and Parlett 2004, through SciPy) destroys ``A_i`` and returns
    the eigenvectors ``Q`` in a new ``k x k`` array, ``W_i = (Q sqrt(w)) (Q sqrt(w))^T`` is written into
    ``A_i``'s storage, and ``Q`` is freed. A matrix that needs it (:func:`_needs_svd`) gets
    :func:`_svd_weights` instead. Measured at k = 1024 (1 thread):
    560 ms against torch's 724 ms, residuals ``||A Q - Q diag(lam)|| / ||A||`` 2.2e-15 and 2.8e-15."""
    from scipy.linalg import eigh as scipy_eigh

    # the choice of the accurate SVD is made per matrix on the host: CPU values (this route's only device), read
    # as NumPy arrays, wait for nothing (as the optimizer's own host verdict on a CPU)
    for i in range(a.shape[0]):
        # a[i].mT is Fortran-ordered: SciPy hands it to LAPACK without a copy (and may overwrite it)
        lam, q = scipy_eigh(a[i].mT.numpy(), driver="evr", overwrite_a=True, check_finite=False)
        lam_t, qt = torch.from_numpy(lam)[None], torch.from_numpy(q)  # (qt: column-major, eigenvectors in columns)
        if _needs_svd(lam_t, k, scale[i:i + 1], s_star).logical_and(finite[i]).numpy()[0]:
            a[i].copy_(_svd_weights(qt[None], lam_t, k, scale[i:i + 1], finite[i:i + 1], s_star, x[i:i + 1],
                                    s64[i:i + 1], wide)[0])
        else:
            w = _weights(lam_t, k, scale[i:i + 1], finite[i:i + 1], s_star)[0]
            qt.mul_(w.sqrt()[None, :])
            torch.matmul(qt, mT(qt), out=a[i])
        a[i].mul_(sign)
        del lam, q, qt


def gram_map_(x: torch.Tensor, s_star, b: float, sign: float = 1.0) -> torch.Tensor:
    """Overwrite the batch ``x`` (``(B, m, n)``, float32/float64, contiguous) with ``sign U diag(s*(s)) V^T``
    and return it (module docstring). ``s_star(r)`` maps the float64 ratios ``r = s / b`` (``(B, k)``, computed
    as ``(s / p) (p / b)`` with the input's power-of-two scale ``p``, so a subnormal ``s`` or ``b`` loses no
    digits) to the new singular values (``>= 0``, finite; unresolved directions get 0 whatever ``s_star``).

    Peak extra memory (float64): ``A`` for each matrix of the batch plus, on CPU, the ``k x k`` eigenvectors of
    one matrix (``dsyevr``, :func:`_w_syevr_`: ``W_i`` is written into ``A_i``'s storage, then the eigenvectors
    are freed); elsewhere LAPACK's divide-and-conquer workspace of ``2 k^2 + 6 k + 1`` for one matrix, then
    one ``k x k`` product at a time (:func:`_eigh_`); then two blocks. For one matrix on CPU that is ``2 k^2``
    float64 (``16 k^2`` bytes: 4x a square fp32 input, 1.5x a ``k x 2.7k`` one; elsewhere ``3 k^2``); no
    full-size temporary."""
    bsz, m, n = x.shape
    wide = m <= n
    k = min(m, n)
    s64 = _pow2_scale(x)
    a = _gram(x, s64, wide)
    # (B,): a nan/inf entry of x makes the diagonal entry of A of its row (tall: column) nan/inf, and the
    # entries of a finite x / s are below 2, so a finite x gives a finite trace; no k x k temporary
    # (isfinite(a) would allocate |a|)
    finite = torch.isfinite(torch.diagonal(a, dim1=-2, dim2=-1).sum(-1))
    a.masked_fill_(~finite[:, None, None], 0.0)
    scale = s64[:, 0, 0] / b
    if _use_syevr(a):
        _w_syevr_(a, k, scale, finite, s_star, sign, x, s64, wide)
        wm = a
    else:
        lam, q = _eigh_(a)
        del a
        w = _weights(lam, k, scale, finite, s_star)
        # W = sign Q diag(w) Q^T = sign (Q sqrt(w)) (Q sqrt(w))^T (w >= 0), built in Q's own storage one matrix
        # at a time: one new k x k at a time, whatever the batch size
        if q.requires_grad:  # (explicit method="gram" under autograd: no in-place step, no sqrt'(0))
            wm = (q * (w * sign)[:, None, :]) @ mT(q)
        else:  # the accurate SVD for every matrix (no host read to pick the matrices)
            wm = _svd_weights(q, lam, k, scale, finite, s_star, x, s64, wide).mul_(sign)
        del q
    for j0, j1 in _blocks(n if wide else m, bsz * k, x.numel()):
        view = x[:, :, j0:j1] if wide else x[:, j0:j1, :]
        blk = view.to(torch.float64, copy=True).div_(s64)
        view.copy_(wm @ blk if wide else blk @ wm)
        del blk
    return x


def lmo_weights(regularizer: str, radius: float, p: float | None):
    """``r = s / b -> s*`` of eq. E.3 on float64 tensors (no overflow: the exponentials are capped in logs)."""
    d = float(radius)
    log_d = math.log(d)
    if regularizer == "frobenius":
        return lambda r: r.clamp_max(d)
    if regularizer == "nuclear":
        return lambda r: torch.where(r > 1.0, torch.full_like(r, d), torch.zeros_like(r))
    if regularizer == "schatten":
        return lambda r: torch.exp((torch.log(r) / (p - 1.0)).clamp_max(log_d))
    return lambda r: torch.exp(r.clamp_max(log_d))
