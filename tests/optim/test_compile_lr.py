"""A Python-float ``lr`` that changes on every call (a scheduler assigning ``group["lr"] = float``) under
``torch.compile(opt.step)`` (``aot_eager``): no graph break, and at most one recompile, where dynamo's first
graph took the first value as a constant and the second one takes the number as an input (torch.optim.AdamW
recompiles on every new value until dynamo's recompile limit, then runs eagerly). The plain presets' fused CPU
step (SGD here; AdamW shares its code) passes the number to torch's kernel as a float64 0-d tensor while
traced. The compiled steps equal the eager ones bit for bit, and a non-finite lr still raises ValueError naming
``lr``."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo as dynamo
from torch._dynamo.backends.debugging import aot_eager
from torch._dynamo.utils import counters

import spectrakit.optim as O

TWO = ((6, 4), (4,))  # a matrix and a vector


def _pair(name):
    gen = torch.Generator().manual_seed(0)
    shapes = TWO[:1] if "Muon" in name else TWO
    init = [torch.randn(s, generator=gen) for s in shapes]
    a = [torch.nn.Parameter(t.clone()) for t in init]
    b = [torch.nn.Parameter(t.clone()) for t in init]
    kwargs = dict(momentum=0.9, weight_decay=0.1) if name == "SGD" else {}  # SGD: the decay's lr path too
    return a, b, getattr(O, name)(a, lr=1e-3, **kwargs), getattr(O, name)(b, lr=1e-3, **kwargs), gen


def _set_lr(opt, lr):
    for g in opt.param_groups:
        g["lr"] = lr


def _compiled(opt):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return aot_eager(gm, example_inputs)

    dynamo.reset()
    counters.clear()
    return torch.compile(opt.step, backend=backend), graphs


@pytest.mark.parametrize("name", ["SpectraAdamW", "Signum", "Muon", "SGD"])
def test_a_new_float_lr_every_call_neither_breaks_the_graph_nor_recompiles_per_value(name):
    a, b, opt, ref, gen = _pair(name)
    step, graphs = _compiled(opt)
    for i, lr in enumerate((1e-3, 2.5e-3, 7e-4, 3.1e-3)):
        grads = [torch.randn(p.shape, generator=gen) for p in a]
        for p, q, g in zip(a, b, grads):
            p.grad, q.grad = g.clone(), g.clone()
        _set_lr(opt, lr)
        _set_lr(ref, lr)
        step()
        ref.step()
        for p, q in zip(a, b):  # bit for bit, every call (the lr enters as an input, not a constant)
            assert torch.equal(p, q), (name, i)
    breaks = dict(counters["graph_break"])
    assert not breaks, breaks  # math.isfinite of the symbolic lr broke the graph here before
    assert len(graphs) <= 2, len(graphs)  # the first value as a constant, then the lr as an input; 4 values


def test_a_non_finite_float_lr_still_raises_in_the_compiled_step():
    a, _, opt, _, gen = _pair("Signum")
    step, _ = _compiled(opt)
    for lr in (1e-3, 2e-3):  # the second value makes the lr an input of the graph
        for p in a:
            p.grad = torch.randn(p.shape, generator=gen)
        _set_lr(opt, lr)
        step()
    before = [p.detach().clone() for p in a]
    for bad in (float("nan"), -1e-3):  # each a guard failure: a new trace, which raises
        _set_lr(opt, bad)
        with pytest.raises(ValueError, match="lr"):
            step()
        assert all(torch.equal(p, q) for p, q in zip(a, before))  # nothing was modified
    _set_lr(opt, 5e-4)  # a good value again steps
    step()
    assert not any(torch.equal(p, q) for p, q in zip(a, before))
