"""Presets that carry a published name against the published optimizer, step by step: ``Muon``/``DMuon``
against ``torch.optim.Muon`` (Jordan et al. 2024; Liu et al. 2025). Our steps run with bf16 forced on
(``bf16_matmul_override(True)``): where bf16 matmuls are emulated the presets compute in fp32 instead."""

from __future__ import annotations

import math

import pytest
import torch

import spectrakit.optim as O
from spectrakit.linalg import bf16_matmul_override

# wide, tall (both 1:3), square and a small tall one (Muon's shape-dependent scaling on every side); bf16
# matmuls are emulated on CPUs without bf16 units, so the sizes stay small
SHAPES = [(32, 96), (96, 32), (32, 32), (48, 16)]


def _grads(steps, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [[torch.randn(s, generator=gen) for s in SHAPES] for _ in range(steps)]


def _run(make, grads):
    gen = torch.Generator().manual_seed(1)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in SHAPES]
    opt = make(params)
    for gs in grads:
        for p, g in zip(params, gs):
            p.grad = g.clone()
        with bf16_matmul_override(True):
            opt.step()
    return [p.detach() for p in params], opt


@pytest.mark.parametrize("cls,adjust,lr,wd", [(O.Muon, "original", 0.02, 0.1), (O.Muon, "original", 0.02, 0.0),
                                              (O.DMuon, "match_rms_adamw", 1e-3, 0.1)])
def test_muon_equals_torch_muon(cls, adjust, lr, wd):
    """50 steps on fixed gradient sequences: momentum buffers and Newton-Schulz outputs are bit-identical
    to ``torch.optim.Muon``; the parameters differ only by the rounding of the final ``p + (-lr) U`` (torch
    fuses it): <= 2e-6 relative (max abs difference / max |p|)."""
    grads = _grads(50)
    ours, opt = _run(lambda ps: cls(ps, lr=lr, weight_decay=wd), grads)
    ref, ref_opt = _run(lambda ps: torch.optim.Muon(ps, lr=lr, weight_decay=wd, adjust_lr_fn=adjust), grads)
    for p, r in zip(ours, ref):
        assert (p - r).abs().max() <= 2e-6 * r.abs().max()
    for p, q in zip(opt.param_groups[0]["params"], ref_opt.param_groups[0]["params"]):
        assert torch.equal(opt.state[p]["momentum_buffer"], ref_opt.state[q]["momentum_buffer"])


def test_muon_one_step_update_matches():
    """One step: the update ``p_1 - p_0`` equals torch's up to the rounding of ``p`` (relative 1e-5)."""
    grads = _grads(1, seed=3)
    gen = torch.Generator().manual_seed(1)
    start = [torch.randn(s, generator=gen) for s in SHAPES]
    ours, _ = _run(lambda ps: O.Muon(ps, lr=0.02), grads)
    ref, _ = _run(lambda ps: torch.optim.Muon(ps, lr=0.02, weight_decay=0.0), grads)
    for p, r, s in zip(ours, ref, start):
        assert ((p - s) - (r - s)).norm() <= 1e-5 * (r - s).norm()


def test_muon_spectral_option_differs():
    """``normalize="spectral"`` is a different start (not Muon): the update differs from torch's by >1%."""
    grads = _grads(1, seed=4)
    gen = torch.Generator().manual_seed(1)
    start = [torch.randn(s, generator=gen) for s in SHAPES]
    ours, _ = _run(lambda ps: O.Muon(ps, lr=0.02, normalize="spectral"), grads)
    ref, _ = _run(lambda ps: torch.optim.Muon(ps, lr=0.02, weight_decay=0.0), grads)
    for p, r, s in zip(ours, ref, start):
        assert (p - r).norm() > 1e-2 * (r - s).norm()


@pytest.mark.parametrize("betas,wd,lr", [((0.9, 0.999), 1e-2, 1e-2), ((0.8, 0.95), 0.1, 3e-3)])
def test_adamw_equals_torch_adamw(betas, wd, lr):
    """``AdamW`` against ``torch.optim.AdamW(foreach=False)``, 50 fp32 steps on matrices, a vector and a
    conv kernel with gradients of varying size: max |difference| <= 2e-7 max |p| (measured 6e-8 .. 1.2e-7,
    i.e. <= 2 ulps of the largest entry; bias corrections in float64 as torch's Python floats). The
    remaining differences are the rounding order: ``v`` by ``lerp`` (torch: ``mul + addcmul``), ``1/denom``
    times ``m`` (torch: ``addcdiv``), which keeps every code path of ours bit-identical (skipped steps
    without branches). With fp32 bias corrections this was 8e-7."""
    shapes = [(64, 32), (100,), (16, 16, 3, 3)]
    gen = torch.Generator().manual_seed(0)
    init = [torch.randn(s, generator=gen) for s in shapes]
    grads = [[torch.randn(s, generator=gen) * (0.1 + k % 5) for s in shapes] for k in range(50)]
    out = []
    for make in (lambda ps: O.AdamW(ps, lr=lr, betas=betas, weight_decay=wd),
                 lambda ps: torch.optim.AdamW(ps, lr=lr, betas=betas, weight_decay=wd, foreach=False)):
        ps = [torch.nn.Parameter(p.clone()) for p in init]
        opt = make(ps)
        for gs in grads:
            for p, g in zip(ps, gs):
                p.grad = g.clone()
            opt.step()
        out.append(ps)
    for a, b in zip(*out):
        assert (a - b).abs().max() <= 2e-7 * b.abs().max()


def _ref_rule(u, c):
    """The paper's 1-D rule, written out: u if ||u|| <= c else u / sqrt(1 + ||u||^2/c^2)."""
    n = float(u.norm())
    return u if n <= c else u / math.sqrt(1 + n * n / (c * c))


@pytest.mark.parametrize("rule", [True, "reference"])
def test_vector_clip_rules(rule):
    """1-D parameters under plain SGD (no momentum) with ``c = 1``: gradient norms on both sides of c
    (0.5, 0.99, 1.01, 3); the reference rule leaves ``||u|| <= c`` alone, the smooth one never does."""
    c, lr = 1.0, 0.1
    for norm in (0.5, 0.99, 1.01, 3.0):
        g = torch.randn(7, dtype=torch.float64)
        g = g * (norm / g.norm())
        p = torch.nn.Parameter(torch.zeros(7, dtype=torch.float64))
        opt = O.Spectra([p], base="sgd", post="none", momentum=0.0, lr=lr, weight_decay=0.0, c=c,
                        vector_clip=rule)
        p.grad = g.clone()
        opt.step()
        want = _ref_rule(g, c) if rule == "reference" else g / math.sqrt(1 + norm**2 / c**2)
        torch.testing.assert_close(p.detach(), -lr * want, rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match="vector_clip"):
        O.Spectra([p], vector_clip="paper")
