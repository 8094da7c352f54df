"""Matrix logistic regression, the test problem of the Frank-Wolfe experiments (Jiang, Semenov and Stich 2026
§F.1.1): ``f(X) = 1/n sum_i log(1 + exp(-y_i <A_i, X>))`` on Gaussian ``d x d`` features ``A_i`` with labels
``y_i = sign(<A_i, X~> + xi_i)``; shared by :mod:`.fw_logistic` and :mod:`.fw_family`.
"""

from __future__ import annotations

import torch


def logistic_data(d: int, n: int, n_test: int, noise: float, seed: int = 0, dtype=torch.float64):
    """``(A, y, A_test, y_test, X~)``: Gaussian ``d x d`` features, labels ``sign(<A_i, X~> + xi_i)``."""
    gen = torch.Generator().manual_seed(seed)
    X_true = torch.randn(d, d, generator=gen, dtype=dtype)
    A = torch.randn(n + n_test, d, d, generator=gen, dtype=dtype)
    xi = noise * torch.randn(n + n_test, generator=gen, dtype=dtype)
    y = torch.sign(A.flatten(1) @ X_true.flatten() + xi)
    y[y == 0] = 1.0
    return A[:n], y[:n], A[n:], y[n:], X_true


def logistic_loss(X: torch.Tensor, A: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``f(X) = mean_i log(1 + exp(-y_i <A_i, X>))``."""
    return torch.logaddexp(torch.zeros((), dtype=X.dtype), -y * (A.flatten(1) @ X.flatten())).mean()


def logistic_grad(X: torch.Tensor, A: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``grad f(X) = mean_i (-y_i / (1 + exp(y_i <A_i, X>))) A_i``."""
    z = y * (A.flatten(1) @ X.flatten())
    return ((-y * torch.sigmoid(-z)) @ A.flatten(1)).view_as(X) / A.shape[0]
