"""Small shared helpers of :mod:`spectrakit.linalg`: orientation, thresholds, dtypes, norms."""

from __future__ import annotations

import math

import torch

from spectrakit._checks import check_scalar

# Smallest norm used when normalising: keeps zero input at zero without producing nan/inf.
TINY = 1e-30


def tiny_for(dtype: torch.dtype) -> float:
    """A positive floor for norms in ``dtype`` (well above its smallest normal number)."""
    return max(TINY, float(torch.finfo(dtype).tiny) * 1e3)


def compute_dtype(x: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    """The dtype a function computes in: ``dtype`` if given, else the input's dtype (fp16 -> fp32)."""
    if dtype is None:
        return torch.float32 if x.dtype == torch.float16 else x.dtype
    if dtype not in (torch.bfloat16, torch.float32, torch.float64):
        raise TypeError(f"dtype must be torch.bfloat16, torch.float32 or torch.float64, got {dtype}")
    return dtype


_FLUSH_SHIFT: dict = {}


def _flush_shift(dtype: torch.dtype) -> float:
    """The power of two ``C`` with ``ulp(C) / 4 = 2^ceil(log2(4 sqrt(finfo.tiny)))`` (see :func:`flush_tiny`)."""
    c = _FLUSH_SHIFT.get(dtype)
    if c is None:
        fi = torch.finfo(dtype)
        floor_exp = math.ceil(math.log2(4 * fi.tiny ** 0.5))
        c = 2.0 ** (floor_exp + 2 - round(math.log2(fi.eps)))  # ulp(C) = C eps
        _FLUSH_SHIFT[dtype] = c
    return c


def flush_tiny(x: torch.Tensor) -> torch.Tensor:
    """On CPU, flush entries below ``~4 sqrt(finfo.tiny)`` (~4e-19 in fp32/bf16) to zero: ``(x + C) - C``.

    Converged polar iterations drive the off-diagonal entries of their Gram matrices (norm ~1) towards 0
    super-exponentially, into subnormal numbers, which x86 CPUs multiply 5-10x slower (measured:
    soft_clip 256x256 at sigma_max/c = 1e-3 took 250 ms instead of 28 ms). Adding and subtracting the power
    of two ``C`` (``2^-36`` in fp32) rounds every entry to a multiple of ``ulp(C)/2`` (``~4e-19``) below
    ``C`` in magnitude and is exact up to one rounding above it: entries below ``ulp(C)/4`` become exactly 0
    and the smallest non-zero magnitude is ``ulp(C)/2``, so products of two entries stay normal numbers.
    Perturbations of ~1e-18 (fp32) are far below the rounding error of a norm-1 matrix, so this changes
    nothing that matters; it is ~8x cheaper than a comparison and a masked fill. No-op on CUDA, and for
    bfloat16: its rounding (2^-8 relative) keeps converged iterates far from subnormals, and bf16 inputs with
    a block scaled by 1e-25, or entirely at 1e-30, ran no slower without the flush (msign, soft_clip,
    256x256, CPU), while the flush cost 15% of a batched 12x128x128 bf16 soft_clip.
    """
    if x.device.type != "cpu" or x.dtype == torch.bfloat16:
        return x
    c = _flush_shift(x.dtype)
    return (x + c) - c


def mT(x: torch.Tensor) -> torch.Tensor:
    """Transpose of the last two dims."""
    return x.transpose(-2, -1)


def eye_like(x: torch.Tensor, n: int | None = None) -> torch.Tensor:
    """Identity of size ``n`` (default ``x.shape[-1]``) with x's dtype/device (broadcasts over batch)."""
    n = x.shape[-1] if n is None else n
    return torch.eye(n, dtype=x.dtype, device=x.device)


def sym_part(x: torch.Tensor) -> torch.Tensor:
    """``(X + X^T) / 2`` without overflow: where ``X + X^T`` overflows (entries near the dtype's largest value)
    ``X / 2 + X^T / 2`` instead (exact there; the plain form keeps subnormal entries exact)."""
    xt = mT(x)
    a = x + xt
    return torch.where(torch.isfinite(a), a / 2, x / 2 + xt / 2)


def frob(x: torch.Tensor) -> torch.Tensor:
    """Frobenius norm over the last two dims, keepdim (shape ``(..., 1, 1)``), computed in >= fp32."""
    xf = x if x.dtype == torch.float64 else x.float()
    # scale by the largest entry first: no overflow/underflow of the squares for huge/tiny inputs
    amax = xf.abs().amax(dim=(-2, -1), keepdim=True)
    amax = torch.where(amax > 0, amax, torch.ones_like(amax))  # subnormal maxima are kept (exact division)
    y = xf / amax
    # sum of squares >= 1 for nonzero input (the largest entry of y is 1): the floor only acts on the zero
    # matrix, where it makes the gradient 0 (the subgradient chosen there) instead of sqrt'(0) * 0 = nan
    ss = (y * y).sum(dim=(-2, -1), keepdim=True).clamp_min(0.25)
    return (amax * ss.sqrt()).to(x.dtype)


def pow2_scale(x: torch.Tensor) -> torch.Tensor:
    """A power of two within a factor 2 of ``max|x|`` per matrix (shape ``(..., 1, 1)``, x's dtype), 1 for a zero
    matrix; detached. Dividing by it is exact, brings every entry into ``[0, 2)`` and every norm of ``x / s``
    below ``2 sqrt(m n)``, so no intermediate overflows (entries up to fp32's largest value, whose Frobenius
    norm is not representable) or underflows (subnormal entries); the functions using it are homogeneous
    or scale-invariant, so treating ``s`` as a constant also gives exact gradients."""
    amax = x.detach().abs().amax(dim=(-2, -1), keepdim=True)
    s = torch.exp2(torch.floor(torch.log2(amax)))
    return torch.where((amax > 0) & torch.isfinite(s), s, torch.ones_like(s))


class _Scale(torch.autograd.Function):
    """Forward ``x / s`` (``mode="div"``), ``x * s`` (``"mul"``) or ``x`` (``"grad_div"``); backward: the incoming
    gradient unchanged, or divided by ``s`` for ``"grad_div"`` (see :func:`to_unit`)."""

    @staticmethod
    def forward(ctx, x, s, mode):
        ctx.save_for_backward(s)
        ctx.mode = mode
        return x / s if mode == "div" else x * s if mode == "mul" else x.clone()

    @staticmethod
    def backward(ctx, g):
        (s,) = ctx.saved_tensors
        return (g / s if ctx.mode == "grad_div" else g), None, None


def to_unit(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """``x / s`` for a homogeneous function ``F(X, t) = s F(X / s, t / s)``, paired with :func:`from_unit` on its
    output: the backward passes skip both factors (``1/s`` here, ``s`` there), whose product is 1, so the
    gradients of inputs near the top of the range (``s ~ 1e37``) or subnormal ones do not overflow or
    underflow inside the backward pass. Every input of the function (matrix and thresholds) must go through
    it. ``s`` is a power of two (:func:`pow2_scale`): the division is exact."""
    return _Scale.apply(x, s, "div") if x.requires_grad else x / s


def from_unit(y: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """``y * s`` with an identity backward (see :func:`to_unit`)."""
    return _Scale.apply(y, s, "mul") if y.requires_grad else y * s


def grad_div(y: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """``y`` whose backward divides by ``s``: for a term of the output computed from ``to_unit`` inputs but not
    passed through :func:`from_unit` (it restores that term's true gradient)."""
    return _Scale.apply(y, s, "grad_div") if y.requires_grad else y


def threshold(value, name: str, x: torch.Tensor, dtype: torch.dtype, *, low=None, low_inclusive=True,
              allow_inf: bool = False) -> torch.Tensor | float:
    """Validate a threshold (float, or tensor broadcastable to the batch shape ``x.shape[:-2]``).

    Returns a Python float unchanged, or the tensor reshaped to ``(..., 1, 1)`` in ``dtype`` on x's device.
    """
    check_scalar(value, name, low=low, low_inclusive=low_inclusive)
    if isinstance(value, torch.Tensor):
        batch = x.shape[:-2]
        try:
            ok = torch.broadcast_shapes(value.shape, batch) == batch
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(f"{name} must be a float or a tensor broadcastable to the batch shape "
                             f"{tuple(batch)} of the input, got a tensor of shape {tuple(value.shape)}")
        return value.to(device=x.device, dtype=dtype)[..., None, None]
    v = float(value)
    if v == float("inf") and not allow_inf:
        raise ValueError(f"{name} must be finite, got inf")
    return v


def as_tensor(v, like: torch.Tensor) -> torch.Tensor:
    """A threshold (float or (..., 1, 1) tensor) as a tensor broadcastable against ``like``."""
    if isinstance(v, torch.Tensor):
        return v.to(dtype=like.dtype)
    return torch.full((1, 1), float(v), dtype=like.dtype, device=like.device)
