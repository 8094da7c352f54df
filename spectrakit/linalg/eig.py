"""Eigenvalue functions of symmetric matrices through the eigen-sign ``msign`` (SPEC §1.4, seed 002 §2).

For symmetric ``W = Q diag(lambda) Q^T``, ``msign(W) = Q sign(diag(lambda)) Q^T`` (the polar factor of a
symmetric matrix is its eigen-sign), and the scalar identity
``clip_[a, b](x) = (a + b + (a - x) sign(a - x) - (b - x) sign(b - x)) / 2`` lifts to matrices:

- ``eig_clip(W, lo, hi) = ((lo + hi) I + (lo I - W) msign(lo I - W) - (hi I - W) msign(hi I - W)) / 2``
- ``eig_relu(W, lo) = (lo I + W + (lo I - W) msign(lo I - W)) / 2``, ``proj_psd(W) = (W + W msign(W)) / 2``
- ``eig_hardcap(W, hi) = (hi I + W - (hi I - W) msign(hi I - W)) / 2``, ``proj_nsd(W) = (W - W msign(W)) / 2``
- ``eig_stepfun(W, t) = (I + msign(W - t I)) / 2`` (projector onto eigenvectors with eigenvalue > t)

Inputs and outputs are symmetrised with ``sym(A) = (A + A^T) / 2``. The sign is a Polar Express
iteration with relative lower bound 1e-6. The clips are evaluated in the shifted-sandwich form
``max(W, t) = t I + R (W - t I) R`` with ``R = (I - msign(t I - W)) / 2`` (the projector onto the
eigenvalues above ``t``), ``min(W, t) = t I + P (W - t I) P`` with ``P = (I + msign(t I - W)) / 2``, and
``eig_clip = max(min(W, hi), lo)`` as two such steps. A sign error ``E`` then costs ``E (W - t I) R`` (the
kept part only) and ``E (W - t I) E`` (second order), instead of ``(t I - W) E / 2`` in the identity above:
eigenvalues far beyond the threshold (``|lambda| >> |t|``, e.g. a cluster at 1e3 capped at 1) no longer
cost ``~ eps |lambda|`` (measured, fp32: 2.1e-3 -> 5.3e-5 for ``eig_clip`` of a spectrum over +-[1e-3, 1e3];
bf16: 6.2 -> 3.6e-3 for ``eig_hardcap`` of a 1e3 cluster at 0). bf16 also needs the sign's eigenvectors:
its steps stay in fp32 until the tracked lower bound reaches ``polar.CLIP_BF16_SWITCH``, and the signs are
symmetrised (a skew error is a rotation that the sandwich would carry to first order); on a linear
spectrum in [-1, 1] bf16 errors went from 8e-3 to 4e-3, fp32 stays ~1e-6.
Near ``t`` the error stays weighted by ``|lambda - t|``; ``eig_stepfun`` is discontinuous,
so eigenvalues within ``~1e-6 ||W - t I||`` of ``t`` get a value between 0 and 1 (exactly 1/2 at ``t``).
``method="exact"`` uses a float64 ``torch.linalg.eigh`` (it synchronises on CUDA).
"""

from __future__ import annotations

import torch

from spectrakit._checks import check_choice, check_int, check_tensor, value_checks_enabled

from ._util import compute_dtype, mT, threshold
from .polar import clip_sign

METHODS = ("polar", "exact")


def sym(W: torch.Tensor) -> torch.Tensor:
    """``sym(W) = (W + W^T) / 2`` over the last two dims (SPEC notation; seed 002 §2).

    Raises:
        TypeError: W not a floating tensor. ValueError: W not square / fewer than 2 dims.
    """
    check_tensor(W, "W", min_ndim=2, square=True, finite=False)
    return (W + mT(W)) / 2


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


def _work(W: torch.Tensor, cdt: torch.dtype):
    work = torch.float32 if cdt == torch.bfloat16 else cdt
    w = W.to(work)
    return (w + mT(w)) / 2, torch.eye(W.shape[-1], dtype=work, device=W.device)


def _thr(v, work_like):
    return v.to(work_like.dtype) if isinstance(v, torch.Tensor) else v


def _check_order(lo, hi):
    if isinstance(lo, float) and isinstance(hi, float):
        if lo > hi:
            raise ValueError(f"lo must be <= hi, got lo={lo}, hi={hi}")
    elif value_checks_enabled() and bool((torch.as_tensor(lo) > torch.as_tensor(hi)).any()):
        raise ValueError("lo must be <= hi elementwise")


def eig_clip(W: torch.Tensor, lo, hi, *, method: str = "polar", steps: int | None = None,
             dtype: torch.dtype | None = None) -> torch.Tensor:
    """Eigenvalue clip ``Q clip_[lo, hi](Lambda) Q^T`` of symmetric ``W`` (SPEC §1.4, seed 002 §2.1).

    ``= ((lo + hi) I + (lo I - W) msign(lo I - W) - (hi I - W) msign(hi I - W)) / 2`` (both signs in one
    batched call), computed as ``max(min(W, hi), lo)`` in the shifted-sandwich form of the module docstring;
    relative error <= 1e-3 in fp32.

    Args:
        W: ``(..., n, n)`` floating tensor (symmetrised first), finite.
        lo, hi: finite thresholds with lo <= hi; floats or tensors broadcastable to ``W.shape[:-2]``.
        method: "polar" or "exact" (float64 eigh). steps: sign iterations (1..100), default by dtype.
        dtype: compute dtype (bf16: the sign steps run in fp32 until the tracked lower bound reaches
            ``polar.CLIP_BF16_SWITCH``); output has W's dtype.

    Raises:
        TypeError: W not floating / thresholds not numbers. ValueError: W not square or non-finite,
        thresholds non-finite or not broadcastable, lo > hi, unknown method, steps out of range.
    """
    _prep(W, "W", method, steps)
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
    w, eye = _work(W, cdt)
    lo_i, hi_i = _thr(lo_t, w) * eye, _thr(hi_t, w) * eye
    s_lo, s_hi = eigen_signs([lo_i - w, hi_i - w], cdt, steps)
    h = shifted_sandwich(w, hi_i, (eye + s_hi) / 2)              # min(W, hi)
    out = shifted_sandwich(h, lo_i, (eye - s_lo) / 2)            # max(min(W, hi), lo)
    return ((out + mT(out)) / 2).to(W.dtype)


def _one_sided(W: torch.Tensor, t, name: str, side: int, method: str, steps, dtype) -> torch.Tensor:
    """``(t I + W + side (t I - W) msign(t I - W)) / 2``: ``Q max(Lambda, t) Q^T`` for ``side = +1``,
    ``Q min(Lambda, t) Q^T`` for ``side = -1`` (one eigen-sign; the exact path applies max/min to ``eigh``)."""
    _prep(W, "W", method, steps)
    cdt = compute_dtype(W, dtype)
    t_t = threshold(t, name, W, torch.float64 if method == "exact" else cdt)
    if method == "exact":
        t64 = _t64(t_t)
        pick = torch.maximum if side > 0 else torch.minimum
        return _eigfun_exact(W, lambda lam: pick(lam, torch.as_tensor(t64, dtype=lam.dtype, device=lam.device)))
    if W.numel() == 0:  # an empty matrix maps to itself
        return W.clone()
    w, eye = _work(W, cdt)
    t_i = _thr(t_t, w) * eye
    (s,) = eigen_signs([t_i - w], cdt, steps)
    # R = (I - side sign(t I - W)) / 2 projects onto the eigenvalues kept (> t for max, < t for min)
    out = shifted_sandwich(w, t_i, (eye - side * s) / 2)
    return ((out + mT(out)) / 2).to(W.dtype)


def eig_relu(W: torch.Tensor, lo, *, method: str = "polar", steps: int | None = None,
             dtype: torch.dtype | None = None) -> torch.Tensor:
    """``Q max(Lambda, lo) Q^T = (lo I + W + (lo I - W) msign(lo I - W)) / 2`` (SPEC §1.4, seed 002 §2.2),
    computed as ``lo I + R (W - lo I) R`` with ``R = (I - msign(lo I - W)) / 2`` (module docstring).

    Arguments and errors as :func:`eig_clip` (``lo`` finite, float or batch-broadcastable tensor).
    """
    return _one_sided(W, lo, "lo", +1, method, steps, dtype)


def eig_hardcap(W: torch.Tensor, hi, *, method: str = "polar", steps: int | None = None,
                dtype: torch.dtype | None = None) -> torch.Tensor:
    """``Q min(Lambda, hi) Q^T = (hi I + W - (hi I - W) msign(hi I - W)) / 2`` (SPEC §1.4, seed 002 §2.3),
    computed as ``hi I + P (W - hi I) P`` with ``P = (I + msign(hi I - W)) / 2`` (module docstring).

    Arguments and errors as :func:`eig_clip` (``hi`` finite, float or batch-broadcastable tensor).
    """
    return _one_sided(W, hi, "hi", -1, method, steps, dtype)


def proj_psd(W: torch.Tensor, *, method: str = "polar", steps: int | None = None,
             dtype: torch.dtype | None = None) -> torch.Tensor:
    """Projection onto the PSD cone ``(W + W msign(W)) / 2 = Q max(Lambda, 0) Q^T`` (seed 002 §2.2)."""
    return eig_relu(W, 0.0, method=method, steps=steps, dtype=dtype)


def proj_nsd(W: torch.Tensor, *, method: str = "polar", steps: int | None = None,
             dtype: torch.dtype | None = None) -> torch.Tensor:
    """Projection onto the NSD cone ``(W - W msign(W)) / 2 = Q min(Lambda, 0) Q^T`` (seed 002 §2.3)."""
    return eig_hardcap(W, 0.0, method=method, steps=steps, dtype=dtype)


def eig_stepfun(W: torch.Tensor, t=0.0, *, method: str = "polar", steps: int | None = None,
                dtype: torch.dtype | None = None) -> torch.Tensor:
    """``(I + msign(W - t I)) / 2 = Q step_t(Lambda) Q^T`` with ``step_t(x) = [x > t]`` (seed 002 §2.4).

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
    (s,) = eigen_signs([w - _thr(t_t, w) * eye], cdt, steps)
    out = (eye + s) / 2
    return ((out + mT(out)) / 2).to(W.dtype)
