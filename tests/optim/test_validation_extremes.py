"""Bad hyperparameters, unknown param-group keys, sparse gradients and overflowing gradients."""

import math

import pytest
import torch

from spectrakit.optim import Spectra, SpectraAdamW


def _param():
    torch.manual_seed(0)
    return torch.nn.Parameter(torch.randn(8, 6))


@pytest.mark.parametrize("name,value", [("lr", math.inf), ("lr", math.nan), ("weight_decay", math.inf),
                                        ("c", math.nan), ("pre_c", -math.inf), ("betas", (0.9, math.nan)),
                                        ("eps", math.inf), ("peak_lr", math.inf)])
def test_nonfinite_hyperparameters_rejected_naming_the_argument(name, value):
    with pytest.raises(ValueError, match=name):
        SpectraAdamW([_param()], **{name: value})
    with pytest.raises(ValueError, match=name):  # inside a param group too
        SpectraAdamW([{"params": [_param()], name: value}])


def test_unknown_param_group_key_is_a_type_error():
    with pytest.raises(TypeError, match="betaz"):
        SpectraAdamW([{"params": [_param()], "betaz": (0.9, 0.99)}])
    opt = SpectraAdamW([_param()])
    with pytest.raises(TypeError, match="lrr"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3))], "lrr": 1.0})
    # keys of the group's own base are accepted
    Spectra([{"params": [_param()], "base": "sgd", "momentum": 0.5}], base="adamw")


def test_sparse_gradient_rejected():
    emb = torch.nn.Embedding(10, 4, sparse=True)
    opt = SpectraAdamW(emb.parameters())
    emb(torch.tensor([1, 3])).sum().backward()
    with pytest.raises(ValueError, match="sparse"):
        opt.step()


@pytest.mark.parametrize("post", ["soft_clip", "none"])
def test_overflowing_gradient_is_skipped_and_parameters_stay_finite(post):
    """A single 3e38 gradient: torch.optim.AdamW keeps finite parameters; so do we, by skipping the step."""
    p = _param()
    ref = torch.nn.Parameter(p.detach().clone())
    opt = SpectraAdamW([p], post=post)
    torch_opt = torch.optim.AdamW([ref])
    before = p.detach().clone()
    p.grad = torch.zeros_like(p)
    p.grad[0, 0] = 3e38
    ref.grad = p.grad.clone()
    opt.step()
    torch_opt.step()
    assert torch.isfinite(ref).all()
    assert torch.isfinite(p).all() and torch.equal(p.detach(), before)
    assert int(opt.skipped_steps) == 1
    for s in opt.state[p].values():
        assert torch.isfinite(s).all()
    # training continues normally afterwards
    p.grad = torch.randn_like(p)
    opt.step()
    assert torch.isfinite(p).all() and not torch.equal(p.detach(), before)
    assert int(opt.skipped_steps) == 1


def test_huge_finite_gradient_below_overflow_not_skipped():
    p = _param()
    opt = SpectraAdamW([p], post="none")
    p.grad = torch.full_like(p, 1e18)  # square 1e36 fits in fp32
    opt.step()
    assert int(opt.skipped_steps) == 0 and torch.isfinite(p).all()


def test_manifold_sgd_group_validation():
    from spectrakit.manifold import ManifoldSGD, Stiefel

    p = torch.nn.Parameter(torch.linalg.qr(torch.randn(6, 4))[0])
    with pytest.raises(TypeError, match="lrr"):
        ManifoldSGD([{"params": [p], "lrr": 0.1}], manifold=Stiefel(), lr=0.1)
    with pytest.raises(ValueError, match="weight_decay"):
        ManifoldSGD([p], manifold=Stiefel(), lr=0.1, weight_decay=math.inf)
