"""Each base direction with post="none" against an independent reference, step by step for 50 steps."""

from __future__ import annotations

import inspect

import pytest
import torch

import spectrakit.optim as O
from tests.optim._reference import REFERENCES

SHAPES = [(6, 4), (4, 6), (6, 4), (5,), (3, 2, 2, 2), ()]
SCALES = [1.0, 1e3, 1e-3, 1.0, 1.0, 1.0]  # per-parameter gradient magnitudes (huge / tiny included)

CASES = [
    ("adamw", dict(betas=(0.9, 0.999), eps=1e-8)),
    ("adamw", dict(betas=(0.8, 0.95), eps=1e-6)),
    ("signum", dict(momentum=0.9, nesterov=False)),
    ("signum", dict(momentum=0.95, nesterov=True)),
    ("sgd", dict(momentum=0.9, dampening=0.0, nesterov=False)),
    ("sgd", dict(momentum=0.9, dampening=0.9, nesterov=True)),
    ("lion", dict(betas=(0.9, 0.99))),
    ("ademamix", dict(betas=(0.9, 0.999, 0.9999), alpha=5.0, alpha_warmup=None, beta3_warmup=None, eps=1e-8)),
    ("ademamix", dict(betas=(0.8, 0.99, 0.999), alpha=5.0, alpha_warmup=30, beta3_warmup=40, eps=1e-8)),
    ("mars", dict(betas=(0.95, 0.99), gamma=0.025, eps=1e-8)),
    ("mars", dict(betas=(0.9, 0.999), gamma=0.5, eps=1e-8)),
]


def _params():
    return [torch.randn(s) for s in SHAPES]


@pytest.mark.parametrize("base,hp", CASES, ids=[f"{b}-{i}" for i, (b, _) in enumerate(CASES)])
@pytest.mark.parametrize("wd", [0.0, 0.1])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_base_matches_reference(base, hp, wd, dtype):
    """float64 params (float64 state) agree to 1e-10; float32 ones up to the fp32 rounding of the params."""
    lr = 1e-2 if base in ("sgd",) else 1e-3
    init = _params()
    params = [p.to(dtype).requires_grad_() for p in init]
    opt = O.Spectra(params, base=base, post="none", lr=lr, weight_decay=wd, **hp)
    refs = [REFERENCES[base](p, lr, wd, **hp) for p in init]
    # float32: 50 roundings of the stored parameter (ulp 1.2e-7 relative) bound the drift; 5e-6 relative
    tol = 1e-10 if dtype == torch.float64 else 5e-6
    for k in range(50):
        grads = [torch.randn(s, dtype=torch.float64) * sc for s, sc in zip(SHAPES, SCALES)]
        for p, g in zip(params, grads):
            p.grad = g.to(dtype)
        opt.step()
        for i, (p, r, g) in enumerate(zip(params, refs, grads)):
            r.step(g.to(dtype))
            # max |p - p_ref| <= tol max(1, max |p_ref|) (torch.testing.assert_close's atol form, without its
            # per-call cost: 300 comparisons per test)
            err, scale = float((p.detach().double() - r.p).abs().max()), max(1.0, float(r.p.abs().max()))
            assert p.shape == r.p.shape and err <= tol * scale, (k, i, SHAPES[i], err, tol * scale)


@pytest.mark.parametrize("betas,wd,lr", [((0.9, 0.999), 1e-2, 1e-3), ((0.8, 0.999), 0.1, 3e-3)])
def test_adamw_matches_torch(betas, wd, lr):
    init = _params()
    a = [p.clone().requires_grad_() for p in init]
    b = [p.clone().requires_grad_() for p in init]
    ours = O.AdamW(a, lr=lr, betas=betas, weight_decay=wd)
    theirs = torch.optim.AdamW(b, lr=lr, betas=betas, weight_decay=wd, foreach=False)
    for _ in range(50):
        for pa, pb, s, sc in zip(a, b, SHAPES, SCALES):
            g = torch.randn(s) * sc
            pa.grad, pb.grad = g.clone(), g.clone()
        ours.step()
        theirs.step()
        for pa, pb in zip(a, b):
            torch.testing.assert_close(pa, pb, atol=3e-7, rtol=3e-7)


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_matches_torch(nesterov):
    init = _params()
    a = [p.clone().requires_grad_() for p in init]
    b = [p.clone().requires_grad_() for p in init]
    ours = O.SGD(a, lr=1e-2, momentum=0.9, nesterov=nesterov)
    theirs = torch.optim.SGD(b, lr=1e-2, momentum=0.9, nesterov=nesterov)
    for _ in range(50):
        for pa, pb, s in zip(a, b, SHAPES):
            g = torch.randn(s)
            pa.grad, pb.grad = g.clone(), g.clone()
        ours.step()
        theirs.step()
    for pa, pb in zip(a, b):
        torch.testing.assert_close(pa, pb, atol=1e-6, rtol=1e-6)


def test_presets_are_the_pipeline():
    p = [torch.nn.Parameter(torch.randn(3, 3))]
    for cls, base, post in [
        (O.SpectraAdamW, "adamw", "soft_clip"),
        (O.SpectraSignum, "signum", "soft_clip"),
        (O.SpectraSGD, "sgd", "soft_clip"),
        (O.SpectraAdEMAMix, "ademamix", "soft_clip"),
        (O.SpectraMARS, "mars", "soft_clip"),
        (O.SpectraLion, "lion", "soft_clip"),
        (O.AdamW, "adamw", "none"),
        (O.Signum, "signum", "none"),
        (O.Lion, "lion", "none"),
        (O.AdEMAMix, "ademamix", "none"),
        (O.MARS, "mars", "none"),
        (O.Muon, "ema", "newton_schulz5"),
        (O.DMuon, "ema", "newton_schulz5"),
    ]:
        opt = cls(p)
        # torch.optim.Optimizer wraps each class's ``step`` in a profiling hook (functools.wraps): unwrap it
        assert isinstance(opt, O.Spectra) and inspect.unwrap(type(opt).step) is inspect.unwrap(O.Spectra.step)
        assert opt.defaults["base"] == base and opt.defaults["post"] == post
    assert O.Muon(p, normalize="spectral").defaults["post"] == "newton_schulz5_spectral"
    with pytest.raises(ValueError, match="normalize"):
        O.Muon(p, normalize="gram")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("w", [0.1, 1e-3, 0.0, 0.49, 0.9])
@pytest.mark.parametrize("small", [True, False], ids=["addcmul-form", "lerp-form"])
def test_foreach_lerp_equals_per_tensor_lerp(dtype, w, small, monkeypatch):
    """The eager multi-tensor moment update (``addcmul`` form for small float32/float64 lists and weights below
    0.5, else ``_foreach_lerp_``) gives ``lerp``'s bits, with a 0-d weight on the device and with one per
    tensor, on entries of very different magnitudes; a zero weight (a skipped step) leaves the targets as
    they were."""
    import spectrakit.optim.bases as B

    if not small:
        monkeypatch.setattr(B, "ADDCMUL_MAX_NUMEL", 0)
    gen = torch.Generator().manual_seed(3)
    shapes, scales = [(64, 32), (7,), (3, 5, 2), ()], [1.0, 1e6, 1e-6, 3.0]
    targets = [(torch.randn(s, generator=gen, dtype=torch.float64) * k).to(dtype) for s, k in zip(shapes, scales)]
    ends = [(torch.randn(s, generator=gen, dtype=torch.float64) * k).to(dtype) for s, k in zip(shapes, scales)]
    weight = torch.tensor(w, dtype=dtype)
    expected = [t.lerp(e, weight) for t, e in zip(targets, ends)]
    for wt in (weight, [weight.clone() for _ in targets]):
        got = [t.clone() for t in targets]
        B.foreach_lerp_(got, ends, wt, bound=max(w, 1e-3) if w < 0.5 else 1.0)
        for g, x, t in zip(got, expected, targets):
            assert torch.equal(g, x)
            if w == 0.0:
                assert torch.equal(g, t)
