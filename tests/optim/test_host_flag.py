"""An eager step of CPU tensors decides its non-finite check on the host (``Spectra._flags_on_host``): the verdict
is a Python bool, the plain AdamW/SGD route calls torch's fused kernel without ``found_inf`` or not at all, and the
skip counter is added to only on a skipped step. Checked against the tensor flag a GPU keeps (the same bits, skip
counts and step counts over steps with bad gradients, for the fused route, the pipeline, the matrix posts and
mixed groups), by the ops a step dispatches, and for when the tensor flag must stay (a tensor ``lr``, a norm on
another device, the multi-tensor path)."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import spectrakit.optim as O

SHAPES = [(8, 6), (6,), (5, 8), (8, 6)]


def _tensor_flags(opt: O.Spectra) -> O.Spectra:
    opt._flags_on_host = lambda grads, grad_norm: False
    return opt


def _make(name: str, params, **kw) -> O.Spectra:
    if name == "mixed":  # a checked AdamW group and an unchecked SGD group (it steps whatever the verdict)
        return O.AdamW([{"params": params[:2]},
                        {"params": params[2:], "base": "sgd", "momentum": 0.9, "check_finite": False,
                         "weight_decay": 0.0}], lr=1e-2)
    return getattr(O, name)(params, lr=1e-2, **kw)


@pytest.mark.parametrize("given_norm", [False, True], ids=["checked", "grad_norm"])
@pytest.mark.parametrize("name", ["AdamW", "SGD", "Lion", "Signum", "SpectraAdamW", "Muon", "mixed"])
def test_host_verdict_gives_the_tensor_flags_steps(name, given_norm):
    """Six steps, the third with a NaN entry and the fifth with an infinite one (a NaN or infinite norm when it is
    given): parameters, states, ``skipped_steps`` and ``steps_taken`` equal the tensor flag's bit for bit."""
    gen = torch.Generator().manual_seed(3)
    init = [torch.randn(s, generator=gen) for s in SHAPES]
    a = [torch.nn.Parameter(x.clone()) for x in init]
    b = [torch.nn.Parameter(x.clone()) for x in init]
    host, tensor = _make(name, a), _tensor_flags(_make(name, b))
    sgd = [torch.nn.Parameter(x.clone()) for x in init[2:]]  # mixed: torch's SGD on the unchecked group's tensors
    torch_sgd = torch.optim.SGD(sgd, lr=1e-2, momentum=0.9, fused=True)
    for k in range(6):
        for p, q in zip(a, b):
            p.grad = torch.randn(p.shape, generator=gen)
            q.grad = p.grad.clone()
        for p, r in zip(a[2:], sgd):
            r.grad = p.grad.clone()
        torch_sgd.step()
        if k in (2, 4):
            a[0].grad.view(-1)[3] = b[0].grad.view(-1)[3] = math.nan if k == 2 else -math.inf
        assert host._flags_on_host([p.grad for p in a], None)
        if given_norm:
            host.step(grad_norm=torch.nn.utils.get_total_norm([p.grad for p in a]))
            tensor.step(grad_norm=torch.nn.utils.get_total_norm([q.grad for q in b]))
        else:
            host.step()
            tensor.step()
    assert all(torch.equal(p, q) for p, q in zip(a, b))
    for p, q in zip(a, b):
        assert host.state[p].keys() == tensor.state[q].keys()
        for key, value in host.state[p].items():
            assert torch.equal(value, tensor.state[q][key]), key
    for g, h in zip(host.param_groups, tensor.param_groups):
        assert int(g["skipped_steps"]) == int(h["skipped_steps"]) == 2  # (the step's count, in every group)
        assert int(g["steps_taken"]) == int(h["steps_taken"]) == 6
    if name == "mixed":  # the unchecked group stepped all six times (torch's SGD, bit for bit), the checked one four
        assert float(host.state[a[0]]["step"]) == 4
        assert all(torch.equal(p, r) for p, r in zip(a[2:], sgd))


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket).removeprefix("aten.")] += 1
        return func(*args, **(kwargs or {}))


def _step_ops(opt, params, bad: bool, **kw) -> Counter:
    gen = torch.Generator().manual_seed(0)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    if bad:
        params[1].grad[0] = math.inf
    norm = {"grad_norm": torch.nn.utils.get_total_norm([p.grad for p in params])} if kw.get("norm") else {}
    with _Ops() as rec:
        opt.step(**norm)
    return rec.ops


@pytest.mark.parametrize("norm", [False, True], ids=["checked", "grad_norm"])
@pytest.mark.parametrize("name,kernel", [("AdamW", "_fused_adamw_"), ("SGD", "_fused_sgd_")])
def test_fused_route_issues_no_flag_ops(name, kernel, norm):
    """A taken step: the kernel without ``found_inf`` and none of the tensor flag's ops (its cast, ``1 - ok``, the
    counter's comparison); a skipped step: no kernel, nothing written but the two counters. The tensor flag's
    step does issue them (the test would pass vacuously otherwise)."""
    params = [torch.nn.Parameter(torch.randn(s)) for s in SHAPES]
    opt = getattr(O, name)(params, lr=1e-2)
    opt.step()
    flag_ops = {"rsub", "eq", "_to_copy", "abs", "all", "detach"}
    taken = _step_ops(opt, params, bad=False, norm=norm)
    assert taken[kernel] == 1 and not flag_ops & set(taken), taken
    skipped = _step_ops(opt, params, bad=True, norm=norm)
    assert kernel not in skipped and not flag_ops & set(skipped), skipped
    assert int(opt.skipped_steps) == 1
    assert flag_ops & set(_step_ops(_tensor_flags(opt), params, bad=False, norm=norm))


def test_tensor_flag_where_a_value_cannot_be_read_for_free():
    """A tensor ``lr`` (folded into the flag, never read), a norm that is not a CPU tensor, and the multi-tensor
    code path forced on a CPU (the GPU's, which studies time there) keep the tensor flag."""
    params = [torch.nn.Parameter(torch.randn(s)) for s in SHAPES]
    grads = [torch.randn(s) for s in SHAPES]
    opt = O.AdamW(params, lr=1e-2)
    assert opt._flags_on_host(grads, None) and opt._flags_on_host(grads, torch.tensor(1.0))
    assert not opt._flags_on_host(grads, torch.empty((), device="meta"))
    assert not O.AdamW(params, lr=torch.tensor(1e-2))._flags_on_host(grads, None)
    multi = type("MultiTensorAdamW", (O.AdamW,), {"_per_tensor": staticmethod(lambda device: False)})(params)
    assert not multi._flags_on_host(grads, None)
