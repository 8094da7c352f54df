"""Regularizers (values vs direct bounds, gradients, warm-state reuse) and the Lipschitz report."""

import math

import pytest
import torch
from torch import nn

from spectrakit.conv import (
    ConvRegularizer,
    TNRegularizer,
    channel_gram_kernel,
    dense_jacobian,
    f4_bound,
    lipschitz_report,
    tn_bound,
)
from spectrakit.models.cnn import simple_cnn


def _model():
    return nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 6, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(6, 6, 3, padding=1, stride=2), nn.ReLU()).double()


@pytest.mark.parametrize("kind", ["tn", "f4", "2norm", "ratio"])
def test_regularizer_values_and_grad(kind):
    torch.manual_seed(0)
    model = _model()
    # 60 cold iterations: the penalty within 1.8e-6 (f4), 1.5e-15 (the others) of the direct bounds (measured;
    # tolerance 2e-3)
    reg = ConvRegularizer(model, 0.5, kind=kind, cold_iters=60)
    pen = reg()
    pen.backward()
    expected = 0.0
    for m in (model[0], model[2], model[4]):
        W = m.weight.detach()
        if kind == "tn":
            expected += float(tn_bound(m)[0].detach())
        elif kind == "f4":
            expected += float(f4_bound(m)[0].detach())
        elif kind == "ratio":
            expected += float(tn_bound(m)[0].detach()) / float(torch.linalg.vector_norm(W))
        else:
            from spectrakit.conv.kernel import effective_kernel
            Q, _ = effective_kernel(W, stride=m.stride)
            M = channel_gram_kernel(Q, 2)
            expected += float(tn_bound(M[0])[0])
    assert abs(float(pen.detach()) - 0.5 * expected) / (0.5 * expected) < 2e-3
    for m in (model[0], model[2], model[4]):
        assert m.weight.grad is not None and torch.isfinite(m.weight.grad).all() and m.weight.grad.abs().sum() > 0
    assert set(reg.layer_values()) == {"0", "2", "4"}
    assert len(reg.stacks) == 3 if kind else True


def test_same_shaped_layers_are_stacked_and_warm():
    model = _model()
    reg = TNRegularizer(model, 1.0, restart_every=10)
    assert sorted(len(v) for v in reg.stacks.values()) == [1, 1, 1]
    m2 = nn.Sequential(nn.Conv2d(4, 4, 3), nn.Conv2d(4, 4, 3), nn.Conv2d(4, 4, 3, stride=2))
    reg2 = TNRegularizer(m2, 1.0)
    assert sorted(len(v) for v in reg2.stacks.values()) == [1, 2]
    v0 = reg2().detach()
    v1 = reg2().detach()                               # warm step, unchanged weights: same value
    torch.testing.assert_close(v1, v0, rtol=1e-4, atol=0)


def test_channel_gram_kernel_is_TtT_minus_I():
    """The circular conv with M equals T^T T - I (dense check on a small grid)."""
    K = torch.randn(5, 3, 3, 3, dtype=torch.float64)
    M = channel_gram_kernel(K, 2)
    assert M.shape == (3, 3, 5, 5)
    T = dense_jacobian(K, 6, padding_mode="circular")
    G = T.T @ T - torch.eye(T.shape[1], dtype=torch.float64)
    t = torch.linalg.matrix_norm(G, ord=2)
    TM = dense_jacobian(M, 6, padding_mode="circular")
    torch.testing.assert_close(torch.linalg.svdvals(TM), torch.linalg.svdvals(G), rtol=1e-8, atol=1e-8)
    assert tn_bound(M)[0] >= t * (1 - 1e-4)


def test_bad_regularizer_args():
    with pytest.raises(ValueError, match="kind"):
        ConvRegularizer(_model(), 1.0, kind="l2")
    with pytest.raises(ValueError, match="beta"):
        ConvRegularizer(_model(), -1.0)
    with pytest.raises(ValueError, match="no nn.Conv"):
        ConvRegularizer(nn.Linear(2, 2), 1.0)


def test_lipschitz_report_sequential_bound_holds():
    torch.manual_seed(0)
    model = simple_cnn(1, 3, 4, 8).double()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 2.0)
    model.eval()
    res = lipschitz_report(model, (1, 8, 8), exact=True, verbose=False)
    assert res["sequential"]
    convs = [r for r in res["layers"] if r["type"] == "Conv2d"]
    assert [r["bn_folded"] for r in convs] == [True, True, False]
    for r in convs:
        assert r["exact"] <= r["tn"] * (1 + 1e-4) <= r["f4"] * (1 + 1e-4)
    # the product bounds the Jacobian norm of the network at random points
    x = torch.randn(1, 1, 8, 8, dtype=torch.float64)
    J = torch.autograd.functional.jacobian(lambda z: model(z).flatten(), x).reshape(3, -1)
    assert torch.linalg.matrix_norm(J, ord=2) <= res["product"]
    lin = [r for r in res["layers"] if r["type"] == "Linear"][0]
    assert math.isclose(lin["bound"], float(torch.linalg.matrix_norm(model[-1].weight.detach(), ord=2)), rel_tol=1e-5)


def test_lipschitz_report_bad_input():
    with pytest.raises(TypeError, match="nn.Module"):
        lipschitz_report(torch.ones(3), (1, 8, 8))
