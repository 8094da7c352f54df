"""The host cost of the multi-tensor step (the one a GPU runs): the number of ops an element-wise preset issues per
step does not grow with the number of distinct parameter shapes, and the plan and work tensors kept across steps
follow changes of the parameters. Counted with a ``TorchDispatchMode`` (every op the step dispatches), never timed."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import spectrakit.optim as O


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def _multi_tensor(cls):
    """``cls`` with the multi-tensor (``torch._foreach_*``) element-wise path forced on CPU (CUDA's path)."""
    return type(f"MultiTensor{cls.__name__}", (cls,), {"_per_tensor": staticmethod(lambda device: False)})


SAME = [(4, 3)] * 6 + [(5,)]
DISTINCT = [(4, 3), (3, 4), (2, 6), (6, 2), (1, 12), (2, 2, 3), (5,)]
PRESETS = [
    (O.Lion, {}),
    (O.Signum, {}),
    (O.Signum, dict(nesterov=True, weight_decay=0.1)),
    (O.SGD, dict(torch_kernel=False, weight_decay=0.1)),
    (O.AdamW, dict(torch_kernel=False)),
]


def _step_ops(cls, shapes, **kw):
    """Ops of the third step (the first ones create the states and keep the plan)."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    opt = _multi_tensor(cls)(params, lr=1e-3, **kw)
    for _ in range(3):
        for p in params:
            p.grad = torch.randn_like(p)
        with _Count() as count:
            opt.step()
    return count.ops


@pytest.mark.parametrize("cls,kw", PRESETS, ids=[f"{c.__name__}-{i}" for i, (c, _) in enumerate(PRESETS)])
def test_multi_tensor_step_ops_do_not_grow_with_distinct_shapes(cls, kw):
    """7 parameters of 2 shapes and of 7 shapes: the same ops (one flat batch per dtype and device); a step
    issued ~20 ops per batch before, i.e. 124 for Lion on the 21 parameters of a 5-shape model."""
    same, distinct = _step_ops(cls, SAME, **kw), _step_ops(cls, DISTINCT, **kw)
    assert same == distinct
    # a bound with some slack: no op per parameter or per shape (AdamW: the bias corrections and the moments)
    assert sum(distinct.values()) <= (50 if cls is O.AdamW else 30), distinct
    assert "view" not in distinct and "split_with_sizes" not in distinct  # the kept work tensor's views


def test_multi_tensor_step_ops_do_not_grow_with_parameters():
    """Twice the parameters: the same ops (each ``torch._foreach_*`` call covers them all)."""
    assert _step_ops(O.Lion, DISTINCT) == _step_ops(O.Lion, DISTINCT * 2)


def _uncached(cls):
    """``cls`` building its plan and work tensors afresh at every step (nothing kept across steps)."""
    return type(f"Uncached{cls.__name__}", (cls,), {"_cached_plan": lambda self, group: (self._plan(group), None)})


@pytest.mark.parametrize("multi", [False, True])
@pytest.mark.parametrize("cls", [O.Lion, O.SpectraAdamW])
def test_kept_plan_follows_parameter_changes(cls, multi):
    """The plan and the work tensors kept across steps are rebuilt when a parameter loses its gradient, gets
    one back, or is replaced by a tensor of another shape (``p.data = ...``), or a hyperparameter that batches
    them changes: bit for bit the parameters and states of an optimizer that rebuilds them at every step."""
    cls = _multi_tensor(cls) if multi else cls
    runs = []
    for c in (cls, _uncached(cls)):
        gen = torch.Generator().manual_seed(1)
        params = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in DISTINCT]
        opt = c(params, lr=1e-2)
        for k in range(7):
            if k == 4:
                params[2].data = torch.randn(3, 5, generator=gen)
                opt.state.pop(params[2])  # its state had the old shape
            if k == 5:
                opt.param_groups[0]["scale"] = 0.5  # one alpha for every shape
            for i, p in enumerate(params):
                g = torch.randn(p.shape, generator=gen)
                p.grad = None if (k in (1, 2) and i % 2) else g
            opt.step()
        runs.append((params, opt))
    (pa, oa), (pb, ob) = runs
    assert all(torch.equal(a, b) for a, b in zip(pa, pb))
    for sa, sb in zip(oa.state_dict()["state"].values(), ob.state_dict()["state"].values()):
        assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_host_overhead_bench_restores_the_cpu_path():
    """``benchmarks/bench_optim.py --host-overhead``: one row per optimizer with its op count (the plain presets
    below torch AdamW foreach's 55), and the CPU path is back afterwards."""
    from benchmarks.bench_optim import bench_host
    from spectrakit.optim.spectra import Spectra

    rows = bench_host(8, "cpu", reps=1)
    ops = {r["optimizer"]: r["ops per step"] for r in rows}
    assert ops["torch AdamW (foreach)"] > max(ops["Lion"], ops["Signum"], ops["AdamW (torch_kernel=False)"])
    assert Spectra._per_tensor(torch.device("cpu")) and Spectra._flag_copies(torch.device("cpu"))


def test_kept_plans_do_not_accumulate_over_state_dict_loads():
    """``load_state_dict`` makes new group dicts: the plans (and kept work tensors) of the replaced groups are
    dropped when the new ones are planned, so repeated loads keep one plan per group."""
    ps = [torch.nn.Parameter(torch.randn(s)) for s in [(6, 4), (4, 6), (5,)]]
    opt = O.Lion([{"params": ps[:2]}, {"params": ps[2:], "weight_decay": 0.0}], lr=1e-2)
    for _ in range(4):
        for p in ps:
            p.grad = torch.randn_like(p)
        opt.step()
        opt.load_state_dict(opt.state_dict())
    for p in ps:
        p.grad = torch.randn_like(p)
    opt.step()
    assert sum(1 for k in opt._scratch_bufs if k[0] == "plan") == len(opt.param_groups) == 2


def test_parity_rounds_step_shared_tensors():
    """``benchmarks/bench_optim.py --parity-widths``: every optimizer steps the same parameters, torch's and our
    AdamW / SGD keep their states in the same tensors (what the ratios compare is then the code, not where each
    copy lies), and every row of a small run has finite ratios."""
    from benchmarks.bench_optim import PARITY, bench_parity, share_states

    params = [torch.nn.Parameter(torch.randn(s)) for s in [(6, 4), (5,)]]
    for p in params:
        p.grad = torch.randn_like(p)
    opts = {"torch": torch.optim.AdamW(params, lr=1e-3, fused=True), "ours": O.AdamW(params, lr=1e-3),
            "torch SGD": torch.optim.SGD(params, lr=1e-3, momentum=0.9), "ours SGD": O.SGD(params, lr=1e-3)}
    for opt in opts.values():
        opt.step()
    assert share_states(opts, params) > 0
    for p in params:
        assert all(opts["ours"].state[p][k] is opts["torch"].state[p][k] for k in ("step", "exp_avg", "exp_avg_sq"))
        assert opts["ours SGD"].state[p]["momentum_buffer"] is opts["torch SGD"].state[p]["momentum_buffer"]
    rows = bench_parity([8], "cpu", reps=4, clock="cpu", instances=2)
    assert {r["optimizer"] for r in rows} >= set(PARITY)
    assert all(math.isfinite(r["/ torch fused"]) and r["step ms"] > 0 for r in rows)
