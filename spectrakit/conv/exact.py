"""Input-size dependent references for the spectral norm of a convolution (Grishina, Gorbunov and Rakhuba 2024 §2,
§6.1).

* :func:`exact_circular` (Sedghi et al. 2019): for circular padding on an ``n_1 x .. x n_d`` input the Jacobian
  is block-diagonalised by the DFT, ``||T||_2 = max_f sigma_1(K_hat(f))`` with ``K_hat(f) = sum_a K[:, :, a]
  exp(-2 pi i <a, f/n>)`` (``c_out x c_in`` per frequency). Strided layers: ``Q`` of Thm 4.3 on the
  ``n/s`` grid (needs ``s | n``).
* :func:`exact_zero_pad`: power iteration ``x <- T^T T x`` with ``conv`` / ``conv_transpose``
  (``output_padding`` chosen so that ``T^T`` maps back onto the input size for any stride).
* :func:`lipbound` (after Araujo et al. 2021): the sampled generating function with a certified correction,
  an input-size independent upper bound.
* :func:`gram_bound` (Delattre et al. 2023): Gram iteration ``G <- G^H G / ||G||_F^2`` per frequency,
  ``sigma_1(G_0) <= ||G_t||_F^{1/2^t} prod_j ||G_j||_F^{1/2^j}`` (an upper bound converging superlinearly).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from spectrakit._checks import check_choice, check_int
from spectrakit.conv.kernel import _tuple, dilate, read_conv, split_groups, strided_reshape

_TINY = 1e-30
_CONV = {1: (F.conv1d, F.conv_transpose1d), 2: (F.conv2d, F.conv_transpose2d), 3: (F.conv3d, F.conv_transpose3d)}


def _full_kernel(weight, stride, dilation, groups, spatial_dims):
    """Grouped kernel with the true dilation: ``(..., g, c_out/g, c_in/g, k_eff..)`` and its geometry."""
    weight, geo = read_conv(weight, stride=stride, dilation=dilation, groups=groups, spatial_dims=spatial_dims)
    return dilate(split_groups(weight, geo), geo, all_axes=True), geo


def _sizes(input_size, d, ks, name="input_size"):
    n = _tuple(input_size, name, d)
    for ni, k in zip(n, ks):
        if ni < k:
            raise ValueError(f"{name} must be >= the (dilated) kernel size {tuple(ks)} on every axis, got {n}")
    return n


def _fft_kernel(Q: torch.Tensor, n: tuple[int, ...]) -> torch.Tensor:
    """``K_hat`` of ``Q (..., co, ci, k..)`` on the ``n`` grid as ``(..., F, co, ci)`` (real FFT on the last
    axis: the conjugate frequencies have the same singular values for a real kernel)."""
    d = len(n)
    cdt = torch.float64 if Q.dtype == torch.float64 else torch.float32
    Kf = torch.fft.rfftn(Q.to(cdt), s=n, dim=tuple(range(-d, 0)))
    return Kf.flatten(-d).movedim(-1, -3)


def _circular_grid(weight, input_size, stride, dilation, groups, spatial_dims):
    K, geo = _full_kernel(weight, stride, dilation, groups, spatial_dims)
    d = geo.spatial_dims
    n = _tuple(input_size, "input_size", d)
    for ni, s in zip(n, geo.stride):
        if ni % s:
            raise ValueError(f"input_size must be divisible by the stride for circular padding, got {n} and "
                             f"stride {geo.stride}")
    Q = strided_reshape(K, geo.stride)
    m = _sizes(tuple(ni // s for ni, s in zip(n, geo.stride)), d, Q.shape[-d:], "input_size / stride")
    return Q, m, geo


def exact_circular(weight, input_size, *, stride=1, dilation=1, groups: int = 1, spatial_dims: int = 2,
                   reduce_groups: bool = True) -> torch.Tensor:
    """Exact ``||T||_2`` of the circularly padded convolution on an ``input_size`` grid (Sedghi et al. 2019).

    ``weight``: kernel ``(..., c_out, c_in/groups, k..)`` or ``nn.ConvNd`` (as :func:`~spectrakit.conv.tn_bound`).
    ``input_size``: int or per-axis tuple, divisible by the stride, with ``input_size/stride`` >= the reshaped
    kernel size. Returns the norm per batch kernel (max over groups), in float32/float64. Memory
    ``O(prod(n) c_out c_in)``: batched SVD over all frequencies. Differentiable through ``torch.linalg``.
    Raises ``TypeError``/``ValueError`` for bad kernels, sizes or strides.
    """
    Q, m, _ = _circular_grid(weight, input_size, stride, dilation, groups, spatial_dims)
    out = torch.linalg.matrix_norm(_fft_kernel(Q, m), ord=2).amax(-1)
    return out.amax(-1) if reduce_groups else out


def gram_bound(weight, input_size, *, iters: int = 6, padding: str = "circular", stride=1, dilation=1,
               groups: int = 1, spatial_dims: int = 2, reduce_groups: bool = True) -> torch.Tensor:
    """Gram-iteration upper bound (Delattre et al. 2023) on ``||T||_2``, per frequency of the FFT'd kernel.

    ``padding="circular"``: bounds :func:`exact_circular` at ``input_size`` (equal in the limit of ``iters``).
    ``padding="zero"``: the zero-padded convolution is a sub-matrix of the circular one on a grid of size
    ``n + 2 (k_eff - 1)`` (rounded up to a multiple of the stride), whose bound is returned. ``iters`` >= 1
    (error factor ``<= rank^{1/2^{iters+1}}``). Memory as :func:`exact_circular`. Differentiable.
    Raises ``TypeError``/``ValueError`` for bad kernels, sizes, strides or ``padding``.
    """
    check_int(iters, "iters", low=1)
    check_choice(padding, "padding", ("circular", "zero"))
    if padding == "zero":
        K, geo = _full_kernel(weight, stride, dilation, groups, spatial_dims)
        d = geo.spatial_dims
        n = _sizes(input_size, d, K.shape[-d:])
        input_size = tuple(-(-(ni + 2 * (k - 1)) // s) * s for ni, k, s in zip(n, K.shape[-d:], geo.stride))
    Q, m, _ = _circular_grid(weight, input_size, stride, dilation, groups, spatial_dims)
    G = _fft_kernel(Q, m)
    if G.shape[-2] > G.shape[-1]:
        G = G.mH
    log_bound = torch.zeros(G.shape[:-2], dtype=G.real.dtype, device=G.device)
    for t in range(iters):
        nrm = torch.linalg.matrix_norm(G).clamp_min(_TINY)
        log_bound = log_bound + torch.log(nrm) / 2 ** t
        G = G / nrm[..., None, None]
        G = G @ G.mH
    log_bound = log_bound + torch.log(torch.linalg.matrix_norm(G).clamp_min(_TINY)) / 2 ** iters
    out = torch.exp(log_bound).amax(-1)
    return out.amax(-1) if reduce_groups else out


# default LipBound sampling: the smallest grid whose correction factor 1 / (1 - alpha) is <= 1 / (1 - LIPBOUND_ALPHA)
LIPBOUND_ALPHA = 0.1


def lipbound(weight, *, samples=None, stride=1, dilation=1, groups: int = 1, spatial_dims: int = 2,
             reduce_groups: bool = True) -> torch.Tensor:
    """Input-size independent upper bound on ``||T||_2`` from the sampled generating function (the approach
    of LipBound, Araujo et al. 2021, cited in Grishina, Gorbunov and Rakhuba 2024 §1-2 and Table 1).

    For any input size and zero or circular padding, ``||T||_2 <= M = sup_w sigma_1(F(w))`` with the
    matrix-valued trigonometric polynomial ``F(w) = sum_a K[:, :, a] exp(-i <a, w>)`` (Toeplitz theory, Grishina,
    Gorbunov and Rakhuba 2024
    §4; strided layers use the kernel ``Q`` of Thm 4.3). ``F`` is evaluated by an FFT on an ``S_1 x .. x S_d``
    grid. Each ``u^H F v`` (unit ``u, v``) is, up to a phase, a trigonometric polynomial of degree
    ``N_i = (k_i - 1) / 2`` on axis ``i``, so Bernstein's inequality bounds its derivative along axis ``i`` by
    ``N_i M``; every point lies within ``pi / S_i`` of a grid point on every axis, hence

        ``M <= max_grid sigma_1(F) / (1 - alpha)``,  ``alpha = pi sum_i N_i / S_i < 1``,

    which is what is returned (a certified bound, unlike a plain grid maximum). Default ``samples``: per axis
    the smallest ``S_i >= k_i`` with ``alpha <= 0.1``.

    ``weight``: kernel ``(..., c_out, c_in/groups, k..)`` or ``nn.ConvNd`` (as :func:`~spectrakit.conv.tn_bound`);
    ``samples``: int or per-axis tuple, >= the (reshaped, dilated) kernel size, with ``alpha < 1``. Cost: one
    batched SVD of ``prod(S) / 2`` matrices ``c_out x c_in``. Differentiable through ``torch.linalg``.
    Raises ``TypeError``/``ValueError`` for bad kernels, strides or ``samples``.
    """
    K, geo = _full_kernel(weight, stride, dilation, groups, spatial_dims)
    d = geo.spatial_dims
    Q = strided_reshape(K, geo.stride)
    ks = tuple(Q.shape[-d:])
    deg = [(k - 1) / 2 for k in ks]
    if samples is None:  # S_i = pi D N_i / alpha_max (D axes with N_i > 0) gives alpha = alpha_max
        axes = sum(nd > 0 for nd in deg)
        S = tuple(max(k, math.ceil(math.pi * axes * nd / LIPBOUND_ALPHA)) for k, nd in zip(ks, deg))
    else:
        S = _tuple(samples, "samples", d)
        if any(si < k for si, k in zip(S, ks)):
            raise ValueError(f"samples must be >= the (reshaped, dilated) kernel size {ks} on every axis, got {S}")
    alpha = math.pi * sum(nd / si for nd, si in zip(deg, S))
    if alpha >= 1:
        raise ValueError(f"samples {S} too few for kernel size {ks}: need pi * sum((k_i - 1) / 2 / S_i) < 1, "
                         f"got {alpha:.3f}")
    out = torch.linalg.matrix_norm(_fft_kernel(Q, S), ord=2).amax(-1) / (1 - alpha)
    return out.amax(-1) if reduce_groups else out


def exact_zero_pad(weight, input_size, *, stride=1, padding=None, dilation=1, groups: int = 1,
                   spatial_dims: int = 2, iters: int = 100, state: torch.Tensor | None = None,
                   generator: torch.Generator | None = None, reduce_groups: bool = True
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """``||T||_2`` of the zero-padded convolution by power iteration on ``T^T T`` (conv then conv_transpose).

    ``padding``: int or per-axis tuple >= 0 (default ``k_eff // 2``, "same" for odd kernels and stride 1).
    ``T^T`` is ``conv_transpose`` with ``output_padding = n - ((m - 1) s - 2 p + k_eff)`` so that it maps back
    onto the ``input_size`` grid for any stride. ``iters`` >= 1; ``state``: the input vector of the previous call
    (warm start). All kernels of the batch and all groups run as one grouped convolution. Returns
    ``(value, state)``; ``value`` (per batch kernel, max over groups) is a lower estimate converging to
    ``||T||_2`` and is differentiable (``||T v||`` with ``v`` fixed). Raises ``TypeError``/``ValueError``.
    """
    check_int(iters, "iters", low=1)
    K, geo = _full_kernel(weight, stride, dilation, groups, spatial_dims)
    d = geo.spatial_dims
    ks = K.shape[-d:]
    n = _sizes(input_size, d, ks)
    pad = tuple(k // 2 for k in ks) if padding is None else _tuple_nonneg(padding, d)
    m = tuple((ni + 2 * p - k) // s + 1 for ni, p, k, s in zip(n, pad, ks, geo.stride))
    out_pad = tuple(ni - ((mi - 1) * s - 2 * p + k) for ni, mi, p, k, s in zip(n, m, pad, ks, geo.stride))
    if any(op >= s and op > 0 for op, s in zip(out_pad, geo.stride)):
        raise ValueError(f"padding {pad} too large for kernel {tuple(ks)} and input {n}")
    lead = K.shape[:-d - 3]
    g, co, ci = K.shape[-d - 3:-d]
    L = math.prod(lead) * g
    cdt = torch.float64 if K.dtype == torch.float64 else torch.float32
    W = K.to(cdt).reshape(L * co, ci, *ks)
    conv, convT = _CONV[d]
    fwd = lambda x, w: conv(x, w, stride=geo.stride, padding=pad, groups=L)
    with torch.no_grad():
        Wd = W.detach()
        if state is None:
            x = torch.randn(1, L * ci, *n, dtype=cdt, device=K.device, generator=generator)
            if all(st == 1 for st in geo.stride):
                x = 0.01 * x + _plane_wave_start(Wd.reshape(L, co, ci, *ks), n)
        else:
            if state.shape != (1, L * ci, *n):
                raise ValueError(f"state must have shape {(1, L * ci, *n)}, got {tuple(state.shape)}")
            x = state.to(device=K.device, dtype=cdt)

        def normalize(x):
            nrm = torch.linalg.vector_norm(x.reshape(L, -1), dim=-1).clamp_min(_TINY)
            return (x.reshape(L, -1) / nrm[:, None]).reshape(x.shape)

        x = normalize(x)
        for _ in range(iters):
            x = normalize(convT(fwd(x, Wd), Wd, stride=geo.stride, padding=pad, output_padding=out_pad, groups=L))
    y = fwd(x, W)
    value = torch.linalg.vector_norm(y.reshape(L, -1), dim=-1).reshape(*lead, g)
    return (value.amax(-1) if reduce_groups else value), x


def _plane_wave_start(W: torch.Tensor, n: tuple[int, ...]) -> torch.Tensor:
    """Start vector ``x[c, p] = Re(v_c exp(2 pi i <f, p/n>))`` at the frequency ``f`` with the largest
    ``sigma_1(K_hat(f))`` (``v`` its right singular vector): the top singular vector of the circular
    convolution, close to the zero-padded one, so power iteration starts near the answer."""
    L, ci, d = W.shape[0], W.shape[2], len(n)
    Kf = _fft_kernel(W, n)                                               # (L, F, co, ci)
    best = torch.linalg.svdvals(Kf)[..., 0].argmax(-1)                   # (L,)
    # singular vectors of the chosen frequency only (a full SVD at every frequency cost 2.5x more)
    _, _, Vh = torch.linalg.svd(Kf[torch.arange(L, device=W.device), best], full_matrices=False)
    v = Vh[:, 0].conj()                                                  # (L, ci)
    shape = list(n[:-1]) + [n[-1] // 2 + 1]
    phase = torch.zeros(L, *n, dtype=W.dtype, device=W.device)
    rem = best
    for a in reversed(range(d)):
        f = (rem % shape[a]).to(W.dtype)
        rem = rem // shape[a]
        grid = torch.arange(n[a], dtype=W.dtype, device=W.device).reshape([1] + [-1 if b == a else 1
                                                                              for b in range(d)])
        phase = phase + 2 * math.pi * f.reshape([-1] + [1] * d) * grid / n[a]
    wave = torch.polar(torch.ones_like(phase), phase)                    # (L, n..)
    x = (v.reshape(L, ci, *([1] * d)) * wave[:, None]).real
    return x.reshape(1, L * ci, *n)


def _tuple_nonneg(value, d):
    vals = (value,) * d if isinstance(value, int) and not isinstance(value, bool) else tuple(value)
    if len(vals) != d:
        raise ValueError(f"padding must be an int or a tuple of {d} ints, got {value!r}")
    for v in vals:
        check_int(v, "padding", low=0)
    return vals
