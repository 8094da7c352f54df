"""The tensor-norm (TN) bound on the spectral norm of a convolution (seed 001 §4–5).

For a kernel ``K`` of shape ``(c_out, c_in, k_1..k_d)`` and any zero or circular padding, stride 1:

    ||K||_sigma <= ||T||_2 <= sqrt(k_1 ... k_d) ||K||_sigma,
    ||K||_sigma = sup_{u_i in C^{n_i}, ||u_i|| = 1} | K(u_1, ..., u_{d+2}) |          (Thm 4.1/4.2)

where the supremum is over COMPLEX unit vectors (App. B: the real supremum can fail to bound ``T``). Strided
layers use the reshaped kernel ``Q`` of Thm 4.3 (see :mod:`spectrakit.conv.kernel`).

``||K||_sigma`` is computed by the higher-order power method (HOPM, Alg. 1): for each mode ``i`` in turn,
``u_i <- conj(K(u_1..I..u_D)) / ||.||``. HOPM finds a local maximum, so several random complex starts are run
as one batch and the best is kept; the singular vectors are returned as a :class:`TNState` so the next call
can warm-start from them (one iteration per training step suffices, seed 001 App. F).

Gradient (Prop. 1): with ``z = K(u_1..u_D) = re + i im`` at the fixed point,
``d||K||_sigma/dK = (re * Re(u_1 o..o u_D) + im * Im(u_1 o..o u_D)) / |z|``, computed in real arithmetic by a
custom ``autograd.Function`` (no back-propagation through the iterations).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from spectrakit._checks import check_int
from spectrakit.conv.kernel import effective_kernel

DEFAULT_ITERS = 100
DEFAULT_RESTARTS = 64
SCREEN_ITERS = 10
SCREEN_KEEP = 8
_TINY = 1e-30


@dataclass
class TNState:
    """Complex singular vectors of the (reshaped) kernel, one per mode, each of shape ``(*batch, n_i)``.

    ``batch`` includes the group axis. Pass it back as ``state=`` to warm-start HOPM from these vectors.
    """

    vectors: tuple[torch.Tensor, ...]

    @property
    def mode_sizes(self) -> tuple[int, ...]:
        return tuple(v.shape[-1] for v in self.vectors)

    def to(self, device) -> TNState:
        return TNState(tuple(v.to(device) for v in self.vectors))


def _complex_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.complex128 if dtype == torch.float64 else torch.complex64


def _outer(vectors) -> torch.Tensor:
    """Flattened outer product ``v_1 o v_2 o ...`` of complex vectors ``(..., n_i)`` -> ``(..., prod n_i)``."""
    out = vectors[0]
    for v in vectors[1:]:
        out = (out[..., :, None] * v[..., None, :]).flatten(-2)
    return out


def _real_outer(parts) -> tuple[torch.Tensor, torch.Tensor]:
    """Real and imaginary parts of ``u_1 o..o u_D`` from ``[(re_1, im_1), ...]`` using real arithmetic only."""
    re, im = parts[0]
    for b_re, b_im in parts[1:]:
        re, im = ((re[..., :, None] * b_re[..., None, :] - im[..., :, None] * b_im[..., None, :]).flatten(-2),
                  (re[..., :, None] * b_im[..., None, :] + im[..., :, None] * b_re[..., None, :]).flatten(-2))
    return re, im


def _unfoldings(K: torch.Tensor, nb: int) -> list[torch.Tensor]:
    """Mode-i unfoldings ``(B, n_i, N / n_i)`` (other modes in their original order), batch flattened."""
    D = K.ndim - nb
    flat = K.reshape(-1, *K.shape[nb:])
    return [flat.movedim(1 + i, 1).reshape(flat.shape[0], flat.shape[1 + i], -1) for i in range(D)]


def hopm(unf: list[torch.Tensor], vectors: list[torch.Tensor], iters: int) -> tuple[list[torch.Tensor],
                                                                                    torch.Tensor]:
    """Run ``iters`` HOPM sweeps (seed 001 Alg. 1) on all starts at once.

    ``unf``: mode unfoldings ``(B, n_i, N/n_i)`` of a real kernel; ``vectors``: complex starts ``(R, B, n_i)``.
    Returns the updated vectors and ``|K(u_1..u_D)|`` of shape ``(R, B)`` (the norm of the last contraction).
    """
    D = len(unf)
    R = vectors[0].shape[0]
    value = None
    for _ in range(iters):
        for i in range(D):
            w = _outer([vectors[j] for j in range(D) if j != i])           # (R, B, M) complex
            B, M = w.shape[1], w.shape[2]
            W = torch.view_as_real(w).permute(1, 2, 0, 3).reshape(B, M, 2 * R)  # (B, M, 2R) real
            y = torch.bmm(unf[i], W).reshape(B, -1, R, 2)                       # (B, n_i, R, 2)
            y = torch.view_as_complex(y).permute(2, 0, 1)                       # (R, B, n_i)
            value = torch.linalg.vector_norm(y, dim=-1)
            vectors[i] = y.conj() / value.clamp_min(_TINY)[..., None]
    return vectors, value


class _TensorNormAtVectors(torch.autograd.Function):
    """``|K(u_1..u_D)|`` for fixed unit vectors; backward is Prop. 1 of seed 001 in real arithmetic."""

    @staticmethod
    def forward(ctx, K, nb, *parts):
        pairs = [(parts[2 * i], parts[2 * i + 1]) for i in range(len(parts) // 2)]
        p_re, p_im = _real_outer(pairs)
        flat = K.reshape(*K.shape[:nb], -1)
        re, im = (flat * p_re).sum(-1), (flat * p_im).sum(-1)
        value = torch.hypot(re, im)
        ctx.save_for_backward(re, im, value, *parts)
        ctx.nb, ctx.shape = nb, K.shape
        return value

    @staticmethod
    def backward(ctx, grad):
        re, im, value, *parts = ctx.saved_tensors
        pairs = [(parts[2 * i], parts[2 * i + 1]) for i in range(len(parts) // 2)]
        p_re, p_im = _real_outer(pairs)
        inv = torch.where(value > 0, grad / value.clamp_min(_TINY), torch.zeros_like(value))
        g = (re * inv)[..., None] * p_re + (im * inv)[..., None] * p_im
        return (g.reshape(ctx.shape), None) + (None,) * len(parts)


def tensor_norm_at(K: torch.Tensor, vectors, nb: int) -> torch.Tensor:
    """Differentiable ``|K(u_1..u_D)|`` with the vectors held fixed (gradient = Prop. 1 of seed 001)."""
    parts = []
    for v in vectors:
        parts += [v.real.to(K.dtype).detach(), v.imag.to(K.dtype).detach()]
    return _TensorNormAtVectors.apply(K, nb, *parts)


def _random_starts(shape_b, sizes, R, dtype, device, generator) -> list[torch.Tensor]:
    out = []
    for n in sizes:
        z = torch.randn(R, *shape_b, n, 2, dtype=dtype, device=device, generator=generator)
        z = torch.complex(z[..., 0], z[..., 1])
        out.append(z / torch.linalg.vector_norm(z, dim=-1, keepdim=True))
    return out


def tensor_spectral_norm(K: torch.Tensor, *, batch_dims: int = 0, iters: int = DEFAULT_ITERS,
                         restarts: int | None = None, state: TNState | None = None,
                         generator: torch.Generator | None = None) -> tuple[torch.Tensor, TNState]:
    """``||K||_sigma`` over complex unit vectors of a real tensor with ``batch_dims`` leading batch dims.

    Runs HOPM from ``state`` (if given) plus ``restarts`` random complex starts (default: 64 without a state,
    0 with one), all batched. HOPM converges to local maxima (a single random start lands up to 20% low on
    small Gaussian kernels), so when there are more than 8 starts and ``iters`` > 10 all starts are screened
    for 10 sweeps and the best 8 continue; the best final start per kernel is kept.
    Differentiable w.r.t. ``K`` through Prop. 1.
    Computes in float32 (float64 for float64 input); returns the value in ``K.dtype`` and the state.
    ``iters`` >= 1; ``restarts`` >= 0 (>= 1 when ``state`` is None). Raises ``ValueError``/``TypeError``.
    """
    check_int(iters, "iters", low=1)
    if restarts is None:
        restarts = 0 if state is not None else DEFAULT_RESTARTS
    check_int(restarts, "restarts", low=0 if state is not None else 1)
    cdt = torch.float64 if K.dtype == torch.float64 else torch.float32
    Kc = K.to(cdt)
    shape_b, sizes = tuple(K.shape[:batch_dims]), tuple(K.shape[batch_dims:])
    starts: list[list[torch.Tensor]] = []
    if state is not None:
        if not isinstance(state, TNState):
            raise TypeError(f"state must be a TNState or None, got {type(state).__name__}")
        if state.mode_sizes != sizes or tuple(state.vectors[0].shape[:-1]) != shape_b:
            raise ValueError(f"state has vectors for shape {state.mode_sizes} with batch "
                             f"{tuple(state.vectors[0].shape[:-1])}, expected {sizes} with batch {shape_b}")
        starts.append([v.to(device=K.device, dtype=_complex_dtype(cdt))[None] for v in state.vectors])
    if restarts:
        starts.append(_random_starts(shape_b, sizes, restarts, cdt, K.device, generator))
    vecs = [torch.cat([s[i] for s in starts], 0).reshape(-1, math.prod(shape_b), n) for i, n in enumerate(sizes)]
    with torch.no_grad():
        unf = _unfoldings(Kc.detach(), batch_dims)
        if vecs[0].shape[0] > SCREEN_KEEP and iters > SCREEN_ITERS:
            # screening: all starts for a few sweeps, then only the best SCREEN_KEEP continue
            vecs, value = hopm(unf, vecs, SCREEN_ITERS)
            top = value.topk(SCREEN_KEEP, dim=0).indices                    # (keep, B)
            idx = torch.arange(top.shape[1], device=K.device)
            vecs = [v[top, idx] for v in vecs]
            iters -= SCREEN_ITERS
        vecs, value = hopm(unf, vecs, iters)
        best = value.argmax(0)                                               # (B,)
        idx = torch.arange(best.shape[0], device=K.device)
        vecs = [v[best, idx].reshape(*shape_b, v.shape[-1]) for v in vecs]
    value = tensor_norm_at(Kc, vecs, batch_dims)
    return value.to(K.dtype), TNState(tuple(vecs))


def tn_bound(weight, *, stride=1, dilation=1, groups: int = 1, spatial_dims: int = 2,
             iters: int | None = None, restarts: int | None = None, state: TNState | None = None,
             generator: torch.Generator | None = None, reduce_groups: bool = True,
             finite: bool = True) -> tuple[torch.Tensor, TNState]:
    """TN upper bound ``sqrt(k'_1..k'_d) ||Q||_sigma >= ||T||_2`` of a convolution (seed 001 Thm 4.1–4.3).

    ``weight``: kernel ``(..., c_out, c_in/groups, k_1..k_d)`` (leading dims = batch of same-shaped kernels;
    ``d = spatial_dims`` in {1, 2, 3}) or an ``nn.Conv1d/2d/3d`` (its stride, dilation, groups are used).
    ``stride``, ``dilation``: int or per-axis tuple, >= 1. ``groups`` >= 1 dividing ``c_out``: each group is
    bounded and (``reduce_groups=True``) the max over groups is returned. ``Q`` is the strided reshape
    ``(c_out, c_in prod(s), ceil(k_i/s_i)..)``, ``k'_i = ceil(k_i/s_i)`` (dilated on strided axes).
    ``iters`` >= 1 HOPM sweeps (default 100 cold, 1 when warm-started from ``state``); ``restarts`` random
    complex starts (default 64 cold, screened to 8 after 10 sweeps; 0 warm).
    Also ``sqrt(k'..) ||Q||_sigma <= sqrt(k'..) ||T||_2``.
    Independent of padding (zero or circular) and of the input size.

    Returns ``(bound, state)``: ``bound`` of shape ``batch`` (``batch + (groups,)`` if not reduced), in the
    weight's dtype, differentiable w.r.t. ``weight`` (Prop. 1 gradient); ``state`` warm-starts the next call.
    Raises ``TypeError`` (non-tensor, complex/integer dtype, non-conv module) or ``ValueError`` (too few dims,
    stride/dilation/iters out of range, non-finite values when value checks are on).
    """
    Q, geo = effective_kernel(weight, stride=stride, dilation=dilation, groups=groups,
                              spatial_dims=spatial_dims, finite=finite)
    if iters is None:
        iters = 1 if state is not None else DEFAULT_ITERS
    nb = Q.ndim - geo.spatial_dims - 2
    sigma, st = tensor_spectral_norm(Q, batch_dims=nb, iters=iters, restarts=restarts, state=state,
                                     generator=generator)
    bound = sigma * math.sqrt(math.prod(Q.shape[-geo.spatial_dims:]))
    if reduce_groups:
        bound = bound.amax(-1)
    return bound, st
