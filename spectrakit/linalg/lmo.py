"""Regularised linear minimisation over the spectral-norm ball (Jiang, Semenov & Stich 2026, §3.1, App. E.3).

For a unitarily invariant regularizer ``psi`` the Frank–Wolfe subproblem

    X* = argmin_{||X||_2 <= D} <G, X> + psi(X)

keeps the singular vectors of ``G = U diag(s) V^T`` and maps every singular value separately (eq. E.3):
``X* = -U diag(s*) V^T`` with ``s* = argmin_{x in [0, D]} -s x + psi_1(x)``:

=============  ======================================  =========================================
regularizer    ``psi(X)``                              ``s*(s)``
=============  ======================================  =========================================
frobenius      ``b/2 ||X||_F^2``                       ``min(s / b, D)``  (SPECTRA's hard clip)
nuclear        ``b sum_i s_i(X)``                      ``0`` if ``s <= b``, ``D`` if ``s > b``
schatten       ``b/p sum_i s_i(X)^p`` (``p > 1``)      ``min((s / b)^(1/(p-1)), D)``
entropy        ``b sum_i (s_i log s_i - s_i)``         ``min(exp(s / b), D) = exp(min(s/b, log D))``
=============  ======================================  ========================================="""

# ``method="gram"`` (the default on CPU for inputs that autograd does not track) is a matrix function of the
# Gram matrix: ``X* = -W G`` with ``W = Q diag(s*(s)/s) Q^T`` from a float64 ``eigh`` of ``A = G G^T = Q diag(s^2)
# Q^T`` (``m x m``, wide orientation), see :mod:`spectrakit.linalg.lmo_gram`: float64 accuracy for every
# singular value above ``~2e-6 s_max``, 0 below (the null space), any Schatten ``p > 1``, no full-size
# temporary in its in-place form :func:`spectral_lmo_`.
#
# ``method="polar"`` (the default on CUDA, where ``eigh`` blocks the device, and under autograd) works on the
# polar core of :mod:`spectrakit.linalg.hard_clip`: in the wide
# orientation, ``O = msign(G) = U V^T`` and the symmetric absolute value ``A = sym(G O^T) = U diag(s) U^T``
# (``m x m``), then ``X* = -f(A) O`` with the scalar map ``f`` built from eigen-sign sandwiches and matmuls:
#
# - frobenius: ``min(A, bD) / b``, i.e. :func:`~spectrakit.linalg.spectral_hardcap` at ``bD``, divided by ``b``;
# - nuclear: ``D P`` with the spectral projector ``P = (I - sign(bI - A)) / 2`` onto ``{s > b}``. The step is
#   resolved by the sign iteration (relative lower bound 1e-6 of ``||A||_F``): a singular value within
#   ``~1e-6 max(||G||_F, b)`` of ``b`` gets a value between 0 and ``D`` (exactly ``D/2`` at ``s = b``, the
#   midpoint of the optimal set ``[0, D]``: at ``s = b`` the objective is flat in that direction); the
#   ``"exact"`` route returns 0 there (the paper's case ``s <= b``);
# - schatten: ``D (tau/t)^q M^q`` with ``M = min(A, t) / tau``, ``t = b D^(p-1)`` (the clip by a sandwich),
#   ``tau = min(t, ||G||_F)`` (so ``M`` is not uniformly tiny when ``t >> s_max``) and
#   ``q = 1/(p-1)``: the integer part of ``q`` by matmuls, the fractional part by repeated square roots
#   ``M^(1/2)``, ``M^(1/4)``, ... (so ``q`` must be a multiple of ``1/16``: ``p = 3, 5, 9, 17, 1.5, 2, 4/3+...``
#   e.g. ``p = 3 -> q = 1/2``; other ``p`` raise ``ValueError`` on this route, use ``method="exact"``). The
#   square root runs the Polar Express schedule of the sign iteration on ``w = sqrt(lambda)`` in coupled form
#   without ever forming ``sqrt(M)`` first: with ``w <- w h(w^2)``, ``h(u) = a + b u + c u^2``, the matrices
#   ``X = w^2`` and ``Y = sqrt(M) w`` follow ``Y <- Y h(X)``, ``X <- X h(X)^2`` from ``X = Y = M``, and
#   ``Y -> sqrt(M)`` as ``w -> 1`` (eigenvalues of ``M`` below ``1e-8`` are only partly resolved, an absolute
#   error below ``1e-4``);
# - entropy: ``exp(N)`` with ``N = min(A, b log D) / b`` (a sandwich), by scaling and squaring of a degree-12
#   Taylor polynomial of ``exp(N - (log D / 2) I)`` (the number of squarings is fixed on the host from ``b``
#   and ``D``, no data-dependent branch); for ``D <= 1``, ``s* = D`` for every ``s`` and ``X* = -D O``.
#
# Zero singular values (rank-deficient ``G``, ``r = rank(G) < min(m, n)``): for frobenius, nuclear and schatten
# ``s*(0) = 0``, so the zero directions do not matter. For entropy ``s*(0) = min(1, D) > 0``, and any
# orthonormal pairs spanning the left and right null spaces of ``G`` give a minimiser (the minimiser is not
# unique). The ``"exact"`` route uses the pairs of ``torch.linalg.svd`` (the thin SVD's completion,
# ``min(m, n)`` pairs); the ``"polar"`` route uses the range of ``G`` only (``O`` is 0 on its null space), so it
# returns the minimiser over matrices whose row and column spaces lie in those of ``G``: the zero directions get
# 0. The same holds for singular values below ``~1e-6 s_max`` (only partly resolved by ``O``).
#
# Accuracy of the Gram route (tested against a float64 SVD): relative error <= 1e-4 in fp32 (measured
# <= 1.5e-5), <= 1e-6 in fp64, on Gaussian, spiked and 4-decade spectra, rank-deficient, tiny and huge inputs,
# bf16 inputs (the output's rounding, <= 5e-3). Accuracy of the polar route: relative Frobenius error
# <= 1e-3 in fp32 wherever no singular value
# lies within 2.5% of ``b`` (nuclear) and the spectrum spans at most 4 decades (``s_min >= 1e-4 s_max``), for
# ``b`` from 1e-3 to 10 and ``D`` from 0.5 to 100 (measured 3e-6 .. 6e-4); bf16 (``dtype=torch.bfloat16``: the
# sign iterations as in :func:`~spectrakit.linalg.spectral_clip`, the rest in fp32): <= 3e-2 (measured
# 5e-3 .. 8e-3). Beyond that the polar factor resolves singular values below ``~1e-6 s_max`` only partly, which
# the maps that amplify small values inherit: measured on a spectrum over 6 decades (fp32) 1.5e-2 for
# Schatten-9 (``s^(1/8)``), 2.8e-3 for entropy with ``D = 1``, <= 5e-4 otherwise; a square Gaussian matrix
# plus a 1e3 spike (its smallest singular values near ``1e-6 s_max``): <= 2e-2 for Schatten-5/9 and up to
# 8e-2 for entropy with ``D <= 1`` (there ``X* = -D msign(G)``, so every unresolved singular value counts).
# No host synchronisation on the ``"polar"`` route (``b``, ``radius`` and ``p`` are Python numbers); the ``"gram"``
# route reads no tensor value either, but LAPACK's ``eigh`` checks its status on the host (free on a CPU).

from __future__ import annotations

import math

import torch

from spectrakit._checks import check_choice, check_int, check_scalar, check_tensor

from ._util import compute_dtype, frob, mT, pow2_scale, tiny_for
from .eig import CLIP_PASSES, clip_sym, eigen_signs
from .lmo_gram import GRAM_DEVICE_TYPES, gram_map_, lmo_weights
from .polar import clip_sign, to_wide
from .schedules import polar_express_coeffs, steps_for

REGULARIZERS = ("frobenius", "nuclear", "schatten", "entropy")
METHODS = ("gram", "polar", "exact")
# largest number of square roots for the fractional part of q = 1/(p-1) (q a multiple of 2^-MAX_HALVINGS)
MAX_HALVINGS = 4
_TAYLOR_DEGREE = 12


def _exponent_parts(p: float) -> tuple[int, int]:
    """``q = 1/(p-1) = k + j / 2^MAX_HALVINGS``: returns ``(k, j)``; ValueError if ``q`` is not such a multiple."""
    q = 1.0 / (p - 1.0)
    scaled = q * 2**MAX_HALVINGS
    j_all = round(scaled)
    if abs(scaled - j_all) > 1e-9 * max(1.0, scaled) or j_all == 0:
        raise ValueError(
            f"p={p}: method='polar' needs 1/(p-1) to be a positive multiple of 1/{2**MAX_HALVINGS} "
            f"(e.g. p = 3, 5, 9, 17, 2, 1.5, 5/3); use method='exact' for other p")
    return j_all // 2**MAX_HALVINGS, j_all % 2**MAX_HALVINGS


def default_method(device: torch.device, requires_grad: bool = False) -> str:
    """``method=None`` of :func:`spectral_lmo`: ``"gram"`` on CPU (:data:`~.lmo_gram.GRAM_DEVICE_TYPES`) for an
    input that autograd does not track, ``"polar"`` elsewhere (``torch.linalg.eigh`` blocks a CUDA device
    until the host reads its status, and its backward is not finite at repeated or zero eigenvalues)."""
    if requires_grad and torch.is_grad_enabled():
        return "polar"
    return "gram" if torch.device(device).type in GRAM_DEVICE_TYPES else "polar"


def check_lmo_args(regularizer, b, radius, p, method: str = "polar") -> None:
    """Validate the arguments of :func:`spectral_lmo` (also used by the optimizer's ``post="spectral_lmo"``)."""
    check_choice(regularizer, "regularizer", REGULARIZERS)
    check_choice(method, "method", METHODS)
    check_scalar(b, "b", low=0.0, low_inclusive=False, allow_tensor=False)
    if not math.isfinite(float(b)):
        raise ValueError(f"b must be a finite number > 0, got {b}")
    check_scalar(radius, "radius", low=0.0, low_inclusive=False, allow_tensor=False)
    if not math.isfinite(float(radius)):
        raise ValueError(f"radius must be a finite number > 0, got {radius}")
    if regularizer == "schatten":
        if p is None:
            raise ValueError("p is required for regularizer='schatten' (a number > 1)")
        check_scalar(p, "p", low=1.0, low_inclusive=False, allow_tensor=False)
        if not math.isfinite(float(p)):
            raise ValueError(f"p must be a finite number > 1, got {p}")
        if method == "polar":
            _exponent_parts(float(p))
    elif p is not None:
        raise ValueError(f"p is only used by regularizer='schatten', got p={p} with regularizer={regularizer!r}")


def lmo_singular_values(s: torch.Tensor, regularizer: str, b: float, radius: float, p: float | None = None
                        ) -> torch.Tensor:
    """The scalar map ``s -> s*`` of eq. E.3 (module docstring table), elementwise on a tensor ``s >= 0``."""
    d = float(radius)
    if regularizer == "frobenius":
        return (s / b).clamp_max(d)
    if regularizer == "nuclear":
        return torch.where(s > b, torch.full_like(s, d), torch.zeros_like(s))
    if regularizer == "schatten":
        # (s/b)^(1/(p-1)) capped at D, in logs (no overflow); s = 0 -> 0
        logv = torch.log(s / b) / (p - 1.0)
        return torch.exp(logv.clamp_max(math.log(d)))
    return torch.exp((s / b).clamp_max(math.log(d)))


def _exact(G: torch.Tensor, regularizer, b, radius, p) -> torch.Tensor:
    u, s, vh = torch.linalg.svd(G.double(), full_matrices=False)
    st = lmo_singular_values(s, regularizer, b, radius, p)
    return (-(u * st[..., None, :]) @ vh).to(G.dtype)


def _sqrt_psd(m: torch.Tensor, shift: float, steps: int | None) -> torch.Tensor:
    """``(M + shift I)^(1/2)`` of symmetric PSD float64 ``m`` with eigenvalues in ``[0, 1]`` by the coupled
    Polar Express iteration (module docstring): ``Y <- Y h(X)``, ``X <- X h(X)^2`` from ``X = Y = M + shift I``.
    The shift lifts rounding-level negative eigenvalues (which the iteration would amplify) and is the
    schedule's lower bound ``sqrt(shift)``."""
    lb = math.sqrt(shift)
    n_steps = steps or steps_for(lb, 1e-8)
    eye = torch.eye(m.shape[-1], dtype=m.dtype, device=m.device)
    x = y = m + shift * eye
    for a, bb, c in polar_express_coeffs(lb, n_steps):
        h = a * eye + bb * x + c * (x @ x)
        y = y @ h
        x = x @ h @ h
        x = (x + mT(x)) / 2
    return (y + mT(y)) / 2


def _power(m: torch.Tensor, p: float, steps: int | None) -> torch.Tensor:
    """``M^q`` for ``q = 1/(p-1) = k + j / 2^MAX_HALVINGS``, eigenvalues of ``M`` in ``[0, 1]``; the square
    roots run in float64 (``m x m``) with a shift of ``16 eps`` of the input dtype (module docstring)."""
    k, j = _exponent_parts(p)
    shift = 16 * float(torch.finfo(m.dtype).eps)
    out = None
    for _ in range(k):
        out = m if out is None else out @ m
    root = m.double()
    for level in range(1, MAX_HALVINGS + 1):
        if j == 0:
            break
        root = _sqrt_psd(root, shift, steps)
        bit = 2 ** (MAX_HALVINGS - level)
        if j >= bit:
            r = root.to(m.dtype)
            out = r if out is None else out @ r
            j -= bit
    return (out + mT(out)) / 2


def _exp_psd(n: torch.Tensor, upper: float) -> torch.Tensor:
    """``exp(N)`` of symmetric ``N`` with eigenvalues in ``[0, upper]``: shift by ``upper/2``, scale by
    ``2^-k`` (``k`` from ``upper`` on the host) so the eigenvalues are within ``[-1/4, 1/4]``, Taylor, square."""
    half = upper / 2
    k = max(0, math.ceil(math.log2(half / 0.25))) if half > 0.25 else 0
    eye = torch.eye(n.shape[-1], dtype=n.dtype, device=n.device)
    z = (n - half * eye) / 2**k
    e = eye + z / _TAYLOR_DEGREE
    for i in range(_TAYLOR_DEGREE - 1, 0, -1):  # Horner: I + z/1 (I + z/2 (I + ...))
        e = eye + (z @ e) / i
    for _ in range(k):
        e = e @ e
    return math.exp(half) * (e + mT(e)) / 2


def _big(work: torch.dtype) -> float:
    return float(torch.finfo(work).max) / 4


def _polar(xw: torch.Tensor, regularizer, b, radius, p, cdt, steps) -> torch.Tensor:
    """``f(A) O`` (module docstring) for wide ``xw`` in the work dtype; the caller negates.

    Works on ``xw / s`` and ``b / s`` (``s`` a power of two near ``max|xw|``; ``X*`` depends on ``G / b`` only),
    so no norm overflows at the top of the range and subnormal inputs are normal numbers; ``b / s`` and the
    threshold ``t`` are float64 tensors until they are capped at a quarter of the work dtype's largest value."""
    m = xw.shape[-2]
    d = float(radius)
    s = pow2_scale(xw)
    xw = xw / s
    o = clip_sign(xw, cdt, steps)
    if regularizer == "entropy" and d <= 1.0:
        return d * o
    b64 = torch.full((1, 1), float(b), dtype=torch.float64, device=xw.device) / s.double()
    big = _big(xw.dtype)
    if regularizer == "frobenius":
        t64 = b64 * d
    elif regularizer == "nuclear":
        t64 = b64
    elif regularizer == "schatten":
        t64 = torch.exp((torch.log(b64) + (p - 1.0) * math.log(d)).clamp_max(math.log(big)))
    else:
        t64 = b64 * math.log(d)
    t = t64.clamp_max(big).to(xw.dtype)
    a = xw @ mT(o)
    # scale so that A / sc and t / sc are <= 1 (no overflow; sign errors relative to 1)
    fr = frob(xw).clamp_min(tiny_for(xw.dtype))
    sc = torch.maximum(fr, t)
    a = (a + mT(a)) / (2 * sc)
    eye = torch.eye(m, dtype=xw.dtype, device=xw.device)
    tiny = torch.finfo(xw.dtype).tiny
    t_rel = (t / sc).clamp_min(tiny)
    if regularizer == "nuclear":
        sgn = eigen_signs([t_rel * eye - a], cdt, steps)[0]  # sign(t I - A): +1 on {s < t}, -1 on {s > t}
        return (d * (eye - sgn) / 2) @ o
    # min(A, t) / sc, clipped at 0 too (A's rounding-level negative eigenvalues, ~ -eps, would otherwise pass
    # through and, divided by a tiny tau below, leave [0, 1]: the square roots diverged to nan), with the
    # refinement passes of the hard clips (a cap far below s_max); t >= ||G||_F: exactly A
    capped = clip_sym(a, None, t_rel, cdt, steps, CLIP_PASSES, psd=True)
    if regularizer == "frobenius":  # min(A, bD) / b = D min(A, t) / t
        return (d * (capped / t_rel)) @ o
    if regularizer == "schatten":
        # min(A, t) / tau with tau = min(t, ||G||_F) (eigenvalues in [0, 1], not all tiny when t >> s_max),
        # then D (tau / t)^q M^q = D (min(A, t) / t)^q
        tau = torch.minimum(fr, t)
        mm = capped / (tau / sc).clamp_min(tiny)
        gain = d * torch.exp((torch.log(tau) - torch.log(t)) / (p - 1.0))
        return (gain * _power(mm, p, steps)) @ o
    b_rel = (b64 / sc.double()).to(xw.dtype).clamp_min(tiny)
    return _exp_psd(capped / b_rel, math.log(d)) @ o


def spectral_lmo(G: torch.Tensor, regularizer: str, *, b: float, radius: float, p: float | None = None,
                 method: str | None = None, steps: int | None = None, dtype: torch.dtype | None = None
                 ) -> torch.Tensor:
    """Regularised linear minimisation oracle ``argmin_{||X||_2 <= D} <G, X> + psi(X)`` (Jiang, Semenov &
    Stich 2026, §3.1 and Appendix E.3).

    ``X* = -U diag(s*) V^T`` for ``G = U diag(s) V^T`` with (``D = radius``)

    - ``"frobenius"``: ``psi = b/2 ||X||_F^2``, ``s* = min(s/b, D)``;
    - ``"nuclear"``: ``psi = b sum s_i``, ``s* = D [s > b]`` (0 for ``s <= b``);
    - ``"schatten"``: ``psi = b/p sum s_i^p`` (``p > 1``), ``s* = min((s/b)^(1/(p-1)), D)``;
    - ``"entropy"``: ``psi = b sum (s_i log s_i - s_i)``, ``s* = min(exp(s/b), D)``.

    ``method="gram"``: ``X* = -W G``, ``W = Q diag(s*(s)/s) Q^T`` from a float64 eigendecomposition of
    ``G G^T = Q diag(s^2) Q^T`` (``min(m, n)`` square), singular values below ``~2e-6 s_max`` mapped to 0.
    ``method="polar"``: ``X* = -f(A) O`` with ``O = msign(G)``, ``A = sym(G O^T)`` and ``f`` from
    eigen-sign sandwiches, coupled square-root iterations and a Taylor exponential (module docstring; the
    nuclear step near ``s = b``, the zero singular values and the accuracy are described there). Schatten-p on
    this route needs ``1/(p-1)`` to be a multiple of 1/16. ``method="exact"``: float64 SVD (syncs on CUDA).
    Default (None): ``"gram"`` on CPU, ``"polar"`` on CUDA or when ``G`` requires grad.

    Args:
        G: ``(..., m, n)`` floating tensor, finite (the gradient or momentum).
        regularizer: "frobenius", "nuclear", "schatten" or "entropy".
        b: regularisation strength, a finite number > 0.
        radius: ``D``, the spectral-norm radius, a finite number > 0.
        p: the Schatten exponent, a finite number > 1 (only with ``regularizer="schatten"``).
        method: None (default, see above), "gram", "polar" or "exact".
        steps: sign iterations of the polar route (1..100), also used for the Schatten square roots (the Gram
            route has none); default: linalg's defaults
            (square roots: enough Polar Express steps for 1e-8 at the lower bound ``sqrt(16 eps)``).
        dtype: compute dtype of the polar route's sign iterations (the Gram route computes in float64; bf16: mixed as in
            :func:`~spectrakit.linalg.spectral_clip`, the rest in fp32); output has G's dtype.

    Raises:
        TypeError: G not a floating tensor; b, radius or p not numbers.
        ValueError: non-finite G, unknown regularizer/method, b or radius not finite and > 0, p missing,
            p <= 1, p given for another regularizer, a Schatten p the polar route does not support.
    """
    check_tensor(G, "G", min_ndim=2)
    method = default_method(G.device, G.requires_grad) if method is None else method
    check_lmo_args(regularizer, b, radius, p, method)
    if steps is not None:
        check_int(steps, "steps", low=1, high=100)
    b, radius = float(b), float(radius)
    p = None if p is None else float(p)
    cdt = compute_dtype(G, dtype)
    if G.numel() == 0:
        return G.clone()
    if method == "exact":
        return _exact(G, regularizer, b, radius, p)
    if method == "gram":
        work = torch.float64 if G.dtype == torch.float64 else torch.float32
        x = G.to(work, copy=True, memory_format=torch.contiguous_format)
        out = gram_map_(x.reshape(-1, *G.shape[-2:]), lmo_weights(regularizer, radius, p), b, sign=-1.0)
        return out.reshape(G.shape).to(G.dtype)
    x, transposed = to_wide(G)
    work = torch.float32 if cdt == torch.bfloat16 else cdt
    out = -_polar(x.to(work), regularizer, b, radius, p, cdt, steps)
    out = mT(out) if transposed else out
    return out.to(G.dtype)


def spectral_lmo_(X: torch.Tensor, regularizer: str, *, b: float, radius: float, p: float | None = None,
                  steps: int | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
    """In-place :func:`spectral_lmo` with the default method: overwrites ``X`` with ``X*`` and returns it.

    On the Gram route (CPU, ``X`` float32/float64 and contiguous) no full-size temporary is allocated: the
    Gram matrix (``min(m, n)^2`` float64, which receives the eigenvectors and then ``W``), LAPACK's ``eigh``
    workspace (``2 min(m, n)^2`` float64) or one ``min(m, n)^2`` product, and blocks of at most ``2^20``
    float64 elements (:mod:`spectrakit.linalg.lmo_gram`). Elsewhere the out-of-place result is
    copied into ``X``. Arguments and errors as :func:`spectral_lmo` (``method``: the default).
    """
    check_tensor(X, "X", min_ndim=2)
    if (default_method(X.device, X.requires_grad) == "gram" and X.dtype in (torch.float32, torch.float64)
            and X.is_contiguous() and X.numel() > 0):
        check_lmo_args(regularizer, b, radius, p, "gram")
        if steps is not None:
            check_int(steps, "steps", low=1, high=100)
        compute_dtype(X, dtype)
        p = None if p is None else float(p)
        gram_map_(X.view(-1, *X.shape[-2:]), lmo_weights(regularizer, float(radius), p), float(b), sign=-1.0)
        return X
    return X.copy_(spectral_lmo(X, regularizer, b=b, radius=radius, p=p, steps=steps, dtype=dtype))
