"""Optimizer registry: every name builds a working torch optimizer with the paper's groups; parity of
spectrakit's AdamW with torch.optim.AdamW on the LM; argument errors."""

from __future__ import annotations

import pytest
import torch

from spectrakit.data.batches import TokenBatches
from spectrakit.train.optimizers import OPTIMIZERS, build_optimizer, param_groups


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_optimizer_steps_and_changes_matrices(name, make_model, tokens):
    model = make_model(0)
    opt = build_optimizer(name, model, warmup_steps=0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    x, y = TokenBatches(tokens[0], 4, 12).batch(0)
    for _ in range(2):
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    for n, p in model.named_parameters():
        assert torch.isfinite(p).all()
        if p.ndim >= 2:
            assert not torch.equal(p, before[n]), n
    assert opt.param_groups[0]["lr"] == OPTIMIZERS[name].lr


def test_param_groups_decay_matrices_only_and_dedupe_tied(make_model):
    model = make_model(0, tie_embeddings=True)
    groups = param_groups(model, 0.1)
    kinds = {g["kind"]: g for g in groups}
    assert kinds["matrix"]["weight_decay"] == 0.1 and kinds["vector"]["weight_decay"] == 0.0
    n_params = sum(len(g["params"]) for g in groups)
    assert n_params == len({id(p) for p in model.parameters()})
    assert all(p.ndim >= 2 for p in kinds["matrix"]["params"]) and all(
        p.ndim == 1 for p in kinds["vector"]["params"]
    )
    split = {g["kind"]: g["names"] for g in param_groups(make_model(0), 0.1, split_embeddings=True)}
    assert split["embedding"] == ["embed.weight", "head.weight"]


def test_muon_gives_embeddings_and_vectors_to_adamw(make_model):
    opt = build_optimizer("muon", make_model(0))
    posts = sorted((g["post"], g["base"]) for g in opt.param_groups)
    assert posts == [("newton_schulz5", "ema"), ("none", "adamw"), ("none", "adamw")]


def test_adamw_matches_torch_reference(make_model, tokens):
    """``adamw`` (spectrakit pipeline, paper betas and groups) equals ``torch.optim.AdamW`` (an independent
    implementation) step by step, in float64."""
    models = {n: make_model(0).double() for n in ("adamw", "torch-adamw")}
    opts = {n: build_optimizer(n, m, lr=1e-2) for n, m in models.items()}
    for i in range(3):
        x, y = TokenBatches(tokens[0], 4, 12).batch(i)
        for n, m in models.items():
            _, loss = m(x, y)
            loss.backward()
            opts[n].step()
            opts[n].zero_grad()
    for a, b in zip(models["adamw"].parameters(), models["torch-adamw"].parameters()):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_embedding_scale_sets_alpha_of_embedding_and_head_only(make_model, tokens):
    """``embedding_scale`` puts the embedding/head in their own group with that ``alpha``; the applied update
    of the head then obeys ``||dW||_2 <= lr * alpha * c`` with the new alpha (weight decay 0)."""
    model = make_model(0)
    opt = build_optimizer("spectra-adamw", model, embedding_scale=0.25, weight_decay=0.0, lr=0.1, c=0.5)
    scales = sorted(str(g["scale"]) for g in opt.param_groups)
    assert scales == ["0.25", "auto", "auto"]
    head = model.head.weight  # reference alpha max(1, sqrt(vocab/d)) >= 1
    before = head.detach().clone()
    x, y = TokenBatches(tokens[0], 4, 12).batch(0)
    _, loss = model(x, y)
    loss.backward()
    opt.step()
    step_norm = float(torch.linalg.matrix_norm((head.detach() - before).double(), 2))
    assert 0.5 * 0.1 * 0.25 * 0.5 < step_norm <= 0.1 * 0.25 * 0.5 * (1 + 1e-3)
    # plain optimizers ignore it (no SPECTRA clip): same groups as without it
    assert len(build_optimizer("adamw", make_model(0), embedding_scale=1.0).param_groups) == 2
    with pytest.raises(ValueError, match="embedding_scale"):
        build_optimizer("spectra-adamw", make_model(0), embedding_scale=0.0)


@pytest.mark.parametrize(
    "kwargs,err,match",
    [
        (dict(name="sgd-nope"), ValueError, "optimizer must be one of"),
        (dict(name="adamw", lr=-1.0), ValueError, "lr"),
        (dict(name="spectra-adamw", c=0.0), ValueError, "c must be"),
        (dict(name="adamw", weight_decay=-0.1), ValueError, "weight_decay"),
        (dict(name="adamw", world_size=0), ValueError, "world_size"),
        (dict(name="adamw", world_size=2.0), TypeError, "world_size"),
    ],
)
def test_errors(make_model, kwargs, err, match):
    with pytest.raises(err, match=match):
        build_optimizer(model=make_model(0), **kwargs)


@pytest.mark.parametrize("name", ["spectra-adamw", "muon", "adamw", "torch-adamw"])
def test_world_size_selects_the_sharded_class(make_model, tokens, name):
    """world_size > 1: every Spectra class becomes ``sharded(cls)`` (torch's AdamW stays as is); without a
    process group the sharded optimizer steps exactly like the plain one (the 2-process equivalence is in
    test_parallel.py)."""
    from spectrakit.distributed import ShardedSpectraMixin
    from spectrakit.optim import Spectra

    models = [make_model(0), make_model(0)]
    plain = build_optimizer(name, models[0])
    shard = build_optimizer(name, models[1], world_size=2)
    assert isinstance(shard, ShardedSpectraMixin) == isinstance(plain, Spectra)
    assert isinstance(shard, type(plain))
    data = TokenBatches(tokens[0], 2, 8, seed=0)
    for i in range(2):
        x, y = data.batch(i)
        for model, opt in zip(models, (plain, shard)):
            model(x, y)[1].backward()
            opt.step()
            opt.zero_grad()
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(a, b)
