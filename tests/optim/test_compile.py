"""``torch.compile(opt.step)`` on CPU with the ``eager`` and ``aot_eager`` backends: same numbers as the
eager step; every preset traces in one graph (no graph break), traced before or after its first step, and
the compiled step is not recompiled on later calls (state created by ``_init_group`` while tracing, step
counters as tensors). The regularised Frank-Wolfe posts on their CPU (Gram) route too (soak tier)."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo as dynamo
from torch._dynamo.utils import counters

import spectrakit.optim as O

NO_BREAKS = ["AdamW", "Signum", "Lion", "SGD", "Muon", "DMuon", "AdEMAMix"]


def _pair(name, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(16, 8), (8, 16), (8,)]
    init = [torch.randn(s, generator=gen) for s in shapes]
    out = []
    for _ in range(2):
        ps = [torch.nn.Parameter(x.clone()) for x in init]
        out.append((ps, getattr(O, name)(ps, lr=1e-2)))
    grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(3)]
    return out, grads


CASES = [(n, "eager") for n in NO_BREAKS + ["SpectraAdamW"]] + [("AdamW", "aot_eager"), ("Muon", "aot_eager")]


@pytest.mark.parametrize("name,backend", CASES)
def test_compiled_step_equals_eager(name, backend):
    dynamo.reset()
    ((ps, opt), (qs, ref)), grads = _pair(name)
    step = torch.compile(opt.step, backend=backend)
    for gs in grads:
        for p, q, g in zip(ps, qs, gs):
            p.grad, q.grad = g.clone(), g.clone()
        step()
        ref.step()
    for p, q in zip(ps, qs):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ["AdamW", "Signum", "Lion", "Muon", "AdEMAMix"])
def test_no_graph_break(name):
    dynamo.reset()
    ((ps, opt), _), grads = _pair(name)
    for p, g in zip(ps, grads[0]):
        p.grad = g
    explained = dynamo.explain(opt.step)()
    assert explained.graph_break_count == 0, [str(r.reason)[:200] for r in explained.break_reasons]


PLAIN = ["AdamW", "SGD", "Lion", "Signum", "Muon", "DMuon"]
# longer traces (per-parameter schedules, gradient differences): soak tier with the SPECTRA presets
SLOW_PLAIN = ["AdEMAMix", "MARS"]
SPECTRA = ["SpectraAdamW", "SpectraSGD", "SpectraSignum", "SpectraLion", "SpectraAdEMAMix", "SpectraMARS"]
FW = {"spectral_lmo nuclear": dict(post="spectral_lmo", regularizer="nuclear", b=0.1),
      "linf_fw": dict(post="linf_fw")}


def _compile_counts(name: str, before: bool, calls: int = 3, **kwargs) -> tuple[dict, int]:
    """Compile ``opt.step`` with ``aot_eager`` (traced before the first step, or after one eager step) and call
    it ``calls`` times with fresh gradients, recompiles raising; returns (graph-break reasons, graphs
    compiled)."""
    dynamo.reset()
    counters.clear()
    gen = torch.Generator().manual_seed(1)
    ps = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in [(6, 4), (4,)]]
    opt = getattr(O, name)(ps, lr=1e-2, **kwargs)
    if not before:
        for p in ps:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
    step = torch.compile(opt.step, backend="aot_eager")
    with dynamo.config.patch(error_on_recompile=True):
        for _ in range(calls):
            for p in ps:
                p.grad = torch.randn(p.shape, generator=gen)
            step()
    out = dict(counters["graph_break"]), counters["stats"]["unique_graphs"]
    dynamo.reset()
    return out


def _assert_one_graph(name, before, **kwargs):
    breaks, graphs = _compile_counts(name, before, **kwargs)
    assert not breaks, list(breaks)[:3]
    assert graphs == 1


@pytest.mark.parametrize("before", [True, False], ids=["before_first_step", "after_first_step"])
@pytest.mark.parametrize("name", PLAIN)
def test_one_graph_no_recompile(name, before):
    """0 graph breaks, one graph for three calls (``error_on_recompile``): a Python number that changes per
    step in the traced code, a state created at the first call or a key added to a group would fail it."""
    _assert_one_graph(name, before)


@pytest.mark.soak
@pytest.mark.parametrize("before", [True, False], ids=["before_first_step", "after_first_step"])
@pytest.mark.parametrize("name", SPECTRA + SLOW_PLAIN)
def test_one_graph_no_recompile_spectra(name, before):
    """The SPECTRA presets (soft clip post-transform), AdEMAMix and MARS: one graph, no recompile (slow
    traces: soak tier)."""
    _assert_one_graph(name, before)


def test_one_graph_spectra_adamw_before_first_step():
    """Default tier: SpectraAdamW traced before its first step (the soft clip's coefficient tables are built
    eagerly by ``_init_group``, not in the trace), with a cheap ``global_clip`` and with the soft clip."""
    _assert_one_graph("SpectraAdamW", True, post="global_clip")


def test_recompile_check_can_fail():
    """The counting sees a recompile: a Python-number lr changed between calls is guarded on."""
    dynamo.reset()
    counters.clear()
    p = torch.nn.Parameter(torch.randn(4, 3))
    opt = O.AdamW([p], lr=1e-2)
    step = torch.compile(opt.step, backend="aot_eager")
    for lr in (1e-2, 2e-2):
        opt.param_groups[0]["lr"] = lr
        p.grad = torch.randn_like(p)
        step()
    assert counters["stats"]["unique_graphs"] == 2
    dynamo.reset()


def test_tensor_lr_changes_without_recompile():
    """A 0-d tensor lr (changed in place, as a scheduler for compiled steps does) is not guarded on."""
    dynamo.reset()
    counters.clear()
    p = torch.nn.Parameter(torch.randn(4, 3))
    q = torch.nn.Parameter(p.detach().clone())
    lr = torch.tensor(1e-2)
    opt, ref = O.AdamW([p], lr=lr), O.AdamW([q], lr=1e-2)
    step = torch.compile(opt.step, backend="aot_eager")
    with dynamo.config.patch(error_on_recompile=True):
        for value in (1e-2, 3e-2, 5e-3):
            lr.fill_(value)
            ref.param_groups[0]["lr"] = value
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
            step()
            ref.step()
    torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-7)
    dynamo.reset()


def test_steps_taken_counts_compiled_steps():
    dynamo.reset()
    p = torch.nn.Parameter(torch.randn(4, 3))
    opt = O.SGD([p], lr=1e-2)
    step = torch.compile(opt.step, backend="aot_eager")
    for _ in range(3):
        p.grad = torch.randn_like(p)
        step()
    assert int(opt.param_groups[0]["steps_taken"]) == 3 and int(opt.state[p]["step"]) == 3
    dynamo.reset()


@pytest.mark.soak
@pytest.mark.parametrize("variant", list(FW))
def test_frank_wolfe_posts_one_graph(variant):
    _assert_one_graph("SpectraSGD", False, **FW[variant])


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
    dynamo.reset()
