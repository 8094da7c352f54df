"""How the traced step (``torch.compile``) reads its skip flag and checks finiteness, in the functionalized graph
(``aot_eager``, no inductor): the shapes that keep inductor's first compile short on a CPU (docs/BENCHMARKS.md,
"Compile-first"). The traced step's numbers are checked against the eager step, bit for bit, by
tests/optim/test_compile_foreach.py and tests/optim/test_compile.py."""

from __future__ import annotations

import collections

import pytest
import torch
import torch._dynamo as dynamo
from torch._dynamo.backends.common import aot_autograd

import spectrakit.optim as O
from spectrakit.optim.bases import stored

SHAPES = [(16, 8)] * 3 + [(8, 16), (5,)]  # three batches: 3 x (16, 8), (8, 16), the flat one


def _graph(name):
    gen = torch.Generator().manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in SHAPES]
    for p in ps:
        p.grad = torch.randn(p.shape, generator=gen)
    graphs = []

    def fw(gm, example_inputs):
        graphs.append(gm.graph)
        return gm.forward

    dynamo.reset()
    opt = getattr(O, name)(ps, lr=1e-2)
    torch.compile(opt.step, backend=aot_autograd(fw_compiler=fw))()
    assert len(graphs) == 1
    return graphs[0]


def _flag_copies(graph) -> int:
    """``amin`` nodes over an ``expand`` of a 0-d tensor (:func:`spectrakit.optim.bases.stored` of a flag)."""
    count = 0
    for n in graph.nodes:
        if n.op == "call_function" and "amin" in str(n.target):
            src = n.args[0]
            if "expand" in str(getattr(src, "target", "")) and src.args[0].meta["val"].ndim == 0:
                count += 1
    return count


@pytest.mark.parametrize("name", ["SpectraAdamW", "SpectraSignum"])
def test_traced_checks_are_single_reductions_and_each_batch_has_its_flag(name):
    """No ``aminmax`` (two accumulators in inductor's code), no ``nan_to_num`` (three selects and an unvectorised
    ``isnan``), no stack of 0-d reduction results (inductor copies each in a kernel of its own): one ``amax`` per
    gradient and per matrix batch's update; and every batch reads a stored copy of the skip flag (at least one
    per batch: inductor's fusion search pairs the nodes that read one buffer)."""
    graph = _graph(name)
    ops = collections.Counter(str(n.target) for n in graph.nodes if n.op == "call_function")
    assert not any("aminmax" in k or "nan_to_num" in k for k in ops), dict(ops)
    stacks = [n for n in graph.nodes if n.op == "call_function" and "stack" in str(n.target)
              and all(a.meta["val"].ndim == 0 and "amax" in str(getattr(a, "target", "")) for a in n.args[0])]
    assert not stacks
    assert ops["aten.amax.default"] == len(SHAPES) + 2  # every gradient, and the two matrix batches' updates
    assert _flag_copies(graph) >= 3


def test_stored_is_the_same_values_and_the_identity_outside_a_trace():
    x = torch.tensor([1.0, -0.0, 3.5e-8, 1e30])
    assert stored(x) is x
    traced = torch.compile(stored, backend="aot_eager", fullgraph=True)
    for v in (x, torch.tensor(0.0), torch.tensor(1.0), torch.tensor(-0.0)):
        got = traced(v)
        assert got.shape == v.shape and torch.equal(got, v)
        assert torch.equal(torch.signbit(got), torch.signbit(v))
