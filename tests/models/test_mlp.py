"""MLP used by the manifold experiments: forward pass against a hand-written reference, Stiefel init."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from spectrakit.models.mlp import MLP


@pytest.mark.parametrize("dims", [[2, 16, 16, 2], [62, 32, 31], [5, 3]])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_forward_matches_reference(dims, activation):
    model = MLP(dims, activation=activation, generator=torch.Generator().manual_seed(0))
    x = torch.randn(7, dims[0])
    act = F.relu if activation == "relu" else F.gelu
    h = x
    for i, layer in enumerate(model.layers):
        h = h @ layer.weight.T
        if i < len(model.layers) - 1:
            h = act(h)
    assert torch.allclose(model(x), h, atol=1e-6)
    assert all(layer.bias is None for layer in model.layers)


@pytest.mark.parametrize("shape", [(16, 2), (2, 16), (8, 8)])
def test_stiefel_init_has_unit_rms_norm(shape):
    model = MLP([shape[1], shape[0]], generator=torch.Generator().manual_seed(1))
    s = torch.linalg.svdvals(model.layers[0].weight.detach().double())
    assert torch.allclose(s, torch.full_like(s, math.sqrt(shape[0] / shape[1])), rtol=1e-5)


def test_init_is_reproducible_and_default_init_differs():
    a = MLP([4, 8, 3], generator=torch.Generator().manual_seed(2))
    b = MLP([4, 8, 3], generator=torch.Generator().manual_seed(2))
    c = MLP([4, 8, 3], init="default")
    assert torch.equal(a.layers[0].weight, b.layers[0].weight)
    assert not torch.allclose(torch.linalg.svdvals(c.layers[0].weight.detach()),
                              torch.full((4,), math.sqrt(2.0)))


@pytest.mark.parametrize("kwargs,err,match", [
    ({"dims": [3]}, ValueError, "at least"), ({"dims": [3, 0]}, ValueError, "dims\\[1\\]"),
    ({"dims": [3, 2.5]}, TypeError, "dims\\[1\\]"),
    ({"dims": [3, 2], "activation": "tanh"}, ValueError, "activation"),
    ({"dims": [3, 2], "init": "xavier"}, ValueError, "init"),
])
def test_invalid_arguments(kwargs, err, match):
    with pytest.raises(err, match=match):
        MLP(**kwargs)
