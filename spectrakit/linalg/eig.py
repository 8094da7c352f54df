"""Eigenvalue functions of symmetric matrices through the eigen-sign ``msign`` (Cesista 2025 §2).

For symmetric ``W = Q diag(lambda) Q^T``, ``msign(W) = Q sign(diag(lambda)) Q^T`` (the polar factor of a
symmetric matrix is its eigen-sign), and the scalar identity
``clip_[a, b](x) = (a + b + (a - x) sign(a - x) - (b - x) sign(b - x)) / 2`` lifts to matrices:

- ``eig_clip(W, lo, hi) = ((lo + hi) I + (lo I - W) msign(lo I - W) - (hi I - W) msign(hi I - W)) / 2``
- ``eig_relu(W, lo) = (lo I + W + (lo I - W) msign(lo I - W)) / 2``, ``proj_psd(W) = (W + W msign(W)) / 2``
- ``eig_hardcap(W, hi) = (hi I + W - (hi I - W) msign(hi I - W)) / 2``, ``proj_nsd(W) = (W - W msign(W)) / 2``
- ``eig_stepfun(W, t) = (I + msign(W - t I)) / 2`` (projector onto eigenvectors with eigenvalue > t)"""

# Inputs and outputs are symmetrised with ``sym(A) = (A + A^T) / 2``. The sign is a Polar Express
# iteration with relative lower bound 1e-6. The clips are evaluated in the shifted-sandwich form
# ``max(W, t) = t I + R (W - t I) R`` with ``R = (I - msign(t I - W)) / 2`` (the projector onto the
# eigenvalues above ``t``), ``min(W, t) = t I + P (W - t I) P`` with ``P = (I + msign(t I - W)) / 2``, and
# ``eig_clip = max(min(W, hi), lo)`` as two such steps. A sign error ``E`` then costs ``E (W - t I) R`` (the
# kept part only) and ``E (W - t I) E`` (second order), instead of ``(t I - W) E / 2`` in the identity above:
# eigenvalues far beyond the threshold (``|lambda| >> |t|``, e.g. a cluster at 1e3 capped at 1) no longer
# cost ``~ eps |lambda|`` (measured, fp32: 2.1e-3 -> 5.3e-5 for ``eig_clip`` of a spectrum over +-[1e-3, 1e3];
# bf16: 6.2 -> 3.6e-3 for ``eig_hardcap`` of a 1e3 cluster at 0). bf16 also needs the sign's eigenvectors:
# its steps stay in fp32 until the tracked lower bound reaches ``polar.CLIP_BF16_SWITCH``, and the signs are
# symmetrised (a skew error is a rotation that the sandwich would carry to first order); on a linear
# spectrum in [-1, 1] bf16 errors went from 8e-3 to 4e-3, fp32 stays ~1e-6.
# Near ``t`` the error stays weighted by ``|lambda - t|``; ``eig_stepfun`` is discontinuous,
# so eigenvalues within ``~1e-6 ||W - t I||`` of ``t`` get a value between 0 and 1 (exactly 1/2 at ``t``).
# ``method="exact"`` uses a float64 ``torch.linalg.eigh`` (it synchronises on CUDA).

from __future__ import annotations

import math

import torch

from spectrakit._checks import check_choice, check_int, check_tensor, value_checks_enabled

from ._util import compute_dtype, frob, from_unit, mT, pow2_scale, sym_part, threshold, to_unit
from .polar import clip_sign

METHODS = ("polar", "exact")


def sym(W: torch.Tensor) -> torch.Tensor:
    """``sym(W) = (W + W^T) / 2`` over the last two dims (Cesista 2025 §2).

    Raises:
        TypeError: W not a floating tensor. ValueError: W not square / fewer than 2 dims.
    """
    check_tensor(W, "W", min_ndim=2, square=True, finite=False)
    return sym_part(W)


def _prep(W, name_method, method, steps):
    check_tensor(W, "W", min_ndim=2, square=True)
    check_choice(method, "method", METHODS)
    if steps is not None:
        check_int(steps, "steps", low=1, high=100)


def _eigfun_exact(W: torch.Tensor, fn) -> torch.Tensor:
    w64 = W.double()
    w64 = (w64 + mT(w64)) / 2
    lam, q = torch.linalg.eigh(w64)
    f = fn(lam)
    out = (q * f[..., None, :]) @ mT(q)
    return ((out + mT(out)) / 2).to(W.dtype)


def _t64(v):
    return v.double()[..., 0] if isinstance(v, torch.Tensor) else v


def shifted_sandwich(w: torch.Tensor, t_eye: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """``t I + R (W - t I) R`` for a spectral projector ``R`` of symmetric ``W`` (module docstring): ``min(W, t)``
    with ``R = (I + sign(t I - W)) / 2``, ``max(W, t)`` with ``R = (I - sign(t I - W)) / 2``. Also the clip
    step of the hard clips (on ``A = sym(X O^T)``)."""
    return t_eye + r @ (w - t_eye) @ r


def eigen_signs(mats: list[torch.Tensor], cdt: torch.dtype, steps: int | None) -> list[torch.Tensor]:
    """Eigen-signs of symmetric matrices (broadcast to one shape) in one batched :func:`~.polar.clip_sign` call."""
    shape = torch.broadcast_shapes(*(m.shape for m in mats))
    stack = torch.stack([m.expand(shape) for m in mats])
    return list(clip_sign(stack, cdt, steps, symmetric=True).unbind(0))


# Refinement passes of :func:`clip_sym`. Measured (fp32, 16x16, eigenvalues in [-k, k], clip to [-1, 1]): one
# pass exceeds the cap by ~4e-8 k relative, and each further pass, rescaled to the capped spectrum, divides the
# excess by ~2.5e7 again: largest spectral norm 3.9 / 1.0000006 / 1.0000006 at k = 1e8 for 1 / 2 / 3 passes,
# 2.4e4 / 1.0006 / 1.0000005 at 1e12, 2.3e12 / 5.1e4 / 1.0003 at 1e20. Three passes: <= 1e-3 up to ~1e20.
CLIP_PASSES = 3
MAX_PASSES = 16


def check_passes(passes) -> int | None:
    """``passes`` of the clips: None (chosen by :func:`auto_passes`) or an int in [1, MAX_PASSES]
    (``ValueError``)."""
    if passes is None:
        return None
    check_int(passes, "passes", low=1, high=MAX_PASSES)
    return int(passes)


def passes_for(ratio: float, dtype: torch.dtype) -> int:
    """Refinement passes that hold a cap to 1e-3 for a spread ``ratio = ||W||_F / |t|`` (fp32 measurements in
    :data:`CLIP_PASSES`' comment: 3 up to 1e20, 4 up to 1e25, 5 up to 1e35, 6 to fp32's end; float64 gains
    ~1e16 per pass instead of ~2.5e7)."""
    if not ratio > 1e20:  # (nan: no finite nonzero threshold)
        return CLIP_PASSES
    if dtype == torch.float64:
        return min(MAX_PASSES, CLIP_PASSES + max(0, math.ceil((math.log10(ratio) - 40) / 15)))
    return 4 if ratio <= 1e25 else 5 if ratio <= 1e35 else 6


def auto_passes(passes: int | None, f: torch.Tensor, thresholds, dtype: torch.dtype) -> int:
    """``passes`` if given; else, when value checks are on (the call already synchronises for them), the count
    of :func:`passes_for` for the largest spread ``f / |t|`` over the batch and the finite nonzero
    thresholds (one scalar read); with value checks off (hot paths: no host sync) :data:`CLIP_PASSES`."""
    if passes is not None:
        return passes
    if not value_checks_enabled():
        return CLIP_PASSES
    worst = None
    for t in thresholds:
        if t is None:
            continue
        a = t.abs()
        r = torch.where((a > 0) & torch.isfinite(a), f / a, torch.zeros_like(f + a))
        worst = r.amax() if worst is None else torch.maximum(worst, r.amax())
    return CLIP_PASSES if worst is None else passes_for(float(worst.detach()), dtype)


def clip_sym(w: torch.Tensor, lo, hi, cdt: torch.dtype, steps: int | None, passes: int = CLIP_PASSES,
             psd: bool = False) -> torch.Tensor:
    """``Q clip_[lo, hi](Lambda) Q^T`` of symmetric ``w`` (work dtype), scale-invariant and sync-free.

    ``lo``/``hi``: None (no clip on that side) or tensors ``(..., 1, 1)`` in w's dtype (``-inf``/``+inf`` allowed).
    Each pass scales by ``sc = max(||w||_F, |lo'|, |hi'|)`` with the thresholds first moved onto the spectrum
    bound ``F = ||w||_F >= |lambda|`` (``hi' = min(hi, F)``, ``lo' = max(lo, -F)``: the same clip), so every
    term of the sandwich is <= 1 in magnitude whatever the input's scale (subnormal to ~1e38 in fp32); a pass
    whose thresholds lie beyond the spectrum (``hi >= F``, ``lo <= -F``) returns its input exactly
    (``torch.where``, no host sync). A sign error ``delta`` leaves ``~delta^2 lambda_max`` above the cap (second
    order in the sandwich, but first order near the thresholds; ~4e-8 relative per unit of ratio in fp32); the
    next pass, rescaled to the new, capped spectrum, removes most of it: with ``passes=3`` (default) the cap
    is exceeded by <= 1e-3 relative for ratios ``lambda_max / |t|`` up to ~1e20 (``CLIP_PASSES``).

    ``psd=True`` (``w`` positive semidefinite up to rounding, ``lo`` None: the hard clips' ``A = sym(X O^T)``)
    also clips at 0 from the second pass on (in the only pass when ``passes == 1``): ``min(w, hi)`` keeps the
    rounding-level negative eigenvalues of ``w`` (``~ -eps ||w||``, e.g. in the null space of a rank-deficient
    ``X``), which exceed a cap ``hi << eps ||w||`` in magnitude; the first pass shrinks the scale to ``~hi``, so
    the later ones resolve their signs.
    """
    eye = torch.eye(w.shape[-1], dtype=w.dtype, device=w.device)
    floor = torch.finfo(w.dtype).tiny
    out = w
    hi_only = lo
    for k in range(passes):
        if psd and hi_only is None and (k > 0 or passes == 1):
            lo = torch.zeros((1, 1), dtype=w.dtype, device=w.device)
        f = frob(out).clamp_min(floor)
        hi_e = None if hi is None else torch.minimum(hi, f)
        lo_e = None if lo is None else torch.maximum(lo, -f)
        sc = f
        for t in (lo_e, hi_e):
            if t is not None:
                sc = torch.maximum(sc, t.abs())
        a = out / sc
        t_eyes = [(t / sc) * eye for t in (lo_e, hi_e) if t is not None]
        signs = eigen_signs([t - a for t in t_eyes], cdt, steps)
        c = a
        if hi is not None:   # min(W, hi): R = (I + sign(hi I - W)) / 2 projects onto {lambda < hi}
            c = shifted_sandwich(c, t_eyes[-1], (eye + signs[-1]) / 2)
        if lo is not None:   # max(., lo): R = (I - sign(lo I - W)) / 2 projects onto {lambda > lo}
            c = shifted_sandwich(c, t_eyes[0], (eye - signs[0]) / 2)
        c = (c + mT(c)) * (sc / 2)
        keep = None
        if hi is not None:
            keep = hi >= f
        if lo is not None and not (psd and hi_only is None):
            keep = (lo <= -f) if keep is None else keep & (lo <= -f)
        out = torch.where(keep, out, c)
    return out


def clip_scaled(w: torch.Tensor, lo, hi, cdt: torch.dtype, steps: int | None, passes: int | None,
                ) -> torch.Tensor:
    """:func:`clip_sym` of ``sym(w) / s`` with thresholds ``/ s`` (``s``: a power of two near ``max|w|``, exact), times
    ``s``: no norm of ``w`` overflows (entries up to the dtype's largest value) and subnormal entries are
    normal numbers. A threshold beyond the far end of the spectrum (``lo >= ||w||_F``, or ``hi <= -||w||_F``,
    including those whose ratio to ``s`` overflows) gives ``t I`` exactly; inside the clip it is moved onto
    the spectrum bound (the same result, kept finite)."""
    s = pow2_scale(w)
    w1 = sym_part(to_unit(w, s))  # (gradients: to_unit/from_unit skip the factors 1/s and s, product 1)
    f1 = frob(w1)
    eye = torch.eye(w.shape[-1], dtype=w.dtype, device=w.device)
    lo1 = None if lo is None else to_unit(lo, s)
    hi1 = None if hi is None else to_unit(hi, s)
    passes = auto_passes(passes, f1, (lo1, hi1), w.dtype)
    c = from_unit(clip_sym(w1, None if lo is None else torch.minimum(lo1, f1),
                           None if hi is None else torch.maximum(hi1, -f1), cdt, steps, passes), s)
    if lo is not None:
        c = torch.where(lo1 >= f1, lo * eye, c)
    if hi is not None:
        c = torch.where(hi1 <= -f1, hi * eye, c)
    return c


def _thr_work(v, w: torch.Tensor) -> torch.Tensor:
    """A validated threshold (float or ``(..., 1, 1)`` tensor) as a tensor in w's dtype."""
    if isinstance(v, torch.Tensor):
        return v.to(w.dtype)
    return torch.full((1, 1), float(v), dtype=w.dtype, device=w.device)


def _work(W: torch.Tensor, cdt: torch.dtype):
    work = torch.float32 if cdt == torch.bfloat16 else cdt
    # not yet symmetrised: the callers symmetrise after their power-of-two scaling (exact then; halving a
    # subnormal sum is not)
    return W.to(work), torch.eye(W.shape[-1], dtype=work, device=W.device)


def _check_order(lo, hi):
    if isinstance(lo, float) and isinstance(hi, float):
        if lo > hi:
            raise ValueError(f"lo must be <= hi, got lo={lo}, hi={hi}")
    elif value_checks_enabled() and bool((torch.as_tensor(lo) > torch.as_tensor(hi)).any()):
        raise ValueError("lo must be <= hi elementwise")


def eig_clip(W: torch.Tensor, lo, hi, *, method: str = "polar", steps: int | None = None,
             dtype: torch.dtype | None = None, passes: int | None = None) -> torch.Tensor:
    """Eigenvalue clip ``Q clip_[lo, hi](Lambda) Q^T`` of symmetric ``W`` (Cesista 2025 §2.1).

    ``= ((lo + hi) I + (lo I - W) msign(lo I - W) - (hi I - W) msign(hi I - W)) / 2`` (both signs in one
    batched call), computed as ``max(min(W, hi), lo)`` in the shifted-sandwich form of the module docstring;
    relative error <= 1e-3 in fp32. Scale-invariant (:func:`clip_sym`): tested for input scales 1e-30..1e30 and
    thresholds 1e-8..1e8 times the spectrum; thresholds beyond the spectrum return ``W`` exactly; the caps
    hold to 1e-3 relative up to a ratio ``lambda_max / |t|`` of ~1e20 (one-sided functions: to
    ``1e-3 |t| + 1e-6 ||W||_F``); a band narrower than ~1e-6 ``||W||`` keeps only the caps. Gradients are finite
    (zero and repeated eigenvalues).

    Args:
        W: ``(..., n, n)`` floating tensor (symmetrised first), finite.
        lo, hi: finite thresholds with lo <= hi; floats or tensors broadcastable to ``W.shape[:-2]``.
        method: "polar" or "exact" (float64 eigh). steps: sign iterations (1..100), default by dtype.
        passes: refinement passes of the polar route (1..16). Each pass divides the excess over a cap by
            ~2.5e7 in fp32: 3 passes hold the caps to 1e-3 for ratios ``lambda_max / |t|`` up to ~1e20, 5 up
            to ~1e35, 6 over fp32's whole exponent range (1e38); each pass costs one more ``n x n``
            eigen-sign. Default (None): chosen from the spread ``||W||_F / |t|`` (:func:`passes_for`) when
            value checks are on (one scalar read beside the finiteness check), :data:`CLIP_PASSES` = 3 with
            value checks off (no host sync).
        dtype: compute dtype (bf16: the sign steps run in fp32 until the tracked lower bound reaches
            ``polar.CLIP_BF16_SWITCH``); output has W's dtype.

    Raises:
        TypeError: W not floating / thresholds not numbers. ValueError: W not square or non-finite,
        thresholds non-finite or not broadcastable, lo > hi, unknown method, steps out of range.
    """
    _prep(W, "W", method, steps)
    passes = check_passes(passes)
    cdt = compute_dtype(W, dtype)
    lo_t = threshold(lo, "lo", W, torch.float64 if method == "exact" else cdt)
    hi_t = threshold(hi, "hi", W, torch.float64 if method == "exact" else cdt)
    _check_order(lo_t, hi_t)
    if method == "exact":
        lo64, hi64 = _t64(lo_t), _t64(hi_t)
        def clip(lam):
            lo_l = torch.as_tensor(lo64, dtype=lam.dtype, device=lam.device)
            hi_l = torch.as_tensor(hi64, dtype=lam.dtype, device=lam.device)
            return torch.minimum(torch.maximum(lam, lo_l), hi_l)

        return _eigfun_exact(W, clip)
    if W.numel() == 0:  # an empty matrix maps to itself
        return W.clone()
    w, _ = _work(W, cdt)
    return clip_scaled(w, _thr_work(lo_t, w), _thr_work(hi_t, w), cdt, steps, passes).to(W.dtype)


def _one_sided(W: torch.Tensor, t, name: str, side: int, method: str, steps, dtype, passes=None) -> torch.Tensor:
    """``(t I + W + side (t I - W) msign(t I - W)) / 2``: ``Q max(Lambda, t) Q^T`` for ``side = +1``,
    ``Q min(Lambda, t) Q^T`` for ``side = -1`` (one eigen-sign; the exact path applies max/min to ``eigh``)."""
    _prep(W, "W", method, steps)
    passes = check_passes(passes)
    cdt = compute_dtype(W, dtype)
    t_t = threshold(t, name, W, torch.float64 if method == "exact" else cdt)
    if method == "exact":
        t64 = _t64(t_t)
        pick = torch.maximum if side > 0 else torch.minimum
        return _eigfun_exact(W, lambda lam: pick(lam, torch.as_tensor(t64, dtype=lam.dtype, device=lam.device)))
    if W.numel() == 0:  # an empty matrix maps to itself
        return W.clone()
    w, _ = _work(W, cdt)
    t_w = _thr_work(t_t, w)
    lo, hi = (t_w, None) if side > 0 else (None, t_w)
    return clip_scaled(w, lo, hi, cdt, steps, passes).to(W.dtype)


def eig_relu(W: torch.Tensor, lo, *, method: str = "polar", steps: int | None = None,
             dtype: torch.dtype | None = None, passes: int | None = None) -> torch.Tensor:
    """``Q max(Lambda, lo) Q^T = (lo I + W + (lo I - W) msign(lo I - W)) / 2`` (Cesista 2025 §2.2),
    computed as ``lo I + R (W - lo I) R`` with ``R = (I - msign(lo I - W)) / 2`` (module docstring).

    Arguments and errors as :func:`eig_clip` (``lo`` finite, float or batch-broadcastable tensor).
    """
    return _one_sided(W, lo, "lo", +1, method, steps, dtype, passes)


def eig_hardcap(W: torch.Tensor, hi, *, method: str = "polar", steps: int | None = None,
                dtype: torch.dtype | None = None, passes: int | None = None) -> torch.Tensor:
    """``Q min(Lambda, hi) Q^T = (hi I + W - (hi I - W) msign(hi I - W)) / 2`` (Cesista 2025 §2.3),
    computed as ``hi I + P (W - hi I) P`` with ``P = (I + msign(hi I - W)) / 2`` (module docstring).

    Arguments and errors as :func:`eig_clip` (``hi`` finite, float or batch-broadcastable tensor).
    """
    return _one_sided(W, hi, "hi", -1, method, steps, dtype, passes)


def proj_psd(W: torch.Tensor, *, method: str = "polar", steps: int | None = None,
             dtype: torch.dtype | None = None) -> torch.Tensor:
    """Projection onto the PSD cone ``(W + W msign(W)) / 2 = Q max(Lambda, 0) Q^T`` (Cesista 2025 §2.2)."""
    return eig_relu(W, 0.0, method=method, steps=steps, dtype=dtype)


def proj_nsd(W: torch.Tensor, *, method: str = "polar", steps: int | None = None,
             dtype: torch.dtype | None = None) -> torch.Tensor:
    """Projection onto the NSD cone ``(W - W msign(W)) / 2 = Q min(Lambda, 0) Q^T`` (Cesista 2025 §2.3)."""
    return eig_hardcap(W, 0.0, method=method, steps=steps, dtype=dtype)


def eig_stepfun(W: torch.Tensor, t=0.0, *, method: str = "polar", steps: int | None = None,
                dtype: torch.dtype | None = None) -> torch.Tensor:
    """``(I + msign(W - t I)) / 2 = Q step_t(Lambda) Q^T`` with ``step_t(x) = [x > t]`` (Cesista 2025 §2.4).

    The projector onto the eigenvectors with eigenvalue > t. Eigenvalues equal to ``t`` give 1/2 (the sign
    of 0 is 0; ``"exact"`` uses the same convention); eigenvalues within ``~1e-6 ||W - t I||`` of ``t`` get
    values in (0, 1) on the polar route. Arguments and errors as :func:`eig_clip`.
    """
    _prep(W, "W", method, steps)
    cdt = compute_dtype(W, dtype)
    t_t = threshold(t, "t", W, torch.float64 if method == "exact" else cdt)
    if method == "exact":
        t64 = _t64(t_t)
        return _eigfun_exact(W, lambda lam: (1 + torch.sign(lam - t64)) / 2)
    if W.numel() == 0:  # an empty matrix maps to itself
        return W.clone()
    w, eye = _work(W, cdt)
    # sign(W - t I) = sign(W / s - (t / s) I) for a power of two s near max|W| (exact): no overflow of W - t I
    # or of its norms; t / s is moved to within twice the spectrum bound (+1 for the zero matrix), where the
    # sign is already +-I
    sc = pow2_scale(w)
    w1 = sym_part(w / sc)
    bound = 2 * frob(w1) + 1
    t1 = torch.maximum(torch.minimum(_thr_work(t_t, w) / sc, bound), -bound)
    (s,) = eigen_signs([w1 - t1 * eye], cdt, steps)
    out = (eye + s) / 2
    return ((out + mT(out)) / 2).to(W.dtype)
