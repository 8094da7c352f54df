"""stack_scalars: the 0-d results of a multi-tensor reduction as one 1-D tensor, a view of their common buffer
(no copy) where they are its consecutive elements, else their stack; the values of ``torch.stack`` always."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from spectrakit.optim.joint import stack_scalars


def test_consecutive_views_are_returned_without_a_copy():
    buf = torch.randn(7, dtype=torch.float64)
    out = stack_scalars(list(buf.unbind(0)))
    assert out.data_ptr() == buf.data_ptr() and out.shape == (7,)
    assert torch.equal(out, torch.stack(list(buf.unbind(0))))
    part = list(buf[2:6].unbind(0))  # an offset into the buffer
    assert torch.equal(stack_scalars(part), buf[2:6]) and stack_scalars(part).data_ptr() == buf[2:].data_ptr()
    assert torch.equal(stack_scalars([buf[3]]), buf[3:4]) and stack_scalars([buf[3]]).data_ptr() == buf[3:].data_ptr()


@pytest.mark.parametrize("case", ["separate", "strided", "reversed", "repeated", "dtypes", "not 0-d"])
def test_anything_else_is_stacked(case):
    buf = torch.arange(8.0)
    ts = {"separate": [torch.tensor(1.0), torch.tensor(2.0), torch.tensor(3.0)],
          "strided": list(buf[::2].unbind(0)),
          "reversed": list(buf.unbind(0))[::-1],
          "repeated": [buf[0], buf[0], buf[1]],
          "dtypes": [buf[0], buf.double()[1]],
          "not 0-d": [buf[0:2], buf[2:4]]}[case]
    ref = torch.stack(ts)
    out = stack_scalars(ts)
    assert out.dtype == ref.dtype and out.shape == ref.shape and torch.equal(out, ref)
    assert out.untyped_storage().data_ptr() != buf.untyped_storage().data_ptr()  # a stack: a new buffer


def test_foreach_norm_results_and_the_traced_form():
    """On this device's ``_foreach_norm`` results (CPU: tensors of their own, stacked; CUDA: views of one buffer)
    the stack's values; traced by ``torch.compile``, the plain stack, with no graph break."""
    ts = [torch.randn(3, 4), torch.randn(5), torch.full((2,), float("nan"))]
    norms = torch._foreach_norm(ts, float("inf"))
    assert torch.allclose(stack_scalars(norms), torch.stack(norms), rtol=0, atol=0, equal_nan=True)
    counters.clear()
    traced = torch.compile(lambda xs: stack_scalars(torch._foreach_norm(xs, float("inf"))), backend="aot_eager")
    out = traced(ts)
    assert torch.allclose(out, torch.stack(norms), rtol=0, atol=0, equal_nan=True)
    assert not counters["graph_break"]
