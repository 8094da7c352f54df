"""``torch.compile(opt.step)`` on CPU with the ``eager`` and ``aot_eager`` backends: same numbers as the
eager step; the plain presets and Muon trace in one graph (no graph break); the SPECTRA presets still
break (documented in docs/optim.md: the soft clip's host-side Polar-Express schedule)."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo as dynamo

import spectrakit.optim as O

NO_BREAKS = ["AdamW", "Signum", "Lion", "SGD", "Muon", "DMuon", "AdEMAMix"]


def _pair(name, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(16, 8), (8, 16), (8,)]
    init = [torch.randn(s, generator=gen) for s in shapes]
    out = []
    for _ in range(2):
        ps = [torch.nn.Parameter(x.clone()) for x in init]
        out.append((ps, getattr(O, name)(ps, lr=1e-2)))
    grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(3)]
    return out, grads


CASES = [(n, "eager") for n in NO_BREAKS + ["SpectraAdamW"]] + [("AdamW", "aot_eager"), ("Muon", "aot_eager")]


@pytest.mark.parametrize("name,backend", CASES)
def test_compiled_step_equals_eager(name, backend):
    dynamo.reset()
    ((ps, opt), (qs, ref)), grads = _pair(name)
    step = torch.compile(opt.step, backend=backend)
    for gs in grads:
        for p, q, g in zip(ps, qs, gs):
            p.grad, q.grad = g.clone(), g.clone()
        step()
        ref.step()
    for p, q in zip(ps, qs):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ["AdamW", "Signum", "Lion", "Muon", "AdEMAMix"])
def test_no_graph_break(name):
    dynamo.reset()
    ((ps, opt), _), grads = _pair(name)
    for p, g in zip(ps, grads[0]):
        p.grad = g
    explained = dynamo.explain(opt.step)()
    assert explained.graph_break_count == 0, [str(r.reason)[:200] for r in explained.break_reasons]
