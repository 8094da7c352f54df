"""Thin adapter over :mod:`spectrakit.linalg`: every spectral function used by the manifold code, with one
``method`` switch (``"polar"`` = the msign/Newton–Schulz route of Cesista 2025 §2, ``"exact"`` = eigh/SVD
reference). bf16/fp16 inputs are computed in float32 and returned in their dtype. Keeping the calls in one
place lets the sets and dualizers read like the paper's formulas."""

from __future__ import annotations

import torch

from spectrakit import linalg as _L

METHODS = ("polar", "exact")


def _kw(method: str) -> dict:
    return {"method": "exact"} if method == "exact" else {}


def _fp32(fn):
    """Half-precision inputs are computed in float32 and cast back: a retraction or face projector that
    is off by bf16's ~1e-2 would leave the set or misclassify the boundary."""

    def wrapped(X, *args, **kw):
        if X.dtype in (torch.bfloat16, torch.float16):
            return fn(X.float(), *args, **kw).to(X.dtype)
        return fn(X, *args, **kw)

    wrapped.__name__, wrapped.__doc__ = fn.__name__, fn.__doc__
    return wrapped


def sym(X: torch.Tensor) -> torch.Tensor:
    """``(X + X^T) / 2`` over the last two dims."""
    return _L.sym(X)


@_fp32
def msign(X: torch.Tensor, method: str) -> torch.Tensor:
    """Polar factor ``U V^T`` of ``X = U S V^T``."""
    return _L.msign(X, schedule="exact") if method == "exact" else _L.msign(X)


@_fp32
def eig_stepfun(W: torch.Tensor, t, method: str) -> torch.Tensor:
    """``(I + msign(W - t I)) / 2``: projector onto the eigenvectors of symmetric ``W`` with eigenvalue >
    t."""
    return _L.eig_stepfun(W, t, **_kw(method))


@_fp32
def proj_psd(W: torch.Tensor, method: str) -> torch.Tensor:
    """``(W + W msign(W)) / 2``: positive part of symmetric ``W``."""
    return _L.proj_psd(W, **_kw(method))


@_fp32
def proj_nsd(W: torch.Tensor, method: str) -> torch.Tensor:
    """``(W - W msign(W)) / 2``: negative part of symmetric ``W``."""
    return _L.proj_nsd(W, **_kw(method))


@_fp32
def eig_clip(W: torch.Tensor, lo, hi, method: str) -> torch.Tensor:
    """Eigenvalues of symmetric ``W`` clipped into ``[lo, hi]``."""
    return _L.eig_clip(W, lo, hi, **_kw(method))


@_fp32
def eig_relu(W: torch.Tensor, lo, method: str) -> torch.Tensor:
    """Eigenvalues ``lam -> max(lam, lo)``."""
    return _L.eig_relu(W, lo, **_kw(method))


@_fp32
def eig_hardcap(W: torch.Tensor, hi, method: str) -> torch.Tensor:
    """Eigenvalues ``lam -> min(lam, hi)``."""
    return _L.eig_hardcap(W, hi, **_kw(method))


@_fp32
def spectral_hardcap(X: torch.Tensor, hi, method: str) -> torch.Tensor:
    """Singular values ``s -> min(s, hi)``."""
    return _L.spectral_hardcap(X, hi, **_kw(method))


@_fp32
def spectral_clip(X: torch.Tensor, lo, hi, method: str) -> torch.Tensor:
    """Singular values clipped into ``[lo, hi]``."""
    return _L.spectral_clip(X, lo, hi, **_kw(method))


def as_batch_scalar(value, like: torch.Tensor) -> torch.Tensor | float:
    """A float stays a float; a tensor of shape ``batch`` (or broadcastable) becomes ``(..., 1, 1)``."""
    if isinstance(value, torch.Tensor):
        v = value.to(device=like.device, dtype=like.dtype)
        return v.reshape(v.shape + (1, 1)) if v.ndim else v
    return float(value)


def eye_like(W: torch.Tensor, n: int | None = None) -> torch.Tensor:
    n = W.shape[-1] if n is None else n
    return torch.eye(n, dtype=W.dtype, device=W.device)
