"""``spectrakit.optim.param_groups`` on our LLaMA (tied/untied), Hugging Face GPT-2/LLaMA, a CNN and a model
with shared modules: every trainable parameter exactly once, the expected group for each kind, the routing of
the training registry unchanged, and the summary table."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from spectrakit.models.cnn import SmallResNet
from spectrakit.models.llama import Llama, LlamaConfig
from spectrakit.optim import DMuon, Muon, SpectraAdamW, param_group_table, param_groups
from spectrakit.train.optimizers import build_optimizer


def llama(tie=False):
    torch.manual_seed(0)
    return Llama(LlamaConfig(vocab_size=64, dim=16, n_layers=2, n_heads=2, max_seq_len=16, tie_embeddings=tie))


def by_name(groups):
    """``name -> (group index, kind)``; asserts every name appears once."""
    out = {}
    for gi, (kind, names) in enumerate(zip(groups.kinds, groups.names)):
        for n in names:
            assert n not in out, n
            out[n] = (gi, kind)
    return out


def assert_each_param_once(model, groups):
    ids = [id(p) for g in groups for p in g["params"]]
    assert len(ids) == len(set(ids))
    assert set(ids) == {id(p) for p in model.parameters() if p.requires_grad}


@pytest.mark.parametrize("tie", [False, True])
def test_llama_reference_routing_and_muon_side_groups(tie):
    model = llama(tie)
    groups = param_groups(model, weight_decay=0.1)
    assert_each_param_once(model, groups)
    assert groups.kinds == ["matrix", "vector"]
    names = by_name(groups)
    assert names["embed.weight"][1] == "matrix" and ("head.weight" in names) == (not tie)
    assert all(p.ndim >= 2 for p in groups[0]["params"]) and all(p.ndim == 1 for p in groups[1]["params"])
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]

    muon = param_groups(model, optimizer=Muon, weight_decay=0.1, adamw_lr=3e-3)
    assert_each_param_once(model, muon)
    assert muon.kinds == ["matrix", "embedding", "vector"]
    emb = muon.names[1]
    assert emb == (["embed.weight"] if tie else ["embed.weight", "head.weight"])
    for g in muon[1:]:
        assert (g["base"], g["post"], g["scale"], g["betas"], g["lr"]) == ("adamw", "none", "none", (0.8, 0.999), 3e-3)
    assert "base" not in muon[0] and muon[2]["weight_decay"] == 0.0


@pytest.mark.parametrize("name", ["spectra-adamw", "muon", "dmuon", "adamw", "signum"])
@pytest.mark.parametrize("tie", [False, True])
def test_training_registry_uses_the_public_routing(name, tie):
    """The training loop's ``build_optimizer`` groups equal the public helper's (same params, same options)."""
    model = llama(tie)
    opt = build_optimizer(name, model, lr=1e-2, weight_decay=0.1)
    cls = type(opt)
    kw = {"adamw_lr": 3e-3 if name == "muon" else 1e-2} if issubclass(cls, (Muon, DMuon)) else {}
    ref = param_groups(model, optimizer=cls, weight_decay=0.1, **kw)
    assert len(opt.param_groups) == len(ref)
    for g, r in zip(opt.param_groups, ref):
        assert [id(p) for p in g["params"]] == [id(p) for p in r["params"]]
        for k, v in r.items():
            if k != "params":
                assert g[k] == v, (k, g[k], v)


def test_hf_gpt2_and_llama_configs():
    transformers = pytest.importorskip("transformers", reason="needs transformers (pip install 'spectrakit[examples]')")
    cfg = transformers.GPT2Config(vocab_size=96, n_positions=32, n_embd=16, n_layer=2, n_head=2)
    model = transformers.GPT2LMHeadModel(cfg)
    groups = param_groups(model, optimizer=Muon)
    assert_each_param_once(model, groups)
    names = by_name(groups)
    assert names["transformer.wte.weight"][1] == names["transformer.wpe.weight"][1] == "embedding"
    assert "lm_head.weight" not in names  # tied to wte: listed once
    assert names["transformer.h.0.attn.c_attn.weight"][1] == "matrix(in,out)"  # Conv1D: stored (in, out)
    assert names["transformer.h.0.ln_1.weight"][1] == names["transformer.h.0.attn.c_attn.bias"][1] == "vector"

    lcfg = transformers.LlamaConfig(vocab_size=96, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                    num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=False)
    lmodel = transformers.LlamaForCausalLM(lcfg)
    lgroups = param_groups(lmodel, head={"scale": 0.5})
    assert_each_param_once(lmodel, lgroups)
    lnames = by_name(lgroups)
    assert lgroups.kinds == ["matrix", "head", "vector"]
    assert lnames["lm_head.weight"][1] == "head" and lnames["model.embed_tokens.weight"][1] == "matrix"
    assert lgroups[1]["scale"] == 0.5


def test_cnn_conv_kernels_are_matrices_and_named_head():
    model = SmallResNet(widths=(4, 8), blocks=1)
    groups = param_groups(model)
    assert_each_param_once(model, groups)
    assert groups.kinds == ["matrix", "vector"]
    assert all(p.ndim in (2, 4) for p in groups[0]["params"])
    named = param_groups(model, optimizer=Muon, head_names="fc")
    assert by_name(named)["fc.weight"][1] == "head" and named.kinds == ["matrix", "head", "vector"]
    assert named[1]["base"] == "adamw"


class Shared(nn.Module):
    """One Linear applied twice, a Linear tied to another, a frozen matrix and an embedding-shaped last Linear
    without a head name (found by its shape)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(40, 8)
        self.block = nn.Linear(8, 8)
        self.again = self.block
        self.a, self.b = nn.Linear(8, 8, bias=False), nn.Linear(8, 8, bias=False)
        self.b.weight = self.a.weight
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.out = nn.Linear(8, 40, bias=False)
        self.gain = nn.Parameter(torch.ones(()))

    def forward(self, x):
        h = self.emb(x)
        h = self.again(self.block(h))
        return self.out(self.b(self.a(h)) * self.gain)


def test_shared_modules_each_parameter_once():
    model = Shared()
    groups = param_groups(model, embeddings="adamw", head={"lr": 1e-3})
    assert_each_param_once(model, groups)
    names = by_name(groups)
    assert names["out.weight"][1] == "head" and names["emb.weight"][1] == "embedding"
    assert names["gain"][1] == "vector" and "frozen.weight" not in names and "b.weight" not in names
    opt = SpectraAdamW(groups, lr=1e-2)
    model(torch.randint(0, 40, (2, 5))).square().mean().backward()
    opt.step()
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_table_shows_names_groups_and_alpha():
    model = llama()
    groups = param_groups(model)
    text = str(groups)
    row = next(line for line in text.splitlines() if line.startswith("embed.weight"))
    assert "64x16" in row and "0:matrix" in row and f"{math.sqrt(64 / 16):.3g}" in row
    opt = SpectraAdamW(groups, lr=1e-3)
    table = param_group_table(opt, model)
    assert len(table.splitlines()) == 1 + sum(len(g["params"]) for g in groups)
    assert "head.weight" in table and "adamw/soft_clip" in table

    def update(table, name):
        return next(r for r in table.splitlines() if r.startswith(name + " ")).split()[3]

    # what happens: the clip acts on matrices; gains and biases get the base update only, or the vector clip
    names = [n for n, p in model.named_parameters() if p.ndim < 2]
    assert names and all(update(table, n) == "adamw/none" for n in names)
    assert update(table, "head.weight") == "adamw/soft_clip"
    clipped = param_group_table(SpectraAdamW(param_groups(model), lr=1e-3, vector_clip=True), model)
    assert all(update(clipped, n) == "adamw/vector_clip" for n in names)
    muon = param_groups(model, optimizer=Muon)
    assert all(update(muon.table(), n) == "adamw/none" for n in names)


def test_bad_options_raise():
    model = llama()
    with pytest.raises(ValueError, match="embeddings"):
        param_groups(model, embeddings="spectral")
    with pytest.raises(ValueError, match="weight_decay"):
        param_groups(model, weight_decay=-1.0)
    with pytest.raises(ValueError, match="adamw_lr"):
        param_groups(model, adamw_lr=0.0)
    with pytest.raises(TypeError, match="model"):
        param_groups([torch.zeros(2)])


@pytest.mark.parametrize("cls", [Muon, DMuon])
def test_adamw_side_groups_are_torch_adamw(cls):
    """The ``"adamw"`` groups inside Muon/D-Muon step exactly like ``torch.optim.AdamW`` (an independent
    implementation) on the embedding, head and 1-D parameters, in float64, over 3 steps."""
    model = llama().double()
    groups = param_groups(model, optimizer=cls, weight_decay=0.1, adamw_lr=1e-2)
    opt = cls(groups, lr=1e-2)
    side = [p for g in groups[1:] for p in g["params"]]
    copies = [p.detach().clone().requires_grad_() for p in side]
    ref = torch.optim.AdamW([{"params": [c for c, p in zip(copies, side) if p.ndim >= 2], "weight_decay": 0.1},
                             {"params": [c for c, p in zip(copies, side) if p.ndim < 2], "weight_decay": 0.0}],
                            lr=1e-2, betas=(0.8, 0.999), eps=1e-8)
    for _ in range(3):
        for p, c in zip(side, copies):
            g = torch.randn_like(p)
            p.grad, c.grad = g.clone(), g.clone()
        opt.step()
        ref.step()
    for p, c in zip(side, copies):
        torch.testing.assert_close(p, c, rtol=1e-12, atol=1e-12)


def test_a_plain_parameter_list_warns_once_and_param_groups_does_not():
    """``SpectraAdamW(model.parameters())`` puts weight decay on biases and treats embeddings, the head and
    ``(in, out)`` weights as plain matrices: one ``ParamGroupWarning`` pointing at the caller's line and at
    ``param_groups(model)``; the routed groups, a decay-free list and the plain AdamW preset give none."""
    import warnings

    from spectrakit.optim import AdamW, SpectraAdamW, param_groups
    from spectrakit.optim.spectra import ParamGroupWarning

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        SpectraAdamW(model.parameters())
        SpectraAdamW(param_groups(model))
        SpectraAdamW(model.parameters(), weight_decay=0.0)
        AdamW(model.parameters())
    found = [w for w in seen if issubclass(w.category, ParamGroupWarning)]
    assert len(found) == 1 and "param_groups(model)" in str(found[0].message)
    assert found[0].filename == __file__
