"""spectral_lmo's Gram-level route (method="gram", the CPU default) against float64 numpy SVD oracles of the
closed form (eq. E.3 of Jiang, Semenov & Stich 2026): accuracy, rank deficiency, extreme scales, bf16,
batches, layouts, bounds, non-finite input, the in-place form and its memory."""

import math

import numpy as np
import pytest
import torch

from spectrakit._checks import no_value_checks
from spectrakit.linalg import spectral_lmo
from spectrakit.linalg._testing import matrix_with_spectrum, np64, spiked, svd_map
from spectrakit.linalg.lmo import default_method, spectral_lmo_
from spectrakit.linalg.timing import cpu_peak_extra_bytes

# the oracles of test_lmo.py (test modules are imported in isolation)
REGS = [("frobenius", None), ("nuclear", None), ("schatten", 1.5), ("schatten", 3.0), ("schatten", 5.0),
        ("schatten", 9.0), ("entropy", None)]


def _s_star(s, reg, b, d, p):
    """Independent numpy form of the per-singular-value minimiser of -s x + psi_1(x) over [0, d]."""
    s = np.asarray(s, dtype=np.float64)
    if reg == "frobenius":
        return np.minimum(s / b, d)
    if reg == "nuclear":
        return np.where(s > b, d, 0.0)
    if reg == "schatten":
        with np.errstate(divide="ignore"):
            return np.minimum(np.power(s / b, 1.0 / (p - 1.0)), d)
    with np.errstate(over="ignore"):
        return np.minimum(np.exp(s / b), d)


def _oracle(g, reg, b, d, p):
    return -svd_map(g, lambda s: _s_star(s, reg, b, d, p))


def _err(out, ref, d):
    """Frobenius error relative to ``max(||X*||_F, D)`` (X* may be 0, e.g. nuclear with ``b > s_max``)."""
    return float(np.linalg.norm(np64(out) - ref) / max(np.linalg.norm(ref), d))


def _matrix(shape, kind, gen):
    m, n = shape[-2:]
    batch = shape[:-2]
    mats = []
    for _ in range(math.prod(batch) if batch else 1):
        if kind == "spike":
            mats.append(spiked(m, n, 1e3, gen=gen))
        elif kind == "logspec":  # 4 decades
            mats.append(matrix_with_spectrum(m, n, torch.logspace(0, -4, min(m, n)), gen=gen) * 7.0)
        else:
            mats.append(torch.randn(m, n, dtype=torch.float64, generator=gen))
    return torch.stack(mats).reshape(*shape)


def _away(g, b):
    """Move b to the middle of the gap between the singular values around it if one is within 2.5%."""
    s = np.sort(np.linalg.svd(np64(g), compute_uv=False).ravel())
    if np.min(np.abs(s - b)) > 0.025 * b:
        return b
    i = int(np.argmin(np.abs(s - b)))
    lo, hi = (s[i - 1], s[i]) if i > 0 else (s[i] / 2, s[i])
    cand = [math.sqrt(lo * hi)] + ([math.sqrt(s[i] * s[i + 1])] if i + 1 < len(s) else [s[i] * 1.5])
    return max(cand, key=lambda c: np.min(np.abs(s - c)) / c)


def _range_oracle(g, reg, b, d, p, floor=1e-9):
    """X* over matrices whose row/column spaces lie in those of G: singular values below ``floor s_max`` -> 0."""
    def fn(s):
        smax = s.max(axis=-1, keepdims=True)
        return np.where(s > floor * smax, _s_star(s, reg, b, d, p), 0.0)

    return -svd_map(g, fn)


def test_default_route_is_gram_on_cpu_only():
    assert default_method(torch.device("cpu")) == "gram"
    assert default_method(torch.device("cuda")) == "polar"  # eigh blocks a CUDA device
    g = torch.randn(6, 9, dtype=torch.float64)
    torch.testing.assert_close(spectral_lmo(g, "entropy", b=0.5, radius=3.0),
                               spectral_lmo(g, "entropy", b=0.5, radius=3.0, method="gram"), rtol=0, atol=0)


@pytest.mark.parametrize("shape", [(24, 40), (40, 24), (32, 32), (3, 16, 24), (48, 160)], ids=str)
@pytest.mark.parametrize("reg,p", REGS, ids=[f"{r}{p or ''}" for r, p in REGS])
def test_gram_matches_svd_oracle(reg, p, shape):
    """fp32 <= 1e-4, fp64 <= 1e-6 (measured 1.5e-5 and 1.8e-7) on Gaussian, 1e3-spike and 4-decade spectra,
    b from 1e-3 to 2 s_max, D from 0.5 to 100: tighter than the polar route's 1e-3."""
    gen = torch.Generator().manual_seed(100 + REGS.index((reg, p)))
    # the three kinds, each scaled to s_max = 1 (X* depends on G / b only), in one batch: one call per (b, D,
    # dtype) and one float64 SVD for all the oracles (the route works matrix by matrix, see the batch test)
    kinds = ("gauss", "spike", "logspec")
    mats = [_matrix(shape, kind, gen) for kind in kinds]
    g = torch.stack([m / float(np.linalg.svd(np64(m), compute_uv=False).max()) for m in mats])
    u, s, vh = np.linalg.svd(np64(g), full_matrices=False)
    for rel_b in (1e-3, 0.1, 2.0):
        b = _away(g, rel_b) if reg == "nuclear" else rel_b
        for d in (0.5, 3.0, 100.0):
            ref = -(u * _s_star(s, reg, b, d, p)[..., None, :]) @ vh
            for dt, tol in ((torch.float32, 1e-4), (torch.float64, 1e-6)):
                out = spectral_lmo(g.to(dt), reg, b=b, radius=d, p=p, method="gram")
                assert out.dtype == dt and out.shape == g.shape
                for j, kind in enumerate(kinds):
                    err = _err(out[j], ref[j], d)
                    assert err <= tol, (kind, rel_b, d, dt, err)


@pytest.mark.parametrize("reg,p", REGS, ids=[f"{r}{p or ''}" for r, p in REGS])
def test_rank_deficient_is_finite_and_matches(reg, p):
    """Rank 5 of 16 (and a zero matrix in the same batch): finite, the zero directions get 0 (for entropy,
    whose s*(0) > 0, the minimiser over the range of G, as on the polar route), the rest to 1e-5."""
    gen = torch.Generator().manual_seed(7)
    low = matrix_with_spectrum(16, 40, torch.tensor([9.0, 4.0, 2.0, 0.7, 0.2]), gen=gen)
    g = torch.stack([low, torch.zeros(16, 40, dtype=torch.float64), low * 1e3])
    for dt in (torch.float32, torch.float64):
        out = spectral_lmo(g.to(dt), reg, b=0.5, radius=3.0, p=p, method="gram")
        assert torch.isfinite(out).all()
        assert torch.equal(out[1], torch.zeros_like(out[1]))
        ref = _range_oracle(g, reg, 0.5, 3.0, p)
        assert np.linalg.norm(np64(out) - ref) <= 1e-5 * max(np.linalg.norm(ref), 3.0), dt
        # tall orientation (the Gram matrix of G^T)
        outt = spectral_lmo(g.to(dt).mT, reg, b=0.5, radius=3.0, p=p, method="gram")
        torch.testing.assert_close(outt, out.mT, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scale", [1e-30, 1e-12, 1e12, 1e30], ids=str)
@pytest.mark.parametrize("reg,p", REGS, ids=[f"{r}{p or ''}" for r, p in REGS])
def test_tiny_and_huge_norms(reg, p, scale):
    """X* depends on G / b only: G and b scaled together (fp32, entries up to 1e30 and down to 1e-30, some
    subnormal after the scaling) give the same result; no overflow or underflow."""
    gen = torch.Generator().manual_seed(8)
    g = _matrix((2, 12, 30), "spike", gen)
    b = _away(g, 0.3) if reg == "nuclear" else 0.3
    ref = _oracle(g, reg, b, 2.0, p)
    gs = (g * scale).float()
    assert torch.isfinite(gs).all()
    out = spectral_lmo(gs, reg, b=b * scale, radius=2.0, p=p, method="gram")
    assert _err(out, _oracle(gs.double(), reg, b * scale, 2.0, p), 2.0) <= 1e-4
    assert _err(out, ref, 2.0) <= 1e-4


def test_extreme_entries_and_subnormals():
    big = torch.full((4, 6), 3e38)
    big[0, 0] = -3e38
    out = spectral_lmo(big, "frobenius", b=1e38, radius=2.0, method="gram")
    assert torch.isfinite(out).all()
    assert _err(out, _oracle(big.double(), "frobenius", 1e38, 2.0, None), 2.0) <= 1e-5
    sub = torch.randn(5, 7, generator=torch.Generator().manual_seed(9)) * 1e-42  # subnormal fp32 entries
    out = spectral_lmo(sub, "schatten", b=1e-43, radius=5.0, p=3.0, method="gram")
    assert _err(out, _oracle(sub.double(), "schatten", 1e-43, 5.0, 3.0), 5.0) <= 1e-4


@pytest.mark.parametrize("reg,p", REGS, ids=[f"{r}{p or ''}" for r, p in REGS])
def test_bf16_input(reg, p):
    """bf16 in, bf16 out: the error is the output's rounding (measured 1.7e-3 .. 1.9e-3)."""
    gen = torch.Generator().manual_seed(10)
    for kind in ("spike", "logspec"):
        gb = _matrix((2, 24, 40), kind, gen).bfloat16()
        b = _away(gb.double(), 0.5) if reg == "nuclear" else 0.5
        out = spectral_lmo(gb, reg, b=b, radius=3.0, p=p, method="gram")
        assert out.dtype == torch.bfloat16
        assert _err(out, _oracle(gb.double(), reg, b, 3.0, p), 3.0) <= 5e-3


def test_batched_equals_per_matrix_and_layouts():
    """A batch gives each matrix's own result; non-contiguous inputs (transposed, strided) the contiguous one."""
    gen = torch.Generator().manual_seed(11)
    g = torch.randn(2, 3, 20, 36, generator=gen) * torch.tensor([1e-3, 1.0, 1e3]).view(1, 3, 1, 1)
    for reg, p in REGS:
        out = spectral_lmo(g, reg, b=0.4, radius=2.0, p=p, method="gram")
        for i in range(2):
            for j in range(3):
                one = spectral_lmo(g[i, j], reg, b=0.4, radius=2.0, p=p, method="gram")
                torch.testing.assert_close(out[i, j], one, rtol=1e-5, atol=1e-6)
        wide = torch.randn(3, 36, 20, generator=gen).mT  # non-contiguous
        torch.testing.assert_close(spectral_lmo(wide, reg, b=0.4, radius=2.0, p=p, method="gram"),
                                   spectral_lmo(wide.contiguous(), reg, b=0.4, radius=2.0, p=p, method="gram"),
                                   rtol=1e-5, atol=1e-6)
        strided = torch.randn(20, 72, generator=gen)[:, ::2]
        ref = _oracle(strided.double(), reg, 0.4, 2.0, p)
        assert _err(spectral_lmo(strided, reg, b=0.4, radius=2.0, p=p, method="gram"), ref, 2.0) <= 1e-4


@pytest.mark.parametrize("reg,p", REGS, ids=[f"{r}{p or ''}" for r, p in REGS])
def test_bound_holds_far_above_the_radius(reg, p):
    """||X*||_2 <= D to fp32 rounding, also with s_max / b up to 1e8 and a near rank-1 input."""
    gen = torch.Generator().manual_seed(12)
    u = torch.randn(32, 1, generator=gen)
    v = torch.randn(1, 80, generator=gen)
    g = torch.stack([torch.randn(32, 80, generator=gen) * 1e4, u @ v * 1e6 + torch.randn(32, 80, generator=gen)])
    for b in (1e-2, 1.0):
        for d in (0.5, 7.0):
            out = spectral_lmo(g, reg, b=b, radius=d, p=p, method="gram")
            assert torch.linalg.matrix_norm(out.double(), 2).max() <= d * (1 + 1e-5)


def test_nuclear_at_the_threshold_is_the_papers_case():
    """s = b exactly maps to 0 (eq. E.3's case s <= b), as the exact route; the others to D or 0."""
    gen = torch.Generator().manual_seed(6)
    g = matrix_with_spectrum(8, 12, torch.tensor([3.0, 2.0, 1.0, 0.5]), gen=gen)
    out = spectral_lmo(g, "nuclear", b=2.0, radius=1.0, method="gram")
    ref = -svd_map(g, lambda x: np.where(x > 2.0 + 1e-9, 1.0, 0.0))
    assert np.linalg.norm(np64(out) - ref) <= 1e-9


def test_non_finite_matrix_gives_non_finite_output_only_there():
    """With value checks off (the optimizer's call), a matrix with a nan/inf entry yields nan for that matrix
    (so the optimizer skips the batch) and no LAPACK error; the others are unaffected."""
    gen = torch.Generator().manual_seed(13)
    x = torch.randn(3, 10, 16, generator=gen)
    clean = spectral_lmo(x, "entropy", b=0.5, radius=2.0, method="gram")
    x[1, 2, 3] = float("nan")
    x[2, 0, 0] = float("inf")
    with no_value_checks():
        out = spectral_lmo_(x.clone(), "entropy", b=0.5, radius=2.0)
    assert torch.isnan(out[1]).all() and not torch.isfinite(out[2]).all()
    torch.testing.assert_close(out[0], clean[0], rtol=0, atol=0)


def test_inplace_form_overwrites_and_allocates_no_full_size_temporary():
    """Peak extra memory: the batch's Gram matrices (W is built in their storage), the eigenvectors of one
    matrix, two blocks."""
    gen = torch.Generator().manual_seed(14)
    for shape in ((2, 48, 4096), (2, 4096, 48), (3, 256, 512), (3, 512, 256)):
        x = torch.randn(*shape, generator=gen)
        ref = spectral_lmo(x, "schatten", b=0.3, radius=2.0, p=3.0)
        y = x.clone()
        ptr = y.data_ptr()
        with no_value_checks():
            out = spectral_lmo_(y, "schatten", b=0.3, radius=2.0, p=3.0)
        assert out is y and y.data_ptr() == ptr
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
        k = min(shape[-2:])
        with no_value_checks():
            peak = cpu_peak_extra_bytes(lambda y=y: spectral_lmo_(y, "schatten", b=0.3, radius=2.0, p=3.0))
        # B float64 k x k, the k x k eigenvectors of one matrix (LAPACK's dsyevr through SciPy, counted by
        # tracemalloc; torch's divide and conquer needed 2 k^2 + 6 k + 1 float64 of workspace) and O(k)
        # workspace, two float64 blocks of numel / 64 (at least 64 columns), the Python objects
        bound = 8 * (shape[0] * k * k + k * k + 40 * k) + 2 * 8 * max(x.numel() // 64, 64 * shape[0] * k) + 65536
        assert peak <= bound, (peak, bound)
        if k < 64:
            assert peak < 0.25 * 4 * x.numel()
    # the out-of-place form allocates a full-size result
    assert cpu_peak_extra_bytes(lambda: spectral_lmo(x, "nuclear", b=0.3, radius=2.0)) >= 4 * x.numel()


def test_any_schatten_p():
    """The Gram route takes every p > 1 (the polar route only p with 1/(p-1) a multiple of 1/16)."""
    gen = torch.Generator().manual_seed(15)
    g = _matrix((2, 16, 28), "logspec", gen)
    for p in (1.1, 2.5, 4.0, 7.3, 50.0):
        out = spectral_lmo(g.float(), "schatten", b=0.05, radius=4.0, p=p, method="gram")
        assert _err(out, _oracle(g, "schatten", 0.05, 4.0, p), 4.0) <= 1e-4, p
    assert math.isfinite(float(spectral_lmo(g, "schatten", b=1e-300, radius=1.0, p=1.0001).abs().max()))


def test_autograd_and_traced_calls_take_the_out_of_place_eigh():
    """Under autograd (eigh's ``out=`` has no backward) and while dynamo traces (it takes no strided ``out=``)
    the Gram route calls the out-of-place eigh: same values as the in-place call, gradients flow, no graph
    break."""
    gen = torch.Generator().manual_seed(16)
    g = matrix_with_spectrum(12, 20, torch.linspace(3.0, 0.5, 12), gen=gen)
    ref = spectral_lmo(g, "schatten", b=0.4, radius=2.0, p=3.0, method="gram")
    leaf = g.clone().requires_grad_(True)
    out = spectral_lmo(leaf, "schatten", b=0.4, radius=2.0, p=3.0, method="gram")
    torch.testing.assert_close(out.detach(), ref, rtol=1e-10, atol=1e-12)
    out.square().sum().backward()
    assert leaf.grad is not None and torch.isfinite(leaf.grad).all() and leaf.grad.abs().max() > 0

    def inplace(x):
        with no_value_checks():
            return spectral_lmo_(x, "schatten", b=0.4, radius=2.0, p=3.0)

    torch._dynamo.reset()
    # fullgraph=True: a graph break raises (with its reason), so one trace checks both
    traced = torch.compile(inplace, backend="eager", fullgraph=True)(g.clone())
    torch.testing.assert_close(traced, ref, rtol=1e-10, atol=1e-12)
    torch._dynamo.reset()
