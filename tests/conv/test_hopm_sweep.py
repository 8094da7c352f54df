"""The two-pass HOPM sweep (issue #4) against an independent mode-by-mode einsum reference (seed 001 Alg. 1)."""

import pytest
import torch

from spectrakit.conv import tensor_spectral_norm
from spectrakit.conv.tensor_norm import _random_starts, hopm, tensor_norm_at

LETTERS = "defghij"


def _reference_hopm(K, vectors, iters):
    """Plain Alg. 1: for each mode i in turn, u_i <- conj(K(u_1..I..u_D)) / ||.||, one einsum per mode."""
    D = K.ndim - 1
    Kc = K.to(vectors[0].dtype)
    modes = LETTERS[:D]
    us = [v.clone() for v in vectors]
    value = None
    for _ in range(iters):
        for i in range(D):
            others = [j for j in range(D) if j != i]
            spec = f"b{modes}," + ",".join(f"rb{modes[j]}" for j in others) + f"->rb{modes[i]}"
            y = torch.einsum(spec, Kc, *[us[j] for j in others])
            value = torch.linalg.vector_norm(y, dim=-1)
            us[i] = y.conj() / value[..., None]
    return us, value


@pytest.mark.parametrize("sizes", [(5, 4, 3), (4, 6, 3, 2), (3, 4, 2, 3, 2), (6, 5, 1, 1), (4, 3), (7, 12, 4, 4)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_sweep_matches_reference(sizes, dtype):
    g = torch.Generator().manual_seed(len(sizes) * 100 + sum(sizes))
    B, R = 3, 4
    K = torch.randn(B, *sizes, generator=g, dtype=dtype)
    starts = _random_starts((B,), sizes, R, dtype, "cpu", g)
    ref, ref_val = _reference_hopm(K.double(), [v.to(torch.complex128) for v in starts], 5)
    got, val = hopm(K, [v.clone() for v in starts], 5)
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    assert val.shape == (R, B) and all(v.shape == (R, B, n) for v, n in zip(got, sizes))
    torch.testing.assert_close(val.double(), ref_val, rtol=tol, atol=0)
    for u, r in zip(got, ref):
        torch.testing.assert_close(u.to(torch.complex128), r, rtol=tol, atol=tol)
    # the returned value is |K(u_1..u_D)| at the returned vectors
    modes = LETTERS[:len(sizes)]
    z = torch.einsum(f"b{modes}," + ",".join(f"rb{m}" for m in modes) + "->rb", K.double().to(torch.complex128),
                     *[u.to(torch.complex128) for u in got])
    torch.testing.assert_close(val.double(), z.abs(), rtol=tol, atol=0)


def test_sweep_zero_kernel_stays_finite():
    K = torch.zeros(2, 4, 3, 3, 3)
    starts = _random_starts((2,), (4, 3, 3, 3), 3, torch.float32, "cpu", torch.Generator().manual_seed(0))
    us, val = hopm(K, starts, 2)
    assert torch.all(val == 0) and all(torch.isfinite(torch.view_as_real(u)).all() for u in us)


@pytest.mark.parametrize("shape,nb", [((3, 5, 4, 3, 3), 1), ((4, 6, 2), 0), ((2, 2, 3, 2, 2, 2), 1)])
def test_value_and_gradient_at_returned_vectors(shape, nb):
    """The value passed on from HOPM equals a fresh pass over K, and so does the Prop. 1 gradient."""
    torch.manual_seed(0)
    K = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    val, st = tensor_spectral_norm(K, batch_dims=nb, iters=30, restarts=4)
    fresh = tensor_norm_at(K, st.vectors, nb)                      # z recomputed from K
    torch.testing.assert_close(val, fresh, rtol=1e-12, atol=0)
    w = torch.randn(val.shape, dtype=torch.float64)
    (g1,) = torch.autograd.grad((val * w).sum(), K)
    (g2,) = torch.autograd.grad((fresh * w).sum(), K)
    torch.testing.assert_close(g1, g2, rtol=1e-10, atol=1e-12)
    # Prop. 1 from the definition: d|z|/dK = Re(conj(z)/|z| u_1 o..o u_D)
    modes = LETTERS[:len(shape) - nb]
    lead = "a" if nb else ""
    outer = torch.einsum(",".join(f"{lead}{m}" for m in modes) + f"->{lead}{modes}", *st.vectors)
    z = torch.einsum(f"{lead}{modes},{lead}{modes}->{lead}", K.detach().to(outer.dtype), outer)
    g3 = ((z.conj() / z.abs() * w).reshape(*w.shape, *([1] * (len(shape) - nb))) * outer).real
    torch.testing.assert_close(g1, g3, rtol=1e-10, atol=1e-12)


def test_too_few_modes():
    with pytest.raises(ValueError, match="at least 2 modes"):
        tensor_spectral_norm(torch.randn(3, 4), batch_dims=1)
