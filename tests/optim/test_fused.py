"""Plain AdamW / SGD groups on CPU take torch's fused kernel (spectrakit.optim.fused): the numbers of
``torch.optim.AdamW(fused=True)`` / ``torch.optim.SGD(fused=True)`` bit for bit, the non-finite skip
(``check_finite``), the fallbacks to the general pipeline, and the options' validation."""

from __future__ import annotations

import copy

import pytest
import torch

import spectrakit.optim as O
from spectrakit.optim.fused import fused_base
from spectrakit.optim.spectra import GRAD_BOUND

SHAPES = [(12, 8), (8, 12), (5,), (3, 2, 2, 2), ()]


def _init(dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen, dtype=torch.float64).to(dtype) for s in SHAPES]


def _run(make, init, steps, seed=1, bad=None):
    """``steps`` steps on fresh copies of ``init``; ``bad = (step, value)`` puts ``value`` in one gradient
    entry at that step."""
    params = [torch.nn.Parameter(x.clone()) for x in init]
    opt = make(params)
    gen = torch.Generator().manual_seed(seed)
    for k in range(steps):
        for p in params:
            p.grad = (torch.randn(p.shape, generator=gen, dtype=torch.float64) * 3).to(p.dtype)
        if bad is not None and k == bad[0]:
            params[1].grad[2, 3] = bad[1]
        opt.step()
    return params, opt


TORCH = {
    "AdamW": lambda ps, **kw: torch.optim.AdamW(ps, fused=True, **kw),
    "SGD": lambda ps, **kw: torch.optim.SGD(ps, fused=True, **kw),
}
CASES = [
    ("AdamW", dict(lr=1e-2, weight_decay=0.1)),
    ("AdamW", dict(lr=3e-3, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.0)),
    ("SGD", dict(lr=1e-2, momentum=0.9)),
    ("SGD", dict(lr=1e-2, momentum=0.95, nesterov=True)),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name,kw", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_equals_torch_fused_bit_for_bit(name, kw, dtype):
    init = _init(dtype)
    ours, opt = _run(lambda ps: getattr(O, name)(ps, **kw), init, 20)
    theirs, ref = _run(lambda ps: TORCH[name](ps, **kw), init, 20)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    key = "exp_avg_sq" if name == "AdamW" else "momentum_buffer"
    assert all(torch.equal(opt.state[a][key], ref.state[b][key]) for a, b in zip(ours, theirs))
    assert int(opt.skipped_steps) == 0


@pytest.mark.parametrize("name,kw", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), 2 * GRAD_BOUND])
def test_bad_gradient_skips_the_whole_step(name, kw, bad):
    """One bad entry: parameters, moments and step counters unchanged, the step counted; the run then equals
    torch's fused run without that step, bit for bit."""
    init = _init()
    ours, opt = _run(lambda ps: getattr(O, name)(ps, **kw), init, 8, bad=(4, bad))
    assert int(opt.skipped_steps) == 1
    if name == "AdamW":
        assert all(float(opt.state[p]["step"]) == 7 for p in ours)
    else:  # SGD keeps its momentum alone, as torch's does
        assert all(opt.state[p].keys() == {"momentum_buffer"} for p in ours)
    # the same gradients without step 4: replay the generator and drop that step
    params = [torch.nn.Parameter(x.clone()) for x in init]
    ref = TORCH[name](params, **kw)
    gen = torch.Generator().manual_seed(1)
    for k in range(8):
        for p in params:
            p.grad = (torch.randn(p.shape, generator=gen, dtype=torch.float64) * 3).to(p.dtype)
        if k != 4:
            ref.step()
    assert all(torch.equal(a, b) for a, b in zip(ours, params))


def test_check_finite_false_is_torch_without_a_check():
    """``check_finite=False``: no check, no skip; a nan reaches the parameters exactly as in torch."""
    init = _init()
    ours, opt = _run(lambda ps: O.AdamW(ps, lr=1e-2, check_finite=False), init, 6, bad=(3, float("nan")))
    theirs, _ = _run(lambda ps: TORCH["AdamW"](ps, lr=1e-2), init, 6, bad=(3, float("nan")))
    assert int(opt.skipped_steps) == 0
    assert torch.isnan(ours[1]).any()
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


def test_unchecked_group_steps_while_a_checked_group_skips():
    init = _init()
    a = [torch.nn.Parameter(x.clone()) for x in init]
    opt = O.AdamW([{"params": a[:2]}, {"params": a[2:], "check_finite": False}], lr=1e-2)
    for p in a:
        p.grad = torch.ones_like(p)
    a[0].grad[0, 0] = float("nan")
    before = [p.detach().clone() for p in a]
    opt.step()
    assert all(torch.equal(p, b) for p, b in zip(a[:2], before[:2]))
    assert not any(torch.equal(p, b) for p, b in zip(a[2:], before[2:]))
    assert [int(g["skipped_steps"]) for g in opt.param_groups] == [1, 1]


def test_sgd_weight_decay_is_decoupled():
    """torch's SGD decay is coupled; ours stays ``(1 - lr wd) p`` (one multiplication before the kernel):
    equal to the general pipeline to float64 rounding."""
    init = _init(torch.float64)
    kw = dict(lr=1e-2, momentum=0.9, weight_decay=0.3)
    fused, opt = _run(lambda ps: O.SGD(ps, **kw), init, 10, bad=(5, float("nan")))
    plain, ref = _run(lambda ps: O.SGD(ps, torch_kernel=False, **kw), init, 10, bad=(5, float("nan")))
    assert int(opt.skipped_steps) == int(ref.skipped_steps) == 1
    for a, b in zip(fused, plain):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)


def _route(opt):
    group = opt.param_groups[0]
    params = [p for p in group["params"] if p.grad is not None]
    return fused_base(group, params)


@pytest.mark.parametrize("make,route", [
    (lambda ps: O.AdamW(ps), "adamw"),
    (lambda ps: O.SGD(ps), "sgd"),
    (lambda ps: O.AdamW(ps, torch_kernel=False), None),
    (lambda ps: O.AdamW(ps, lr=torch.tensor(1e-3)), "adamw"),  # the kernel's tensor-lr form
    (lambda ps: O.AdamW(ps, scale="muon"), None),
    (lambda ps: O.AdamW(ps, vector_clip=True), None),
    (lambda ps: O.SpectraAdamW(ps), None),
    (lambda ps: O.SGD(ps, dampening=0.5), None),  # torch's first step differs (no dampening)
    (lambda ps: O.SGD(ps, momentum=0.0), None),
    (lambda ps: O.Lion(ps), None),
    (lambda ps: O.Signum(ps), None),
], ids=["adamw", "sgd", "kernel-off", "tensor-lr", "scale", "vector-clip", "spectra", "dampening", "no-momentum",
        "lion", "signum"])
def test_route_choice(make, route):
    params = [torch.nn.Parameter(x.clone()) for x in _init()]
    opt = make(params)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    assert _route(opt) == route


def test_bf16_falls_back():
    """bf16 parameters keep an fp32 state: the general pipeline."""
    params = [torch.nn.Parameter(torch.randn(8, 4).bfloat16())]
    params[0].grad = torch.randn(8, 4).bfloat16()
    opt = O.AdamW(params, lr=1e-2)
    opt.step()
    assert _route(opt) is None


def test_non_contiguous_gradient_falls_back():
    """A non-contiguous gradient takes the general pipeline, within the documented 2e-7 of torch."""
    p = torch.nn.Parameter(torch.randn(8, 4))
    q = torch.nn.Parameter(p.detach().clone())
    opt, ref = O.AdamW([p], lr=1e-2), torch.optim.AdamW([q], lr=1e-2, fused=True)
    for _ in range(5):
        g = torch.randn(4, 8).t()  # (8, 4), not contiguous
        p.grad, q.grad = g, g.contiguous()
        opt.step()
        ref.step()
        assert _route(opt) is None
    assert (p - q).abs().max() <= 2e-7 * q.abs().max()


@pytest.mark.parametrize("key", ["check_finite", "torch_kernel"])
@pytest.mark.parametrize("value", [1, "yes", None])
def test_options_must_be_bool(key, value):
    with pytest.raises(TypeError, match=key):
        O.AdamW([torch.nn.Parameter(torch.randn(3))], **{key: value})
    opt = O.AdamW([torch.nn.Parameter(torch.randn(3))])
    opt.param_groups[0][key] = value
    opt.param_groups[0]["params"][0].grad = torch.randn(3)
    with pytest.raises(TypeError, match=f"param group 0: {key}"):
        opt.step()


def test_state_dict_resumes_exactly_and_loads_older_states():
    init = _init()
    straight, _ = _run(lambda ps: O.AdamW(ps, lr=1e-2), init, 10)
    params = [torch.nn.Parameter(x.clone()) for x in init]
    opt = O.AdamW(params, lr=1e-2)
    gen = torch.Generator().manual_seed(1)

    def steps(opt, params, n):
        for _ in range(n):
            for p in params:
                p.grad = (torch.randn(p.shape, generator=gen, dtype=torch.float64) * 3).to(p.dtype)
            opt.step()

    steps(opt, params, 5)
    saved = copy.deepcopy(opt.state_dict())
    for g in saved["param_groups"]:  # a state saved before the options existed
        del g["check_finite"], g["torch_kernel"]
    resumed = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt2 = O.AdamW(resumed, lr=1e-2)
    opt2.load_state_dict(saved)
    assert opt2.param_groups[0]["check_finite"] is True and opt2.param_groups[0]["torch_kernel"] is True
    steps(opt2, resumed, 5)
    assert all(torch.equal(a, b) for a, b in zip(straight, resumed))


@pytest.mark.parametrize("name,kw", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_tensor_lr_equals_torch_fused_with_a_tensor_lr(name, kw):
    """A 0-d tensor ``lr`` (changed in place between steps, as a scheduler of a compiled step does) takes the
    kernel's tensor-lr form: torch's ``fused=True`` numbers with the same tensor, bit for bit."""
    init = _init()
    kw = {k: v for k, v in kw.items() if k != "lr"}
    lr_a, lr_b = torch.tensor(1e-2, dtype=torch.float64), torch.tensor(1e-2, dtype=torch.float64)
    ours = [torch.nn.Parameter(x.clone()) for x in init]
    theirs = [torch.nn.Parameter(x.clone()) for x in init]
    opt, ref = getattr(O, name)(ours, lr=lr_a, **kw), TORCH[name](theirs, lr=lr_b, **kw)
    gen = torch.Generator().manual_seed(1)
    for k in range(6):
        lr_a.fill_(1e-2 / (1 + k))
        lr_b.fill_(1e-2 / (1 + k))
        for p, q in zip(ours, theirs):
            p.grad = torch.randn(p.shape, generator=gen, dtype=torch.float64).float()
            q.grad = p.grad.clone()
        opt.step()
        ref.step()
    assert _route(opt) == name.lower()
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


@pytest.mark.parametrize("name,kw", [("AdamW", dict(weight_decay=0.1)), ("SGD", dict(momentum=0.9, weight_decay=0.1)),
                                     ("SGD", dict(momentum=0.9, check_finite=False))])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_bad_tensor_lr_skips_the_step(name, kw, bad, monkeypatch):
    """A non-finite or negative tensor ``lr`` is refused by an eager CPU step (ValueError, nothing changed); where
    the step does not read it (a GPU's tensor: forced here) it skips the step (parameters, moments, step counters
    unchanged) and counts it, also with decoupled weight decay (a nan lr must not reach ``1 - lr wd``) and
    without the gradient check."""
    ps = [torch.nn.Parameter(x.clone()) for x in _init()]
    lr = torch.tensor(1e-2)
    opt = getattr(O, name)(ps, lr=lr, **kw)
    for p in ps:
        p.grad = torch.randn_like(p)
    opt.step()
    before = [p.detach().clone() for p in ps]
    states = copy.deepcopy([opt.state[p] for p in ps])
    lr.fill_(bad)
    with pytest.raises(ValueError, match="param group 0: lr must be"):
        opt.step()
    assert all(torch.equal(p, b) for p, b in zip(ps, before))
    monkeypatch.setattr(O.Spectra, "_reads_lr_on_host", staticmethod(lambda lr: False))
    opt.step()
    assert _route(opt) == name.lower()
    assert all(torch.equal(p, b) for p, b in zip(ps, before))
    assert all(torch.equal(opt.state[p][k], st[k]) for p, st in zip(ps, states) for k in st)
    assert int(opt.skipped_steps) == 1 and opt.lr_skipped_steps() == {0: 1}
    lr.fill_(1e-2)
    opt.step()
    assert not any(torch.equal(p, b) for p, b in zip(ps, before) if p.numel() > 1)


@pytest.mark.parametrize("name", ["AdamW", "SGD"])
def test_compiled_floor_study_times_the_step_it_claims(name):
    """``benchmarks/studies/study_compiled_floor.py`` compares our step with a bare call of the fused operator: that
    call must compute what the optimizer's (unchecked) step computes, eagerly and traced (``aot_eager``), bit for bit,
    or its floor would be the floor of some other computation."""
    from benchmarks.studies.study_compiled_floor import calls

    runs, opt = calls(name, 8, backend="aot_eager", warm=0)
    params = [p for g in opt.param_groups for p in g["params"]]

    def snapshot():
        return [t.detach().clone() for p in params for t in (p, *opt.state[p].values())
                if isinstance(t, torch.Tensor)]

    def restore(saved):
        with torch.no_grad():
            for dst, src in zip([t for p in params for t in (p, *opt.state[p].values())
                                 if isinstance(t, torch.Tensor)], saved):
                dst.copy_(src)

    start = snapshot()
    results = {}
    for key, fn in runs.items():
        restore(start)
        fn()
        fn()
        results[key] = snapshot()
    ref = results[("step", False)]
    assert any(not torch.equal(a, b) for a, b in zip(ref, start))  # the step moved something
    for key, got in results.items():
        assert all(torch.equal(a, b) for a, b in zip(got, ref)), key
