"""``ManifoldSGD``: steepest descent on spectral sets as a ``torch.optim.Optimizer`` (Cesista 2025 §3.1, A2).

Per matrix parameter ``W`` (in a set ``M``) with gradient ``g``::

    B  <- mu B + g                                  # heavy-ball momentum (B = g when momentum = 0)
    D  <- g + mu B   (nesterov)   or   B
    A  <- dualizer(M, W, D, lr, norm)               # steepest on-tangent direction, ||A|| <= lr
    W  <- retract_M((1 - lr * weight_decay) W + A)

``manifold=None`` gives unconstrained steepest descent under the norm; with ``weight_decay = lambda`` this is
the weight-decay-as-constraint view of Cesista 2025 A2: ``W <- (1 - lr lambda) W + A`` with ``||A|| <= lr`` keeps
``limsup ||W|| <= 1 / lambda`` in the chosen norm (Prop. 3), i.e. an implicit ball of radius ``1/lambda``.
Parameters with fewer than 2 dims (biases, gains) get plain SGD with momentum: ``p <- p - lr * D``.

Same-shaped parameters of a group are stacked and processed as one batch; no host synchronisation.
bf16/fp16 parameters are updated in float32 (momentum kept in float32) and stored back in their dtype.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from spectrakit._checks import check_choice, check_int, check_scalar, no_value_checks
from spectrakit._groups import check_finite_hyperparameters, check_group_keys
from spectrakit._optstate import check_state_dict
from spectrakit.manifold.dualizers import DUALIZERS, steepest_direction
from spectrakit.manifold.norms import NORMS
from spectrakit.manifold.sets import SpectralSet


class ManifoldSGD(torch.optim.Optimizer):
    """Steepest descent on spectral sets with momentum (see module docstring for the update).

    Args:
        params: parameters or param groups; a group may set its own ``manifold`` (per-parameter choice of
        set),
            ``lr``, ``norm``, ``dualizer`` etc.
        manifold: a :class:`~spectrakit.manifold.sets.SpectralSet` (``PSDCone()``, ``SpectralBall(4,
        rms=True)``,
            ...) or ``None`` (unconstrained).
        lr: step size ``eta > 0`` = the norm of the update ``A``.
        norm: ``"rms"`` (RMS→RMS operator norm), ``"spectral"`` or ``"frobenius"``.
        dualizer: ``"naive"``, ``"alternating"``, ``"pdhg"`` or ``"dual_ascent"``.
        dualizer_options: keyword arguments of the dualizer (``steps``, ``step_ratio``, ``sigma``, ``rtol``).
        momentum: ``mu`` in [0, 1); ``nesterov``: use ``g + mu B``.
        weight_decay: ``lambda >= 0`` with ``lr * lambda <= 1`` (decoupled, applied before the retraction).
        retract_init: retract the matrix parameters into their set at construction (default True).

    Raises ``ValueError``/``TypeError`` for out-of-range hyperparameters or a non-square parameter in a
    symmetric set.
    """

    def __init__(self, params, *, manifold: SpectralSet | None = None, lr: float = 0.1, norm: str = "rms",
                 dualizer: str = "alternating", dualizer_options: dict | None = None, momentum: float = 0.0,
                 nesterov: bool = False, weight_decay: float = 0.0, retract_init: bool = True):
        defaults = dict(manifold=manifold, lr=lr, norm=norm, dualizer=dualizer,
                        dualizer_options=dict(dualizer_options or {}), momentum=momentum, nesterov=nesterov,
                        weight_decay=weight_decay)
        super().__init__(params, defaults)
        if retract_init:
            self.retract_parameters()

    def add_param_group(self, param_group: dict) -> None:
        """Add a group (validated like the constructor's arguments; not retracted automatically)."""
        check_group_keys(param_group, set(self.defaults))
        super().add_param_group(param_group)
        check_finite_hyperparameters(self.param_groups[-1])
        self._check_group(self.param_groups[-1])

    @staticmethod
    def _check_group(group) -> None:
        check_scalar(group["lr"], "lr", low=0.0, low_inclusive=False, allow_tensor=False)
        check_scalar(group["momentum"], "momentum", low=0.0, high=1.0, high_inclusive=False,
                     allow_tensor=False)
        check_scalar(group["weight_decay"], "weight_decay", low=0.0, allow_tensor=False)
        if group["lr"] * group["weight_decay"] > 1:
            raise ValueError(f"lr * weight_decay must be <= 1, got {group['lr'] * group['weight_decay']}")
        check_choice(group["norm"], "norm", NORMS)
        check_choice(group["dualizer"], "dualizer", DUALIZERS)
        m = group["manifold"]
        if m is not None and not isinstance(m, SpectralSet):
            raise TypeError(f"manifold must be a SpectralSet or None, got {type(m).__name__}")
        if "steps" in group["dualizer_options"]:
            check_int(group["dualizer_options"]["steps"], "dualizer_options['steps']", low=0)
        for p in group["params"]:
            if m is not None and m.symmetric and p.ndim >= 2 and p.shape[-1] != p.shape[-2]:
                raise ValueError(f"{type(m).__name__} needs square parameters, got shape {tuple(p.shape)}")

    @torch.no_grad()
    def retract_parameters(self) -> None:
        """Put every matrix parameter on its set: ``W <- retract(W)``."""
        with no_value_checks():
            for group in self.param_groups:
                m = group["manifold"]
                if m is None:
                    continue
                for params in _buckets(group["params"]).values():
                    W = torch.stack([_work(p) for p in params])
                    for p, w in zip(params, m.retract(W).unbind(0)):
                        p.copy_(w)

    def load_state_dict(self, state_dict: dict) -> None:
        """``torch.optim.Optimizer.load_state_dict`` after checking every saved state against its parameter:
        at most a ``momentum_buffer`` of the parameter's shape (float32 for half-precision parameters), finite
        (``ValueError`` naming the parameter and key otherwise; nothing is changed)."""
        check_state_dict(self, state_dict, lambda group, saved, p: {"momentum_buffer": _work(p)},
                         may_lack=("momentum_buffer",))
        super().load_state_dict(state_dict)

    @torch.no_grad()
    def step(self, closure=None):
        """One update of every parameter with a gradient; returns the closure's loss if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with no_value_checks():
            for group in self.param_groups:
                self._step_group(group)
        return loss

    def _direction(self, p, group) -> torch.Tensor:
        g = _work(p.grad)
        mu = group["momentum"]
        if mu == 0:
            return g
        state = self.state[p]
        buf = state.get("momentum_buffer")
        if buf is None:
            buf = state["momentum_buffer"] = g.clone()
        else:
            buf.mul_(mu).add_(g)
        return g + mu * buf if group["nesterov"] else buf

    def _step_group(self, group) -> None:
        lr, wd, m = group["lr"], group["weight_decay"], group["manifold"]
        params = [p for p in group["params"] if p.grad is not None]
        for shape, bucket in _buckets(params).items():
            D = [self._direction(p, group) for p in bucket]
            if len(shape) < 2:
                for p, d in zip(bucket, D):
                    p.add_(d.to(p.dtype), alpha=-lr)
                    if wd:
                        p.mul_(1 - lr * wd)
                continue
            W = torch.stack([_work(p) for p in bucket])
            G = torch.stack(D)
            A = steepest_direction(m, W, G, lr, norm=group["norm"], dualizer=group["dualizer"],
                                   **group["dualizer_options"])
            W_new = (1 - lr * wd) * W + A
            if m is not None:
                W_new = m.retract(W_new)
            for p, w in zip(bucket, W_new.unbind(0)):
                p.copy_(w)


def _work(t: torch.Tensor) -> torch.Tensor:
    """Half-precision tensors are updated in float32 (state included); others in their own dtype."""
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t


def _buckets(params):
    out = defaultdict(list)
    for p in params:
        out[tuple(p.shape)].append(p)
    return out
