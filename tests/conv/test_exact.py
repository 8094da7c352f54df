"""exact_circular / exact_zero_pad / gram_bound / f4_bound against the dense Jacobian (float64 SVD)."""

import math

import pytest
import torch

from spectrakit.conv import dense_jacobian, exact_circular, exact_zero_pad, f4_bound, gram_bound, tn_bound

CASES = [  # shape, stride, n, dilation, groups
    ((4, 3, 3, 3), 1, 6, 1, 1), ((3, 4, 3, 2), 2, 6, 1, 1), ((4, 3, 3, 3), 3, 6, 1, 1), ((4, 4, 3, 3), 1, 8, 2, 1),
    ((4, 2, 3, 3), 2, 8, 1, 2), ((4, 2, 3), 2, 8, 1, 1), ((2, 3, 3, 3, 3), 1, 4, 1, 1), ((3, 3, 1, 1), 1, 5, 1, 1),
]


def _dense_norm(K, n, s, dil, g, mode):
    d = K.ndim - 2
    T = dense_jacobian(K, n, stride=s, dilation=dil, groups=g, spatial_dims=d, padding_mode=mode)
    return torch.linalg.matrix_norm(T, ord=2)


@pytest.mark.parametrize("shape,s,n,dil,g", CASES)
@pytest.mark.parametrize("scale", [1.0, 1e-5, 1e5])
def test_exact_circular_and_gram(shape, s, n, dil, g, scale):
    K = torch.randn(*shape, dtype=torch.float64) * scale
    kw = dict(stride=s, dilation=dil, groups=g, spatial_dims=len(shape) - 2)
    t = _dense_norm(K, n, s, dil, g, "circular")
    torch.testing.assert_close(exact_circular(K, n, **kw), t, rtol=1e-6, atol=0)
    gb = gram_bound(K, n, iters=8, **kw)
    assert t * (1 - 1e-9) <= gb <= t * 1.01


@pytest.mark.parametrize("shape,s,n,dil,g", CASES)
def test_exact_zero_pad_and_bounds(shape, s, n, dil, g):
    K = torch.randn(*shape, dtype=torch.float64)
    kw = dict(stride=s, dilation=dil, groups=g, spatial_dims=len(shape) - 2)
    t = _dense_norm(K, n, s, dil, g, "zeros")
    # float32 power iteration (float64 conv_transpose is ~10x slower on CPU); gaps down to 0.9986 need ~4000 its
    ex, state = exact_zero_pad(K.float(), n, iters=4000, **kw)
    torch.testing.assert_close(ex.double(), t, rtol=1e-4, atol=0)
    ex2, _ = exact_zero_pad(K.float(), n, iters=1, state=state, **kw)  # warm start stays converged
    torch.testing.assert_close(ex2.double(), t, rtol=1e-4, atol=0)
    assert gram_bound(K, n, padding="zero", **kw) >= t * (1 - 1e-9)
    f4, _ = f4_bound(K, **kw)
    tn, _ = tn_bound(K, **kw)
    assert f4 >= tn * (1 - 1e-6)            # TN is never looser than F4 (Lemma 1)
    if dil == 1:
        assert f4 >= t * (1 - 1e-6)


def test_exact_zero_pad_batched_gradient():
    K = torch.randn(2, 3, 4, 3, 3, dtype=torch.float64, requires_grad=True)
    v, _ = exact_zero_pad(K, 6, iters=1500)
    for i in range(2):
        torch.testing.assert_close(v[i], _dense_norm(K[i].detach(), 6, 1, 1, 1, "zeros"), rtol=1e-4, atol=0)
    v.sum().backward()
    # gradient of sigma_1 = u v^T contracted, compare with the dense top singular pair
    T = dense_jacobian(K[0].detach(), 6)
    U, S, Vh = torch.linalg.svd(T)
    Kp = K[0].detach().clone().requires_grad_()
    x = Vh[0].reshape(1, 4, 6, 6)
    y = torch.nn.functional.conv2d(x, Kp, padding=1)
    (torch.linalg.vector_norm(y)).backward()
    # the vector converges like sqrt of the value error: compare relative to the gradient norm
    assert torch.linalg.vector_norm(K.grad[0] - Kp.grad) < 2e-2 * torch.linalg.vector_norm(Kp.grad)


def test_f4_power_iteration_warm_matches_exact():
    K = torch.randn(8, 6, 3, 3, dtype=torch.float64)
    exact, _ = f4_bound(K)
    v, st = f4_bound(K, iters=500)
    torch.testing.assert_close(v, exact, rtol=1e-6, atol=0)
    v1, _ = f4_bound(K, state=st)
    torch.testing.assert_close(v1, exact, rtol=1e-6, atol=0)
    assert math.isfinite(float(v1))


@pytest.mark.parametrize("fn,args,kw,exc,msg", [
    (exact_circular, (torch.randn(3, 3, 5, 5), 4), {}, ValueError, "input_size"),
    (exact_circular, (torch.randn(3, 3, 3, 3), 7), {"stride": 2}, ValueError, "divisible"),
    (exact_zero_pad, (torch.randn(3, 3, 5, 5), 3), {}, ValueError, "input_size"),
    (exact_zero_pad, (torch.randn(3, 3, 3, 3), 8), {"iters": 0}, ValueError, "iters"),
    (exact_zero_pad, (torch.randn(3, 3, 3, 3), 8), {"padding": -1}, ValueError, "padding"),
    (gram_bound, (torch.randn(3, 3, 3, 3), 8), {"padding": "reflect"}, ValueError, "padding"),
    (exact_circular, (torch.randn(3, 3, 3, 3, dtype=torch.complex64), 8), {}, TypeError, "real floating"),
    (f4_bound, (torch.randn(3, 3),), {}, ValueError, "weight must have shape"),
])
def test_bad_inputs(fn, args, kw, exc, msg):
    with pytest.raises(exc, match=msg):
        fn(*args, **kw)
