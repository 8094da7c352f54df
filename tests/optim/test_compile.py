"""``torch.compile(opt.step)`` on CPU with the ``eager`` and ``aot_eager`` backends: same numbers as the
eager step; every preset traces in one graph (no graph break), traced before or after its first step, and
the compiled step is not recompiled on later calls (state created by ``_init_group`` while tracing, step
counters as tensors). The regularised Frank-Wolfe posts on their CPU (Gram) route too (soak tier). A traced
plain AdamW/SGD step is one call of the fused operator (spectrakit.optim.fused), bit-identical to eager; a traced
SPECTRA / Frank-Wolfe / Muon step calls its matrix transforms as one operator (spectrakit.optim.opaque), no
matmul traced, bit-identical to eager."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch
import torch._dynamo as dynamo
from torch._dynamo.utils import counters

import spectrakit.optim as O

NO_BREAKS = ["AdamW", "Signum", "Lion", "SGD", "Muon", "DMuon", "AdEMAMix"]
PLAIN = ["AdamW", "SGD", "Lion", "Signum", "Muon", "DMuon"]
# longer traces (per-parameter schedules, gradient differences): soak tier with the SPECTRA presets
SLOW_PLAIN = ["AdEMAMix", "MARS"]
SPECTRA = ["SpectraAdamW", "SpectraSGD", "SpectraSignum", "SpectraLion", "SpectraAdEMAMix", "SpectraMARS"]
FW = {"spectral_lmo nuclear": dict(post="spectral_lmo", regularizer="nuclear", b=0.1),
      "linf_fw": dict(post="linf_fw")}
SHAPES = ((12, 8), (8, 12), (12, 8), (8,))  # two matrix batches, (12, 8) x 2 and (8, 12), and a vector
SMALL = ((8, 4), (4, 8), (4,))  # tall, wide, vector: where the batching does not matter
TWO = ((6, 4), (4,))  # a matrix and a vector: what a guard or a graph break depends on
FUSED_SHAPES = ((12, 8), (8,), (3, 2, 2))


def _recording(targets: list, backend: str):
    """``backend`` (``eager``: dynamo's graph run as is; ``aot_eager``: the functionalized graph run eagerly)
    that also records the call targets of dynamo's graph."""
    from torch._dynamo.backends.registry import lookup_backend

    inner = lookup_backend(backend)

    def record(gm, example_inputs):
        targets.extend(n.target for n in gm.graph.nodes if n.op == "call_function")
        return inner(gm, example_inputs)

    return record


def _trace(name: str, before: bool = True, backend: str = "aot_eager", shapes: tuple = SHAPES, nan: bool = True,
           tensor_lr: bool = False, **kw) -> SimpleNamespace:
    """One traced ``torch.compile(opt.step)`` that several tests read (a trace costs about a second of CPU, and
    is made once per module): the optimizer ``name`` over parameters of ``shapes``, traced before its first step
    (or after one eager step), called 3 times with fresh gradients (with ``nan``, the second has a nan entry: a
    skipped step) beside an eager twin fed the same gradients, with ``error_on_recompile``. ``tensor_lr``: both
    take a 0-d tensor lr, changed in place before each call (1e-2, 3e-2, 5e-3; as a scheduler of compiled steps
    does). Returns both optimizers and parameter lists, the call targets of dynamo's graphs, the graph-break
    reasons and the number of graphs compiled."""
    return _traced(name, before, backend, shapes, nan, tensor_lr, tuple(sorted(kw.items())))


@functools.cache
def _traced(name, before, backend, shapes, nan, tensor_lr, kw) -> SimpleNamespace:
    dynamo.reset()
    counters.clear()
    gen = torch.Generator().manual_seed(5)
    init = [torch.randn(s, generator=gen) for s in shapes]
    ps = [torch.nn.Parameter(x.clone()) for x in init]
    qs = [torch.nn.Parameter(x.clone()) for x in init]
    lrs = [torch.tensor(1e-2), torch.tensor(1e-2)] if tensor_lr else [1e-2, 1e-2]
    opt, ref = getattr(O, name)(ps, lr=lrs[0], **dict(kw)), getattr(O, name)(qs, lr=lrs[1], **dict(kw))

    def grads(k: int):
        for p, q in zip(ps, qs):
            p.grad = torch.randn(p.shape, generator=gen) * 10
            q.grad = p.grad.clone()
        if nan and k == 1:
            ps[1].grad.view(-1)[0] = qs[1].grad.view(-1)[0] = float("nan")
        if tensor_lr:
            for lr in lrs:
                lr.fill_((1e-2, 3e-2, 5e-3)[k])

    if not before:
        grads(0)
        opt.step()
        ref.step()
    targets: list = []
    step = torch.compile(opt.step, backend=_recording(targets, backend))
    with dynamo.config.patch(error_on_recompile=True):
        for k in range(3):
            grads(k)
            step()
            ref.step()
    out = SimpleNamespace(opt=opt, ref=ref, ps=ps, qs=qs, targets=targets, breaks=dict(counters["graph_break"]),
                          graphs=counters["stats"]["unique_graphs"])
    dynamo.reset()
    return out


# The default tier's trace of each preset before its first step, read by the equality, graph-break and one-graph
# tests (AdamW and SGD: the fused kernel's first configurations below; SpectraAdamW: with a tensor lr, over SHAPES,
# the batches of same-shape matrices; AdEMAMix: dynamo only, its longer trace functionalized in the soak tier;
# the others over a tall and a wide matrix and a vector: two matrix batches, as many as the transforms'
# operator call gathers; the batching of same-shape matrices in a traced step is tests/optim/test_compile_foreach.py's)
_PRESET = {
    "AdamW": dict(shapes=FUSED_SHAPES, weight_decay=0.1),
    "SGD": dict(shapes=FUSED_SHAPES, momentum=0.9, weight_decay=0.1),
    "Lion": dict(shapes=SMALL), "Signum": dict(shapes=SMALL), "DMuon": dict(shapes=SMALL), "Muon": dict(shapes=SMALL),
    "AdEMAMix": dict(shapes=SMALL, backend="eager"),
    "SpectraAdamW": dict(tensor_lr=True),
}


def _preset(name: str, before: bool = True) -> SimpleNamespace:
    """Traced before its first step: ``aot_eager``. After it (over two parameters): dynamo's graph only
    (``eager``), the same operations functionalized before; what that trace checks (graph breaks, guards, state
    created earlier) is dynamo's."""
    if before:
        return _trace(name, **_PRESET.get(name, {}))
    return _trace(name, False, "eager", shapes=TWO)


def _assert_equals_eager(t, skipped: int = 1):
    """The compiled parameters, states (moments, step counters) and skip counter equal the eager twin's bit for
    bit."""
    assert all(torch.equal(p, q) for p, q in zip(t.ps, t.qs))
    for p, q in zip(t.ps, t.qs):
        assert t.opt.state[p].keys() == t.ref.state[q].keys()
        assert all(torch.equal(v, t.ref.state[q][k]) for k, v in t.opt.state[p].items() if torch.is_tensor(v))
    assert int(t.opt.skipped_steps) == int(t.ref.skipped_steps) == skipped


@pytest.mark.parametrize("name", NO_BREAKS + ["SpectraAdamW"])
def test_compiled_step_equals_eager(name):
    """Traced before the first step (``aot_eager``; AdEMAMix: ``eager``): the eager numbers bit for bit over 3
    steps, a skipped one (nan gradient) included."""
    _assert_equals_eager(_preset(name))


@pytest.mark.parametrize("name", ["AdamW", "Signum", "Lion", "Muon", "AdEMAMix"])
def test_no_graph_break(name):
    t = _preset(name)
    assert not t.breaks, list(t.breaks)[:3]


def test_graph_break_count_can_fail():
    """The counting sees a graph break (the check above can fail)."""
    dynamo.reset()
    counters.clear()

    def f(x):
        x = x + 1
        dynamo.graph_break()
        return x * 2

    torch.compile(f, backend="eager")(torch.ones(3))
    assert counters["graph_break"] and counters["stats"]["unique_graphs"] == 2
    dynamo.reset()


def _assert_one_graph(t):
    assert not t.breaks, list(t.breaks)[:3]
    assert t.graphs == 1


@pytest.mark.parametrize("before", [True, False], ids=["before_first_step", "after_first_step"])
@pytest.mark.parametrize("name", PLAIN)
def test_one_graph_no_recompile(name, before):
    """0 graph breaks, one graph for three calls (``error_on_recompile``): a Python number that changes per
    step in the traced code, a state created at the first call or a key added to a group would fail it. The
    compiled steps equal the eager ones bit for bit in both cases."""
    t = _preset(name, before)
    _assert_one_graph(t)
    _assert_equals_eager(t)


@pytest.mark.soak
@pytest.mark.parametrize("before", [True, False], ids=["before_first_step", "after_first_step"])
@pytest.mark.parametrize("name", SPECTRA + SLOW_PLAIN)
def test_one_graph_no_recompile_spectra(name, before):
    """The SPECTRA presets (soft clip post-transform), AdEMAMix and MARS: one graph, no recompile, the eager
    numbers (slow traces, all ``aot_eager``: soak tier)."""
    t = _trace(name, before, shapes=TWO)
    _assert_one_graph(t)
    _assert_equals_eager(t)


@pytest.mark.soak
@pytest.mark.parametrize("name", PLAIN)
def test_one_graph_no_recompile_aot_after_first_step(name):
    """The plain presets traced after their first step with ``aot_eager`` too (the default tier's trace is
    dynamo's)."""
    t = _trace(name, False, shapes=TWO)
    _assert_one_graph(t)
    _assert_equals_eager(t)


def test_one_graph_spectra_adamw_before_first_step():
    """Default tier: SpectraAdamW traced before its first step (the soft clip's coefficient tables are built
    eagerly by ``_init_group``, not in the trace), with a cheap ``global_clip`` (dynamo's graph: what breaks a
    graph or guards is dynamo's) and with the soft clip (``aot_eager``)."""
    _assert_one_graph(_trace("SpectraAdamW", backend="eager", shapes=TWO, post="global_clip"))
    _assert_one_graph(_preset("SpectraAdamW"))


def test_recompile_check_can_fail():
    """The counting sees a recompile: a Python-number lr changed between calls is guarded on."""
    dynamo.reset()
    counters.clear()
    p = torch.nn.Parameter(torch.randn(4, 3))
    opt = O.AdamW([p], lr=1e-2)
    step = torch.compile(opt.step, backend="eager")
    for lr in (1e-2, 2e-2):
        opt.param_groups[0]["lr"] = lr
        p.grad = torch.randn_like(p)
        step()
    assert counters["stats"]["unique_graphs"] == 2
    dynamo.reset()


@functools.cache
def _tensor_lr_trace(name: str) -> SimpleNamespace:
    """``name`` (weight decay 0.1) with a 0-d tensor lr changed in place between compiled calls (as a scheduler
    for compiled steps does), a nan value among them (skipped by the traced step, refused by the eager twin),
    ``aot_eager`` beside an eager twin, ``error_on_recompile``."""
    dynamo.reset()
    counters.clear()
    gen = torch.Generator().manual_seed(4)
    init = [torch.randn(s, generator=gen) for s in [(6, 4), (4,)]]
    ps, qs = [torch.nn.Parameter(x.clone()) for x in init], [torch.nn.Parameter(x.clone()) for x in init]
    lr_p, lr_q = torch.tensor(1e-2), torch.tensor(1e-2)
    opt, ref = getattr(O, name)(ps, lr=lr_p, weight_decay=0.1), getattr(O, name)(qs, lr=lr_q, weight_decay=0.1)
    targets: list = []
    step = torch.compile(opt.step, backend=_recording(targets, "aot_eager"))
    with dynamo.config.patch(error_on_recompile=True):
        for value in (1e-2, 3e-2, float("nan"), 5e-3):
            lr_p.fill_(value)
            lr_q.fill_(value)
            for p, q in zip(ps, qs):
                p.grad = torch.randn(p.shape, generator=gen)
                q.grad = p.grad.clone()
            step()
            if value != value:  # the eager CPU step reads a CPU lr and refuses NaN; the traced one skips the step
                with pytest.raises(ValueError, match="lr must be a finite number"):
                    ref.step()
            else:
                ref.step()
    out = SimpleNamespace(opt=opt, ref=ref, ps=ps, qs=qs, targets=targets, graphs=counters["stats"]["unique_graphs"])
    dynamo.reset()
    return out


def test_tensor_lr_changes_without_recompile():
    """A 0-d tensor lr (changed in place, as a scheduler for compiled steps does) is not guarded on."""
    t = _tensor_lr_trace("AdamW")
    assert t.graphs == 1
    assert all(torch.equal(p, q) for p, q in zip(t.ps, t.qs))


def test_steps_taken_counts_compiled_steps():
    """3 compiled calls (one skipped: a nan gradient) count 3 steps taken and 2 parameter steps (AdamW's
    counters; SGD keeps none, as torch's SGD), as the eager ones."""
    for name in ("SGD", "AdamW"):
        t = _preset(name)
        assert int(t.opt.param_groups[0]["steps_taken"]) == int(t.ref.param_groups[0]["steps_taken"]) == 3
        if name == "AdamW":
            assert int(t.opt.state[t.ps[0]]["step"]) == int(t.ref.state[t.qs[0]]["step"]) == 2
        else:
            assert "step" not in t.opt.state[t.ps[0]] and "step" not in t.ref.state[t.qs[0]]


@pytest.mark.soak
@pytest.mark.parametrize("variant", list(FW))
def test_frank_wolfe_posts_one_graph(variant):
    t = _trace("SpectraSGD", False, shapes=TWO, **FW[variant])
    _assert_one_graph(t)
    _assert_equals_eager(t)


@pytest.mark.parametrize("name", ["AdamW", "SpectraAdamW", "Muon"])
def test_skip_counter_lives_on_the_gradients_device(name):
    """``_init_group`` (run eagerly while a step is traced) puts the ``skipped_steps`` counter on the device of
    the gradients, where the step's skip flag is computed: a CPU counter moved by the first traced call was a
    guard failure, so every optimizer recompiled at its second call on CUDA (measured on an H100). A
    ``meta`` parameter stands in for a GPU one here."""
    p = torch.nn.Parameter(torch.empty(4, 3, device="meta"))
    p.grad = torch.empty(4, 3, device="meta")
    opt = getattr(O, name)([p], lr=1e-2)
    assert opt.param_groups[0]["skipped_steps"].device.type == "cpu"
    opt._init_group(opt.param_groups[0])
    assert opt.param_groups[0]["skipped_steps"].device.type == "meta"


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["AdamW", "SpectraAdamW", "Muon"])
def test_no_recompile_on_cuda(name):
    """On CUDA: one graph for three calls traced before the first step (``error_on_recompile``)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    dynamo.reset()
    counters.clear()
    gen = torch.Generator(device="cuda").manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(s, device="cuda", generator=gen)) for s in [(16, 8), (8, 16), (8,)]]
    step = torch.compile(getattr(O, name)(ps, lr=1e-2).step, backend="aot_eager")
    with dynamo.config.patch(error_on_recompile=True):
        for _ in range(3):
            for p in ps:
                p.grad = torch.randn(p.shape, device="cuda", generator=gen)
            step()
    assert counters["stats"]["unique_graphs"] == 1


# (optimizer, options, backend): the first two are the AdamW and SGD presets' traces above
FUSED = [("AdamW", _PRESET["AdamW"], "aot_eager"), ("SGD", _PRESET["SGD"], "aot_eager"),
         ("SGD", dict(shapes=FUSED_SHAPES, momentum=0.9, nesterov=True), "eager"),
         ("AdamW", dict(shapes=FUSED_SHAPES, check_finite=False, nan=False), "eager")]


@pytest.mark.parametrize("name,kw,backend", FUSED)
def test_compiled_plain_step_is_the_fused_kernel(name, kw, backend):
    """A traced plain AdamW/SGD step is one call of the fused operator (torch's kernel), not the general pipeline,
    in one graph without recompiles; its numbers equal the eager step's bit for bit, a skipped step (nan
    gradient) included."""
    t = _trace(name, backend=backend, **kw)
    assert getattr(torch.ops.spectrakit, f"fused_{name.lower()}_step_").default in t.targets
    _assert_one_graph(t)
    _assert_equals_eager(t, skipped=1 if kw.get("nan", True) else 0)


def test_compiled_general_pipeline_where_the_route_does_not_apply():
    """``torch_kernel=False`` traces the general pipeline: no fused operator in the graph (the check above can
    fail)."""
    dynamo.reset()
    p = torch.nn.Parameter(torch.randn(6, 4))
    opt = O.AdamW([p], lr=1e-2, torch_kernel=False)
    targets: list = []
    p.grad = torch.randn_like(p)
    torch.compile(opt.step, backend=_recording(targets, "eager"))()
    assert torch.ops.spectrakit.fused_adamw_step_.default not in targets and targets
    dynamo.reset()


@pytest.mark.parametrize("name", ["AdamW", "SGD"])
def test_compiled_fused_step_with_a_tensor_lr(name):
    """A tensor lr changed in place (a scheduler of a compiled step): the fused operator, one graph for every
    value, the eager numbers bit for bit; a nan value skips the traced step (the eager CPU twin refuses it)."""
    t = _tensor_lr_trace(name)
    assert getattr(torch.ops.spectrakit, f"fused_{name.lower()}_step_").default in t.targets
    assert t.graphs == 1
    assert all(torch.equal(p, q) for p, q in zip(t.ps, t.qs))
    assert int(t.opt.skipped_steps) == 1 and int(t.ref.skipped_steps) == 0


# --- the matrix transforms as one opaque operator call per batch (spectrakit.optim.opaque) ---------------------

_OP = torch.ops.spectrakit.post_transform_.default
_MATMULS = {torch.matmul, torch.mm, torch.bmm, torch.baddbmm, torch.addmm, torch.addbmm, torch.linalg.svd,
            torch.linalg.eigh, torch.Tensor.matmul, torch.Tensor.mm, torch.Tensor.bmm, torch.Tensor.baddbmm_}
# (optimizer, options, operator calls per traced step): the post-transforms of a group's matrix batches are one
# call; the pre-clip (before the base direction) one call per batch
TRACED_TRANSFORMS = {
    "SpectraAdamW": ("SpectraAdamW", _PRESET["SpectraAdamW"], 1),
    "SpectraSignum": ("SpectraSignum", {}, 1),
    "pre-clip": ("SpectraAdamW", dict(pre_c=2.0), 3),  # the accurate pre-transform per batch, then the post
    "spectral_lmo nuclear": ("SpectraSignum", dict(FW["spectral_lmo nuclear"], shapes=SMALL), 1),
    "linf_fw": ("SpectraSGD", FW["linf_fw"], 1),
    "hardcap": ("SpectraAdamW", dict(post="hardcap"), 1),
    "Muon": ("Muon", _PRESET["Muon"], 1),
}


# (cheaper variants of the same trace in the soak tier)
_SOAK_CASES = ("SpectraSignum", "linf_fw", "hardcap", "pre-clip")


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.soak) if c in _SOAK_CASES else c
                                  for c in TRACED_TRANSFORMS])
def test_traced_matrix_transforms_are_one_operator_call(case):
    """A traced SPECTRA / Frank-Wolfe / Muon step calls ``spectrakit::post_transform_`` once for the matrix
    batches of the group (the pre-clip: once per batch) and traces none of the transform's matmuls; with
    ``aot_eager`` it equals the eager step bit for bit over 3 steps (one with a nan gradient: skipped), in one
    graph without recompiles, traced before its first step."""
    name, kw, calls = TRACED_TRANSFORMS[case]
    t = _trace(name, **kw)
    assert t.targets.count(_OP) == calls, t.targets.count(_OP)
    assert not _MATMULS & set(t.targets)
    _assert_one_graph(t)
    _assert_equals_eager(t)


def test_eager_step_does_not_call_the_operator(monkeypatch):
    """Outside a trace the transform is the eager function (the operator is for ``torch.compile`` only)."""
    import spectrakit.optim.batching as spectra  # (the batch transforms live there)

    def fail(*args):
        raise AssertionError("operator called eagerly")

    monkeypatch.setattr(spectra, "traced_transforms", fail)
    p = torch.nn.Parameter(torch.randn(6, 4))
    p.grad = torch.randn(6, 4)
    O.SpectraAdamW([p], lr=1e-2).step()


def test_traced_tensor_lr_changes_without_recompile_through_the_operator():
    """SpectraAdamW with a 0-d tensor lr changed in place between compiled calls: one graph, the operator in it,
    the eager numbers bit for bit."""
    t = _preset("SpectraAdamW")
    assert _OP in t.targets
    _assert_one_graph(t)
    _assert_equals_eager(t)


@pytest.mark.parametrize("name,kw", [("soft_clip", {}), ("soft_clip_accurate", {}), ("hardcap", {}),
                                     ("global_clip", {}), ("newton_schulz5", {}), ("linf_fw", dict(b=0.5)),
                                     ("spectral_lmo", dict(regularizer="nuclear", b=0.1, p=None))])
def test_operator_kernel_is_the_eager_transform(name, kw):
    """The operator's kernel overwrites each batch of its list with the eager transform bit for bit (the in-place
    variant where one exists, as the eager step calls it), in place, also a non-contiguous (transposed) batch; its
    fake kernel computes nothing and leaves the fake batches as they are."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from spectrakit.optim.transforms import POST_TRANSFORMS

    gen = torch.Generator().manual_seed(7)
    U = torch.randn(3, 9, 5, generator=gen) * 4
    U2 = torch.randn(2, 4, 6, generator=gen)
    fn = POST_TRANSFORMS[name]
    fn = getattr(fn, "inplace", fn)
    want, want2 = fn(U.clone(), 2.0, None, None, **kw), fn(U2.clone(), 2.0, None, None, **kw)
    args = (kw.get("regularizer", "frobenius"), kw.get("b", 1.0), kw.get("p"))
    ptr = U.untyped_storage().data_ptr()
    assert _OP([U, U2], name, 2.0, None, None, *args, [1, 1]) is None
    assert torch.equal(U, want) and torch.equal(U2, want2) and U.untyped_storage().data_ptr() == ptr
    V = torch.randn(3, 5, 9, generator=gen, dtype=torch.float64).mT  # a transposed (non-contiguous) batch
    want = fn(V.contiguous(), 2.0, 3, None, **kw)
    _OP([V], name, 2.0, 3, None, *args, [1, 1])
    assert torch.equal(V, want) and not V.is_contiguous()
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(V)
        assert _OP([fake], name, 2.0, 3, torch.bfloat16, "frobenius", 1.0, None, [1, 1]) is None
    assert fake.shape == (3, 9, 5) and fake.dtype == torch.float64


def test_operator_kernel_copies_a_view_result_before_writing():
    """A transform that returns a view of its input (no in-place variant) is copied before the batch is
    overwritten: the batch gets the transform, not a half-overwritten mix."""
    from spectrakit.optim import transforms

    def transposed_view(U, c, steps=None, dtype=None, **_):  # U (B, n, n) -> its transpose, a view
        return U.mT

    transforms.POST_TRANSFORMS["_test_view"] = transposed_view
    try:
        U = torch.arange(2 * 4 * 4, dtype=torch.float32).view(2, 4, 4)
        want = U.mT.clone()
        _OP([U], "_test_view", 1.0, None, None, "frobenius", 1.0, None, [1, 1])
        assert torch.equal(U, want)
    finally:
        del transforms.POST_TRANSFORMS["_test_view"]


@pytest.mark.soak
def test_scheduled_c_reaches_the_operator_without_recompiles():
    """A decaying clip threshold (``c_schedule`` with a decay: a new ``c_k`` every step, a tensor made from the
    step counter while traced) is passed to the operator in one graph, without a graph break or a recompile over
    5 calls, and the numbers equal the eager step's bit for bit (tests/optim/test_compile_schedules.py: the
    warm-up, the pre-clip, a tensor lr)."""
    dynamo.reset()
    counters.clear()
    gen = torch.Generator().manual_seed(8)
    init = torch.randn(12, 8, generator=gen)
    p, q = torch.nn.Parameter(init.clone()), torch.nn.Parameter(init.clone())
    kw = dict(lr=1e-2, c=1.0, c_schedule={"decay": "linear", "total_steps": 6})
    opt, ref = O.SpectraAdamW([p], **kw), O.SpectraAdamW([q], **kw)
    targets: list = []
    step = torch.compile(opt.step, backend=_recording(targets, "aot_eager"))
    graphs = []
    for _ in range(5):
        p.grad = torch.randn(p.shape, generator=gen) * 30  # above c: the clip is active
        q.grad = p.grad.clone()
        step()
        ref.step()
        graphs.append(counters["stats"]["unique_graphs"])
    assert torch.ops.spectrakit.post_transform_.scheduled in targets and graphs == [1] * 5, graphs
    assert not counters["graph_break"], list(counters["graph_break"])[:3]
    assert torch.equal(p, q)
    dynamo.reset()
