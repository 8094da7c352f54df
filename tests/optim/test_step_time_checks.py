"""Hyperparameters that turn bad after construction, post-transforms that break down, tensor learning rates.

- a group's ``lr``/``weight_decay``/``eps`` set to nan/inf, ``betas`` to (1, ...) or ``post`` to an unknown
  name after construction: ``step`` raises ``ValueError`` naming the group and the argument, before any
  parameter or state is modified;
- a post-transform (or pre-clip) whose output is non-finite: that batch's parameters are not changed and the
  step counts in ``skipped_steps`` (the flag is tensor arithmetic, no host read);
- ``Muon`` (and every Spectra optimizer) accepts a 0-d tensor ``lr``, as ``torch.optim.Muon`` does; a
  non-finite tensor ``lr`` skips the step.
"""

from __future__ import annotations

import math

import pytest
import torch

import spectrakit.optim as O
from spectrakit.optim import transforms as T


def _param(seed: int, shape=(8, 6)) -> torch.nn.Parameter:
    g = torch.Generator().manual_seed(seed)
    return torch.nn.Parameter(torch.randn(*shape, generator=g))


def _grad(p: torch.Tensor, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    p.grad = torch.randn(p.shape, generator=g)


@pytest.mark.parametrize("key,value,opt_kw", [
    ("lr", math.nan, {}),
    ("lr", math.inf, {}),
    ("lr", -1e-3, {}),
    ("weight_decay", math.nan, {}),
    ("weight_decay", -math.inf, {}),
    ("eps", math.nan, {}),
    ("eps", math.inf, {}),
    ("betas", (1.0, 0.999), {}),
    ("betas", (0.9, 1.0), {}),
    ("momentum", 1.0, {"base": "sgd"}),
    ("c", math.nan, {}),
    ("b", math.inf, {"post": "spectral_lmo"}),
])
def test_bad_hyperparameter_after_construction_raises_before_any_change(key, value, opt_kw):
    p = _param(1)
    opt = O.Spectra([p], **opt_kw)
    _grad(p, 2)
    opt.step()
    before = p.detach().clone()
    state = {k: v.clone() for k, v in opt.state[p].items() if torch.is_tensor(v)}
    opt.param_groups[0][key] = value
    _grad(p, 3)
    with pytest.raises(ValueError, match=rf"param group 0: {key}"):
        opt.step()
    assert torch.equal(p.detach(), before)
    for k, v in state.items():
        assert torch.equal(opt.state[p][k], v), k
    assert int(opt.skipped_steps) == 0


def test_unknown_post_name_lists_the_accepted_names():
    p = _param(4)
    with pytest.raises(ValueError) as e:
        O.Spectra([p], post="bogus")
    for name in T.POST_TRANSFORMS:
        assert repr(name) in str(e.value)
    opt = O.Spectra([p])
    opt.param_groups[0]["post"] = "bogus"
    _grad(p, 5)
    with pytest.raises(ValueError) as e:
        opt.step()
    assert "post must be one of" in str(e.value) and "'soft_clip'" in str(e.value) and "'linf_fw'" in str(e.value)


@pytest.fixture
def broken_post():
    """Register a post-transform that returns nan on every odd call (an injected breakdown)."""
    calls = []

    def bad(U, c, steps=None, dtype=None):
        calls.append(1)
        return U * math.nan if len(calls) % 2 else U.clone()

    T.POST_TRANSFORMS["_broken_for_test"] = bad
    yield "_broken_for_test"
    del T.POST_TRANSFORMS["_broken_for_test"]


def test_non_finite_post_transform_output_skips_and_counts(broken_post):
    p, q = _param(6), _param(7, (5, 3))
    opt = O.Spectra([p, q], post=broken_post, weight_decay=0.1, lr=0.01)
    _grad(p, 8)
    _grad(q, 9)
    before = [p.detach().clone(), q.detach().clone()]
    opt.step()  # call 1 (p's batch): nan -> p unchanged; call 2 (q's batch): finite -> q moves
    assert torch.equal(p.detach(), before[0])
    assert not torch.equal(q.detach(), before[1]) and torch.isfinite(q).all()
    assert int(opt.skipped_steps) == 1
    for st in (opt.state[p], opt.state[q]):
        assert all(torch.isfinite(v).all() for v in st.values() if torch.is_tensor(v))
    _grad(p, 10)
    _grad(q, 11)
    opt.step()  # call 3 (p): nan again, call 4 (q): finite
    assert torch.equal(p.detach(), before[0])
    assert int(opt.skipped_steps) == 2
    # a finite update afterwards is applied: the flag is per step, not sticky
    T.POST_TRANSFORMS[broken_post] = lambda U, c, steps=None, dtype=None: U.clone()
    _grad(p, 12)
    opt.step()
    assert not torch.equal(p.detach(), before[0]) and torch.isfinite(p).all()
    assert int(opt.skipped_steps) == 2


def test_non_finite_pre_clip_output_keeps_state_and_parameters(monkeypatch):
    p = _param(13)
    opt = O.Spectra([p], pre_c=1.0, pre="soft_clip_exact", lr=0.01)
    _grad(p, 14)
    opt.step()
    before = p.detach().clone()
    state = {k: v.clone() for k, v in opt.state[p].items() if torch.is_tensor(v)}
    monkeypatch.setitem(T.POST_TRANSFORMS, "soft_clip_exact", lambda U, c, steps=None, dtype=None: U * math.inf)
    _grad(p, 15)
    opt.step()
    assert torch.equal(p.detach(), before)
    for k, v in state.items():
        if k != "step":
            assert torch.equal(opt.state[p][k], v), k
    assert int(opt.skipped_steps) == 1


def test_spectral_lmo_post_never_reaches_the_weights_with_nan():
    """The Schatten polar route used to return nan on rank-deficient directions (regression): through the
    optimizer the weights stay finite and the update obeys ||dW||_2 <= lr alpha c."""
    g = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(torch.randn(64, 192, generator=g))
    opt = O.Spectra([w], base="sgd", post="spectral_lmo", regularizer="schatten", p=3.0, b=0.01, c=1.0,
                    lr=0.1, weight_decay=0.0, momentum=0.0)
    for s in range(3):
        gs = torch.Generator().manual_seed(100 + s)
        w.grad = torch.randn(64, 8, generator=gs) @ torch.randn(8, 192, generator=gs) / 100
        before = w.detach().double().clone()
        opt.step()
        assert torch.isfinite(w).all()
        assert torch.linalg.matrix_norm(w.detach().double() - before, 2) <= 0.1 * 1.0 * (1 + 1e-3)
    assert int(opt.skipped_steps) == 0


@pytest.mark.parametrize("b", [1.0, 1e-3])
def test_linf_fw_update_obeys_its_bound_on_spiked_gradients(b):
    """Regression: ``post="linf_fw"`` on a 512x1024 weight with gradient ``randn + 100 u v^T`` gave 77x its
    bound ``||dW||_2 <= lr alpha c`` (the hard cap of a nearly rank-1 sign matrix overshot). Smaller shape,
    same structure."""
    g = torch.Generator().manual_seed(21)
    m, n = 96, 192
    w = torch.nn.Parameter(torch.zeros(m, n))
    lr, c = 0.5, 1.0
    opt = O.Spectra([w], base="sgd", post="linf_fw", c=c, b=b, lr=lr, weight_decay=0.0)
    alpha = T.update_scale("auto", "linf_fw", m, n)
    u, v = torch.randn(m, 1, generator=g), torch.randn(1, n, generator=g)
    for _ in range(5):
        w.grad = torch.randn(m, n, generator=g) + 100 * (u / u.norm()) @ (v / v.norm()) * math.sqrt(m * n)
        before = w.detach().double().clone()
        opt.step()
        step = torch.linalg.matrix_norm(w.detach().double() - before, 2)
        assert step <= lr * alpha * c * (1 + 1e-3), float(step)


def test_muon_accepts_a_tensor_lr_like_torch(monkeypatch):
    shapes = [(8, 5), (5, 8)]
    gen = torch.Generator().manual_seed(31)
    init = [torch.randn(s, generator=gen) for s in shapes]
    ours = [t.clone().requires_grad_() for t in init]
    ref = [t.clone().requires_grad_() for t in init]
    opt = O.Muon(ours, lr=torch.tensor(0.02), weight_decay=0.1)
    ref_opt = torch.optim.Muon(ref, lr=torch.tensor(0.02), weight_decay=0.1)
    for _ in range(4):
        grads = [torch.randn(s, generator=gen) for s in shapes]
        for a, r, g in zip(ours, ref, grads):
            a.grad, r.grad = g.clone(), g.clone()
        opt.step()
        ref_opt.step()
    for a, r in zip(ours, ref):
        assert torch.allclose(a, r, rtol=0, atol=1e-5)
    # a tensor lr that turns nan: refused by an eager CPU step; folded into the skip flag where the step does not
    # read it (a GPU's tensor, forced here)
    opt.param_groups[0]["lr"].fill_(math.nan)
    before = [a.detach().clone() for a in ours]
    for a in ours:
        a.grad = torch.ones_like(a)
    with pytest.raises(ValueError, match="lr must be"):
        opt.step()
    monkeypatch.setattr(O.Spectra, "_reads_lr_on_host", staticmethod(lambda lr: False))
    opt.step()
    assert all(torch.equal(a.detach(), b) for a, b in zip(ours, before))
    assert int(opt.skipped_steps) == 1
    with pytest.raises(TypeError, match="lr must be a number or a 0-d"):
        O.Muon([torch.nn.Parameter(torch.randn(3, 3))], lr=torch.tensor([0.1, 0.2]))
    with pytest.raises(ValueError, match="lr"):
        O.Muon([torch.nn.Parameter(torch.randn(3, 3))], lr=torch.tensor(math.nan))
