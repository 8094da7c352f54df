"""Clip schedules under ``torch.compile(opt.step)``: a warm-up (``warmup_steps > 0``) or a decay of the clip
threshold ``c_k`` traces with 0 graph breaks and compiles once. While traced, ``c_k`` (and ``pre_c_k``) is a 0-d
tensor made by the operator ``spectrakit::clip_threshold`` from the ``steps_taken`` and ``lr`` tensors (its
kernel is :func:`spectrakit.optim.schedules.clip_threshold`), so the compiled step (``aot_eager``) equals the
eager one bit for bit across the warm-up boundary, with a tensor lr changed in place and a skipped step."""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import pytest
import torch
import torch._dynamo as dynamo
from torch._dynamo.backends.registry import lookup_backend
from torch._dynamo.utils import counters

import spectrakit.optim as O
from spectrakit.optim.schedules import clip_threshold, make_schedule
from spectrakit.optim.transforms import POST_TRANSFORMS

_THRESHOLD = torch.ops.spectrakit.clip_threshold.default
_SCHEDULED = torch.ops.spectrakit.post_transform_.scheduled
SHAPES = ((6, 4), (4, 6), (4,))  # two matrix batches and a vector
LRS = (2e-3, 5e-3, 1e-2, 8e-3)  # set in place before each call: the warm-up's ramp to the peak, then a decay
DECAY = {"decay": "cosine", "total_steps": 4, "decay_start": 0.25}
# (optimizer, options): every case crosses the warm-up boundary (warmup_steps=2, 4 calls, the second skipped)
CASES = {
    "SpectraAdamW": ("SpectraAdamW", dict(warmup_steps=2)),
    "SpectraSignum": ("SpectraSignum", dict(warmup_steps=2)),
    "pre_c": ("SpectraAdamW", dict(warmup_steps=2, pre_c=2.0, pre_c_schedule="standard", vector_clip=True)),
    "c_schedule decay": ("SpectraAdamW", dict(warmup_steps=2, vector_clip=True, c_schedule=DECAY)),
}
# the same options without the step-dependent schedules (a run whose numbers must differ: the schedule acts)
CONSTANT = dict(warmup_steps=0, c_schedule="constant", pre_c_schedule="constant")


@functools.cache
def _run(case: str) -> SimpleNamespace:
    """One ``aot_eager`` trace of ``case`` (``error_on_recompile``) called 4 times beside an eager twin and an eager
    run without the schedules, on the same gradients (the second call's has a nan entry: skipped); a 0-d tensor lr
    (peak 1e-2 at construction) takes the values ``LRS`` in place before each call."""
    name, kw = CASES[case]
    dynamo.reset()
    counters.clear()
    gen = torch.Generator().manual_seed(11)
    init = [torch.randn(s, generator=gen) for s in SHAPES]
    sets = [[torch.nn.Parameter(x.clone()) for x in init] for _ in range(3)]
    lrs = [torch.tensor(1e-2) for _ in range(3)]
    opts = [getattr(O, name)(ps, lr=lr, c=1.0, **{**kw, **(CONSTANT if i == 2 else {})})
            for i, (ps, lr) in enumerate(zip(sets, lrs))]
    targets: list = []

    def record(gm, example_inputs):
        targets.extend(n.target for n in gm.graph.nodes if n.op == "call_function")
        return lookup_backend("aot_eager")(gm, example_inputs)

    step = torch.compile(opts[0].step, backend=record)
    with dynamo.config.patch(error_on_recompile=True):
        for k, value in enumerate(LRS):
            grads = [torch.randn(s, generator=gen) * 10 for s in SHAPES]
            if k == 1:
                grads[0][0, 0] = float("nan")
            for ps, lr in zip(sets, lrs):
                lr.fill_(value)
                for p, g in zip(ps, grads):
                    p.grad = g.clone()
            step()
            opts[1].step()
            opts[2].step()
    out = SimpleNamespace(opts=opts, sets=sets, targets=targets, breaks=dict(counters["graph_break"]),
                          graphs=counters["stats"]["unique_graphs"])
    dynamo.reset()
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_scheduled_clip_traces_once_and_equals_eager(case):
    """0 graph breaks, one graph for 4 calls (no recompile), the threshold operator in it, and the eager numbers
    bit for bit (parameters, states, step and skip counters), which differ from a run without the schedule."""
    t = _run(case)
    assert not t.breaks, list(t.breaks)[:3]
    assert t.graphs == 1
    assert _THRESHOLD in t.targets
    (ps, qs, rs), (opt, ref, _) = t.sets, t.opts
    assert all(torch.equal(p, q) for p, q in zip(ps, qs))
    assert not all(torch.equal(q, r) for q, r in zip(qs, rs))  # the schedule changed the numbers
    for p, q in zip(ps, qs):
        for key, value in ref.state[q].items():
            assert torch.equal(opt.state[p][key], value), key
    assert int(opt.skipped_steps) == int(ref.skipped_steps) == 1
    assert int(opt.param_groups[0]["steps_taken"]) == int(ref.param_groups[0]["steps_taken"]) == 4


@pytest.mark.soak
def test_python_number_lr_changing_in_the_warm_up_is_not_specialised():
    """A Python-number lr set to a new value before every call (as a float scheduler does): after the recompiles
    that make it a symbolic input (as for torch's optimizers), the graphs of the warm-up serve the later calls
    (the threshold operator does not guard on its value), with the eager numbers bit for bit. (Soak tier: the
    recompiles take about 7 s.)"""
    dynamo.reset()
    counters.clear()
    gen = torch.Generator().manual_seed(2)
    init = [torch.randn(6, 4, generator=gen), torch.randn(4, generator=gen)]
    ps, qs = ([torch.nn.Parameter(x.clone()) for x in init] for _ in range(2))
    kw = dict(lr=1e-2, c=1.0, warmup_steps=3, vector_clip=True)
    opt, ref = O.SpectraAdamW(ps, **kw), O.SpectraAdamW(qs, **kw)
    step = torch.compile(opt.step, backend="aot_eager")
    graphs = []
    for lr in (2e-3, 5e-3, 7e-3, 1e-2, 9e-3, 8e-3):
        opt.param_groups[0]["lr"] = ref.param_groups[0]["lr"] = lr
        for p, q in zip(ps, qs):
            p.grad = torch.randn(p.shape, generator=gen) * 10
            q.grad = p.grad.clone()
        step()
        ref.step()
        graphs.append(counters["stats"]["unique_graphs"])
    dynamo.reset()
    assert graphs[3:] == [graphs[3]] * 3, graphs
    assert all(torch.equal(p, q) for p, q in zip(ps, qs))


def test_matrix_post_transform_takes_the_scheduled_threshold():
    """The post-transform of the matrix batches is one call of the ``scheduled`` overload (threshold tensor)."""
    t = _run("SpectraAdamW")
    assert t.targets.count(_SCHEDULED) == 1
    assert torch.ops.spectrakit.post_transform_.default not in t.targets


def test_constant_schedule_calls_no_threshold_operator():
    """Without a step-dependent schedule (``warmup_steps=0``) the threshold stays the constant float: no threshold
    operator, the float overload of the post-transform (the counter is not read)."""
    dynamo.reset()
    counters.clear()
    p = torch.nn.Parameter(torch.randn(6, 4))
    p.grad = torch.randn(6, 4)
    targets: list = []

    def record(gm, example_inputs):
        targets.extend(n.target for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch.compile(O.SpectraAdamW([p], lr=1e-2, warmup_steps=0).step, backend=record)()
    dynamo.reset()
    assert _THRESHOLD not in targets and _SCHEDULED not in targets
    assert torch.ops.spectrakit.post_transform_.default in targets


SCHEDULES = ["standard", "constant", DECAY, {"decay": "sqrt", "total_steps": 5, "decay_start": 0.0},
             {"warmup": "none", "decay": "linear", "total_steps": 3, "final_scale": 0.1}]


@pytest.mark.parametrize("spec", SCHEDULES, ids=["standard", "constant", "cosine", "sqrt", "linear"])
def test_threshold_kernel_is_the_python_function(spec):
    """The operator's kernel gives ``clip_threshold`` bit for bit (a tensor lr read during the warm-up only:
    after it a nan lr changes nothing; lr 0 or nan in the warm-up: ``c``; ``c = inf``: inf); the fake kernel a 0-d
    float64 tensor without computing."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from spectrakit.optim.opaque import traced_threshold

    sched = make_schedule(spec)
    for c in (0.7, 3.0, math.inf):
        for k in range(6):
            for lr in (2e-3, 1.7e-2, 0.0, math.nan):
                for tensor_lr in (True, False):
                    group = {"lr": torch.tensor(lr) if tensor_lr else lr, "steps_taken": torch.tensor(k),
                             "peak_lr": 1e-2, "warmup_steps": 3}
                    lr_k = float(torch.tensor(lr)) if tensor_lr else lr  # (a float32 tensor's value)
                    want = clip_threshold(c, k, lr_k, 1e-2, 3, sched)
                    got = traced_threshold(c, group, sched)
                    assert got.dtype == torch.float64 and got.shape == () and got.device.type == "cpu"
                    assert float(got) == want or (math.isnan(want) and math.isnan(float(got))), (c, k, lr, want)
    with FakeTensorMode() as mode:
        fake = traced_threshold(2.0, {"lr": 1e-3, "steps_taken": mode.from_tensor(torch.tensor(1)), "peak_lr": 1e-2,
                                      "warmup_steps": 3}, sched)
    assert fake.shape == () and fake.dtype == torch.float64


def test_scheduled_post_transform_kernel():
    """The ``scheduled`` overload overwrites the batch as the float overload does for the tensor's value; an
    infinite threshold (no clip) leaves the batch as it is (the identity), as the eager step skips the
    transform."""
    gen = torch.Generator().manual_seed(3)
    U = torch.randn(2, 5, 3, generator=gen) * 4
    args = (None, None, "frobenius", 1.0, None, [1, 1])
    for name in ("soft_clip", "hardcap"):
        got, ref = U.clone(), U.clone()
        _SCHEDULED([got], name, torch.tensor(1.5, dtype=torch.float64), *args)
        torch.ops.spectrakit.post_transform_.default([ref], name, 1.5, *args)
        fn = POST_TRANSFORMS[name]
        assert torch.equal(got, ref) and not torch.equal(got, U)
        assert torch.equal(got, getattr(fn, "inplace", fn)(U.clone(), 1.5, None, None))
        same = U.clone()
        _SCHEDULED([same], name, torch.tensor(math.inf, dtype=torch.float64), *args)
        assert torch.equal(same, U)
