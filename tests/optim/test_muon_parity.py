"""``Muon`` does no more matrix work than ``torch.optim.Muon``: one step issues exactly torch's matrix products
(same aten ops, operand shapes, strides, dtypes and ``beta``/``alpha``), so the Newton-Schulz iteration,
which dominates the step where bf16 matmuls are emulated, runs the same kernels; and the results stay
bit-identical to torch's (momentum buffers, Newton-Schulz output) whichever loop computes them
(tests/optim/test_conformance.py checks 50 steps). Step times are in benchmarks/bench_muon.py."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import spectrakit.optim as O

pytest.importorskip("torch.optim._muon", reason="torch.optim.Muon (the reference) is in torch >= 2.9")

# tall, wide and square matrices, repeated shapes (one batch each in spectrakit), a shape seen once
SHAPES = [(48, 16), (16, 40), (48, 16), (24, 24), (16, 40), (48, 16), (24, 24), (8, 56)]
_MATMULS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "addmm_", "baddbmm_", "mv", "dot", "addbmm"}


class _MatmulLog(TorchDispatchMode):
    """Records every matrix product: (op, operand shapes, strides, dtypes, keyword scalars)."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name.split("::")[-1]
        if name in _MATMULS:
            ops = tuple((tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)
            self.calls.append((name, ops, tuple(sorted(kwargs.items()))))
        return func(*args, **kwargs)


def _one_logged_step(make, seed=0):
    gen = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in SHAPES]
    opt = make(params)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    opt.step()  # the first step allocates state; the second one is logged
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    with _MatmulLog() as log:
        opt.step()
    return log.calls, opt


@pytest.mark.parametrize("ns_steps", [5, 2])
def test_muon_step_issues_exactly_torchs_matrix_products(ns_steps):
    """The multiset of matrix products of one step equals torch.optim.Muon's: 3 per Newton-Schulz step and
    matrix (``X X^T`` and two ``addmm``), in bf16, with the same operand layouts (a tall matrix iterates on
    its transpose). A batched ``bmm``/``baddbmm`` over same-shape matrices, an extra product or a copy that
    changes a layout (and thus the kernel) fails it."""
    ours, _ = _one_logged_step(lambda ps: O.Muon(ps, lr=0.02, weight_decay=0.1, post_steps=ns_steps))
    ref, _ = _one_logged_step(lambda ps: torch.optim.Muon(ps, lr=0.02, weight_decay=0.1, ns_steps=ns_steps))
    assert len(ref) == 3 * ns_steps * len(SHAPES)
    assert all(dt == torch.bfloat16 for _, ops, _ in ref for op in ops if isinstance(op, tuple) for dt in op[2:])
    assert Counter(ours) == Counter(ref)


def test_muon_and_dmuon_match_torch_bits_with_per_matrix_loop():
    """Two steps of Muon and D-Muon: the momentum buffers are bit-identical to torch.optim.Muon's and the
    parameters agree to the rounding of the final ``p + (-lr alpha) U`` (torch fuses it into one ``add``)."""
    for cls, adjust, lr in ((O.Muon, "original", 0.02), (O.DMuon, "match_rms_adamw", 1e-3)):
        _, ours = _one_logged_step(lambda ps, cls=cls, lr=lr: cls(ps, lr=lr, weight_decay=0.1))
        _, ref = _one_logged_step(lambda ps, adjust=adjust, lr=lr: torch.optim.Muon(
            ps, lr=lr, weight_decay=0.1, adjust_lr_fn=adjust))
        for p, q in zip(ours.param_groups[0]["params"], ref.param_groups[0]["params"]):
            assert torch.equal(ours.state[p]["momentum_buffer"], ref.state[q]["momentum_buffer"])
            assert (p - q).abs().max() <= 2e-6 * q.abs().max()


def test_batched_post_runs_one_product_per_stack_and_muons_arithmetic():
    """``Muon(post="newton_schulz5_batched")`` (the speed option for CPUs with bf16 matrix units): one ``bmm``
    and two ``baddbmm`` per Newton-Schulz step and same-shape stack, each on the whole stack in its wide
    orientation, in bf16; the momentum stays torch.optim.Muon's bit for bit and the parameters within one bf16
    place of an update entry times lr per step (the batched kernel may round a product differently from the per-matrix
    one at small shapes on some CPUs; where it does not, the bits are torch's)."""
    stacks = Counter(s if s[0] <= s[1] else (s[1], s[0]) for s in SHAPES)
    ours, opt = _one_logged_step(lambda ps: O.Muon(ps, lr=0.02, weight_decay=0.1, post="newton_schulz5_batched"))
    assert Counter(name for name, _, _ in ours) == {"bmm": 5 * len(stacks), "baddbmm": 10 * len(stacks)}
    wide = Counter()
    for name, ops, _ in ours:
        shape, _, dtype = ops[0]
        assert dtype == torch.bfloat16
        if name == "bmm":
            assert shape[1] <= shape[2]
            wide[(shape[1], shape[2])] += shape[0]
    assert wide == Counter({k: 5 * v for k, v in stacks.items()})
    _, ref = _one_logged_step(lambda ps: torch.optim.Muon(ps, lr=0.02, weight_decay=0.1))
    for p, q in zip(opt.param_groups[0]["params"], ref.param_groups[0]["params"]):
        assert torch.equal(opt.state[p]["momentum_buffer"], ref.state[q]["momentum_buffer"])
        # one bf16 ulp of an update entry of size <= 1 times lr (0.02 max(1, m/n)^0.5 <= 0.04), per step
        assert (p - q).abs().max() <= 2 * 0.04 * 2**-8
