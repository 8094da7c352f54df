"""``step(grad_norm=...)``: the non-finite check decided from a norm of the gradients the caller already has (the
value ``clip_grad_norm_`` returns) instead of a pass over the gradients. Checked against the checked step (the same
bits after clipped steps, for the fused route, the pipeline and the matrix posts), against an oracle of the skip
(``float32(norm) <= float32(GRAD_BOUND)``) on adversarial norms of every floating dtype, by the ops the step
dispatches (no reduction over a gradient when the norm is given, the check's ``aminmax`` without it), under
``torch.compile`` (one graph, no recompile as the norm changes, the eager numbers), and for bad arguments."""

from __future__ import annotations

import math

import pytest
import torch
import torch._dynamo as dynamo
from torch._dynamo.utils import counters
from torch.utils._python_dispatch import TorchDispatchMode

import spectrakit.optim as O
from spectrakit.optim.spectra import GRAD_BOUND

SHAPES = [(8, 6), (6,), (5, 8), (8, 6)]
PRESETS = ["AdamW", "SGD", "Lion", "SpectraAdamW", "SpectraMARS", "Muon"]


def _pair(name: str, seed: int = 0, host: bool = True, **kw):
    """Two optimizers on equal parameters; ``host=False``: both keep the step's flag a tensor as on a GPU (on a
    CPU the eager step decides it on the host)."""
    gen = torch.Generator().manual_seed(seed)
    init = [torch.randn(s, generator=gen) for s in SHAPES]
    a = [torch.nn.Parameter(x.clone()) for x in init]
    b = [torch.nn.Parameter(x.clone()) for x in init]
    kw = {"momentum": 0.9, **kw} if name == "SGD" else kw
    oa, ob = getattr(O, name)(a, lr=1e-2, **kw), getattr(O, name)(b, lr=1e-2, **kw)
    for o in (oa, ob):
        assert o._flags_on_host([p.grad for p in a if p.grad is not None] or [torch.zeros(1)], None)
        if not host:
            o._flags_on_host = lambda grads, grad_norm: False
    return a, oa, b, ob, gen


def _grads(a, b, gen, scale=3.0):
    for p, q in zip(a, b):
        p.grad = torch.randn(p.shape, generator=gen) * scale
        q.grad = p.grad.clone()


def _same(a, b, oa, ob):
    assert all(torch.equal(p, q) for p, q in zip(a, b))
    for p, q in zip(a, b):
        for k, v in oa.state[p].items():
            assert torch.equal(v, ob.state[q][k]), k


@pytest.mark.parametrize("host", [True, False], ids=["host flag", "tensor flag"])
@pytest.mark.parametrize("name", PRESETS)
def test_given_norm_gives_the_checked_steps(name, host):
    """Clipped gradients (``clip_grad_norm_`` at 1.0, its returned norm given), 4 steps: parameters and states
    equal the checked step's bit for bit, no step skipped."""
    a, oa, b, ob, gen = _pair(name, host=host)
    for _ in range(4):
        _grads(a, b, gen)
        torch.nn.utils.clip_grad_norm_(a, 1.0)
        norm = torch.nn.utils.clip_grad_norm_(b, 1.0)
        oa.step()
        ob.step(grad_norm=norm)
    _same(a, b, oa, ob)
    assert int(ob.skipped_steps) == int(oa.skipped_steps) == 0


def _norms():
    """Adversarial norms of every floating dtype, with the oracle's verdict (True: the step is taken)."""
    bound32 = torch.tensor(GRAD_BOUND, dtype=torch.float32)
    above = torch.nextafter(bound32, torch.tensor(math.inf)).item()
    below = torch.nextafter(bound32, torch.tensor(0.0)).item()
    values = [0.0, 1e-30, 2.5, bound32.item(), below, above, 4 * GRAD_BOUND, 1e300, math.inf, math.nan, 7e4]
    out = []
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        for v in values:
            t = torch.tensor(v, dtype=dtype)  # (float16: 7e4 and above round to inf)
            taken = bool(math.isfinite(t.double().item())) and t.float().item() <= bound32.item()
            out.append((t, taken))
    return out


@pytest.mark.parametrize("host", [True, False], ids=["host flag", "tensor flag"])
@pytest.mark.parametrize("name", ["AdamW", "SGD", "SpectraAdamW"])
def test_skip_follows_the_oracle_on_adversarial_norms(name, host):
    """Each norm (0-d, and one of shape (1,)) on clean gradients: taken steps equal the checked step, skipped
    ones leave parameters and states untouched and count in ``skipped_steps``; both verdicts occur."""
    a, oa, b, ob, gen = _pair(name, seed=1, host=host)
    skipped, verdicts = 0, set()
    for k, (norm, taken) in enumerate(_norms()):
        _grads(a, b, gen, scale=1e-2)
        before = [q.detach().clone() for q in b]
        ob.step(grad_norm=norm.reshape(1) if k % 5 == 0 else norm)
        verdicts.add(taken)
        if taken:
            oa.step()
            _same(a, b, oa, ob)
        else:
            skipped += 1
            assert all(torch.equal(x, q) for x, q in zip(before, b)), (norm, norm.dtype)
        assert int(ob.skipped_steps) == skipped, (norm, norm.dtype)
    assert verdicts == {True, False}


class _Ops(TorchDispatchMode):
    """Records the aten ops dispatched and whether any reads one of ``watch`` (by storage)."""

    def __init__(self, watch):
        super().__init__()
        self.ptrs = {t.untyped_storage().data_ptr() for t in watch}
        self.reads: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        flat = [x for a in list(args) + list((kwargs or {}).values()) for x in (a if isinstance(a, (list, tuple))
                                                                            else [a])]
        if any(isinstance(x, torch.Tensor) and x.untyped_storage().data_ptr() in self.ptrs for x in flat):
            self.reads.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", ["AdamW", "SGD", "Lion"])
def test_given_norm_reads_no_gradient_for_the_check(name):
    """Without ``grad_norm`` the step's ops read the gradients in the check (``aminmax``) and in the update; with
    it, only the update reads them: the kernel (fused route) or the work copy (pipeline)."""
    a, oa, b, ob, gen = _pair(name, seed=2)
    _grads(a, b, gen)
    norm = torch.nn.utils.get_total_norm([q.grad for q in b])
    with _Ops([p.grad for p in a]) as plain:
        oa.step()
    with _Ops([q.grad for q in b]) as given:
        ob.step(grad_norm=norm)
    assert "aminmax" in plain.reads
    assert given.reads and not {"aminmax", "amax", "amin", "max", "min", "abs", "isfinite", "_foreach_norm",
                                "linalg_vector_norm"} & set(given.reads), given.reads
    _same(a, b, oa, ob)


def test_grad_norm_arguments():
    """Numbers >= 0 (NaN and inf too: they skip), 0-d or one-element floating tensors; anything else raises
    naming ``grad_norm`` before the step changes anything; not with a closure."""
    a, oa, b, ob, gen = _pair("AdamW", seed=3)
    _grads(a, b, gen)
    before = [q.detach().clone() for q in b]
    for bad, err in [("1.0", TypeError), (True, TypeError), ([1.0], TypeError),
                     (torch.tensor(2), TypeError), (torch.ones(2), TypeError), (torch.ones(()) + 0j, TypeError),
                     (-1.0, ValueError), (-math.inf, ValueError)]:
        with pytest.raises(err, match="grad_norm"):
            ob.step(grad_norm=bad)
    with pytest.raises(ValueError, match="closure"):
        ob.step(lambda: torch.zeros(()), grad_norm=1.0)
    assert all(torch.equal(x, q) for x, q in zip(before, b)) and int(ob.skipped_steps) == 0
    ob.step(grad_norm=math.nan)
    assert int(ob.skipped_steps) == 1
    ob.step(grad_norm=3)
    oa.step()
    assert int(ob.skipped_steps) == 1 and all(torch.equal(p, q) for p, q in zip(a, b))


@pytest.mark.parametrize("name", ["AdamW", "SpectraAdamW"])
def test_compiled_step_with_changing_norms(name):
    """``torch.compile(opt.step)`` (``aot_eager``) called with the norm of each step's gradients, one of them
    infinite (a skipped step): one graph, no recompile, no graph break, the eager twin's numbers bit for bit."""
    a, oa, b, ob, gen = _pair(name, seed=4)
    dynamo.reset()
    counters.clear()
    step = torch.compile(ob.step, backend="aot_eager")
    with dynamo.config.patch(error_on_recompile=True):
        for k in range(3):
            _grads(a, b, gen)
            norm = torch.nn.utils.get_total_norm([q.grad for q in b])
            if k == 1:
                norm = norm * math.inf
            step(grad_norm=norm)
            oa.step(grad_norm=norm)
    breaks, graphs = dict(counters["graph_break"]), counters["stats"]["unique_graphs"]
    dynamo.reset()
    assert not breaks and graphs == 1
    _same(a, b, oa, ob)
    assert int(ob.skipped_steps) == int(oa.skipped_steps) == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["AdamW", "SpectraAdamW"])
def test_cuda_norm_from_the_host_keeps_the_counter_on_the_device(name):
    """CUDA parameters with a Python-number norm and a CPU tensor norm (an infinite one skips): the steps equal the
    checked ones and ``skipped_steps`` stays on the gradients' device (no copy back and forth every step)."""
    gen = torch.Generator().manual_seed(6)
    init = [torch.randn(s, generator=gen) for s in SHAPES]
    a = [torch.nn.Parameter(x.cuda()) for x in init]
    b = [torch.nn.Parameter(x.cuda()) for x in init]
    oa, ob = getattr(O, name)(a, lr=1e-2), getattr(O, name)(b, lr=1e-2)
    for k, norm in enumerate([2.5, torch.tensor(3.0), torch.tensor(math.inf), 1.0]):
        for p, q in zip(a, b):
            p.grad = torch.randn(p.shape, generator=gen).cuda()
            q.grad = p.grad.clone()
        if k != 2:
            oa.step()
        ob.step(grad_norm=norm)
        assert ob.skipped_steps.device.type == "cuda"
    _same(a, b, oa, ob)
    assert int(ob.skipped_steps) == 1
