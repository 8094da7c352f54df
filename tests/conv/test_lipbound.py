"""lipbound: a certified, input-size independent upper bound, checked against the dense Jacobian (float64
SVD) and against the supremum of the generating function (exact_circular on a fine grid)."""

import functools
import math
import zlib

import pytest
import torch

from spectrakit.conv import dense_jacobian, exact_circular, lipbound, tn_bound
from spectrakit.conv.exact import LIPBOUND_ALPHA

CASES = [  # shape, stride, n, dilation, groups
    ((4, 3, 3, 3), 1, 6, 1, 1), ((3, 4, 3, 2), 2, 6, 1, 1), ((4, 3, 3, 3), 3, 6, 1, 1), ((4, 4, 3, 3), 1, 8, 2, 1),
    ((4, 2, 3, 3), 2, 8, 1, 2), ((4, 2, 3), 2, 8, 1, 1), ((2, 3, 3, 3, 3), 1, 4, 1, 1), ((3, 3, 1, 1), 1, 5, 1, 1),
    ((3, 3, 5, 5), 1, 7, 1, 1), ((2, 2, 4, 4), 1, 6, 1, 1),
]


KINDS = ["gauss", "rank1", "single_tap"]


def _kernel(shape, kind):
    gen = torch.Generator().manual_seed(zlib.crc32(repr((shape, kind)).encode()) % 1000)  # hash() varies per run
    K = torch.randn(*shape, dtype=torch.float64, generator=gen)
    if kind == "rank1":  # spatially rank-1: the worst case of the sqrt(hw) factor of TN/F4
        K = K[..., :1].expand(shape).clone() if len(shape) == 3 else K[..., :1, :1].expand(shape).clone()
    if kind == "single_tap":
        K = torch.zeros(shape, dtype=torch.float64)
        K[(slice(None), slice(None)) + tuple(k // 2 for k in shape[2:])] = torch.randn(*shape[:2], generator=gen,
                                                                                          dtype=torch.float64)
    return K


@functools.cache
def _bounds(shape, s, dil, g):
    """lipbound and the fine circular grid's norm of every kind's kernel of one case, from one batched call
    each (neither depends on the padding or the input size, so every test of the case shares them)."""
    K = torch.stack([_kernel(shape, kind) for kind in KINDS])
    d = len(shape) - 2
    kw = dict(stride=s, dilation=dil, groups=g, spatial_dims=d)
    lb, fine = lipbound(K, **kw), exact_circular(K, 64 * s if d < 3 else 16 * s, **kw)
    assert lb.shape == fine.shape == (len(KINDS),)
    return lb, fine


@pytest.mark.parametrize("shape,s,n,dil,g", CASES)
@pytest.mark.parametrize("mode", ["zeros", "circular"])
@pytest.mark.parametrize("kind", KINDS)
def test_lipbound_bounds_the_dense_norm_at_any_padding(shape, s, n, dil, g, mode, kind):
    K = _kernel(shape, kind)
    d = len(shape) - 2
    kw = dict(stride=s, dilation=dil, groups=g, spatial_dims=d)
    T = dense_jacobian(K, n, padding_mode=mode, **kw)
    t = torch.linalg.matrix_norm(T, ord=2)
    lbs, fines = _bounds(shape, s, dil, g)
    lb, fine = lbs[KINDS.index(kind)], fines[KINDS.index(kind)]
    assert lb >= t * (1 - 1e-9)
    # and it is within its correction factor of the supremum (a fine circular grid approaches it from below)
    if n % s == 0:
        assert lb <= fine / (1 - LIPBOUND_ALPHA) * 1.05


def test_lipbound_converges_to_the_supremum_and_is_independent_of_the_input():
    K = torch.randn(8, 6, 3, 3, dtype=torch.float64)
    sup = exact_circular(K, 512)
    for S, alpha in ((32, 2 * math.pi / 32), (128, 2 * math.pi / 128), (512, 2 * math.pi / 512)):
        lb = lipbound(K, samples=S)
        assert sup * (1 - 1e-9) <= lb <= sup / (1 - alpha) * (1 + 1e-9)
    assert lb <= sup * 1.013  # samples=512
    for n in (6, 17, 64):  # one bound for every input size
        assert exact_circular(K, n) <= lipbound(K)


def test_lipbound_batched_groups_module_and_tn_comparison():
    K = torch.randn(3, 8, 4, 3, 3)
    out = lipbound(K)
    for i in range(3):
        torch.testing.assert_close(out[i], lipbound(K[i]))
    conv = torch.nn.Conv2d(8, 8, 3, groups=2, stride=2, padding=1)
    assert torch.allclose(lipbound(conv), lipbound(conv.weight, groups=2, stride=2))
    per_group = lipbound(conv, reduce_groups=False)
    assert per_group.shape == (2,) and torch.allclose(per_group.amax(), lipbound(conv))
    W = torch.randn(16, 16, 3, 3, requires_grad=True)
    lipbound(W).backward()
    assert torch.isfinite(W.grad).all() and W.grad.abs().sum() > 0
    # input-size independent like TN; for Gaussian kernels looser than TN but much tighter than sqrt(hw) x
    tn, _ = tn_bound(W.detach())
    assert lipbound(W.detach()) < 3 * tn


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(samples=2), ValueError, "samples"),            # below the kernel size
    (dict(samples=3), ValueError, "too few"),            # alpha = 2 pi / 3 >= 1
    (dict(samples=(8, 0)), ValueError, "samples"),
    (dict(stride=0), ValueError, "stride"),
])
def test_lipbound_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        lipbound(torch.randn(4, 4, 3, 3), **kwargs)
    with pytest.raises(TypeError):
        lipbound(torch.randint(0, 3, (4, 4, 3, 3)))
