"""The two element-wise code paths of the step (per-tensor kernels on CPU, ``torch._foreach_*`` elsewhere), the
merged flat batch of ``post="none"``, and the CPU non-finite check, each against an independent route."""

from __future__ import annotations

import copy

import pytest
import torch

import spectrakit.optim as O

SHAPES = [(6, 4), (4, 6), (6, 4), (5,), (3, 2, 2, 2), (), (7, 3)]

BASES = [
    ("adamw", {}),
    ("adamw", dict(eps=0.0)),
    ("signum", dict(nesterov=False)),
    ("signum", dict(nesterov=True)),
    ("sgd", dict(nesterov=False)),
    ("sgd", dict(nesterov=True, dampening=0.9)),
    ("lion", {}),
    ("ademamix", dict(alpha_warmup=5, beta3_warmup=5)),
    ("mars", {}),
]


class _MultiTensor(O.Spectra):
    """The optimizer with the non-CPU (``torch._foreach_*``, no merged flat batch) path forced on CPU."""

    @staticmethod
    def _per_tensor(device):
        return False


class _Unmerged(O.Spectra):
    """The optimizer without the merged flat batch (one batch per matrix shape, as :meth:`_batches` gives)."""

    def _plan(self, group):
        return [(k, s, ps, self._update_scale(group, k, s, ps)) for k, s, ps in self._batches(group)]


def _run(cls, init, steps, seed, bad_step=None, **kw):
    params = [torch.nn.Parameter(x.clone()) for x in init]
    opt = cls(params, **kw)
    gen = torch.Generator().manual_seed(seed)
    for k in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype)
        if k == bad_step:
            params[1].grad[2, 3] = float("nan")
        opt.step()
    return params, opt


@pytest.mark.parametrize("base,hp", BASES, ids=[f"{b}-{i}" for i, (b, _) in enumerate(BASES)])
@pytest.mark.parametrize("post", ["none", "soft_clip_exact", "global_clip"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_per_tensor_and_multi_tensor_paths_are_bit_identical(base, hp, post, dtype):
    """8 steps including a skipped one: the CPU path (per-tensor ``out=`` kernels, fused grad copy, merged
    flat batch) and the forced multi-tensor path (the one CUDA takes) give bit-identical parameters and
    states, and both skip the bad step. (The step-by-step math is checked against independent references
    in test_bases.py / test_spectra.py; this pins that the CPU shortcuts reorder no rounding.)"""
    init = [torch.randn(s).to(dtype) for s in SHAPES]
    # torch_kernel=False: our pipeline (the fused route, torch's kernel, is checked in test_fused.py)
    kw = dict(base=base, post=post, lr=1e-2, weight_decay=0.1, c=1.0, torch_kernel=False, **hp)
    pa, oa = _run(O.Spectra, init, 8, 0, bad_step=4, **kw)
    pb, ob = _run(_MultiTensor, init, 8, 0, bad_step=4, **kw)
    assert all(torch.equal(a, b) for a, b in zip(pa, pb))
    for sa, sb in zip(oa.state_dict()["state"].values(), ob.state_dict()["state"].values()):
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert int(oa.skipped_steps) == int(ob.skipped_steps) == 1


@pytest.mark.parametrize("scale", ["auto", "muon", "moonlight", 0.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_merged_flat_batch_is_bit_identical(scale, dtype):
    """``post="none"`` merges the CPU batches of one (dtype, alpha) into one flat batch: the parameters and
    states are bit-identical to the per-shape batches, also when ``alpha`` differs across shapes."""
    init = [torch.randn(s).to(dtype) for s in SHAPES]
    kw = dict(base="adamw", post="none", lr=1e-2, weight_decay=0.1, scale=scale, torch_kernel=False)
    pa, oa = _run(O.Spectra, init, 6, 1, bad_step=2, **kw)
    pb, ob = _run(_Unmerged, init, 6, 1, bad_step=2, **kw)
    assert all(torch.equal(a, b) for a, b in zip(pa, pb))
    for sa, sb in zip(oa.state_dict()["state"].values(), ob.state_dict()["state"].values()):
        assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_merged_plan_groups_by_alpha_and_skips_the_post_hook():
    calls = []

    class Rec(O.Spectra):
        def _post_transform_groups(self, batches):
            calls.append(batches)
            return super()._post_transform_groups(batches)

    ps = [torch.nn.Parameter(torch.randn(s)) for s in [(8, 2), (2, 8), (8, 2), (3,)]]
    opt = Rec(ps, post="none", scale="muon")
    for p in ps:
        p.grad = torch.randn_like(p)
    plan = opt._plan(opt.param_groups[0])
    # alpha = 2 for the (8, 2) matrices, 1 for the (2, 8) one and the vector: two flat batches
    assert sorted((len(b[2]), b[3]) for b in plan) == [(2, 1.0), (2, 2.0)]
    assert all(b[0] == "flat" for b in plan)
    opt.step()
    assert calls == []
    # a matrix post-transform keeps the per-shape stacked batches
    opt2 = Rec(ps, post="global_clip")
    assert sorted(b[0] for b in opt2._plan(opt2.param_groups[0])) == ["flat", "matrix", "matrix"]


@pytest.mark.parametrize("cls", [O.Spectra, _MultiTensor])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nonfinite_check_is_exact(cls, bad):
    """One bad entry anywhere skips the step (+inf, -inf, nan, alone in an otherwise finite tensor); large
    gradients up to GRAD_BOUND (whose sum or 2-norm overflows in fp32) do not, larger finite ones do."""
    from spectrakit.optim.spectra import GRAD_BOUND

    ps = [torch.nn.Parameter(torch.randn(s)) for s in [(5, 4), (4,), ()]]
    opt = cls(ps, post="none", base="sgd", lr=1e-30, weight_decay=0.0)
    for p in ps:
        p.grad = torch.full_like(p, -GRAD_BOUND)
    ok = opt._finite_flag([p.grad for p in ps])
    assert ok.dtype == torch.float32 and float(ok) == 1.0
    assert float(opt._finite_flag([torch.full((3,), 3e38)])) == 0.0
    for i in range(len(ps)):
        grads = [q.grad.clone() for q in ps]
        grads[i].view(-1)[-1] = bad
        assert float(opt._finite_flag(grads)) == 0.0
    before = copy.deepcopy([p.detach() for p in ps])
    ps[0].grad[3, 1] = bad
    opt.step()
    assert int(opt.skipped_steps) == 1 and all(torch.equal(p, b) for p, b in zip(ps, before))
