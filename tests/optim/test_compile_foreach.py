"""The traced form of the element-wise work (``torch.compile``): on every code path (the CPU's per-tensor one and
the multi-tensor one of CUDA, forced here on the CPU) the traced step runs the base direction and the update as
``torch._foreach_*`` calls over one work tensor per parameter, with no write into a view of a shared buffer
(after functionalization each such write copies the whole buffer: ``select_scatter``/``slice_scatter`` nodes)
and no ``_foreach_lerp`` with a list of tensor weights (inductor has no lowering for it: an opaque call per
tensor) nor a per-tensor moment update (on a GPU inductor would store the multi-tensor outputs it reads); and it
gives the eager step's numbers bit for bit with ``aot_eager`` (skipped steps included). On the
CPU's path the same graph shows how the traced step checks finiteness and reads its skip flag. Each configuration
is traced once per module and read by every test that checks it.
Inductor's compile time is measured by ``benchmarks/bench_compile.py`` (docs/BENCHMARKS.md, "Compile-first")."""

from __future__ import annotations

import collections
import contextlib
import functools
import math
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
import torch._dynamo as dynamo
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.utils import counters

import spectrakit.optim as O
from spectrakit.optim.spectra import Spectra

MATRICES = 3  # same-shape matrices: one batch
SHAPES = [(16, 8)] * MATRICES + [(8, 16), (5,)]
# a matrix fewer (still a batch of two, a wide matrix, a vector): the variants whose check does not count nodes
FEWER = tuple(SHAPES[1:])
PRESETS = ["SpectraAdamW", "SpectraSignum", "Muon", "Lion", "SpectraAdEMAMix", "SpectraMARS"]
# a full-size multi-tensor operation of the batch of matrices per step, per preset (at least): the per-tensor
# form has none
FOREACH_OPS = {"SpectraAdamW": 6, "SpectraSignum": 3, "Muon": 3, "Lion": 3}


PATHS = ["per_tensor", "multi_tensor"]
# the CPU's own path of a compiled step is also checked against eager by tests/optim/test_compile.py: here
# the default tier takes the multi-tensor path for the variants below, the soak tier both
SOAK_PER_TENSOR = [pytest.param("per_tensor", marks=pytest.mark.soak), "multi_tensor"]


@pytest.fixture
def path(request, monkeypatch):
    """The CPU's code path, or the multi-tensor one (CUDA's) forced on the CPU (the test's ``path`` parameter)."""
    if request.param == "multi_tensor":
        monkeypatch.setattr(Spectra, "_per_tensor", staticmethod(lambda device: False))
    return request.param


def _make(name, dtype=torch.float32, seed=0, shapes=SHAPES):
    gen = torch.Generator().manual_seed(seed)
    init = [torch.randn(s, generator=gen).to(dtype) for s in shapes]
    pairs = []
    for _ in range(2):
        ps = [torch.nn.Parameter(x.clone()) for x in init]
        pairs.append((ps, getattr(O, name)(ps, lr=1e-2)))
    grads = [[torch.randn(s, generator=gen).to(dtype) for s in shapes] for _ in range(4)]
    grads[1][1][3, 4] = float("nan")  # the second step is skipped
    grads[2][-1][0] = 1e30  # finite but above the bound (1e18): the third step is skipped as well
    return pairs, grads


def _step_both(step, ref, ps, qs, grads) -> None:
    """One traced step (``step`` over ``ps``) and one eager step (``ref`` over ``qs``) on the same gradients."""
    for p, q, g in zip(ps, qs, grads):
        p.grad, q.grad = g.clone(), g.clone()
    step()
    ref.step()


def _aot_step(opt, graphs: list):
    """``opt.step`` compiled as with ``aot_eager`` (the functionalized graph, run as traced), each forward graph
    appended to ``graphs``."""

    def fw(gm, example_inputs):
        graphs.append(gm.graph)
        return gm.forward

    dynamo.reset()
    return torch.compile(opt.step, backend=aot_autograd(fw_compiler=fw))


def _aot_graph(opt):
    """The forward graph after functionalization (aot_autograd) of the traced ``opt.step``."""
    graphs = []
    _aot_step(opt, graphs)()
    assert len(graphs) == 1
    return graphs[0]


@contextlib.contextmanager
def _on(path: str):
    """The CPU's code path, or the multi-tensor one (CUDA's) forced on the CPU."""
    with contextlib.ExitStack() as stack:
        if path == "multi_tensor":
            stack.enter_context(mock.patch.object(Spectra, "_per_tensor", staticmethod(lambda device: False)))
        yield


@functools.cache
def _traced(name: str, path: str, shapes: tuple = tuple(SHAPES)) -> SimpleNamespace:
    """One ``aot_autograd`` trace of ``name`` over ``shapes`` on ``path`` (a trace costs seconds of CPU: made once
    per module, read by the structure, node-growth and finite-check tests), called 4 times beside an eager twin on
    the same gradients (the second and third steps skipped: a nan, a finite entry above the bound). Returns the
    functionalized forward graph, the number of graphs compiled, both optimizers and parameter lists."""
    with _on(path):
        pairs, grads = _make(name, shapes=shapes)
        (ps, opt), (qs, ref) = pairs
        graphs = []
        step = _aot_step(opt, graphs)
        counters.clear()
        for gs in grads:
            _step_both(step, ref, ps, qs, gs)
        out = SimpleNamespace(graph=graphs[0], graphs=counters["stats"]["unique_graphs"], opt=opt, ref=ref, ps=ps,
                              qs=qs)
    dynamo.reset()
    return out


def _full_size_foreach(graph, shape) -> int:
    """Multi-tensor nodes whose first list holds the ``MATRICES`` tensors of ``shape`` (and maybe others: the
    CPU merges an element-wise group into one batch)."""
    count = 0
    for node in graph.nodes:
        if node.op != "call_function" or "_foreach_" not in str(node.target):
            continue
        first = node.args[0] if node.args else None
        if isinstance(first, (list, tuple)):
            shapes = [tuple(a.meta["val"].shape) for a in first if "val" in getattr(a, "meta", {})]
            count += shapes.count(shape) == MATRICES
    return count


def _nodes(graph) -> int:
    return sum(1 for nd in graph.nodes if nd.op == "call_function")


def _structure(graph, name):
    ops = collections.Counter(str(n.target) for n in graph.nodes if n.op == "call_function")
    scatters = {k: v for k, v in ops.items() if "scatter" in k}
    assert not scatters, f"writes into views of a shared buffer: {scatters}"
    assert not any("_foreach_lerp.List" in k for k in ops), "an opaque _foreach_lerp (List) in the graph"
    # the moments' updates as multi-tensor operations: inductor stores (on a GPU) every output of a _foreach_*
    # operation that a per-tensor operation reads, so a per-tensor addcmul or lerp there adds stored buffers
    per_tensor = {k: v for k, v in ops.items() if k in ("aten.addcmul.default", "aten.lerp.Tensor")}
    assert not per_tensor, f"per-tensor moment updates: {per_tensor}"
    if name in FOREACH_OPS:
        assert _full_size_foreach(graph, (16, 8)) >= FOREACH_OPS[name], dict(ops)


def _assert_equals_eager(t, skipped: int = 2):
    """No recompilation; the traced steps' parameters, states and skip counter equal the eager twin's bit for
    bit."""
    assert t.graphs == 1  # no recompilation
    assert int(t.opt.skipped_steps) == int(t.ref.skipped_steps) == skipped
    for p, q in zip(t.ps, t.qs):
        assert torch.equal(p, q)
        for key, value in t.ref.state[q].items():
            assert torch.equal(t.opt.state[p][key], value), key


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", PRESETS)
def test_traced_step_is_multi_tensor_and_equals_eager_bitwise(name, path):
    """One trace per preset and path: its functionalized graph (no whole-buffer scatters, no opaque
    ``_foreach_lerp``, multi-tensor nodes over the batch of matrices), then four steps of it against eager
    (two of them skipped), bit for bit, with no recompilation."""
    t = _traced(name, path)
    _structure(t.graph, name)
    _assert_equals_eager(t)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", ["SpectraAdamW", pytest.param("SpectraSignum", marks=pytest.mark.soak)])
def test_graph_grows_by_a_few_nodes_per_parameter(name, path):
    """Nodes of the functionalized graph per extra same-shape matrix (SpectraAdamW 23-25 in the traced form,
    28-29 before, with whole-buffer scatters; SpectraSignum 13-15, before 19-25): bounded, so that a longer
    per-parameter form fails. The graph of the structure test above (``MATRICES`` same-shape matrices beside a
    wide one and a vector) against one with a matrix fewer."""
    bound = {"SpectraAdamW": 25, "SpectraSignum": 15}[name]
    with _on(path):
        gen = torch.Generator().manual_seed(0)
        ps = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in FEWER]
        for p in ps:
            p.grad = torch.randn(p.shape, generator=gen)
        fewer = _nodes(_aot_graph(getattr(O, name)(ps, lr=1e-2)))
    dynamo.reset()
    per_param = _nodes(_traced(name, path).graph) - fewer
    assert 0 < per_param <= bound, per_param


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
    """How the traced step reads its skip flag and checks finiteness on the CPU's path, in the functionalized
    graph: the shapes that keep inductor's first compile short on a CPU (docs/BENCHMARKS.md, "Compile-first").
    The gradients' check is one call of ``spectrakit::grads_within`` (the eager ``aminmax`` check: traced as one
    reduction per gradient, it was a generated kernel each); no traced ``aminmax`` (two accumulators in inductor's
    code), no ``nan_to_num`` (three selects and an unvectorised ``isnan``), no stack of 0-d reduction results
    (inductor copies each in a kernel of its own), no reduction at all: the matrix batches' updates are checked
    and their non-finite entries zeroed by one call of ``spectrakit::finite_`` (the eager passes; traced as
    ``amax`` and ``where``, a generated reduction kernel per batch); and every batch (3: ``MATRICES`` x (16, 8),
    (8, 16), the flat one) reads a stored copy of the skip flag (at least one per batch: inductor's fusion search
    pairs the nodes that read one buffer)."""
    graph = _traced(name, "per_tensor").graph
    ops = collections.Counter(str(n.target) for n in graph.nodes if n.op == "call_function")
    assert not any("aminmax" in k or "nan_to_num" in k for k in ops), dict(ops)
    reductions = ("aten.amax", "aten.max", "aten.sum", "aten.linalg_vector_norm", "aten._foreach_norm")
    assert not any(k.startswith(reductions) for k in ops), dict(ops)  # (amin: the flag's stored copies)
    assert ops["spectrakit.grads_within.default"] == 1, dict(ops)
    mutating = collections.Counter(str(n.args[0]) for n in graph.nodes if "auto_functionalized" in str(n.target))
    assert mutating["spectrakit.finite_.default"] == 1, dict(mutating)  # both matrix batches' updates
    assert _flag_copies(graph) >= 3


@pytest.mark.parametrize("path", SOAK_PER_TENSOR)
@pytest.mark.parametrize("name", ["AdEMAMix", "MARS"])
def test_traced_step_equals_eager_bitwise(name, path):
    _assert_equals_eager(_traced(name, path, FEWER))


@pytest.mark.parametrize("options", [dict(alpha=0.3, betas=(0.9, 0.999, 0.99993)),
                                     dict(alpha=0.3, alpha_warmup=3, beta3_warmup=4)], ids=["constant", "warm-up"])
def test_traced_ademamix_schedules_equal_eager_bitwise(options):
    """AdEMAMix's two forms of ``alpha_t`` and ``b3_t`` (numbers without a warm-up, per-parameter tensors with one;
    an ``alpha`` and ``b3`` that fp32 rounds) traced on the multi-tensor path: the eager numbers bit for bit."""
    gen = torch.Generator().manual_seed(2)
    init = [torch.randn(s, generator=gen) for s in FEWER]
    ps, qs = ([torch.nn.Parameter(x.clone()) for x in init] for _ in range(2))
    with _on("multi_tensor"):
        opt, ref = O.AdEMAMix(ps, lr=1e-2, **options), O.AdEMAMix(qs, lr=1e-2, **options)
        dynamo.reset()
        step = torch.compile(opt.step, backend="aot_eager")
        for i in range(4):
            gs = [torch.randn(s, generator=gen) for s in FEWER]
            if i == 1:
                gs[0][0, 0] = float("nan")
            _step_both(step, ref, ps, qs, gs)
    dynamo.reset()
    for p, q in zip(ps, qs):
        assert torch.equal(p, q)
        assert all(torch.equal(opt.state[p][k], ref.state[q][k]) for k in ("exp_avg", "exp_avg_slow", "exp_avg_sq"))
    assert int(opt.skipped_steps) == int(ref.skipped_steps) == 1


@pytest.mark.parametrize("path", SOAK_PER_TENSOR, indirect=True)
def test_traced_step_equals_eager_bf16_parameters(path):
    """bf16 parameters (fp32 work tensors and states): the traced work copy converts as the eager one."""
    pairs, grads = _make("SpectraAdamW", dtype=torch.bfloat16, shapes=FEWER)
    (ps, opt), (qs, ref) = pairs
    dynamo.reset()
    step = torch.compile(opt.step, backend="aot_eager")
    for gs in grads:
        _step_both(step, ref, ps, qs, gs)
    for p, q in zip(ps, qs):
        assert torch.equal(p, q)
        assert torch.equal(opt.state[p]["exp_avg_sq"], ref.state[q]["exp_avg_sq"])


@pytest.mark.parametrize("options", [dict(vector_clip=True), dict(post="none", vector_clip=True), dict(pre_c=5.0),
                                     dict(c=float("inf")), dict(check_finite=False)],
                         ids=["vector_clip", "vector_clip_only", "pre_clip", "no_clip", "unchecked"])
@pytest.mark.parametrize("path", SOAK_PER_TENSOR, indirect=True)
def test_traced_options_equal_eager_bitwise(options, path):
    """The other branches of the traced step (vector clip with and without a matrix post-transform, the pre-clip,
    which keeps the joint buffer, an identity post-transform, unchecked gradients)."""
    gen = torch.Generator().manual_seed(1)
    init = [torch.randn(s, generator=gen) for s in FEWER]
    ps, qs = ([torch.nn.Parameter(x.clone()) for x in init] for _ in range(2))
    opt, ref = O.SpectraAdamW(ps, lr=1e-2, **options), O.SpectraAdamW(qs, lr=1e-2, **options)
    dynamo.reset()
    step = torch.compile(opt.step, backend="aot_eager")
    for i in range(3):
        gs = [torch.randn(s, generator=gen) for s in FEWER]
        if i == 1 and options.get("check_finite", True):
            gs[0][0, 0] = float("nan")
        _step_both(step, ref, ps, qs, gs)
    for p, q in zip(ps, qs):
        assert torch.equal(p, q)


def test_multi_tensor_check_is_one_operator_call():
    """The multi-tensor (CUDA) path's traced non-finite check is one call of ``spectrakit::grads_within`` (torch's
    multi-tensor inf-norm kernel, compiled into no generated kernel) and no traced ``_foreach_norm`` (inductor
    lowered it into a reduction kernel per gradient); the numbers, skipped step included, are checked against the
    eager step by ``test_traced_step_is_multi_tensor_and_equals_eager_bitwise`` on the same graph."""
    ops = collections.Counter(str(n.target) for n in _traced("SpectraAdamW", "multi_tensor").graph.nodes
                              if n.op == "call_function")
    assert ops["spectrakit.grads_within.default"] == 1, dict(ops)
    assert not any("_foreach_norm" in k for k in ops), dict(ops)


@pytest.mark.parametrize("name", ["SpectraAdamW", "MARS"])
def test_multi_tensor_step_has_no_traced_reduction(name):
    """No reduction is left for inductor to generate a kernel for in the multi-tensor (CUDA) path's traced step:
    the gradients' check is one ``spectrakit::grads_within`` call, the matrix batches' transformed updates are
    checked by one ``spectrakit::finite_`` call (SpectraAdamW: 2 matrix batches) and MARS's per-parameter norms
    are one ``spectrakit::norms`` call per batch (plain MARS: one flat batch), each running the eager kernels (the
    numbers are checked against the eager step on the same graphs by the tests above)."""
    graph = _traced(name, "multi_tensor", *(() if name == "SpectraAdamW" else (FEWER,))).graph
    ops = collections.Counter(str(n.target) for n in graph.nodes if n.op == "call_function")
    reductions = ("aten.amax", "aten.amin", "aten.max", "aten.min", "aten.sum", "aten.linalg_vector_norm",
                  "aten._foreach_norm", "aten.aminmax")
    assert not any(k.startswith(reductions) for k in ops), dict(ops)
    assert ops["spectrakit.grads_within.default"] == 1, dict(ops)
    mutating = collections.Counter(str(n.args[0]) for n in graph.nodes if "auto_functionalized" in str(n.target))
    assert mutating["spectrakit.finite_.default"] == (1 if name == "SpectraAdamW" else 0), dict(mutating)
    assert ops["spectrakit.norms.default"] == (0 if name == "SpectraAdamW" else 1), dict(ops)


@pytest.mark.parametrize("path", PATHS)
def test_step_counter_is_one_operator_call(path):
    """The group's step counter (a 0-d int64 CPU tensor) advances by one call of ``spectrakit::count_step_`` in the
    traced step: traced as ``+= 1`` it was an ``aten.add`` that inductor compiled into a C++ kernel, on a GPU the
    compiled step's only CPU code (~45 s of an H100's cold first compile); the count equals the eager one."""
    t = _traced("SpectraAdamW", path)
    calls = [n for n in t.graph.nodes if n.op == "call_function"
             and "count_step_" in str(n.target) + " ".join(map(str, n.args[:1]) if n.args else "")]
    assert len(calls) == 1, [str(n.target) for n in t.graph.nodes if n.op == "call_function"]
    int_adds = [n for n in t.graph.nodes if n.op == "call_function" and "aten.add" in str(n.target)
                and len(n.args) > 1 and n.args[1] == 1]
    assert not int_adds, int_adds
    assert int(t.opt.param_groups[0]["steps_taken"]) == int(t.ref.param_groups[0]["steps_taken"]) == 4


@pytest.mark.parametrize("path", SOAK_PER_TENSOR, indirect=True)
def test_traced_non_finite_update_of_one_batch_equals_eager(path, monkeypatch):
    """A post-transform that breaks down on one matrix batch (nan for the wide (8, 16) matrix, the others finite)
    in the traced step: that batch's parameter stays as it is (its moments advance with the finite gradients), the
    other batches move, the step is counted as skipped, bit for bit as the eager step (the update check
    ``spectrakit::finite_`` of all batches in one call, and the zeroed non-finite entries)."""
    from spectrakit.optim import transforms as T

    def breaks_on_wide(U, c, steps=None, dtype=None):
        return U * math.nan if U.shape[-2:] in ((8, 16), (16, 8)) and U.shape[0] == 1 else U.clone()

    monkeypatch.setitem(T.POST_TRANSFORMS, "_breaks_on_wide", breaks_on_wide)
    gen = torch.Generator().manual_seed(3)
    init = [torch.randn(s, generator=gen) for s in FEWER]
    ps, qs = ([torch.nn.Parameter(x.clone()) for x in init] for _ in range(2))
    opt, ref = (O.Spectra(xs, post="_breaks_on_wide", lr=1e-2, weight_decay=0.1) for xs in (ps, qs))
    dynamo.reset()
    step = torch.compile(opt.step, backend="aot_eager")
    for _ in range(2):
        _step_both(step, ref, ps, qs, [torch.randn(s, generator=gen) for s in FEWER])
    dynamo.reset()
    assert torch.equal(ps[2], init[2])  # the wide matrix: its update was nan at every step
    assert not torch.equal(ps[0], init[0]) and not torch.equal(ps[3], init[3])
    assert int(opt.skipped_steps) == int(ref.skipped_steps) == 2
    for p, q in zip(ps, qs):
        assert torch.equal(p, q)
        for key, value in ref.state[q].items():
            assert torch.equal(opt.state[p][key], value), key
