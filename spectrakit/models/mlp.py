"""Bias-free multilayer perceptron used by the steepest-descent-on-spectral-sets experiments (Cesista 2025 §6).

``MLP(dims)`` computes ``x -> W_L phi(... phi(W_2 phi(W_1 x)))`` with ``W_l`` of shape ``(dims[l],
dims[l-1])``
(``nn.Linear`` convention ``(out, in)``) and ``phi`` = ReLU or GELU; there are no biases, so every
parameter is a
matrix that can live on a spectral set. Weights are initialised on the scaled Stiefel manifold
``W = sqrt(out/in) * msign(randn)`` (unit RMS→RMS norm, all singular values equal), the natural start for
steepest descent under the RMS→RMS norm.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from spectrakit._checks import check_choice, check_int

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU}


class MLP(nn.Module):
    """``x -> W_L phi(... phi(W_1 x))`` without biases.

    Args:
        dims: layer widths ``(d_in, d_1, ..., d_out)``, at least two ints >= 1.
        activation: ``"relu"`` or ``"gelu"``.
        init: ``"stiefel"`` (``sqrt(out/in) msign(randn)``, unit RMS→RMS norm) or ``"default"`` (PyTorch's).
        generator: optional ``torch.Generator`` for a reproducible initialisation.

    Raises ``ValueError``/``TypeError`` for fewer than two widths, non-positive widths or unknown names.
    """

    def __init__(self, dims: Sequence[int], *, activation: str = "relu", init: str = "stiefel",
                 generator: torch.Generator | None = None):
        super().__init__()
        dims = list(dims)
        if len(dims) < 2:
            raise ValueError(f"dims must list at least an input and an output width, got {dims}")
        for i, d in enumerate(dims):
            check_int(d, f"dims[{i}]", low=1)
        check_choice(activation, "activation", ACTIVATIONS)
        check_choice(init, "init", ("stiefel", "default"))
        self.dims = dims
        self.layers = nn.ModuleList(nn.Linear(a, b, bias=False) for a, b in zip(dims[:-1], dims[1:]))
        self.act = ACTIVATIONS[activation]()
        if init == "stiefel":
            self.reset_stiefel(generator)

    @torch.no_grad()
    def reset_stiefel(self, generator: torch.Generator | None = None) -> None:
        """``W <- sqrt(out/in) U V^T`` for ``randn = U S V^T`` (exact SVD; singular values all
        ``sqrt(out/in)``)."""
        for layer in self.layers:
            out_f, in_f = layer.weight.shape
            g = torch.randn(out_f, in_f, generator=generator, dtype=torch.float64)
            u, _, vh = torch.linalg.svd(g, full_matrices=False)
            layer.weight.copy_((math.sqrt(out_f / in_f) * (u @ vh)).to(layer.weight.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = self.act(x)
        return x
