"""The stored copy of the skip flag that each batch of the traced step (``torch.compile``) reads
(:func:`spectrakit.optim.bases.stored`): the same values, and the identity outside a trace. How the traced step
reads the flag and checks finiteness in its functionalized graph is checked on the graph that
tests/optim/test_compile_foreach.py traces anyway (``test_traced_checks_are_single_reductions_...``); the
traced step's numbers against the eager step, bit for bit, there and in tests/optim/test_compile.py."""

from __future__ import annotations

import torch

from spectrakit.optim.bases import stored


def test_stored_is_the_same_values_and_the_identity_outside_a_trace():
    x = torch.tensor([1.0, -0.0, 3.5e-8, 1e30])
    assert stored(x) is x
    traced = torch.compile(stored, backend="aot_eager", fullgraph=True)
    for v in (x, torch.tensor(0.0), torch.tensor(1.0), torch.tensor(-0.0)):
        got = traced(v)
        assert got.shape == v.shape and torch.equal(got, v)
        assert torch.equal(torch.signbit(got), torch.signbit(v))
