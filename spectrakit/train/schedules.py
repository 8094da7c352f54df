"""Learning-rate schedules with linear warm-up: WSD (warm-up, stable, decay) and cosine (Jiang, Semenov and Stich 2026
§6.2, F.3).

Both are multiplicative factors ``f(k)`` of the peak LR at step ``k`` (0-based), used through
``torch.optim.lr_scheduler.LambdaLR`` so their state is checkpointed with the usual ``state_dict``.

- warm-up (both): ``f(k) = (k + 1) / warmup`` for ``k < warmup``.
- ``wsd``: ``f(k) = 1`` until ``decay_start = total - round(decay_frac * total)``, then the square-root decay
  ``f(k) = final + (1 - final) * (1 - sqrt((k - decay_start) / (total - decay_start)))`` (Hägele et al. 2024;
  the paper decays to zero from 80% of training, i.e. ``decay_frac = 0.2``, ``final = 0``).
- ``cosine``: ``f(k) = final + (1 - final) * (1 + cos(pi * t)) / 2``, ``t = (k - warmup)/(total - warmup)``.
- ``constant``: 1 after warm-up.
"""

from __future__ import annotations

import functools
import math

import torch

from spectrakit._checks import check_choice, check_int, check_scalar

SCHEDULES = ("wsd", "cosine", "constant")


def lr_factor(
    step: int, *, total: int, warmup: int = 0, kind: str = "wsd", decay_frac: float = 0.2, final: float = 0.0
) -> float:
    """The factor ``f(step)`` defined in the module docstring (a Python float; steps past ``total`` are
    clamped to the last step).

    Args:
        step: optimizer step, >= 0.
        total: total steps, >= 1.
        warmup: warm-up steps, in [0, total].
        kind: ``"wsd"``, ``"cosine"`` or ``"constant"``.
        decay_frac: WSD decay share of the run, in [0, 1].
        final: factor reached at the end, in [0, 1].
    Raises ``ValueError``/``TypeError`` for arguments outside these ranges.
    """
    check_int(step, "step", low=0)
    check_int(total, "total", low=1)
    check_int(warmup, "warmup", low=0, high=total)
    check_choice(kind, "kind", SCHEDULES)
    check_scalar(decay_frac, "decay_frac", low=0, high=1, allow_tensor=False)
    check_scalar(final, "final", low=0, high=1, allow_tensor=False)
    step = min(step, total - 1)
    if step < warmup:
        return (step + 1) / warmup
    if kind == "constant":
        return 1.0
    if kind == "cosine":
        t = (step - warmup) / max(1, total - warmup)
        return final + (1 - final) * 0.5 * (1 + math.cos(math.pi * t))
    decay_start = max(warmup, total - round(decay_frac * total))
    if step < decay_start:
        return 1.0
    t = (step - decay_start) / max(1, total - decay_start)
    return final + (1 - final) * (1 - math.sqrt(t))


def make_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    total: int,
    warmup: int = 0,
    kind: str = "wsd",
    decay_frac: float = 0.2,
    final: float = 0.0,
) -> torch.optim.lr_scheduler.LambdaLR:
    """``LambdaLR(optimizer, lr_factor(., total=..., ...))``; arguments as in :func:`lr_factor` (checked
    here)."""
    lr_factor(0, total=total, warmup=warmup, kind=kind, decay_frac=decay_frac, final=final)
    fn = functools.partial(
        lr_factor, total=total, warmup=warmup, kind=kind, decay_frac=decay_frac, final=final
    )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)
