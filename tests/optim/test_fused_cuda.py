"""Plain AdamW / SGD groups of CUDA float32 tensors take torch's fused CUDA kernel (spectrakit.optim.fused):
the numbers of ``torch.optim.AdamW(fused=True)`` / ``torch.optim.SGD(fused=True)`` on the same device bit for bit,
the non-finite skip through the kernel's ``found_inf``, a tensor ``lr`` on the CPU or on the device, no
host-device synchronisation, float64 parameters falling back to the general pipeline, and the compiled step."""

from __future__ import annotations

import copy

import pytest
import torch

import spectrakit.optim as O
from spectrakit.optim.spectra import GRAD_BOUND
from tests.optim.test_fused import CASES, TORCH, _route

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

SHAPES = [(12, 8), (8, 12), (5,), (3, 2, 2, 2), (), (64, 48)]
IDS = [f"{n}-{i}" for i, (n, _) in enumerate(CASES)]


def _init(dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=gen, dtype=torch.float64).to("cuda", dtype) for s in SHAPES]


def _grads(steps, dtype=torch.float32, bad=None):
    gen = torch.Generator().manual_seed(1)
    out = [[(torch.randn(s, generator=gen, dtype=torch.float64) * 3).to("cuda", dtype) for s in SHAPES]
           for _ in range(steps)]
    if bad is not None:
        out[bad[0]][1][2, 3] = bad[1]
    return out


def _run(make, init, grads, drop=None):
    params = [torch.nn.Parameter(x.clone()) for x in init]
    opt = make(params)
    for k, gs in enumerate(grads):
        if k == drop:
            continue
        for p, g in zip(params, gs):
            p.grad = g.clone()
        opt.step()
    return params, opt


@pytest.mark.parametrize("name,kw", CASES, ids=IDS)
def test_equals_torch_fused_on_cuda_bit_for_bit(name, kw):
    init, grads = _init(), _grads(20)
    ours, opt = _run(lambda ps: getattr(O, name)(ps, **kw), init, grads)
    theirs, ref = _run(lambda ps: TORCH[name](ps, **kw), init, grads)
    assert _route(opt) == name.lower()
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    key = "exp_avg_sq" if name == "AdamW" else "momentum_buffer"
    assert all(torch.equal(opt.state[a][key], ref.state[b][key]) for a, b in zip(ours, theirs))
    assert int(opt.skipped_steps) == 0


@pytest.mark.parametrize("name,kw", CASES, ids=IDS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 2 * GRAD_BOUND])
def test_bad_gradient_skips_the_step_on_cuda(name, kw, bad):
    """One bad entry at step 4 of 8: that step is skipped and counted (step counters 7); the run equals
    torch's fused run without that step, bit for bit."""
    init = _init()
    ours, opt = _run(lambda ps: getattr(O, name)(ps, **kw), init, _grads(8, bad=(4, bad)))
    theirs, _ = _run(lambda ps: TORCH[name](ps, **kw), init, _grads(8), drop=4)
    assert int(opt.skipped_steps) == 1
    assert all(float(opt.state[p]["step"]) == 7 for p in ours)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


@pytest.mark.parametrize("name,kw", CASES[::2], ids=IDS[::2])
@pytest.mark.parametrize("where", ["cpu", "cuda"])
def test_tensor_lr_on_cuda(name, kw, where):
    """A 0-d tensor ``lr`` on the CPU (float64) or the device (float32, what torch's CUDA kernels read there),
    changed in place: torch's fused numbers with the same tensor; a nan written there skips the step."""
    kw = {k: v for k, v in kw.items() if k != "lr"}
    lr_a = torch.tensor(1e-2, dtype=torch.float64 if where == "cpu" else torch.float32, device=where)
    lr_b = lr_a.clone()
    init, grads = _init(), _grads(6)
    ours = [torch.nn.Parameter(x.clone()) for x in init]
    theirs = [torch.nn.Parameter(x.clone()) for x in init]
    opt, ref = getattr(O, name)(ours, lr=lr_a, **kw), TORCH[name](theirs, lr=lr_b, **kw)
    for k, gs in enumerate(grads):
        lr_a.fill_(1e-2 / (1 + k))
        lr_b.fill_(1e-2 / (1 + k))
        for p, q, g in zip(ours, theirs, gs):
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        ref.step()
    assert _route(opt) == name.lower()
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    before = [p.detach().clone() for p in ours]
    states = copy.deepcopy([opt.state[p] for p in ours])
    lr_a.fill_(float("nan"))
    opt.step()
    assert all(torch.equal(p, b) for p, b in zip(ours, before))
    assert all(torch.equal(opt.state[p][k], st[k]) for p, st in zip(ours, states) for k in st)
    assert int(opt.skipped_steps) == 1


@pytest.mark.parametrize("name", ["AdamW", "SGD"])
def test_fused_cuda_step_does_not_synchronise(name):
    params = [torch.nn.Parameter(x.clone()) for x in _init()]
    opt = getattr(O, name)(params, lr=1e-2, weight_decay=0.1)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()  # states created
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        opt.step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert _route(opt) == name.lower()


def test_float64_on_cuda_takes_the_pipeline():
    """torch's CUDA kernels read float32 step counters; float64 parameters keep float64 counters here, so they
    take the general pipeline: within float64 rounding of torch's foreach AdamW."""
    init, grads = _init(torch.float64), _grads(10, torch.float64)
    ours, opt = _run(lambda ps: O.AdamW(ps, lr=1e-2, weight_decay=0.1), init, grads)
    theirs, _ = _run(lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, foreach=True), init, grads)
    assert _route(opt) is None
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_float64_lr_on_cuda_takes_the_pipeline():
    """torch's CUDA kernels read an ``lr`` on the device as float32: a float64 one there takes the general
    pipeline, within the documented 5e-7 of torch's AdamW."""
    init, grads = _init(), _grads(6)
    lr = torch.tensor(1e-2, dtype=torch.float64, device="cuda")
    ours, opt = _run(lambda ps: O.AdamW(ps, lr=lr, weight_decay=0.1), init, grads)
    theirs, _ = _run(lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, foreach=True), init, grads)
    assert _route(opt) is None
    for a, b in zip(ours, theirs):
        assert (a - b).abs().max() <= 5e-7 * b.abs().max().clamp_min(1.0)


@pytest.mark.parametrize("name,kw", CASES[::2], ids=IDS[::2])
def test_compiled_fused_cuda_step_equals_eager(name, kw):
    """``torch.compile`` (aot_eager) traces the fused CUDA step as one operator call, its Python-number ``lr`` a
    float32 tensor on the device (no CPU code in the graph): bit for bit the eager step given that tensor, a
    skipped step included, and the eager step with the Python number within one rounding of the parameters."""
    init, grads = _init(), _grads(4, bad=(2, float("nan")))
    lr32 = torch.tensor(kw["lr"], dtype=torch.float32, device="cuda")
    eager, opt = _run(lambda ps: getattr(O, name)(ps, **{**kw, "lr": lr32}), init, grads)
    plain, _ = _run(lambda ps: getattr(O, name)(ps, **kw), init, grads)
    params = [torch.nn.Parameter(x.clone()) for x in init]
    traced = getattr(O, name)(params, **kw)
    step = torch.compile(traced.step, backend="aot_eager")
    for gs in grads:
        for p, g in zip(params, gs):
            p.grad = g.clone()
        step()
    assert int(traced.skipped_steps) == int(opt.skipped_steps) == 1
    assert all(torch.equal(a, b) for a, b in zip(eager, params))
    for a, b in zip(plain, params):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7)
    assert int(traced.param_groups[0]["steps_taken"]) == 4


def test_skip_counter_lives_on_the_parameters_device():
    """The skip counter is made on the parameters' device (a compiled step sees it there from its first trace, and
    never branches on its device) and a state dict saved on the CPU loads it there."""
    params = [torch.nn.Parameter(x.clone()) for x in _init()]
    opt = O.SGD(params, lr=1e-2, momentum=0.9)
    assert opt.param_groups[0]["skipped_steps"].device.type == "cuda"
    cpu = O.SGD([torch.nn.Parameter(x.cpu()) for x in _init()], lr=1e-2, momentum=0.9)
    opt.load_state_dict(cpu.state_dict())
    assert opt.param_groups[0]["skipped_steps"].device.type == "cuda"
