"""The tensor-norm (TN) bound on the spectral norm of a convolution (Grishina, Gorbunov and Rakhuba 2024 §4–5).

For a kernel ``K`` of shape ``(c_out, c_in, k_1..k_d)`` and any zero or circular padding, stride 1:

    ||K||_sigma <= ||T||_2 <= sqrt(k_1 ... k_d) ||K||_sigma,
    ||K||_sigma = sup_{u_i in C^{n_i}, ||u_i|| = 1} | K(u_1, ..., u_{d+2}) |          (Thm 4.1/4.2)

where the supremum is over COMPLEX unit vectors (App. B: the real supremum can fail to bound ``T``). Strided
layers use the reshaped kernel ``Q`` of Thm 4.3 (see :mod:`spectrakit.conv.kernel`).

``||K||_sigma`` is computed by the higher-order power method (HOPM, Alg. 1): for each mode ``i`` in turn,
``u_i <- conj(K(u_1..I..u_D)) / ||.||``. HOPM finds a local maximum, so several random complex starts are run
as one batch and the best is kept; the singular vectors are returned as a :class:`TNState` so the next call
can warm-start from them (one iteration per training step suffices, Grishina, Gorbunov and Rakhuba 2024 App. F). One
sweep over all modes
costs two passes over ``K`` (``4 N`` real multiply-adds per start, ``N`` = number of kernel entries; see
:func:`hopm`), i.e. less than one warm F4 step (a power iteration on each of 4 unfoldings, 8 passes)."""

# Gradient (Prop. 1): with ``z = K(u_1..u_D) = re + i im`` at the fixed point,
# ``d||K||_sigma/dK = (re * Re(u_1 o..o u_D) + im * Im(u_1 o..o u_D)) / |z|``, computed by a custom
# ``autograd.Function`` as one real matmul (no back-propagation through the iterations).

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from spectrakit._checks import check_int
from spectrakit.conv.kernel import effective_kernel

DEFAULT_ITERS = 100
DEFAULT_RESTARTS = 256
SCREEN_ITERS = 10
SCREEN_KEEP = 16
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


def _outer(vectors, like: torch.Tensor) -> torch.Tensor:
    """Flattened outer product ``v_1 o v_2 o ..`` of complex vectors ``(..., n_i)`` -> ``(..., prod n_i)``.

    An empty list gives ones of shape ``like.shape[:-1] + (1,)``."""
    if not vectors:
        return torch.ones_like(like[..., :1])
    out = vectors[0]
    for v in vectors[1:]:
        out = (out[..., :, None] * v[..., None, :]).flatten(-2)
    return out


def _normalized_conj(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(conj(y) / ||y||, ||y||)`` over the last axis (no sync: a zero ``y`` stays zero)."""
    value = torch.linalg.vector_norm(y, dim=-1)
    return y.conj() / value.clamp_min(_TINY)[..., None], value


def _spatial_contraction(S: torch.Tensor, vecs: list[torch.Tensor], j: int) -> torch.Tensor:
    """Contract the small spatial tensor ``S (R, B, k_1..k_d)`` with every ``vecs[m]`` (``(R, B, k_m)``), m != j.

    Returns ``(R, B, k_j)``: modes after ``j`` are contracted from the back, then modes before ``j`` from the front.
    """
    lead, ks = S.shape[:2], list(S.shape[2:])
    y = S
    for m in range(len(ks) - 1, j, -1):              # y: (R, B, k_1..k_m) -> (R, B, k_1..k_{m-1})
        y = (y.reshape(*lead, -1, ks[m]) @ vecs[m][..., :, None]).reshape(*lead, *ks[:m])
    for m in range(j):                               # y: (R, B, k_m..k_j) -> (R, B, k_{m+1}..k_j)
        y = (vecs[m][..., None, :] @ y.reshape(*lead, ks[m], -1)).reshape(*lead, *ks[m + 1:j + 1])
    return y


def hopm(K: torch.Tensor, vectors: list[torch.Tensor], iters: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Run ``iters`` HOPM sweeps (Grishina, Gorbunov and Rakhuba 2024 Alg. 1) on all starts at once.

    ``K``: real kernels ``(B, n_1, .., n_D)`` (modes ``c_out, c_in, k_1..k_d``, ``D >= 2``); ``vectors``: complex
    starts ``(R, B, n_i)``. One sweep is the Gauss–Seidel order ``u_1, .., u_D`` of
    ``u_i <- conj(K(u_1..I..u_D)) / ||.||``, computed with two real matmuls of the contiguous mode-1 unfolding
    ``K_(1) (B, n_1, n_2 P)``, ``P = n_3..n_D``, against ``[Re, Im]`` of all starts at once:

    1. ``u_1 <- conj(K_(1) (u_2 o s)) / ||.||`` with ``s = u_3 o..o u_D`` (size ``P``);
    2. ``C = K x_1 u_1 = K_(1)^T u_1`` (``(n_2, P)`` per start), ``u_2 <- conj(C s) / ||.||``;
    3. ``S = K x_1 u_1 x_2 u_2 = u_2^T C`` (``(k_1..k_d)`` per start), then ``u_3, .., u_D`` in order, each a
       contraction of the small tensor ``S`` with the other (current) spatial vectors.

    This is exactly the mode-by-mode iteration (``u_2`` and ``S`` use the new ``u_1``, ``u_3..`` the new
    ``u_1, u_2``). Cost per start and sweep: ``4 N`` real multiply-adds (``N = n_1 .. n_D``; two passes over
    ``K``) plus ``O(n_2 P + P d)`` small work, instead of ``2 N D`` (one pass per mode, with ``N / n_i``-sized
    outer products) for the plain mode-by-mode contraction.
    Returns the updated vectors and ``|K(u_1..u_D)|`` of shape ``(R, B)`` (the norm of the last contraction).
    """
    B, sizes = K.shape[0], tuple(K.shape[1:])
    D = len(sizes)
    if D < 2:
        raise ValueError(f"hopm needs a tensor with at least 2 modes, got sizes {sizes}")
    n1, n2, sp = sizes[0], sizes[1], sizes[2:]
    P = math.prod(sp)
    R = vectors[0].shape[0]
    K1 = K.reshape(B, n1, n2 * P)
    u = list(vectors)
    value = None
    for _ in range(iters):
        s = _outer(u[2:], u[0])                                                        # (R, B, P)
        t = (u[1][..., :, None] * s[..., None, :]).flatten(-2)                          # (R, B, n2 P)
        W = torch.view_as_real(t).permute(1, 2, 0, 3).reshape(B, n2 * P, 2 * R)
        y = torch.view_as_complex(torch.bmm(K1, W).view(B, n1, R, 2)).permute(2, 0, 1)  # (R, B, n1)
        u[0], value = _normalized_conj(y)
        W = torch.view_as_real(u[0]).permute(1, 2, 0, 3).reshape(B, n1, 2 * R)
        C = torch.view_as_complex(torch.bmm(K1.mT, W).view(B, n2, P, R, 2)).permute(3, 0, 1, 2)  # (R, B, n2, P)
        u[1], value = _normalized_conj((C @ s[..., None])[..., 0])
        if D == 2:
            continue
        S = (u[1][..., None, :] @ C).reshape(R, B, *sp)                                 # (R, B, k_1..k_d)
        spv = u[2:]
        for j in range(len(sp)):
            spv[j], value = _normalized_conj(_spatial_contraction(S, spv, j))
        u[2:] = spv
    return u, value


class _TensorNormAtVectors(torch.autograd.Function):
    """``|K(u_1..u_D)|`` for fixed unit vectors; backward is Prop. 1 of Grishina, Gorbunov and Rakhuba 2024.

    Inputs: ``K (*batch, n_1, n_2, k..)`` real, ``z`` (``K(u_1..u_D)`` if already known, else ``None``) and the
    complex vectors ``u_i (*batch, n_i)``. Forward (``z`` unknown) ``z = u_1^T K_(1) t`` with
    ``t = u_2 o..o u_D (*batch, n_2 P)``: one real matmul of the mode-1 unfolding ``K_(1) (n_1, n_2 P)`` with
    ``[Re t, Im t]``. Backward ``dK = Re(a o t)`` with ``a = conj(z) grad / |z| u_1``, which is Prop. 1's
    ``(Re z Re(u_1 o..o u_D) + Im z Im(u_1 o..o u_D)) grad / |z|``, formed by one matmul
    ``[Re a, -Im a] [Re t; Im t]``.
    """

    @staticmethod
    def forward(ctx, K, nb, z, *vs):
        if z is None:
            t = _outer(vs[1:], vs[0])
            K1 = K.reshape(*K.shape[:nb], vs[0].shape[-1], t.shape[-1])
            y = torch.view_as_complex((K1 @ torch.view_as_real(t)).contiguous())      # (*batch, n1)
            z = (vs[0][..., None, :] @ y[..., :, None])[..., 0, 0]
        value = z.abs()
        ctx.save_for_backward(z, value, *vs)
        ctx.shape = K.shape
        return value

    @staticmethod
    def backward(ctx, grad):
        z, value, *vs = ctx.saved_tensors
        t = _outer(vs[1:], vs[0])
        inv = torch.where(value > 0, grad / value.clamp_min(_TINY), torch.zeros_like(value))
        a = (z.conj() * inv)[..., None] * vs[0]                                       # (*batch, n1)
        left = torch.stack([a.real, -a.imag], -1)                                      # (*batch, n1, 2)
        right = torch.stack([t.real, t.imag], -2)                                      # (*batch, 2, n2 P)
        return ((left @ right).reshape(ctx.shape), None, None) + (None,) * len(vs)


def tensor_norm_at(K: torch.Tensor, vectors, nb: int, z: torch.Tensor | None = None) -> torch.Tensor:
    """Differentiable ``|K(u_1..u_D)|`` with the vectors held fixed (gradient = Prop. 1 of Grishina, Gorbunov and
    Rakhuba 2024).

    ``K``: real ``(*batch, n_1..n_D)`` with ``nb`` batch dims; ``vectors``: complex ``(*batch, n_i)``, D >= 2.
    ``z``: the value ``K(u_1..u_D)`` (shape ``batch``) when the caller already has it, which saves the pass over
    ``K``: after a HOPM update of the last mode, ``u_D = conj(y)/||y||`` gives ``K(u_1..u_D) = ||y||`` exactly."""
    cdt = _complex_dtype(K.dtype)
    vs = [v.detach().to(cdt) for v in vectors]
    return _TensorNormAtVectors.apply(K, nb, None if z is None else z.detach(), *vs)


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

    Runs HOPM from ``state`` (if given) plus ``restarts`` random complex starts (default: 256 without a
    state, 0 with one), all batched. HOPM converges to local maxima (a single random start lands up to 20%
    low on small Gaussian kernels), so when there are more than 16 starts and ``iters`` > 10 all starts are
    screened for 10 sweeps and the best 16 continue; the best final start per kernel is kept. The defaults
    put the value within 1e-3 of a 512-start reference on >= 99% of Gaussian kernels (64x64x3x3 the
    hardest: 119/120; the former 64 starts / best 8 missed 14/120, by up to 2.7%).
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
    if len(sizes) < 2:
        raise ValueError(f"K must have at least 2 modes after {batch_dims} batch dims, got shape {tuple(K.shape)}")
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
    nbatch = math.prod(shape_b)
    vecs = [(torch.cat([s[i] for s in starts], 0) if len(starts) > 1 else starts[0][i]).reshape(-1, nbatch, n)
            for i, n in enumerate(sizes)]
    with torch.no_grad():
        Kb = Kc.detach().reshape(-1, *sizes)
        if vecs[0].shape[0] > SCREEN_KEEP and iters > SCREEN_ITERS:
            # screening: all starts for a few sweeps, then only the best SCREEN_KEEP continue
            vecs, value = hopm(Kb, vecs, SCREEN_ITERS)
            top = value.topk(SCREEN_KEEP, dim=0).indices                    # (keep, B)
            idx = torch.arange(top.shape[1], device=K.device)
            vecs = [v[top, idx] for v in vecs]
            iters -= SCREEN_ITERS
        vecs, value = hopm(Kb, vecs, iters)
        if vecs[0].shape[0] == 1:                                            # a single start: nothing to pick
            vecs, value = [v[0].reshape(*shape_b, v.shape[-1]) for v in vecs], value[0].reshape(shape_b)
        else:
            best = value.argmax(0)                                           # (B,)
            idx = torch.arange(best.shape[0], device=K.device)
            vecs = [v[best, idx].reshape(*shape_b, v.shape[-1]) for v in vecs]
            value = value[best, idx].reshape(shape_b)
    # HOPM's last value is |K(u_1..u_D)| at the returned vectors (exact identity), so no extra pass over K
    value = tensor_norm_at(Kc, vecs, batch_dims, z=value)
    return value.to(K.dtype), TNState(tuple(vecs))


def tn_bound(weight, *, stride=1, dilation=1, groups: int = 1, spatial_dims: int = 2,
             iters: int | None = None, restarts: int | None = None, state: TNState | None = None,
             generator: torch.Generator | None = None, reduce_groups: bool = True,
             finite: bool = True) -> tuple[torch.Tensor, TNState]:
    """TN upper bound ``sqrt(k'_1..k'_d) ||Q||_sigma >= ||T||_2`` of a convolution (Grishina, Gorbunov and Rakhuba 2024
    Thm 4.1–4.3).

    ``weight``: kernel ``(..., c_out, c_in/groups, k_1..k_d)`` (leading dims = batch of same-shaped kernels;
    ``d = spatial_dims`` in {1, 2, 3}) or an ``nn.Conv1d/2d/3d`` (its stride, dilation, groups are used).
    ``stride``, ``dilation``: int or per-axis tuple, >= 1. ``groups`` >= 1 dividing ``c_out``: each group is
    bounded and (``reduce_groups=True``) the max over groups is returned. ``Q`` is the strided reshape
    ``(c_out, c_in prod(s), ceil(k_i/s_i)..)``, ``k'_i = ceil(k_i/s_i)`` (dilated on strided axes).
    ``iters`` >= 1 HOPM sweeps (default 100 cold, 1 when warm-started from ``state``); ``restarts`` random
    complex starts (default 256 cold, screened to 16 after 10 sweeps; 0 warm).
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
