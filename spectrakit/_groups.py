"""Param-group checks shared by the optimizers (:class:`spectrakit.optim.Spectra` and
:class:`spectrakit.manifold.ManifoldSGD`): unknown keys and non-finite hyperparameters."""

from __future__ import annotations

import math
import sys

_FLOAT_MAX = sys.float_info.max

# Keys a param group may hold besides the optimizer's and its base's hyperparameters: those PyTorch's LR
# schedulers add (``initial_lr``; OneCycleLR's ``max_lr``, ``min_lr``, momentum bounds), ``named_parameters``
# groups (``param_names``), a free-form ``name``, and our own per-group counters.
INTERNAL_KEYS = frozenset({"steps_taken", "skipped_steps"})
GROUP_EXTRA_KEYS = frozenset({"params", "initial_lr", "max_lr", "min_lr", "base_momentum", "max_momentum",
                              "param_names", "name"}) | INTERNAL_KEYS


def check_group_keys(group: dict, accepted: set) -> None:
    """Reject keys of a param-group dict that are neither in ``accepted`` nor among
    :data:`GROUP_EXTRA_KEYS` with ``TypeError``, as unknown keyword arguments are."""
    unknown = set(group) - set(accepted) - GROUP_EXTRA_KEYS
    if unknown:
        raise TypeError(f"unknown keys {sorted(unknown)} in a param group; accepted: "
                        f"{sorted((set(accepted) | {'params'}) - INTERNAL_KEYS)}")


def check_finite_hyperparameters(group: dict, allow_inf=("c", "pre_c")) -> None:
    """Reject non-finite numbers (entries of tuples too) among a group's hyperparameters with ``ValueError``
    naming the argument; the keys in ``allow_inf`` may be ``+inf`` (a clip that is off).

    A number ``v`` is finite when ``|v| <= max float`` (false for NaN and +-inf): a comparison, not
    ``math.isfinite``, so that a value ``torch.compile`` traces as a symbolic float (an ``lr`` that a
    scheduler sets to a new Python float every step) becomes a guard of the compiled step, where
    ``math.isfinite`` would break the graph."""
    for key, value in group.items():
        if key == "params":
            continue
        for v in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(v, float) and not abs(v) <= _FLOAT_MAX and not (key in allow_inf and v == math.inf):
                raise ValueError(f"{key} must be a finite number, got {value}")
