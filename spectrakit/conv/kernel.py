"""Turn a convolution (kernel tensor or ``nn.ConvNd``) into the kernel whose norms the bounds use.

Grishina, Gorbunov and Rakhuba 2024 Thm 4.3 (strided convolutions): a convolution with stride ``s`` equals a stride-1
convolution
(on the ``s``-subsampled grid) with the reshaped kernel

    Q[o, (c, p_1..p_d), a_1..a_d] = K[o, c, a_1 s_1 + p_1, ..., a_d s_d + p_d],

with ``K`` zero-padded to a multiple of ``s_i`` *per spatial axis*, so ``Q`` has shape
``(c_out, c_in * prod(s), ceil(k_1/s_1), ..., ceil(k_d/s_d))``.

Dilation ``r`` along an axis with stride 1 does not change the bound: the Jacobian is then a permutation
of a direct sum of ``r`` undilated convolutions on the residue classes of that axis, each a sub-matrix of the
same multilevel Toeplitz operator. Along an axis with stride > 1 the kernel is enlarged to ``r (k - 1) + 1``
taps with zeros in between (still a valid bound, possibly looser).

Groups: the Jacobian is block diagonal over groups, so a grouped kernel ``(c_out, c_in/g, ...)`` is viewed as a
batch of ``g`` kernels ``(c_out/g, c_in/g, ...)``; the layer norm is the maximum over the group axis.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from spectrakit._checks import check_int, check_tensor

CONV_TYPES = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


@dataclass(frozen=True)
class ConvGeometry:
    """Stride, dilation and groups of a convolution with ``spatial_dims`` spatial axes."""

    spatial_dims: int
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int


def _tuple(value, name: str, d: int) -> tuple[int, ...]:
    vals = (value,) * d if isinstance(value, int) and not isinstance(value, bool) else tuple(value)
    if len(vals) != d:
        raise ValueError(f"{name} must be an int or a tuple of {d} ints (one per spatial axis), got {value!r}")
    for v in vals:
        check_int(v, name, low=1)
    return vals


def read_conv(weight, *, stride=1, dilation=1, groups: int = 1, spatial_dims: int = 2,
              finite: bool = True) -> tuple[torch.Tensor, ConvGeometry]:
    """Validate a kernel tensor or ``nn.ConvNd`` and return ``(kernel, geometry)``.

    ``weight``: a real floating tensor of shape ``(..., c_out, c_in/groups, k_1, ..., k_d)`` with
    ``d = spatial_dims`` in {1, 2, 3} (leading dims are a batch of same-shaped kernels), or an ``nn.Conv1d/2d/3d``
    whose ``stride``, ``dilation`` and ``groups`` are used (the keyword arguments are then ignored).

    Raises ``TypeError`` for non-tensors, complex/integer dtypes, unsupported modules; ``ValueError`` for too few
    dims, ``stride``/``dilation`` < 1, ``groups`` not dividing ``c_out``.
    """
    if isinstance(weight, nn.Module):
        if not isinstance(weight, CONV_TYPES):
            raise TypeError(f"weight must be a tensor or nn.Conv1d/Conv2d/Conv3d, got {type(weight).__name__}")
        mod = weight
        spatial_dims = mod.weight.ndim - 2
        stride, dilation, groups, weight = mod.stride, mod.dilation, mod.groups, mod.weight
    check_int(spatial_dims, "spatial_dims", low=1, high=3)
    check_tensor(weight, "weight", finite=finite)
    if weight.ndim < spatial_dims + 2:
        raise ValueError(f"weight must have shape (..., c_out, c_in, k_1..k_{spatial_dims}) for a "
                         f"{spatial_dims}-D convolution (at least {spatial_dims + 2} dims), got shape "
                         f"{tuple(weight.shape)}")
    check_int(groups, "groups", low=1)
    c_out = weight.shape[-spatial_dims - 2]
    if c_out % groups:
        raise ValueError(f"groups must divide c_out={c_out}, got groups={groups}")
    if weight.numel() == 0:
        raise ValueError(f"weight must be non-empty, got shape {tuple(weight.shape)}")
    geo = ConvGeometry(spatial_dims, _tuple(stride, "stride", spatial_dims),
                       _tuple(dilation, "dilation", spatial_dims), groups)
    return weight, geo


def split_groups(weight: torch.Tensor, geo: ConvGeometry) -> torch.Tensor:
    """``(..., c_out, c_in/g, k..)`` -> ``(..., g, c_out/g, c_in/g, k..)`` (a batch of per-group kernels)."""
    d = geo.spatial_dims
    lead, (c_out, c_in), ks = weight.shape[:-d - 2], weight.shape[-d - 2:-d], weight.shape[-d:]
    return weight.reshape(*lead, geo.groups, c_out // geo.groups, c_in, *ks)


def dilate(weight: torch.Tensor, geo: ConvGeometry, *, all_axes: bool = False) -> torch.Tensor:
    """Insert ``dilation - 1`` zeros between taps along every axis whose stride is > 1 (see module doc), or
    along every axis when ``all_axes`` (the true dilated kernel, used by the exact references)."""
    d = geo.spatial_dims
    for i, (s, r) in enumerate(zip(geo.stride, geo.dilation)):
        if r == 1 or (s == 1 and not all_axes):
            continue
        ax = weight.ndim - d + i
        k = weight.shape[ax]
        shape = list(weight.shape)
        shape[ax] = r * (k - 1) + 1
        out = weight.new_zeros(shape)
        idx = [slice(None)] * weight.ndim
        idx[ax] = slice(None, None, r)
        out[tuple(idx)] = weight
        weight = out
    return weight


def strided_reshape(weight: torch.Tensor, stride: tuple[int, ...]) -> torch.Tensor:
    """Grishina, Gorbunov and Rakhuba 2024 Thm 4.3: ``K (.., c_out, c_in, k_1..k_d)`` -> ``Q (.., c_out, c_in prod(s),
    ceil(k_i/s_i)..)``.

    ``Q[o, (c, p_1..p_d), a_1..a_d] = K[o, c, a_1 s_1 + p_1, ...]`` with ``K`` zero-padded per axis to a
    multiple of ``s_i``. Identity when all strides are 1. Differentiable (pad/reshape/permute only).
    """
    d = len(stride)
    if all(s == 1 for s in stride):
        return weight
    ks = weight.shape[-d:]
    pad = []
    for k, s in zip(reversed(ks), reversed(stride)):
        pad += [0, (-k) % s]
    weight = F.pad(weight, pad)
    lead, (c_out, c_in) = weight.shape[:-d - 2], weight.shape[-d - 2:-d]
    nl = len(lead)
    split = []
    for k, s in zip(weight.shape[-d:], stride):
        split += [k // s, s]
    q = weight.reshape(*lead, c_out, c_in, *split)
    # axes after reshape: lead.., c_out, c_in, a_1, p_1, a_2, p_2, ...
    base = nl + 2
    perm = list(range(nl)) + [nl, nl + 1] + [base + 2 * i + 1 for i in range(d)] + [base + 2 * i for i in range(d)]
    q = q.permute(perm)
    return q.reshape(*lead, c_out, c_in * _prod(stride), *(k // s for k, s in zip(weight.shape[-d:], stride)))


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= int(x)
    return out


def effective_kernel(weight, *, stride=1, dilation=1, groups: int = 1, spatial_dims: int = 2,
                     finite: bool = True) -> tuple[torch.Tensor, ConvGeometry]:
    """The kernel ``Q`` whose tensor norm bounds the layer: groups split into a batch axis, dilation applied
    on strided axes, then the strided reshape of Thm 4.3. Returns ``(Q, geometry)`` where ``Q`` has shape
    ``(..., groups, c_out/g, c_in/g * prod(s), k'_1..k'_d)``. See :func:`read_conv` for accepted inputs."""
    weight, geo = read_conv(weight, stride=stride, dilation=dilation, groups=groups, spatial_dims=spatial_dims,
                            finite=finite)
    return strided_reshape(dilate(split_groups(weight, geo), geo), geo.stride), geo
