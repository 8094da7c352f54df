"""ManifoldSGD against a hand-written reference update (seed 002 §3.1, A2)."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from spectrakit.manifold import (
    ManifoldSGD,
    PSDCone,
    SpectralBall,
    Stiefel,
    alternating,
    naive,
    pdhg,
)


def _reference_step(W, G, buf, *, manifold, lr, mu, dualizer, wd=0.0):
    """W <- retract((1 - lr wd) W + A), A = dualizer(buf = mu buf + G)."""
    buf = G.clone() if buf is None else mu * buf + G
    D = buf if mu else G
    A = dualizer(manifold, W, D, lr)
    return manifold.retract((1 - lr * wd) * W + A), buf


@pytest.mark.parametrize("dualizer,fn", [
    ("naive", lambda S, W, G, lr: naive(S, W, G, lr)),
    ("alternating", lambda S, W, G, lr: alternating(S, W, G, lr, steps=2)),
    ("pdhg", lambda S, W, G, lr: pdhg(S, W, G, lr, steps=5)),
])
@pytest.mark.parametrize("mu", [0.0, 0.9])
def test_step_matches_reference(dualizer, fn, mu):
    torch.manual_seed(0)
    S = SpectralBall(1.0, rms=True, method="exact")
    W0 = S.retract(torch.randn(3, 6, 4, dtype=torch.float64) * 3)  # same shape: one batch
    params = [torch.nn.Parameter(w.clone()) for w in W0]
    opts = {} if dualizer == "naive" else {"steps": 2 if dualizer == "alternating" else 5}
    opt = ManifoldSGD(params, manifold=S, lr=0.1, momentum=mu, dualizer=dualizer, dualizer_options=opts)
    W, buf = W0.clone(), None
    for _ in range(3):
        G = torch.randn(3, 6, 4, dtype=torch.float64)
        for p, g in zip(params, G):
            p.grad = g.clone()
        opt.step()
        W, buf = _reference_step(W, G, buf, manifold=S, lr=0.1, mu=mu, dualizer=fn)
        got = torch.stack([p.detach() for p in params])
        assert (got - W).norm() <= 1e-6 * W.norm()
        assert bool(S.contains(got, tol=1e-6).all())


def test_per_group_sets_and_vector_fallback():
    torch.manual_seed(1)
    sq = torch.nn.Parameter(torch.randn(5, 5))
    rect = torch.nn.Parameter(torch.randn(7, 3))
    bias = torch.nn.Parameter(torch.randn(5))
    opt = ManifoldSGD([{"params": [sq], "manifold": PSDCone()}, {"params": [rect], "manifold": Stiefel()},
                       {"params": [bias]}], lr=0.05, momentum=0.5)
    assert bool(PSDCone().contains(sq.detach(), tol=1e-3))  # retracted at construction
    b0 = bias.detach().clone()
    for _ in range(2):
        for p in (sq, rect, bias):
            p.grad = torch.ones_like(p)
        opt.step()
    assert bool(PSDCone().contains(sq.detach(), tol=1e-3))
    s = torch.linalg.svdvals(rect.detach())
    assert torch.allclose(s, torch.ones_like(s), atol=2e-3)
    # plain SGD with heavy-ball momentum on the vector: -lr (1 + (1 + mu))
    assert torch.allclose(bias.detach(), b0 - 0.05 * (1 + 1.5), atol=1e-6)


def test_weight_decay_view_bounds_the_norm():
    """Seed 002 A2: W <- (1 - lr lambda) W + A with ||A||_RMS <= lr keeps ||W||_RMS <= 1/lambda."""
    torch.manual_seed(2)
    lam, lr = 0.5, 0.1
    p = torch.nn.Parameter(torch.randn(8, 4) * 0.01)
    opt = ManifoldSGD([p], manifold=None, lr=lr, weight_decay=lam, dualizer="naive")
    g = torch.randn(8, 4)
    norms = []
    for _ in range(200):
        p.grad = g.clone()  # constant gradient: the update stabilises, W -> A / (lr lambda)
        opt.step()
        norms.append(float(torch.linalg.matrix_norm(p.detach(), ord=2)) * math.sqrt(4 / 8))
    assert max(norms) <= 1 / lam * (1 + 1e-5)
    assert norms[-1] >= 0.999 / lam  # and it is reached (all singular values pulled to 1/lambda)


def test_state_dict_round_trip_resumes_exactly():
    torch.manual_seed(3)
    S = SpectralBall(1.0)
    p1 = torch.nn.Parameter(torch.randn(6, 4, dtype=torch.float64))
    opt1 = ManifoldSGD([p1], manifold=S, lr=0.1, momentum=0.9, dualizer="pdhg", dualizer_options={"steps": 3})
    grads = [torch.randn(6, 4, dtype=torch.float64) for _ in range(4)]
    for g in grads[:2]:
        p1.grad = g.clone()
        opt1.step()
    p2 = torch.nn.Parameter(p1.detach().clone())
    opt2 = ManifoldSGD([p2], manifold=S, lr=0.1, momentum=0.9, dualizer="pdhg", dualizer_options={"steps": 3},
                       retract_init=False)
    opt2.load_state_dict(copy.deepcopy(opt1.state_dict()))
    for g in grads[2:]:
        for p, o in ((p1, opt1), (p2, opt2)):
            p.grad = g.clone()
            o.step()
    assert torch.equal(p1.detach(), p2.detach())


def test_bf16_parameters_and_closure():
    torch.manual_seed(4)
    p = torch.nn.Parameter(torch.randn(8, 8).bfloat16())
    opt = ManifoldSGD([p], manifold=SpectralBall(1.0), lr=0.1)
    x = torch.randn(8).bfloat16()

    def closure():
        opt.zero_grad()
        loss = (p @ x).float().square().sum()
        loss.backward()
        return loss

    loss0 = opt.step(closure)
    assert p.dtype == torch.bfloat16 and torch.isfinite(loss0)
    assert float(torch.linalg.matrix_norm(p.detach().double(), ord=2)) <= 1.02


def test_training_decreases_loss_on_the_ball():
    torch.manual_seed(5)
    target = torch.randn(10, 6)
    W = torch.nn.Parameter(torch.zeros(10, 6))
    opt = ManifoldSGD([W], manifold=SpectralBall(1.0), lr=0.05, dualizer="alternating", norm="spectral")
    losses = []
    for _ in range(40):
        opt.zero_grad()
        loss = (W - target).square().sum()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    # the constrained optimum is spectral_hardcap(target, 1)
    from spectrakit.linalg import spectral_hardcap

    best = float((spectral_hardcap(target.double(), 1.0, method="exact") - target.double()).square().sum())
    # constant-lr SGD reaches the optimum (1.0001 x best at step 20) and then oscillates within ~2% of it
    assert min(losses[-25:]) <= best * 1.01 and max(losses[-10:]) <= best * 1.03 and losses[-1] < losses[0]
    assert float(torch.linalg.matrix_norm(W.detach().double(), 2)) <= 1.0 + 1e-3


@pytest.mark.parametrize("kwargs,match", [
    ({"lr": 0.0}, "lr"), ({"momentum": 1.0}, "momentum"), ({"weight_decay": -1.0}, "weight_decay"),
    ({"lr": 1.0, "weight_decay": 2.0}, "lr \\* weight_decay"), ({"norm": "l1"}, "norm"),
    ({"dualizer": "adam"}, "dualizer"), ({"dualizer_options": {"steps": -1}}, "steps"),
])
def test_invalid_hyperparameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ManifoldSGD([torch.nn.Parameter(torch.zeros(3, 3))], manifold=SpectralBall(1.0), **kwargs)


def test_invalid_manifold():
    with pytest.raises(TypeError, match="manifold"):
        ManifoldSGD([torch.nn.Parameter(torch.zeros(3, 3))], manifold="ball")
    with pytest.raises(ValueError, match="square"):
        ManifoldSGD([torch.nn.Parameter(torch.zeros(3, 4))], manifold=PSDCone())


def test_add_param_group_is_validated():
    opt = ManifoldSGD([torch.nn.Parameter(torch.zeros(3, 3))], manifold=SpectralBall(1.0))
    with pytest.raises(ValueError, match="lr"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2, 2))], "lr": -1.0})
    opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2, 2))], "manifold": PSDCone()})
    assert isinstance(opt.param_groups[-1]["manifold"], PSDCone)
