"""Differentiable spectral regularizers for the convolutions of a model (Grishina, Gorbunov and Rakhuba 2024 §6.2–6.3).

``penalty = beta * sum_l R(K_l)`` with, per layer (``Q`` = strided reshape of Thm 4.3, ``k' = ceil(k/s)``):

* ``"tn"``:    ``R = sqrt(prod k') ||Q||_sigma``  (the TN bound, HOPM warm-started: one sweep per step);
* ``"f4"``:    ``R = sqrt(prod k') min_j ||unfold_j(Q)||_2`` (one warm power iteration per step);
* ``"2norm"``: ``R = sqrt(prod(2k'-1)) ||M - I||_sigma`` with ``M = Q * Q`` the channel Gram kernel
  (correlation of ``Q`` with itself, contracting the larger channel side), i.e. the TN bound of
  ``T^T T - I`` for a circular convolution: small when the layer is orthogonal;
* ``"ratio"``: ``R = sqrt(prod k') ||Q||_sigma / ||K||_F`` (scale-free; 1/sqrt(rank)-like for orthogonal layers).

Layers with the same kernel shape and geometry are stacked and bounded as one batch. The singular vectors are
kept per stack and refreshed by a cold HOPM run (screened random restarts, warm vectors kept as one start)
every ``restart_every`` steps.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from spectrakit._checks import check_choice, check_int, check_scalar
from spectrakit.conv.kernel import CONV_TYPES, effective_kernel
from spectrakit.conv.tensor_norm import tensor_spectral_norm
from spectrakit.conv.unfolding_bound import f4_bound

KINDS = ("tn", "f4", "2norm", "ratio")
_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def channel_gram_kernel(Q: torch.Tensor, d: int) -> torch.Tensor:
    """``M[c1, c2, delta] = sum_o sum_a Q[o, c1, a] Q[o, c2, a + delta] - I[c1, c2] [delta = 0]``.

    ``Q (..., co, ci, k..)``; contracts over the larger of ``co``/``ci`` (so ``M`` is the kernel of ``T^T T - I``
    or ``T T^T - I``); returns ``(..., c, c, 2k-1..)``. Differentiable.
    """
    lead = Q.shape[:-d - 2]
    if Q.shape[-d - 2] < Q.shape[-d - 1]:
        Q = Q.transpose(-d - 2, -d - 1)
    co, ci, ks = Q.shape[-d - 2], Q.shape[-d - 1], Q.shape[-d:]
    L = math.prod(lead)
    X = Q.reshape(L, co, ci, *ks).transpose(1, 2)                            # (L, ci, co, k..)
    inp = X.transpose(0, 1).reshape(ci, L * co, *ks)                         # batch c1, channels (L, o)
    w = X.reshape(L * ci, co, *ks)                                           # out (L, c2), in o
    M = _CONV[d](inp, w, padding=tuple(k - 1 for k in ks), groups=L)         # (c1, L*c2, 2k-1..)
    M = M.reshape(ci, L, ci, *M.shape[2:]).transpose(0, 1)                   # (L, c1, c2, 2k-1..)
    eye = torch.zeros_like(M)
    center = (slice(None), slice(None), slice(None)) + tuple(k - 1 for k in ks)
    eye[center] = torch.eye(ci, dtype=M.dtype, device=M.device)
    return (M - eye).reshape(*lead, ci, ci, *M.shape[3:])


class ConvRegularizer:
    """``beta * sum_l R(K_l)`` over the ``nn.Conv1d/2d/3d`` layers of ``model`` (see module doc for ``kind``).

    ``beta`` >= 0; ``kind`` in ``("tn", "f4", "2norm", "ratio")``; ``iters`` >= 1 warm sweeps per call;
    ``restart_every`` >= 1 calls between cold restarts (``cold_iters`` sweeps, ``restarts`` random starts);
    ``exclude``: names of conv layers to skip. Call it once per training step and add the result to the loss.
    Raises ``ValueError``/``TypeError`` for bad arguments or a model without convolutions.
    """

    def __init__(self, model: nn.Module, beta: float, *, kind: str = "tn", iters: int = 1, restart_every: int = 500,
                 cold_iters: int = 100, restarts: int | None = None, exclude: tuple[str, ...] = ()):
        check_scalar(beta, "beta", low=0.0, allow_tensor=False)
        check_choice(kind, "kind", KINDS)
        check_int(iters, "iters", low=1)
        check_int(restart_every, "restart_every", low=1)
        check_int(cold_iters, "cold_iters", low=1)
        if restarts is not None:
            check_int(restarts, "restarts", low=1)
        self.beta, self.kind, self.iters = float(beta), kind, iters
        self.restart_every, self.cold_iters, self.restarts = restart_every, cold_iters, restarts
        self.stacks: dict[tuple, list[tuple[str, nn.Module]]] = {}
        for name, mod in model.named_modules():
            if isinstance(mod, CONV_TYPES) and name not in exclude:
                key = (tuple(mod.weight.shape), mod.stride, mod.dilation, mod.groups)
                self.stacks.setdefault(key, []).append((name, mod))
        if not self.stacks:
            raise ValueError("model has no nn.Conv1d/Conv2d/Conv3d layers to regularize")
        self.states: dict[tuple, object] = {}
        self.steps = 0
        self.last: dict[str, torch.Tensor] = {}

    def _measure(self, key, mods) -> torch.Tensor:
        m0 = mods[0]
        d = m0.weight.ndim - 2
        W = torch.stack([m.weight for m in mods])                            # (L, co, ci/g, k..)
        cold = key not in self.states or self.steps % self.restart_every == 0
        Q, geo = effective_kernel(W, stride=m0.stride, dilation=m0.dilation, groups=m0.groups, spatial_dims=d,
                                  finite=False)
        if self.kind == "f4":
            val, st = f4_bound(W, stride=m0.stride, dilation=m0.dilation, groups=m0.groups, spatial_dims=d,
                               iters=self.cold_iters if cold else self.iters,
                               state=None if cold else self.states[key], finite=False)
            self.states[key] = st
            return val
        T = channel_gram_kernel(Q, d) if self.kind == "2norm" else Q
        kw = dict(iters=self.cold_iters, restarts=self.restarts) if cold else dict(iters=self.iters, restarts=0)
        sigma, st = tensor_spectral_norm(T, batch_dims=T.ndim - d - 2, state=self.states.get(key), **kw)
        self.states[key] = st
        val = sigma * math.sqrt(math.prod(T.shape[-d:]))
        if self.kind == "ratio":
            val = val / torch.linalg.vector_norm(Q.flatten(-d - 2), dim=-1).clamp_min(1e-12)
        return val.amax(-1)                                                   # max over groups -> (L,)

    def __call__(self) -> torch.Tensor:
        total = None
        for key, named in self.stacks.items():
            vals = self._measure(key, [m for _, m in named])
            for (name, _), v in zip(named, vals.detach()):
                self.last[name] = v
            s = vals.sum()
            total = s if total is None else total + s
        self.steps += 1
        return self.beta * total

    def layer_values(self) -> dict[str, float]:
        """Per-layer values of ``R`` from the last call (floats; synchronises, so call it for logging only)."""
        return {k: float(v) for k, v in self.last.items()}


class TNRegularizer(ConvRegularizer):
    """``beta * sum_l TN(K_l)`` (Grishina, Gorbunov and Rakhuba 2024 §6.2): :class:`ConvRegularizer` with
    ``kind="tn"``."""

    def __init__(self, model: nn.Module, beta: float, **kwargs):
        super().__init__(model, beta, kind="tn", **kwargs)
