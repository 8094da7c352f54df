"""msign / orthogonalize against float64 numpy SVD oracles."""

import numpy as np
import pytest
import torch

from spectrakit.linalg import msign, orthogonalize
from spectrakit.linalg._testing import matrix_with_spectrum, np64, rel_err, svd_map

SHAPES = [(64, 192), (96, 96), (128, 48)]


def _svals_on_range(out, x, lb):
    """Singular values of out restricted to the right singular vectors of x with s >= lb * s_max."""
    u, s, vh = np.linalg.svd(np64(x), full_matrices=False)
    keep = s >= lb * s[..., :1]
    o = np64(out)
    # out ~ U diag(d) V^T: d_i = u_i^T out v_i
    d = np.einsum("...mi,...mn,...in->...i", u, o, vh)
    return d[keep]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-3), (torch.bfloat16, 3e-2), (torch.float64, 1e-6)])
def test_msign_accuracy_on_singular_values(shape, dtype, tol):
    m, n = shape
    k = min(m, n)
    s = torch.logspace(0, -3, k)  # condition number 1e3 = 1 / lower_bound
    x = matrix_with_spectrum(m, n, s).to(dtype)  # the oracle sees the rounded input
    out = msign(x, lower_bound=1e-3)
    assert out.dtype == dtype and out.shape == x.shape
    d = _svals_on_range(out, x, 1e-3)
    assert np.abs(d - 1).max() <= tol
    # and out is close to the exact polar factor (orthogonal directions too)
    assert rel_err(out, svd_map(x, np.ones_like)) <= 2 * tol


@pytest.mark.parametrize("lower_bound", [1e-3, 1e-4, 1e-6])
def test_msign_bf16_compute_of_fp32_input_resolves_down_to_the_lower_bound(lower_bound):
    # fp32 input, dtype=bf16: the fp32 steps see the input itself (it used to be rounded to bf16 first, which
    # lost every singular value below ~4e-3 s_max / sqrt(m): deviation 0.71 at 1e-4, 1.1 at 1e-6), and they
    # last until the tracked lower bound reaches schedules.BF16_SWITCH (a fixed 2 steps left 0.27 at 1e-6)
    x = matrix_with_spectrum(128, 384, torch.logspace(0, -7, 128)).float()
    out = msign(x, lower_bound=lower_bound, dtype=torch.bfloat16)
    assert out.dtype == torch.float32
    d = _svals_on_range(out, x, lower_bound)
    assert np.abs(d - 1).max() <= 3e-2


def test_msign_below_lower_bound_is_monotone_and_bounded():
    s = torch.logspace(0, -8, 48)
    x = matrix_with_spectrum(48, 80, s)
    d = _svals_on_range(msign(x.float(), lower_bound=1e-3), x, 0.0)
    assert np.all(d <= 1 + 1e-3) and np.all(d >= -1e-6)
    assert np.all(np.diff(d) <= 1e-4)  # decreasing with s (up to rounding)


@pytest.mark.parametrize("schedule", ["muon", "newton_schulz", "polar_express", "exact"])
def test_schedules_ranges(schedule):
    x = torch.randn(64, 160)
    s = torch.linalg.svdvals(msign(x, schedule=schedule).double())
    if schedule == "muon":
        assert s.min() > 0.6 and s.max() < 1.25
    else:
        lo = 0.5 if schedule == "newton_schulz" else 0.999
        assert s.min() > lo and s.max() < 1.001


@pytest.mark.parametrize("scale", [1e-30, 1e-8, 1.0, 1e8, 1e30])
def test_huge_and_tiny_norms(scale):
    x = torch.randn(32, 48, dtype=torch.float64)
    ref = msign(x, schedule="exact")
    out = msign((x * scale).float())
    assert torch.isfinite(out).all()
    assert rel_err(out, np64(ref)) < 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.float16])
def test_zero_input_gives_zero(dtype):
    for schedule in ["polar_express", "muon", "exact"]:
        out = msign(torch.zeros(3, 5, 7, dtype=dtype), schedule=schedule)
        assert out.dtype == dtype and torch.equal(out, torch.zeros_like(out))


def test_rank_deficient_zero_singular_values_stay_zero():
    s = torch.tensor([3.0, 1.0, 0.5, 0.0, 0.0, 0.0], dtype=torch.float64)
    x = matrix_with_spectrum(20, 30, s[:3])
    out = msign(x.float())
    sv = torch.linalg.svdvals(out.double())
    assert torch.allclose(sv[:3], torch.ones(3, dtype=torch.float64), atol=1e-3)
    assert sv[3:].max() < 1e-3
    ex = torch.linalg.svdvals(msign(x, schedule="exact"))
    assert ex[3:].max() < 1e-12


def test_batched_equals_loop_and_noncontiguous():
    x = torch.randn(4, 3, 24, 40)
    out = msign(x)
    for i in range(4):
        for j in range(3):
            assert torch.allclose(out[i, j], msign(x[i, j]), atol=1e-5)
    xt = torch.randn(3, 40, 24).transpose(-1, -2)  # non-contiguous (3, 24, 40)
    assert not xt.is_contiguous()
    assert torch.allclose(msign(xt), msign(xt.contiguous()), atol=1e-6)
    assert torch.allclose(orthogonalize(xt), msign(xt), atol=0)


def test_gradient_exists():
    x = torch.randn(6, 9, dtype=torch.float64, requires_grad=True)
    (msign(x) * torch.randn(6, 9, dtype=torch.float64)).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("bad,exc", [
    (dict(X=torch.randn(5)), ValueError),
    (dict(X=torch.tensor([[1.0, float("nan")]])), ValueError),
    (dict(X=torch.ones(2, 2, dtype=torch.int64)), TypeError),
    (dict(X=torch.randn(3, 3), schedule="nope"), ValueError),
    (dict(X=torch.randn(3, 3), steps=0), ValueError),
    (dict(X=torch.randn(3, 3), lower_bound=0.0), ValueError),
    (dict(X=torch.randn(3, 3), lower_bound=1.5), ValueError),
    (dict(X=torch.randn(3, 3), dtype=torch.int32), TypeError),
])
def test_invalid_arguments(bad, exc):
    x = bad.pop("X")
    with pytest.raises(exc) as info:
        msign(x, **bad)
    name = next(iter(bad), "X")
    assert name in str(info.value) or name == "dtype"


def _keller_jordan_newton_schulz5(G: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """Hand-written copy of the published Muon loop (Keller Jordan, ``zeropower_via_newtonschulz5``)."""
    a, b, c = (3.4445, -4.7750, 2.0315)
    X = G.bfloat16()
    if G.size(-2) > G.size(-1):
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + eps)
    for _ in range(steps):
        A = X @ X.mT
        B = b * A + c * A @ A
        X = a * X + B @ X
    if G.size(-2) > G.size(-1):
        X = X.mT
    return X


@pytest.mark.parametrize("shape", [(32, 80), (80, 32), (48, 48), (3, 40, 24)])
@pytest.mark.parametrize("in_dtype", [torch.float32, torch.bfloat16])
def test_muon_frobenius_reproduces_published_loop_exactly(shape, in_dtype):
    """Bit for bit ``torch.optim.Muon``'s Newton-Schulz (fused addmm rounding); Keller Jordan's loop
    (separately rounded terms) to bf16 rounding."""
    _zeropower_via_newtonschulz = pytest.importorskip(
        "torch.optim._muon", reason="torch.optim.Muon (the oracle) is in torch >= 2.9")._zeropower_via_newtonschulz

    def torch_ns(x, steps=5):
        return torch.stack([_zeropower_via_newtonschulz(m, (3.4445, -4.7750, 2.0315), steps, 1e-7)
                            for m in x.reshape(-1, *x.shape[-2:])]).reshape(x.shape)

    g = torch.randn(*shape).to(in_dtype)
    out = msign(g, schedule="muon", normalize="frobenius", dtype=torch.bfloat16)
    assert out.dtype == in_dtype and out.shape == g.shape
    assert torch.equal(out.bfloat16(), torch_ns(g))
    ref = _keller_jordan_newton_schulz5(g).float()
    assert (out.float() - ref).norm() <= 1e-1 * ref.norm()  # measured 2e-2 .. 4e-2 (bf16 rounding)
    # non-contiguous input and a different step count
    gt = g.mT
    assert torch.equal(orthogonalize(gt, schedule="muon", normalize="frobenius", dtype=torch.bfloat16,
                                     steps=3).bfloat16(), torch_ns(gt, steps=3))
    # the default spectral-bound normalisation is a different (tighter) start
    assert not torch.equal(msign(g, schedule="muon", dtype=torch.bfloat16).bfloat16(), ref)


def test_normalize_rejects_unknown():
    with pytest.raises(ValueError, match="normalize"):
        msign(torch.randn(4, 5), normalize="spectral")
    with pytest.raises(TypeError, match="batched"):
        msign(torch.randn(4, 5), normalize="frobenius", batched=1)
    with pytest.raises(ValueError, match="batched applies to normalize='frobenius'"):
        msign(torch.randn(4, 5), batched=True)


@pytest.mark.parametrize("shape", [(40, 24), (24, 40), (2, 3, 40, 24), (3, 24, 24)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_muon_frobenius_loops_agree_bit_for_bit(shape, dtype):
    """The CPU loop (one matrix through all steps: torch.optim.Muon's own calls, written into the output in
    the input's layout and dtype) and the batched bmm/baddbmm loop (used on GPUs) give the same bits, for
    tall, wide and square inputs, 4-D batches and a non-contiguous input; the result is contiguous, in the
    input's dtype, and both loops have the same gradient (float64)."""
    from spectrakit.linalg.polar import _frobenius_iterate, to_wide
    from spectrakit.linalg.schedules import SCHEDULES

    coeffs = SCHEDULES["muon"](5, None)
    for g in (torch.randn(*shape), torch.randn(*shape[:-2], shape[-1], shape[-2]).mT):
        x, transposed = to_wide(g.to(dtype))
        a = _frobenius_iterate(x, coeffs, torch.float32, transposed, per_matrix=True)
        b = _frobenius_iterate(x, coeffs, torch.float32, transposed, per_matrix=False)
        assert a.shape == g.shape and a.dtype == torch.float32 and a.is_contiguous() and b.is_contiguous()
        assert torch.equal(a, b)
        assert torch.equal(msign(g, schedule="muon", normalize="frobenius", dtype=dtype), a)
        assert torch.equal(msign(g, schedule="muon", normalize="frobenius", dtype=dtype, batched=False), a)
    x = torch.randn(2, 6, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 6, 4, dtype=torch.float64)
    grads = [torch.autograd.grad((_frobenius_iterate(x.mT, coeffs, None, True, per_matrix=p) * w).sum(), x)[0]
             for p in (True, False)]
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", [(3, 40, 24), (2, 24, 40), (2, 2, 16, 16)])
@pytest.mark.parametrize("batched", [False, True])
def test_msign_out_equals_the_returned_result(shape, batched):
    """``msign(..., out=)`` writes the same bits as the returned result into ``out``, also when ``out`` is the
    input itself (each matrix is read before its result is written), for the Frobenius loop (per matrix and
    batched; tall, wide, 4-D) and, by a copy, for the other routes; a non-contiguous ``out`` is written too."""
    g = torch.randn(*shape) * 3.0
    ref = msign(g, schedule="muon", normalize="frobenius", dtype=torch.bfloat16, batched=batched)
    out = torch.full_like(g, float("nan"))
    assert msign(g, schedule="muon", normalize="frobenius", dtype=torch.bfloat16, batched=batched, out=out) is out
    assert torch.equal(out, ref)
    x = g.clone()
    assert msign(x, schedule="muon", normalize="frobenius", dtype=torch.bfloat16, batched=batched, out=x) is x
    assert torch.equal(x, ref)
    nc = torch.full((*shape[:-2], shape[-1], shape[-2]), float("nan")).mT  # non-contiguous: computed, then copied
    msign(g, schedule="muon", normalize="frobenius", dtype=torch.bfloat16, batched=batched, out=nc)
    assert torch.equal(nc, ref)
    x = g.clone()
    assert torch.equal(msign(x, out=x), msign(g))  # the default route: computed, then copied into out


def test_msign_out_is_checked():
    g = torch.randn(8, 12)
    with pytest.raises(TypeError, match="out must be a tensor of X's dtype"):
        msign(g, out=torch.empty(8, 12, dtype=torch.float64))
    with pytest.raises(TypeError, match="out must be a tensor"):
        msign(g, out=[0.0])
    with pytest.raises(ValueError, match="out must have X's shape"):
        msign(g, out=torch.empty(12, 8))
