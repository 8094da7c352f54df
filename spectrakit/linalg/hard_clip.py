"""Hard spectral clipping ``U clip_[lo, hi](S) V^T`` and its special cases (Cesista 2025 §2).

Default route (``method="polar"``), built on two polar factors of matrices no larger than ``X``:

1. ``O = msign(X) = U V^T`` (wide orientation, ``m <= n``, Polar Express with relative lower bound 1e-6);
2. ``A = sym(X O^T) = U S U^T``, the ``m x m`` positive semidefinite "absolute value" of ``X`` (its
   eigenvalues are the singular values themselves, not their squares);
3. ``clip_[lo, hi](A) = max(min(A, hi), lo)`` by projector sandwiches (shared with the eigenvalue functions,
   :func:`~spectrakit.linalg.eig.shifted_sandwich`): ``min(A, t) = t I - (t I - A)_+`` with
   ``(t I - A)_+ = P (t I - A) P`` and the spectral projector ``P = (I + sign(t I - A)) / 2`` onto
   ``{s < t}``, then ``max(., lo)`` the same way with ``R = (I - sign(lo I - A)) / 2``; both eigen-signs are
   one batched polar-factor call on ``m x m`` symmetric matrices (``hardcap`` needs only ``hi``, ``relu``
   only ``lo``);
4. ``spectral_clip(X, lo, hi) = clip_[lo, hi](A) O``."""

# The spread of the eigenvalues of ``t I - A`` grows only linearly with ``s_max / t`` (working with
# ``t^2 I - X X^T`` would square it). In the sandwich ``P (t I - A) P`` a sign error ``E`` costs
# ``E (t I - A) P`` (norm ``<= t``) and ``E (t I - A) E`` (second order), and near the threshold it is
# weighted by ``|s - t|``. The identity form ``(t I - A + (t I - A) sign(t I - A)) / 2`` cost
# ``E (t I - A)`` (norm ``~ s_max``) instead, which grew with ``s_max / t`` (measured at ``s_max / t = 1e3``:
# fp32 3e-4..4e-4 -> 4e-5; bf16 2..7 -> <= 1e-2 together with the bf16 settings below). Step 3 runs on
# ``A / sc`` with ``sc = max(t, ||X||_F)``
# so every term is bounded by 1. A threshold ``hi >= ||X||_F`` returns
# ``X`` itself (no rounding), selected with ``torch.where`` (no host sync). Cost: one ``m x n`` polar factor,
# two ``m x m x n`` products, one batched ``m x m`` sign and two ``m x m`` products per threshold (measured
# 24x cheaper than the dilation at 256x1024 on CPU, with the same or better accuracy).
#
# Singular values below ``~1e-6 s_max`` (including the rounding-level ones of a numerically rank-deficient
# fp32 matrix) are only partly resolved by ``O``: exactly zero singular values (zero rows/columns) stay 0
# (their direction is undefined), tiny ones with ``lo > 0`` are raised only partly, to a value in ``[0, lo]``.
# The ``"exact"`` SVD route maps every one of the ``min(m, n)`` singular values, zeros included, into
# ``[lo, hi]``.
#
# Far beyond the specified range the fp32 error stays small: measured at 64x192 for ``s_max / t`` = 1e3, 1e4,
# 1e5, 1e6, 1e8: Gaussian 3.6e-6 .. 4.2e-5, a 1e3 spike 2e-5 .. 4e-5, a spectrum over 6 decades 3.7e-5, 2.3e-4,
# 1.3e-3, 4.2e-3, 4.2e-3 (the dilation: 7e-4 .. 7e-2). The output stays finite for any threshold.
#
# ``method="dilation"``: Higham's trick. With ``H = [[I, X/t], [X^T/t, I]]`` (eigenvalues ``1 +- s_i / t``
# and 1), ``msign(H) = [[P, Q], [Q^T, R]]`` has ``P = sum_{s_i < t} u_i u_i^T`` and
# ``Q = sum_{s_i > t} u_i v_i^T``, so ``hardcap_t(X) = t Q + P X``; ``spectral_clip = hardcap_hi + lo msign -
# hardcap_lo``. One ``(m + n)``-sized polar factor: 20-40x the cost, and ``P X`` carries a first-order sign
# error ``~ l s_max``, so it is less accurate than the default for ``s_max / t >~ 1e3``.
#
# ``method="nested"``: ``hardcap_t(X) = (t O + X - (t O - X) msign(t O - X)^T O) / 2`` with ``O = msign(X)``,
# two sequential ``m x n`` polar factors, numerically unstable when ``s_max / t`` is large (it fails from ~100
# in bf16): documented, not default.
#
# bf16 (``dtype=torch.bfloat16``): the sign iterations run in fp32 until their tracked lower bound reaches
# ``polar.CLIP_BF16_SWITCH`` (7 of 12 steps), the rest in bf16, and the eigen-signs are symmetrised: relative error
# <= 1e-2 measured for ``s_max / t`` from 1e-2 to 1e3 (Gaussian, 1e3 spike, 6-decade spectrum). With fewer
# fp32 steps the bf16 steps rotate the singular vectors of ``O`` and of the signs (their sizes are restored
# by the later steps, the directions are not), which the clip inherits.

from __future__ import annotations

import torch

from spectrakit._checks import check_choice, check_int, check_tensor, value_checks_enabled

from ._util import compute_dtype, frob, from_unit, grad_div, mT, pow2_scale, threshold, tiny_for, to_unit
from .eig import auto_passes, check_passes, clip_sym
from .polar import clip_sign, to_wide

METHODS = ("polar", "dilation", "nested", "exact")


def _exact(w: torch.Tensor, lo, hi) -> torch.Tensor:
    u, s, vh = torch.linalg.svd(w.double(), full_matrices=False)
    lo64 = lo.double()[..., 0] if isinstance(lo, torch.Tensor) else lo
    hi64 = hi.double()[..., 0] if isinstance(hi, torch.Tensor) else hi
    s = s.clamp_min(lo64) if not isinstance(lo64, torch.Tensor) else torch.maximum(s, lo64)
    s = s.clamp_max(hi64) if not isinstance(hi64, torch.Tensor) else torch.minimum(s, hi64)
    return ((u * s[..., None, :]) @ vh).to(w.dtype)


def _hardcap_dilation(w: torch.Tensor, ts: torch.Tensor, cdt: torch.dtype, steps: int | None) -> torch.Tensor:
    """``hardcap_t(w) = t Q + P w`` for a stack of thresholds ``ts`` (k, ..., 1, 1) -> (k, ..., m, n).

    ``P, Q`` are blocks of the eigen-sign of the dense dilation ``H = [[I, w/t], [w^T/t, I]]``. (A block-wise
    iteration on ``(P, Q)`` alone via the push-through identity is 3-10x cheaper but was measured to be
    numerically unstable: rounding errors grow ~5x per step, so it is not used.)
    """
    m, n = w.shape[-2:]
    work = torch.float32 if cdt == torch.bfloat16 else cdt
    wk = w.to(work)
    tw = ts.to(work)
    # msign(H) = msign(H t / s) for s > 0: build H t / s = [[(t/s) I, W/s], [W^T/s, (t/s) I]] with
    # s = max(t, max|W|), so no entry exceeds 1 (W / t overflowed to inf for t/max|W| < ~1e-38 in fp32,
    # e.g. a threshold that underflows to 0 in the compute dtype)
    sc = torch.maximum(tw, wk.abs().amax(dim=(-2, -1), keepdim=True)).clamp_min(tiny_for(work))
    k = wk / sc
    d = tw / sc
    eye_m = d * torch.eye(m, dtype=work, device=w.device)
    eye_n = d * torch.eye(n, dtype=work, device=w.device)
    shape = torch.broadcast_shapes(k.shape[:-2], eye_m.shape[:-2])
    k = k.expand(*shape, m, n)
    h = torch.cat([torch.cat([eye_m.expand(*shape, m, m), k], -1),
                   torch.cat([mT(k), eye_n.expand(*shape, n, n)], -1)], -2)
    s = clip_sign(h, cdt, steps)
    p, q = s[..., :m, :m], s[..., :m, m:]
    p = (p + mT(p)) / 2
    return ts.to(work) * q + p @ wk


def _clip_abs(xw: torch.Tensor, lo: torch.Tensor | None, hi: torch.Tensor | None, cdt: torch.dtype,
              steps: int | None, passes: int | None = None) -> torch.Tensor:
    """``clip_[lo, hi](A) O`` with ``O = msign(xw)``, ``A = sym(xw O^T)`` (module docstring, default route).

    ``xw``: wide ``(..., m, n)`` in the work dtype; ``lo``/``hi``: thresholds ``(..., 1, 1)`` in the work
    dtype (``lo > 0``, ``hi > 0``) or None for "no clip on that side".
    """
    # scale-free: work on xw / (s f) (s a power of two near max|xw|, f = ||xw / s||_F <= 2 sqrt(m n)) and on the
    # thresholds / s / f, undo at the end; nothing overflows for entries up to the dtype's largest value
    s = pow2_scale(xw)
    x1 = to_unit(xw, s)  # (gradients: to_unit/from_unit skip the factors 1/s and s, whose product is 1)
    f = frob(x1).clamp_min(torch.finfo(xw.dtype).tiny)
    lo1 = None if lo is None else to_unit(lo, s)  # inf when lo / s overflows (subnormal input, lo ~ 1)
    hi1 = None if hi is None else to_unit(hi, s)
    xs = x1 / f
    o = clip_sign(xs, cdt, steps)
    a = xs @ mT(o)
    a = (a + mT(a)) / 2
    # a lo at or above the spectrum bound f maps every singular value to lo: lo O (below); the clip itself
    # then gets lo = f (finite, the same result up to the where)
    lo_c = None if lo is None else torch.minimum(lo1, f) / f
    passes = auto_passes(passes, f, (lo1, hi1), xw.dtype)
    c = clip_sym(a, lo_c, None if hi is None else hi1 / f, cdt, steps, passes, psd=True)
    out = from_unit((c @ o) * f, s)  # in this order: f s = ||xw||_F may overflow
    if lo is not None:
        out = torch.where(lo1 >= f, lo * grad_div(o, s), out)
    if hi is not None:                   # hi above an upper bound of s_max: exactly the identity
        keep = hi1 >= f
        if lo is not None:
            keep = keep & (lo <= 0)
        out = torch.where(keep, xw, out)
    return out


def _as_work(t, work: torch.dtype, device) -> torch.Tensor:
    """A threshold (float or ``(..., 1, 1)`` tensor) as a tensor in the work dtype, capped at the dtype's
    largest value (a larger threshold exceeds ``sigma_max`` anyway and must not overflow to inf)."""
    big = torch.finfo(work).max
    if isinstance(t, torch.Tensor):
        return t.to(work).clamp_max(big)
    return torch.full((1, 1), min(t, big), dtype=work, device=device)


def _hardcap_nested(w: torch.Tensor, t, cdt: torch.dtype, steps: int | None) -> torch.Tensor:
    x = w.to(torch.float32 if cdt == torch.bfloat16 else cdt)
    o = clip_sign(x, cdt, steps)
    d = t * o - x
    return (t * o + x - d @ mT(clip_sign(d, cdt, steps)) @ o) / 2


def spectral_clip(X: torch.Tensor, lo=0.0, hi=float("inf"), *, method: str = "polar",
                  steps: int | None = None, dtype: torch.dtype | None = None,
                  passes: int | None = None) -> torch.Tensor:
    """Hard spectral clip ``U clip_[lo, hi](S) V^T`` of ``X = U S V^T`` (Cesista 2025 §2).

    ``method="polar"`` (default): ``clip_[lo, hi](A) O`` with ``O = msign(X)`` and ``A = sym(X O^T) = U S U^T``,
    the clip of the ``m x m`` matrix ``A`` from its eigen-signs ``sign(t I - A)`` (module docstring);
    relative Frobenius error <= 1e-3 in fp32 for ``s_max / hi`` in [1e-2, 1e4] (bf16: <= 3e-2 up to 1e3, see
    the module docstring). ``"dilation"``: <= 1e-3 up to 1e3 from the eigen-sign of ``[[I, X/t], [X^T/t, I]]``
    (20-40x the cost). ``"nested"``: the
    nested-msign hardcap (unstable for large ``s_max / t``). ``"exact"``: float64 SVD.
    Rank-deficient input with ``lo > 0``: the polar route keeps exactly zero singular values at 0.
    Scale-invariant (works on ``X / ||X||_F`` and thresholds ``/ ||X||_F``, see ``eig.clip_sym``): tested for
    input scales 1e-30..1e30 and ``hi`` 1e-8..1e8 times ``sigma_max``; the output never exceeds ``hi`` by more
    than 1e-3 relative for ``sigma_max / hi`` up to ~1e20 in fp32; gradients are finite at the zero matrix and
    at repeated singular values (subgradient 0 of the normalisation at 0).

    Args:
        X: ``(..., m, n)`` floating tensor, finite.
        lo: lower threshold >= 0 (float, or tensor broadcastable to the batch shape ``X.shape[:-2]``).
        hi: upper threshold > 0 and >= lo; ``float("inf")`` (default) means no upper clip. Tensor
            thresholds must be finite.
        method: "polar", "dilation", "nested" or "exact".
        steps: sign iterations (1..100); default: enough for the dtype's accuracy at lower bound 1e-6.
        dtype: compute dtype (bf16 runs the first sign steps in fp32, see the module docstring); output has
            X's dtype.
        passes: refinement passes of the polar route (1..16; see :func:`~spectrakit.linalg.eig_clip`):
            3 hold the cap to 1e-3 for ``sigma_max / hi`` up to ~1e20 in fp32, 5 up to ~1e35, 6 up to 1e38.
            Default (None): from the spread ``||X||_F / hi`` when value checks are on (one scalar read beside
            the finiteness check), 3 with value checks off (no host sync).

    Raises:
        TypeError: X not a floating tensor, thresholds not numbers/tensors.
        ValueError: non-finite X, lo < 0, hi <= 0, lo > hi, tensor thresholds not broadcastable to the
            batch shape, unknown method, steps or passes out of range.
    """
    check_tensor(X, "X", min_ndim=2)
    check_choice(method, "method", METHODS)
    passes = check_passes(passes)
    if steps is not None:
        check_int(steps, "steps", low=1, high=100)
    cdt = compute_dtype(X, dtype)
    lo_t = threshold(lo, "lo", X, torch.float64 if method == "exact" else cdt, low=0.0)
    hi_t = threshold(hi, "hi", X, torch.float64 if method == "exact" else cdt, low=0.0, low_inclusive=False,
                     allow_inf=True)
    if isinstance(lo_t, float) and isinstance(hi_t, float):
        if lo_t > hi_t:
            raise ValueError(f"lo must be <= hi, got lo={lo_t}, hi={hi_t}")
    elif value_checks_enabled() and bool((torch.as_tensor(lo_t) > torch.as_tensor(hi_t)).any()):
        raise ValueError("lo must be <= hi elementwise")
    if X.numel() == 0:  # an empty matrix (a zero dimension) maps to itself
        return X.clone()
    if method == "exact":
        return _exact(X, lo_t, hi_t)
    no_lo = isinstance(lo_t, float) and lo_t == 0.0
    no_hi = isinstance(hi_t, float) and hi_t == float("inf")
    if no_lo and no_hi:
        return X.clone()
    x, transposed = to_wide(X)
    work = torch.float32 if cdt == torch.bfloat16 else cdt
    xw = x.to(work)
    if method == "nested":
        out = xw
        if not no_hi:
            out = _hardcap_nested(x, hi_t, cdt, steps)
        if not no_lo:
            o = clip_sign(xw, cdt, steps)
            out = out + lo_t * o - _hardcap_nested(x, lo_t, cdt, steps)
    elif method == "polar":
        lo_w = None if no_lo else _as_work(lo_t, work, x.device)
        hi_w = None if no_hi else _as_work(hi_t, work, x.device)
        out = _clip_abs(xw, lo_w, hi_w, cdt, steps, passes)
    else:
        ts, signs = [], []
        if not no_hi:
            ts.append(hi_t.to(work) if isinstance(hi_t, torch.Tensor)
                      else torch.full((1, 1), hi_t, dtype=work, device=x.device))
            signs.append(1.0)
        if not no_lo:
            lo_w = lo_t.to(work) if isinstance(lo_t, torch.Tensor) else torch.full((1, 1), lo_t, dtype=work,
                                                                                   device=x.device)
            ts.append(torch.where(lo_w > 0, lo_w, torch.ones_like(lo_w)))  # lo = 0 entries: hardcap_0 = 0
            signs.append(-1.0)
        shape = torch.broadcast_shapes(*(t.shape for t in ts), (*x.shape[:-2], 1, 1))
        stack = torch.stack([t.expand(shape) for t in ts])  # (k, ..., 1, 1)
        caps = _hardcap_dilation(xw, stack, cdt, steps)  # (k, ..., m, n)
        out = xw if no_hi else caps[0]
        if not no_lo:
            cap_lo = caps[-1] * (lo_w > 0)
            out = out + lo_w * clip_sign(xw, cdt, steps) - cap_lo
    out = mT(out) if transposed else out
    return out.to(X.dtype)


def spectral_hardcap(X: torch.Tensor, hi, *, method: str = "polar", steps: int | None = None,
                     dtype: torch.dtype | None = None, passes: int | None = None) -> torch.Tensor:
    """``U min(S, hi) V^T`` = ``spectral_clip(X, 0, hi)``; same arguments/errors, hi > 0 finite
    or inf (identity)."""
    return spectral_clip(X, 0.0, hi, method=method, steps=steps, dtype=dtype, passes=passes)


def spectral_relu(X: torch.Tensor, lo, *, method: str = "polar", steps: int | None = None,
                  dtype: torch.dtype | None = None, passes: int | None = None) -> torch.Tensor:
    """``U max(S, lo) V^T`` = ``spectral_clip(X, lo, inf)``; lo >= 0. Exactly zero singular
    values stay 0 on the polar route (see :func:`spectral_clip`)."""
    return spectral_clip(X, lo, float("inf"), method=method, steps=steps, dtype=dtype, passes=passes)
