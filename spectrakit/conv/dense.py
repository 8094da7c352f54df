"""Dense Jacobian of a small convolution: the ground-truth oracle for tests and examples.

``T`` is the ``(c_out prod(m)) x (c_in prod(n))`` matrix of ``x -> conv(x)`` (Grishina, Gorbunov and Rakhuba 2024 eq.
(1)), built by applying
the convolution to every basis image; ``||T||_2`` is then its largest singular value (float64 SVD).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from spectrakit._checks import check_choice
from spectrakit.conv.kernel import _tuple, read_conv

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def dense_jacobian(weight, input_size, *, stride=1, padding=None, dilation=1, groups: int = 1,
                   spatial_dims: int = 2, padding_mode: str = "zeros", max_size: int = 20000) -> torch.Tensor:
    """The matrix ``T`` with ``vec(conv(x)) = T vec(x)`` for one kernel ``(c_out, c_in/groups, k..)`` (float64).

    ``padding``: int/tuple >= 0, default ``k_eff // 2`` (zeros mode). ``padding_mode``: ``"zeros"`` or
    ``"circular"`` (then the input is wrapped by ``k_eff - 1`` in total per axis and ``padding`` is ignored).
    ``max_size`` bounds ``c_in prod(n)`` (the number of basis images). Raises ``ValueError`` for batched
    kernels or too large problems.
    """
    weight, geo = read_conv(weight, stride=stride, dilation=dilation, groups=groups, spatial_dims=spatial_dims)
    check_choice(padding_mode, "padding_mode", ("zeros", "circular"))
    d = geo.spatial_dims
    if weight.ndim != d + 2:
        raise ValueError(f"dense_jacobian takes one kernel of {d + 2} dims, got shape {tuple(weight.shape)}")
    n = _tuple(input_size, "input_size", d)
    ks = weight.shape[-d:]
    k_eff = [r * (k - 1) + 1 for r, k in zip(geo.dilation, ks)]
    pad = tuple(k // 2 for k in k_eff) if padding is None else _tuple(padding, "padding", d) if padding else (0,) * d
    c_in = weight.shape[-d - 1] * geo.groups
    N = c_in * math.prod(n)
    if N > max_size:
        raise ValueError(f"c_in * prod(input_size) = {N} exceeds max_size={max_size}")
    basis = torch.eye(N, dtype=torch.float64, device=weight.device).reshape(N, c_in, *n)
    w = weight.detach().to(torch.float64)
    if padding_mode == "circular":
        # total padding k_eff - 1 (left (k_eff-1)//2): a true circular convolution with prod(n/s) outputs
        p = []
        for k in reversed(k_eff):
            p += [(k - 1) // 2, k - 1 - (k - 1) // 2]
        basis = F.pad(basis, p, mode="circular")
        pad = 0
    out = _CONV[d](basis, w, stride=geo.stride, padding=pad, dilation=geo.dilation, groups=geo.groups)
    return out.reshape(N, -1).T
