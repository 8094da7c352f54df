"""A fused weight (Q, K and V stacked in one matrix) with ``split_fused``: each block is clipped, orthogonalised and
scaled as a matrix of its own. Oracles: the float64 SVD of every block, and the same optimizer on separate
parameters holding the blocks (the per-matrix semantics of separate Q, K, V layers)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import spectrakit.optim as O
from spectrakit.optim.transforms import POST_TRANSFORMS, block_shape, check_split, on_blocks

D = 6


def _svd_clip(M: torch.Tensor, c: float) -> torch.Tensor:
    U, s, Vh = torch.linalg.svd(M.double(), full_matrices=False)
    return (U * (s / torch.sqrt(1 + (s / c) ** 2)).unsqueeze(-2)) @ Vh


@pytest.mark.parametrize("split", [3, (1, 3), (2, 3)])
@pytest.mark.parametrize("contiguous", [True, False])
def test_on_blocks_is_the_map_of_every_block(split, contiguous):
    g = torch.Generator().manual_seed(0)
    U = torch.randn(2, 6 * D, 3 * D, generator=g, dtype=torch.float64) * torch.logspace(-3, 3, 3 * D,
                                                                                          dtype=torch.float64)
    if not contiguous:
        U = U.mT.contiguous().mT
    r, c = check_split(split)
    bm, bn = block_shape(U.shape[1:], split)
    got = on_blocks(POST_TRANSFORMS["soft_clip_exact"], U.clone(), split, 0.5)
    for b in range(2):
        for i in range(r):
            for j in range(c):
                blk = (b, slice(i * bm, (i + 1) * bm), slice(j * bn, (j + 1) * bn))
                torch.testing.assert_close(got[blk], _svd_clip(U[blk], 0.5), rtol=1e-9, atol=1e-12)


def test_on_blocks_in_place_transform_overwrites_its_input():
    U = torch.randn(1, 3 * D, D)
    ref = on_blocks(POST_TRANSFORMS["soft_clip_exact"], U.clone(), 3, 0.5)
    fast = POST_TRANSFORMS["soft_clip"].inplace
    out = on_blocks(fast, U, 3, 0.5)
    assert out.data_ptr() == U.data_ptr()
    torch.testing.assert_close(U, ref.float(), rtol=2e-3, atol=1e-5)


def _fused_and_separate(layout: str, seed: int = 0):
    """A fused ``(3d, d)`` weight (``layout="rows"``) or ``(d, 3d)`` (``"cols"``, the ``(in, out)`` storage of
    Hugging Face's Conv1D) and three ``(d, d)`` parameters holding its blocks."""
    torch.manual_seed(seed)
    W = torch.randn(3 * D, D) if layout == "rows" else torch.randn(D, 3 * D)
    fused = nn.Parameter(W.clone())
    parts = [nn.Parameter(b.clone()) for b in (W.chunk(3, 0) if layout == "rows" else W.chunk(3, 1))]
    return fused, parts


@pytest.mark.parametrize("name,kw", [("SpectraAdamW", dict(c=0.3)), ("SpectraSignum", dict(c=0.5, pre_c=0.05)),
                                     ("Muon", dict(post_dtype="float32")),
                                     ("Spectra", dict(post="hard_clip", c=0.2))])
@pytest.mark.parametrize("layout", ["rows", "cols"])
def test_fused_weight_steps_as_its_separate_blocks(name, kw, layout):
    cls = getattr(O, name)
    fused, parts = _fused_and_separate(layout)
    split = 3 if layout == "rows" else (1, 3)
    a = cls([fused], lr=0.05, split_fused=split, **kw)
    b = cls(parts, lr=0.05, **kw)
    for step in range(4):
        g = torch.Generator().manual_seed(step)
        G = torch.randn(fused.shape, generator=g) * 10 ** (step - 1)
        fused.grad = G.clone()
        for p, blk in zip(parts, G.chunk(3, 0 if layout == "rows" else 1)):
            p.grad = blk.clone()
        a.step()
        b.step()
    joined = torch.cat([p.detach() for p in parts], 0 if layout == "rows" else 1)
    torch.testing.assert_close(fused.detach(), joined, rtol=1e-5, atol=1e-6)


def test_each_block_meets_the_clip_bound_the_whole_matrix_would_break():
    """Without the split one block can take (almost) the whole clip radius and the others get little; with it
    every block's update is at most ``lr alpha c`` on its own (alpha 1 for a square block, not sqrt(3))."""
    W = nn.Parameter(torch.zeros(3 * D, D))
    G = torch.cat([torch.randn(D, D) * s for s in (100.0, 1.0, 0.01)])
    for split in (None, 3):
        W.data.zero_()
        W.grad = G.clone()
        O.Spectra([W], base="sgd", lr=1.0, c=0.5, weight_decay=0.0, split_fused=split).step()
        norms = [float(torch.linalg.matrix_norm(b, 2)) for b in W.detach().chunk(3)]
        if split is None:
            assert norms[2] < 1e-3  # the small block is all but frozen by the joint clip
        else:
            assert all(n <= 0.5 * (1 + 1e-3) for n in norms) and min(norms) > 1e-3


def test_bad_values_are_refused_with_their_name():
    p = nn.Parameter(torch.randn(3 * D, D))
    for bad, err in ((0, ValueError), ((1, 0), ValueError), ("3", TypeError), ((1, 2, 3), TypeError),
                     (True, TypeError), (2.0, TypeError)):
        with pytest.raises(err, match="split_fused"):
            O.SpectraAdamW([p], split_fused=bad)
    opt = O.SpectraAdamW([p], split_fused=4)  # 18 rows do not split in 4
    p.grad = torch.randn_like(p)
    before = p.detach().clone()
    with pytest.raises(ValueError, match="split_fused=4 .* divide by 4"):
        opt.step()
    assert torch.equal(p.detach(), before)


def test_state_dict_keeps_the_split_and_old_state_dicts_load():
    fused, _ = _fused_and_separate("rows")
    opt = O.SpectraAdamW([fused], split_fused=3)
    fused.grad = torch.randn_like(fused)
    opt.step()
    sd = opt.state_dict()
    assert sd["param_groups"][0]["split_fused"] == 3
    other = O.SpectraAdamW([fused])
    other.load_state_dict(sd)
    assert other.param_groups[0]["split_fused"] == 3
    del sd["param_groups"][0]["split_fused"]  # saved before the option existed: one matrix
    other.load_state_dict(sd)
    assert other.param_groups[0]["split_fused"] is None


class _Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)


class _Conv1D(nn.Module):  # Hugging Face's layout: weight (nx, nf) = (in, out)
    def __init__(self, nf, nx):
        super().__init__()
        self.nf, self.nx = nf, nx
        self.weight = nn.Parameter(torch.randn(nx, nf))


def test_param_groups_splits_named_fused_weights():
    model = nn.ModuleDict({"h0": _Attn(), "h1": _Attn()})
    groups = O.param_groups(model, split_fused={"c_attn": 3})
    split = [g for g in groups if "split_fused" in g]
    assert len(split) == 1 and split[0]["split_fused"] == (3, 1)
    assert {id(p) for p in split[0]["params"]} == {id(model["h0"].c_attn.weight), id(model["h1"].c_attn.weight)}
    assert "split 3x1" in groups.table()
    opt = O.SpectraAdamW(groups)
    assert "1" in O.groups.param_group_table(opt, model).splitlines()[1]


def test_param_groups_splits_in_out_weights_by_columns_with_the_block_alpha():
    model = nn.Module()
    model.c_attn = type("Conv1D", (_Conv1D,), {})(3 * 4 * D, D)  # (in, out) = (d, 12 d): blocks (d, 4 d)
    groups = O.param_groups(model, split_fused={"c_attn": 3})
    (g,) = [g for g in groups if "split_fused" in g]
    assert g["split_fused"] == (1, 3) and g["scale"] == pytest.approx(2.0)  # sqrt(4d / d) of one (out, in) block


def test_param_groups_refuses_names_that_match_nothing_and_blocks_that_do_not_divide():
    model = nn.ModuleDict({"h0": _Attn()})
    with pytest.raises(ValueError, match=r"\['qkv'\] match no matrix"):
        O.param_groups(model, split_fused={"qkv": 3})
    with pytest.raises(ValueError, match="does not divide the output dimension 18"):
        O.param_groups(model, split_fused={"c_attn": 4})
    with pytest.raises(ValueError, match="int >= 1"):
        O.param_groups(model, split_fused={"c_attn": 0})


def test_multihead_attention_in_proj_weight():
    mha = nn.MultiheadAttention(D, 2)
    groups = O.param_groups(mha, split_fused={"in_proj_weight": 3})
    (g,) = [g for g in groups if "split_fused" in g]
    assert g["params"] == [mha.in_proj_weight] and g["split_fused"] == (3, 1)


@pytest.mark.parametrize("backend", ["aot_eager"])
def test_compiled_step_with_split_equals_eager(backend):
    fused, _ = _fused_and_separate("rows")
    twin = nn.Parameter(fused.detach().clone())
    a, b = O.SpectraAdamW([fused], split_fused=3, c=0.3), O.SpectraAdamW([twin], split_fused=3, c=0.3)
    step = torch.compile(a.step, backend=backend, fullgraph=False)
    for k in range(2):
        G = torch.randn(fused.shape, generator=torch.Generator().manual_seed(k))
        fused.grad, twin.grad = G.clone(), G.clone()
        step()
        b.step()
    torch.testing.assert_close(fused.detach(), twin.detach(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("split", [[3, 1], [1, 3], [3, 3]])
def test_operator_kernel_splits_as_the_eager_step(split):
    """The operator a compiled step calls transforms each block as ``on_blocks`` does, in place."""
    U = torch.randn(2, 3 * D, 3 * D, generator=torch.Generator().manual_seed(1)) * 5
    fn = POST_TRANSFORMS["soft_clip"]
    want = on_blocks(fn.inplace, U.clone(), tuple(split), 0.4, None, None)
    ptr = U.data_ptr()
    torch.ops.spectrakit.post_transform_.default([U], "soft_clip", 0.4, None, None, "frobenius", 1.0, None, split)
    assert torch.equal(U, want) and U.data_ptr() == ptr
