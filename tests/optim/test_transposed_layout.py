"""Weights stored ``(in, out)`` (Hugging Face GPT-2's ``Conv1D``, or a module that declares it): param_groups gives
them the alpha of their true ``(out, in)`` matrix, and SPECTRA then updates them exactly as the same layers
stored ``(out, in)`` (the oracle: an ``nn.Linear`` twin holding the transposed weights)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from spectrakit.optim import Muon, SpectraAdamW, param_groups
from spectrakit.optim.groups import transposed_weights


def _transformers():
    """Hugging Face transformers, imported by the tests that use it (about 2.5 s: not at collection, in every
    test process)."""
    return pytest.importorskip("transformers")


def _conv1d():
    _transformers()
    from transformers.pytorch_utils import Conv1D

    return Conv1D


class DeclaredTransposed(nn.Module):
    """A user's linear layer that stores ``(in, out)`` and says so."""

    spectrakit_transposed = True

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out) / math.sqrt(n_in))

    def forward(self, x):
        return x @ self.weight


def _twins(kind):
    torch.manual_seed(0)
    layer = _conv1d() if kind == "conv1d" else (lambda nf, nx: DeclaredTransposed(nx, nf))
    a = nn.Sequential(layer(48, 12), nn.GELU(), layer(12, 48))  # (in, out): (12, 48) then (48, 12)
    b = nn.Sequential(nn.Linear(12, 48), nn.GELU(), nn.Linear(48, 12))
    with torch.no_grad():
        b[0].weight.copy_(a[0].weight.T)
        b[2].weight.copy_(a[2].weight.T)
        for i in (0, 2):
            b[i].bias.copy_(a[i].bias) if hasattr(a[i], "bias") else b[i].bias.zero_()
    return a, b


@pytest.mark.parametrize("kind", ["conv1d", "declared"])
@pytest.mark.parametrize("opt_cls", [SpectraAdamW, Muon])
def test_transposed_layers_update_as_their_linear_twins(kind, opt_cls):
    a, b = _twins(kind)
    if kind == "declared":
        for i in (0, 2):
            b[i].bias.requires_grad_(False)
    assert transposed_weights(a) == {id(a[0].weight), id(a[2].weight)} and not transposed_weights(b)
    kw = dict(lr=0.05, c=0.5) if opt_cls is SpectraAdamW else dict(lr=0.05)
    oa, ob = opt_cls(param_groups(a, optimizer=opt_cls), **kw), opt_cls(param_groups(b, optimizer=opt_cls), **kw)
    gen = torch.Generator().manual_seed(1)
    for _ in range(4):
        x, y = torch.randn(16, 12, generator=gen), torch.randn(16, 12, generator=gen)
        for model, opt in ((a, oa), (b, ob)):
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
    tol = 1e-5 if opt_cls is SpectraAdamW else 2e-2  # Muon: bfloat16 Newton-Schulz
    for i in (0, 2):
        moved = float((b[i].weight.detach() - _twins(kind)[1][i].weight.detach()).norm())
        assert moved > 0.05  # the c = 0.5 clip and the alphas matter: a wrong alpha is visible
        assert torch.allclose(a[i].weight.T, b[i].weight, atol=tol * moved, rtol=0), i


def test_stored_shape_alpha_would_differ():
    """The control: with the alpha of the stored (in, out) shape (groups that ignore the layout) the Conv1D
    model leaves its twin, so the test above can fail."""
    a, b = _twins("conv1d")
    oa = SpectraAdamW([{"params": [a[0].weight, a[2].weight]}, {"params": [a[0].bias, a[2].bias]}], lr=0.05, c=0.5)
    ob = SpectraAdamW(param_groups(b, optimizer=SpectraAdamW), lr=0.05, c=0.5)
    x, y = torch.randn(16, 12), torch.randn(16, 12)
    for model, opt in ((a, oa), (b, ob)):
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
    assert not torch.allclose(a[0].weight.T, b[0].weight, atol=1e-3)


def _gpt2():
    transformers = _transformers()
    cfg = transformers.GPT2Config(vocab_size=100, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg)


def test_gpt2_alphas_are_those_of_the_out_in_matrices():
    model = _gpt2()
    groups = param_groups(model, optimizer=SpectraAdamW)
    alpha = {}
    for g, names in zip(groups, groups.names):
        for n in names:
            alpha[n] = g.get("scale", "auto")
    # c_attn (32 -> 96): sqrt(3); c_fc (32 -> 128): 2; c_proj (128 -> 32 and 32 -> 32): 1
    assert alpha["transformer.h.0.attn.c_attn.weight"] == pytest.approx(math.sqrt(3))
    assert alpha["transformer.h.1.mlp.c_fc.weight"] == pytest.approx(2.0)
    assert alpha["transformer.h.1.mlp.c_proj.weight"] == pytest.approx(1.0)
    assert alpha["transformer.h.0.attn.c_proj.weight"] == pytest.approx(1.0)
    assert alpha["transformer.wte.weight"] == "auto"  # nn.Embedding (vocab, d): stored (out, in) already
    table = groups.table()
    row = next(r for r in table.splitlines() if r.startswith("transformer.h.0.mlp.c_fc.weight"))
    assert " 2 " in row and "matrix(in,out)" in row
    # each parameter once, and a step runs
    assert sum(len(g["params"]) for g in groups) == len({id(p) for p in model.parameters()})
    opt = SpectraAdamW(groups, lr=1e-3)
    model(torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss.backward()
    opt.step()


def test_moonlight_scale_needs_no_transposed_groups():
    from spectrakit.optim import DMuon

    groups = param_groups(_gpt2(), optimizer=DMuon)
    assert all(not isinstance(g.get("scale"), float) for g in groups)


def test_gpt2_c_attn_split_into_q_k_v_updates_as_three_linear_layers():
    """``split_fused={"c_attn": 3}`` on GPT-2: each ``(32, 96)`` Conv1D weight is three ``(32, 32)`` column blocks,
    alpha 1 (a square block), and its update equals SPECTRA on three separate parameters holding Q, K and V."""
    model = _gpt2()
    groups = param_groups(model, optimizer=SpectraAdamW, split_fused={"c_attn": 3})
    (g,) = [g for g in groups if "split_fused" in g]
    assert g["split_fused"] == (1, 3) and g["scale"] == pytest.approx(1.0) and len(g["params"]) == 2
    W = model.transformer.h[0].attn.c_attn.weight
    parts = [torch.nn.Parameter(b.detach().clone()) for b in W.chunk(3, 1)]
    opt = SpectraAdamW(groups, lr=1e-2, c=0.3)
    twin = SpectraAdamW(parts, lr=1e-2, c=0.3, weight_decay=g["weight_decay"])
    for step in range(3):
        opt.zero_grad()
        model(torch.tensor([[1, 2, 3, step]]), labels=torch.tensor([[1, 2, 3, step]])).loss.backward()
        for p, blk in zip(parts, W.grad.chunk(3, 1)):
            p.grad = blk.clone()
        opt.step()
        twin.step()
    torch.testing.assert_close(W.detach(), torch.cat([p.detach() for p in parts], 1), rtol=1e-5, atol=1e-6)
