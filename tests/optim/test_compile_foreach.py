"""The traced form of the element-wise work (``torch.compile``): on every code path (the CPU's per-tensor one and
the multi-tensor one of CUDA, forced here on the CPU) the traced step runs the base direction and the update as
``torch._foreach_*`` calls over one work tensor per parameter, with no write into a view of a shared buffer
(after functionalization each such write copies the whole buffer: ``select_scatter``/``slice_scatter`` nodes)
and no ``_foreach_lerp`` with a list of tensor weights (inductor has no lowering for it: an opaque call per
tensor); and it gives the eager step's numbers bit for bit with ``aot_eager`` (skipped steps included).
Inductor's compile time is measured by ``benchmarks/bench_compile.py`` (docs/BENCHMARKS.md, "Compile-first")."""

from __future__ import annotations

import collections

import pytest
import torch
import torch._dynamo as dynamo
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.utils import counters

import spectrakit.optim as O
from spectrakit.optim.spectra import Spectra

MATRICES = 3  # same-shape matrices: one batch
SHAPES = [(16, 8)] * MATRICES + [(8, 16), (5,)]
PRESETS = ["SpectraAdamW", "SpectraSignum", "Muon", "Lion"]
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


def _make(name, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    init = [torch.randn(s, generator=gen).to(dtype) for s in SHAPES]
    pairs = []
    for _ in range(2):
        ps = [torch.nn.Parameter(x.clone()) for x in init]
        pairs.append((ps, getattr(O, name)(ps, lr=1e-2)))
    grads = [[torch.randn(s, generator=gen).to(dtype) for s in SHAPES] for _ in range(4)]
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


@pytest.mark.parametrize("path", PATHS, indirect=True)
@pytest.mark.parametrize("name", ["SpectraAdamW", pytest.param("SpectraSignum", marks=pytest.mark.soak)])
def test_graph_grows_by_a_few_nodes_per_parameter(name, path):
    """Nodes of the functionalized graph per extra same-shape matrix (SpectraAdamW 23-25 in the traced form,
    28-29 before, with whole-buffer scatters; SpectraSignum 13-15, before 19-25): bounded, so that a longer
    per-parameter form fails."""
    bound = {"SpectraAdamW": 25, "SpectraSignum": 15}[name]

    def nodes(n):
        gen = torch.Generator().manual_seed(0)
        ps = [torch.nn.Parameter(torch.randn(16, 8, generator=gen)) for _ in range(n)]
        for p in ps:
            p.grad = torch.randn(p.shape, generator=gen)
        graph = _aot_graph(getattr(O, name)(ps, lr=1e-2))
        return sum(1 for nd in graph.nodes if nd.op == "call_function")

    per_param = (nodes(4) - nodes(2)) / 2
    assert per_param <= bound, per_param


def _structure(graph, name):
    ops = collections.Counter(str(n.target) for n in graph.nodes if n.op == "call_function")
    scatters = {k: v for k, v in ops.items() if "scatter" in k}
    assert not scatters, f"writes into views of a shared buffer: {scatters}"
    assert not any("_foreach_lerp.List" in k for k in ops), "an opaque _foreach_lerp (List) in the graph"
    if name in FOREACH_OPS:
        assert _full_size_foreach(graph, (16, 8)) >= FOREACH_OPS[name], dict(ops)


@pytest.mark.parametrize("path", PATHS, indirect=True)
@pytest.mark.parametrize("name", PRESETS)
def test_traced_step_is_multi_tensor_and_equals_eager_bitwise(name, path):
    """One trace per preset and path: its functionalized graph (no whole-buffer scatters, no opaque
    ``_foreach_lerp``, multi-tensor nodes over the batch of matrices), then four steps of it against eager
    (two of them skipped), bit for bit, with no recompilation."""
    _traced_equals_eager(name, structure=True)


@pytest.mark.parametrize("path", SOAK_PER_TENSOR, indirect=True)
@pytest.mark.parametrize("name", ["AdEMAMix", "MARS"])
def test_traced_step_equals_eager_bitwise(name, path):
    _traced_equals_eager(name)


def _traced_equals_eager(name, structure=False):
    pairs, grads = _make(name)
    (ps, opt), (qs, ref) = pairs
    graphs = []
    step = _aot_step(opt, graphs)
    counters.clear()
    for gs in grads:
        _step_both(step, ref, ps, qs, gs)
    assert counters["stats"]["unique_graphs"] == 1  # no recompilation
    if structure:
        _structure(graphs[0], name)
    assert int(opt.skipped_steps) == int(ref.skipped_steps) == 2
    for p, q in zip(ps, qs):
        assert torch.equal(p, q)
        for key, value in ref.state[q].items():
            assert torch.equal(opt.state[p][key], value), key


@pytest.mark.parametrize("path", SOAK_PER_TENSOR, indirect=True)
def test_traced_step_equals_eager_bf16_parameters(path):
    """bf16 parameters (fp32 work tensors and states): the traced work copy converts as the eager one."""
    pairs, grads = _make("SpectraAdamW", dtype=torch.bfloat16)
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
    init = [torch.randn(s, generator=gen) for s in SHAPES]
    ps, qs = ([torch.nn.Parameter(x.clone()) for x in init] for _ in range(2))
    opt, ref = O.SpectraAdamW(ps, lr=1e-2, **options), O.SpectraAdamW(qs, lr=1e-2, **options)
    dynamo.reset()
    step = torch.compile(opt.step, backend="aot_eager")
    for i in range(3):
        gs = [torch.randn(s, generator=gen) for s in SHAPES]
        if i == 1 and options.get("check_finite", True):
            gs[0][0, 0] = float("nan")
        _step_both(step, ref, ps, qs, gs)
    for p, q in zip(ps, qs):
        assert torch.equal(p, q)
