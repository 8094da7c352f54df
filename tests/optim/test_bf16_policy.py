"""post_dtype="bfloat16" computes in bf16 only where bf16 matmuls are fast (linalg.bf16_matmul_fast)."""

from __future__ import annotations

import pytest
import torch

import spectrakit.optim as O
import spectrakit.optim.batching as spectra_mod  # (BF16_MIN_DIM is read there)
from spectrakit.linalg import bf16_matmul_override

SHAPES = [(24, 40), (40, 24), (16,)]


def _run(post, post_dtype, fast):
    g = torch.Generator().manual_seed(5)
    params = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in SHAPES]
    opt = O.SpectraAdamW(params, lr=0.1, post=post, post_dtype=post_dtype, c=0.05)
    with bf16_matmul_override(fast):
        for _ in range(3):
            for p in params:
                p.grad = torch.randn(p.shape, generator=g)
            opt.step()
    return [p.detach().clone() for p in params]


@pytest.mark.parametrize("post", ["soft_clip", "soft_clip_accurate", "soft_clip_ns", "spectral_lmo"])
def test_bf16_without_fast_matmuls_is_the_work_dtype(post):
    """bf16 matmuls emulated: post_dtype="bfloat16" steps bit-identically to post_dtype=None."""
    for a, b in zip(_run(post, "bfloat16", False), _run(post, None, False)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_bf16_with_fast_matmuls_is_used(monkeypatch):
    """bf16 matmuls fast (forced), matrices at or above BF16_MIN_DIM (lowered to 16 here): the accurate soft
    clip computes in bf16, so the weights differ from the fp32 run, by about bf16 rounding (the update is
    lr * O(c) per step)."""
    monkeypatch.setattr(spectra_mod, "BF16_MIN_DIM", 16)
    a, b = _run("soft_clip_accurate", "bfloat16", True), _run("soft_clip_accurate", None, True)
    diff = max(float((x - y).abs().max()) for x, y in zip(a, b))
    assert 0 < diff < 0.1 * 0.05 * 3 * 0.1


def test_default_soft_clip_keeps_fp32_on_cpu_even_with_fast_bf16():
    """The default soft clip's bf16 route is slower than its fp32 Gram route on CPU (AMX included): a bf16
    request on a CPU tensor computes in fp32."""
    for a, b in zip(_run("soft_clip", "bfloat16", True), _run("soft_clip", None, True)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("min_dim", [25, 1024])
def test_bf16_below_min_dim_is_the_work_dtype(monkeypatch, min_dim):
    """bf16 matmuls fast, every matrix's min(m, n) = 24 below BF16_MIN_DIM: the step computes in the work
    dtype (bit-identical to post_dtype=None); at the floor (24) bf16 is used again (the weights differ)."""
    monkeypatch.setattr(spectra_mod, "BF16_MIN_DIM", min_dim)
    for a, b in zip(_run("soft_clip_accurate", "bfloat16", True), _run("soft_clip_accurate", None, True)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    monkeypatch.setattr(spectra_mod, "BF16_MIN_DIM", 24)
    a, b = _run("soft_clip_accurate", "bfloat16", True), _run("soft_clip_accurate", None, True)
    assert max(float((x - y).abs().max()) for x, y in zip(a, b)) > 0
