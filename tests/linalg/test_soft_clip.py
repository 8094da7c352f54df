"""soft_clip (polar, newton_schulz, exact) against the float64 numpy SVD oracle."""

import math

import numpy as np
import pytest
import torch

from spectrakit._checks import no_value_checks
from spectrakit.linalg import soft_clip
from spectrakit.linalg._testing import matrix_with_spectrum, np64, rel_err, spiked, svd_map
from spectrakit.linalg.soft_clip import FAST_MAX_RATIO

SHAPES = [(64, 192), (96, 96), (128, 48)]
RATIOS = [1e-2, 1.0, 30.0, 300.0, 1e3, 1e4]


def _oracle(x, c):
    return svd_map(x, lambda s: s / np.sqrt(1 + (s / c) ** 2))


def _input(shape, kind):
    m, n = shape
    if kind == "spike":
        return spiked(m, n, 1e4)
    if kind == "illcond":
        return matrix_with_spectrum(m, n, torch.logspace(0, -6, min(m, n)))
    return torch.randn(m, n, dtype=torch.float64)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", ["gauss", "spike", "illcond"])
def test_polar_fp32_accuracy_all_ratios(shape, kind):
    x64 = _input(shape, kind)
    x = x64.float()
    smax = float(torch.linalg.matrix_norm(x.double(), 2))
    for ratio in RATIOS:
        c = smax / ratio
        err = rel_err(soft_clip(x, c), _oracle(x, c))
        assert err <= 1e-3, (ratio, err)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", ["gauss", "spike", "illcond"])
def test_polar_bf16_accuracy_up_to_1e3(shape, kind):
    # illcond (6 decades) at ratio 1e3 needs the third fp32 step: with two it measured 3.1e-2..4.2e-2
    m, n = shape
    x = (spiked(m, n, 1e3) if kind == "spike" else _input(shape, kind)).float()
    smax = float(torch.linalg.matrix_norm(x.double(), 2))
    for ratio in [1e-2, 1.0, 30.0, 1e3]:
        c = smax / ratio
        out = soft_clip(x, c, dtype=torch.bfloat16)
        assert out.dtype == torch.float32
        assert rel_err(out, _oracle(x, c)) <= 3e-2, ratio
    # bf16 input, bf16 output
    xb = x.bfloat16()
    outb = soft_clip(xb, smax / 30)
    assert outb.dtype == torch.bfloat16 and rel_err(outb, _oracle(xb, smax / 30)) <= 3e-2


def test_polar_bf16_limit_beyond_1e3_is_documented():
    # Beside a 1e4 spike bf16 cannot represent the bulk: the error is large (documented limitation).
    x = torch.randn(96, 96, dtype=torch.float64).float()
    c = float(torch.linalg.matrix_norm(x.double(), 2)) / 1e4
    assert rel_err(soft_clip(x, c, dtype=torch.bfloat16), _oracle(x, c)) > 3e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_newton_schulz_baseline_loses_the_bulk_beside_a_spike(dtype):
    """The paper's Alg. 1 + 3 with 10 steps: large error at sigma_max/c = 300 and 1e4 (seed 000 §5.1)."""
    x = spiked(96, 288, 1e4).float()
    smax = float(torch.linalg.matrix_norm(x.double(), 2))
    errs = {r: rel_err(soft_clip(x, smax / r, method="newton_schulz", dtype=dtype), _oracle(x, smax / r))
            for r in (300.0, 1e4)}
    assert errs[300.0] > 0.1 and errs[1e4] > 0.9
    # ... while the polar route is accurate on the same inputs
    for r in (300.0, 1e4):
        assert rel_err(soft_clip(x, smax / r), _oracle(x, smax / r)) <= 1e-3


def test_newton_schulz_baseline_accurate_at_moderate_ratio():
    x = torch.randn(64, 192)
    smax = float(torch.linalg.matrix_norm(x.double(), 2))
    assert rel_err(soft_clip(x, smax / 10, method="newton_schulz"), _oracle(x, smax / 10)) < 1e-4
    # Algorithm 1's early exit (a separate method): returns X unchanged when the bound s_max <= c
    assert torch.equal(soft_clip(x, 1e3 * smax, method="newton_schulz_early_exit"), x)


@pytest.mark.parametrize("shape", [(16, 16), (24, 40), (40, 24)])
def test_newton_schulz_below_c_matches_exact_map(shape):
    """No early exit (the authors' code): with every singular value 0.5 and c = 1 the NS route applies
    ``s / sqrt(1 + s^2/c^2)`` (0.447); the early-exit variant returns X (relative error 0.12)."""
    gen = torch.Generator().manual_seed(0)
    q1, _ = torch.linalg.qr(torch.randn(shape[0], shape[0], dtype=torch.float64, generator=gen))
    q2, _ = torch.linalg.qr(torch.randn(shape[1], shape[1], dtype=torch.float64, generator=gen))
    k = min(shape)
    x = (0.5 * q1[:, :k] @ q2[:, :k].T).float()
    ref = _oracle(x, 1.0)
    assert rel_err(soft_clip(x, 1.0, method="newton_schulz"), ref) < 1e-5
    assert rel_err(soft_clip(x, 1.0, method="newton_schulz_early_exit"), ref) > 0.1
    # a random matrix below c: the whole spectrum is shrunk as the exact map does
    y = torch.randn(shape, generator=gen)
    c = 3 * float(torch.linalg.matrix_norm(y.double(), 2))
    assert rel_err(soft_clip(y, c, method="newton_schulz"), _oracle(y, c)) < 1e-5


def test_exact_path_matches_numpy():
    x = torch.randn(3, 20, 30, dtype=torch.float64)
    assert rel_err(soft_clip(x, 0.7, method="exact"), _oracle(x, 0.7)) < 1e-12


@pytest.mark.parametrize("method", ["polar", "newton_schulz", "exact"])
def test_batched_per_matrix_threshold_equals_loop(method):
    x = torch.randn(5, 40, 24) * torch.logspace(-2, 2, 5)[:, None, None]
    c = torch.tensor([0.1, 1.0, 3.0, 10.0, 100.0])
    out = soft_clip(x, c, method=method)
    for i in range(5):
        ref = soft_clip(x[i], float(c[i]), method=method)
        assert torch.allclose(out[i], ref, rtol=1e-4, atol=1e-5 * float(ref.abs().max()))
    # scalar-tensor and broadcast (1,) thresholds
    assert torch.allclose(soft_clip(x, torch.tensor(2.0), method=method), soft_clip(x, 2.0, method=method))


def test_noncontiguous_and_extra_batch_dims():
    base = torch.randn(2, 3, 48, 32)
    xt = base.transpose(-1, -2)
    assert not xt.is_contiguous()
    out = soft_clip(xt, 1.5)
    assert out.shape == (2, 3, 32, 48)
    assert rel_err(out, _oracle(xt, 1.5)) < 1e-4


@pytest.mark.parametrize("method", ["polar", "newton_schulz", "exact"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_zero_input(method, dtype):
    out = soft_clip(torch.zeros(2, 8, 5, dtype=dtype), 1.0, method=method)
    assert out.dtype == dtype and torch.equal(out, torch.zeros_like(out))


@pytest.mark.parametrize("scale", [1e-20, 1e20])
def test_huge_and_tiny_norms(scale):
    x = torch.randn(24, 40, dtype=torch.float64)
    for ratio in (0.1, 1e3):
        c = scale * float(torch.linalg.matrix_norm(x, 2)) / ratio
        out = soft_clip((x * scale).float(), c)
        assert torch.isfinite(out).all()
        assert rel_err(out, _oracle(x * scale, c)) < 1e-3


def test_rank_deficient():
    x = matrix_with_spectrum(40, 60, [5.0, 1.0, 0.1])
    assert rel_err(soft_clip(x.float(), 0.5), _oracle(x, 0.5)) < 1e-4


def test_vector_case_is_smooth_norm_map():
    g = torch.randn(100, dtype=torch.float64)
    for c in (0.1, 10.0, 1e3):
        out = soft_clip(g, c)
        n = float(g.norm())
        assert torch.allclose(out, g / np.sqrt(1 + n**2 / c**2))
    assert torch.equal(soft_clip(torch.zeros(7), 1.0), torch.zeros(7))
    huge = soft_clip(torch.full((4,), 1e30), 2.0)
    assert torch.allclose(huge.norm(), torch.tensor(2.0))


def test_output_bounded_by_min_s_c():
    x = torch.randn(4, 30, 50)
    c = 0.5
    out = soft_clip(x, c)
    s_in = torch.linalg.svdvals(x.double())
    s_out = torch.linalg.svdvals(out.double())
    assert (s_out <= torch.minimum(s_in, torch.tensor(c, dtype=torch.float64)) * (1 + 1e-4)).all()


@pytest.mark.parametrize("kind", ["gauss", "spike"])
def test_polar_gradient_matches_the_exact_derivative(kind):
    # gradcheck checks autograd against finite differences of the iteration itself; here the backward pass
    # through the polar iteration is compared with the derivative of the exact map (SVD backward, fp64)
    g = torch.Generator().manual_seed(0)
    x0 = spiked(16, 40, 1e3, gen=g) if kind == "spike" else torch.randn(16, 40, dtype=torch.float64, generator=g)
    w = torch.randn(16, 40, dtype=torch.float64, generator=g)
    smax = float(torch.linalg.matrix_norm(x0, 2))
    for ratio in [0.5, 30.0, 1e3]:
        c = smax / ratio
        grads = {}
        for method, dt in [("exact", torch.float64), ("polar", torch.float32)]:
            x = x0.to(dt).clone().requires_grad_(True)
            (soft_clip(x, c, method=method) * w.to(dt)).sum().backward()
            grads[method] = x.grad.double()
        err = float((grads["polar"] - grads["exact"]).norm() / grads["exact"].norm())
        assert err <= 1e-4, (ratio, err)  # measured <= 1e-5


def test_gradcheck_fp64():
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda a: soft_clip(a, 0.8), (x,), eps=1e-6, atol=1e-5)
    torch.autograd.gradcheck(lambda a: soft_clip(a, 0.8, method="exact"), (x,), eps=1e-6, atol=1e-6)
    v = torch.randn(5, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda a: soft_clip(a, 0.8), (v,))
    # gradient w.r.t. a tensor threshold exists
    c = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda t: soft_clip(x.detach(), t), (c,), eps=1e-6, atol=1e-5)


def test_no_value_checks_skips_finiteness_only():
    with no_value_checks():
        with pytest.raises(ValueError, match="c"):
            soft_clip(torch.randn(3, 4), -1.0)
        soft_clip(torch.randn(3, 4), torch.tensor(-1.0))  # tensor values are not inspected


@pytest.mark.parametrize("args,exc,name", [
    ((torch.randn(3, 4), 0.0), ValueError, "c"),
    ((torch.randn(3, 4), -2.0), ValueError, "c"),
    ((torch.randn(3, 4), float("nan")), ValueError, "c"),
    ((torch.randn(3, 4), float("inf")), ValueError, "c"),
    ((torch.randn(3, 4), torch.tensor([1.0, 0.0])), ValueError, "c"),
    ((torch.randn(2, 3, 4), torch.ones(3)), ValueError, "c"),
    ((torch.randn(3, 4), "1"), TypeError, "c"),
    ((torch.tensor([[1.0, float("inf")]]), 1.0), ValueError, "X"),
    ((torch.ones(3, 4, dtype=torch.int64), 1.0), TypeError, "X"),
    ((torch.randn(5), torch.ones(2)), ValueError, "c"),
])
def test_invalid_arguments(args, exc, name):
    with pytest.raises(exc, match=name):
        soft_clip(*args)
    with pytest.raises(ValueError, match="method"):
        soft_clip(torch.randn(3, 4), 1.0, method="svd")
    with pytest.raises(ValueError, match="steps"):
        soft_clip(torch.randn(3, 4), 1.0, steps=0)


def test_np64_helper_roundtrip():
    x = torch.randn(3, 4)
    assert np.allclose(np64(x), x.double().numpy())


# ---- fast Gram-only route: soft_clip(..., tall_steps=0) ----------------------------------------------------
FAST_RATIOS = [1e-2, 1.0, 10.0, 100.0, FAST_MAX_RATIO]


@pytest.mark.parametrize("shape", [(128, 512), (96, 96), (160, 40)])
@pytest.mark.parametrize("kind", ["gauss", "spike", "illcond"])
def test_fast_fp32_accuracy_up_to_300(shape, kind):
    x = _input(shape, kind).float()
    smax = float(torch.linalg.matrix_norm(x.double(), 2))
    for ratio in FAST_RATIOS:
        c = smax / ratio
        err = rel_err(soft_clip(x, c, tall_steps=0), _oracle(x, c))
        assert err <= 1e-3, (ratio, err)


def test_fast_bf16_input_fp32_compute():
    x = torch.randn(64, 192, dtype=torch.float64).bfloat16()
    smax = float(torch.linalg.matrix_norm(x.double(), 2))
    out = soft_clip(x, smax / 100, tall_steps=0, dtype=torch.float32)
    assert out.dtype == torch.bfloat16
    assert rel_err(out, _oracle(x, smax / 100)) <= 1e-2  # bf16 output rounding (2^-8)


@pytest.mark.parametrize("kind", ["rank1", "gauss", "zero"])
@pytest.mark.parametrize("ratio", [1e-30, 1e3, 1e6, 1e12, 1e30])
def test_fast_beyond_range_is_a_safe_undershoot(kind, ratio):
    g = torch.Generator().manual_seed(3)
    m, n = 48, 144
    if kind == "rank1":
        x = torch.randn(m, 1, generator=g) @ torch.randn(1, n, generator=g)
    elif kind == "zero":
        x = torch.zeros(m, n)
    else:
        x = torch.randn(m, n, generator=g)
    smax = float(torch.linalg.matrix_norm(x.double(), 2)) or 1.0
    c = smax / ratio
    out = soft_clip(x, c, tall_steps=0)
    assert torch.isfinite(out).all()
    top = float(torch.linalg.matrix_norm(out.double(), 2))
    assert top <= min(smax, c) * (1 + 1e-4) + 1e-30


def test_fast_batched_per_matrix_threshold_and_noncontiguous():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 40, 100, generator=g, dtype=torch.float64)
    x[1] *= 1e6
    x[2, :, 0] = 0
    c = torch.tensor([0.1, 3e5, 50.0], dtype=torch.float64)
    xt = x.float().transpose(-2, -1)  # non-contiguous tall inputs
    out = soft_clip(xt, c, tall_steps=0)
    for i in range(3):
        assert rel_err(out[i], _oracle(xt[i], float(c[i]))) <= 1e-3


def test_fast_matches_tall_route_in_fp64():
    x = spiked(64, 128, 1e4)
    smax = float(torch.linalg.matrix_norm(x, 2))
    fast = soft_clip(x, smax / 300, tall_steps=0)
    assert rel_err(fast, _oracle(x, smax / 300)) <= 1e-6


@pytest.mark.parametrize("bad", [-1, 10, 1.5])
def test_tall_steps_validation(bad):
    x = torch.randn(8, 16)
    with pytest.raises((ValueError, TypeError), match="tall_steps"):
        soft_clip(x, 1.0, tall_steps=bad, steps=9)


def test_tall_steps_bf16_rejected():
    with pytest.raises(ValueError, match="tall_steps"):
        soft_clip(torch.randn(8, 16), 1.0, tall_steps=0, dtype=torch.bfloat16)


@pytest.mark.parametrize("tall", [1, 2, 3])
def test_explicit_tall_steps_fp32_accurate(tall):
    x = spiked(64, 192, 1e4).float()
    smax = float(torch.linalg.matrix_norm(x.double(), 2))
    for ratio in (1.0, 300.0, 1e3):
        c = smax / ratio
        assert rel_err(soft_clip(x, c, tall_steps=tall), _oracle(x, c)) <= 1e-3, (tall, ratio)


@pytest.mark.parametrize("shape", [(64, 256), (96, 96), (200, 50)])
@pytest.mark.parametrize("steps", [None, 4])
def test_fast_flop_count_matches_issued_products(shape, steps):
    from torch.utils.flop_counter import FlopCounterMode

    from spectrakit.linalg.flops import soft_clip_fast_flops_by_dtype, soft_clip_newton_schulz_flops

    x = torch.randn(*shape)
    with FlopCounterMode(display=False) as fc:
        soft_clip(x, 0.5, tall_steps=0, steps=steps)
    model = sum(soft_clip_fast_flops_by_dtype(*shape, steps=steps).values())
    assert fc.get_total_flops() == model
    if steps is None:  # default: below the paper's 10-step Newton-Schulz
        assert model < soft_clip_newton_schulz_flops(*shape)


# ----------------------------------------------------------------------------- in-place fast route (issue 3)
@pytest.mark.parametrize("shape", [(64, 192), (192, 64), (96, 96), (3, 40, 120), (4, 90, 30)])
@pytest.mark.parametrize("kind", ["gauss", "spike", "illcond"])
def test_fast_inplace_matches_out_of_place_and_oracle(shape, kind):
    """``soft_clip_fast_`` (the optimizer's in-place route, no full-size temporary) equals
    ``soft_clip(tall_steps=0)`` to rounding and the SVD oracle to 1e-3 up to sigma_max / c = 300, with a
    float or a per-matrix tensor threshold and a small block budget (many column blocks)."""
    from spectrakit.linalg.soft_clip import soft_clip_fast_

    batch, (m, n) = shape[:-2], shape[-2:]
    x = torch.stack([_input((m, n), kind) for _ in range(math.prod(batch))]).reshape(shape).float()
    smax = torch.linalg.matrix_norm(x.double(), 2)
    for ratio in (1e-2, 1.0, 30.0, FAST_MAX_RATIO):
        c = (smax / ratio) if batch else float(smax / ratio)
        ref = soft_clip(x, c, tall_steps=0)
        y = x.clone()
        assert soft_clip_fast_(y, c, chunk=500) is y
        # rounding of the fp32 Gram matrix is relative ~eps (sigma_max / c)^2 on its smallest eigenvalue
        tol = 2e-5 * max(1.0, ratio / 30) ** 2
        assert rel_err(y, np64(ref)) <= tol, (ratio, rel_err(y, np64(ref)))
        for i in range(math.prod(batch)):
            xi = x.reshape(-1, m, n)[i]
            ci = float(c.reshape(-1)[i]) if batch else c
            assert rel_err(y.reshape(-1, m, n)[i], _oracle(xi, ci)) <= 1e-3, (ratio, i)


def test_fast_inplace_on_a_transposed_view_and_fp64():
    from spectrakit.linalg.soft_clip import soft_clip_fast_

    x = spiked(64, 160, 1e4)
    smax = float(torch.linalg.matrix_norm(x, 2))
    base = x.T.contiguous()
    view = base.T  # writes go through the view into base
    soft_clip_fast_(view, smax / 300)
    assert rel_err(base.T, _oracle(x, smax / 300)) <= 1e-6


def test_fast_inplace_flops_and_validation():
    from torch.utils.flop_counter import FlopCounterMode

    from spectrakit.linalg.soft_clip import soft_clip_fast_

    x = torch.randn(64, 256)
    with FlopCounterMode(display=False) as a:
        soft_clip(x, 0.5, tall_steps=0)
    with FlopCounterMode(display=False) as b:
        soft_clip_fast_(x.clone(), 0.5)
    assert a.get_total_flops() == b.get_total_flops()
    with pytest.raises(TypeError, match="float32"):
        soft_clip_fast_(torch.randn(8, 16, dtype=torch.bfloat16), 1.0)
    with pytest.raises(ValueError, match="dims"):
        soft_clip_fast_(torch.randn(8), 1.0)
    with pytest.raises(ValueError, match="chunk"):
        soft_clip_fast_(torch.randn(8, 16), 1.0, chunk=0)
    with pytest.raises(ValueError, match="c"):
        soft_clip_fast_(torch.randn(8, 16), -1.0)
    with pytest.raises(ValueError, match="c"):
        soft_clip_fast_(torch.randn(2, 8, 16), torch.ones(3))
    empty = torch.randn(0, 16)
    assert soft_clip_fast_(empty, 1.0) is empty
