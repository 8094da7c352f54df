"""Clip-threshold schedules ``c_k`` for SPECTRA (Jiang, Semenov and Stich 2026 §5.2 item 3 and §F.3, eq. "standard").

A schedule is a plain dict stored in the param group (so ``state_dict`` saves it and ``torch.save`` with
``weights_only=True`` loads it) and evaluated by the pure function :func:`clip_threshold` from the
step index and the group's learning rates. Nothing here touches tensors: ``c_k`` is a Python float
computed from Python numbers, so evaluating it never synchronises the host with the device.
"""

from __future__ import annotations

import math

from spectrakit._checks import check_choice, check_int, check_scalar

WARMUPS = ("inverse_lr", "none")
DECAYS = (None, "linear", "cosine", "sqrt")

_DEFAULT = {
    "warmup": "inverse_lr",
    "decay": None,
    "decay_start": 0.8,
    "total_steps": None,
    "final_scale": 0.01,
}


def _decay_shape(kind: str, t: float) -> float:
    """Shape ``s(t)`` of the decay from 1 (t = 0) to 0 (t = 1)."""
    if kind == "linear":
        return 1.0 - t
    if kind == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * t))
    return 1.0 - math.sqrt(t)  # "sqrt", as the WSD square-root cool-down


def make_schedule(spec=None, name: str = "c_schedule") -> dict:
    """Normalise a clip-schedule specification to the dict stored in a param group.

    ``spec`` is ``None`` or ``"standard"`` (c_k = c·lr_peak/lr_k during warm-up, then c), ``"constant"``
    (c_k = c), or a dict with any of the keys
    ``warmup`` ("inverse_lr" | "none"), ``decay`` (None | "linear" | "cosine" | "sqrt"),
    ``decay_start`` (fraction of ``total_steps`` in [0, 1) where the decay starts, default 0.8),
    ``total_steps`` (int >= 1, required when ``decay`` is set) and ``final_scale`` (c_K / c, > 0,
    default 0.01).

    Raises ValueError/TypeError naming ``name`` and the offending key.
    """
    if spec is None or spec == "standard":
        return dict(_DEFAULT)
    if spec == "constant":
        return {**_DEFAULT, "warmup": "none"}
    if not isinstance(spec, dict):
        raise TypeError(f"{name} must be 'standard', 'constant' or a dict, got {spec!r}")
    unknown = set(spec) - set(_DEFAULT)
    if unknown:
        raise ValueError(f"{name} has unknown keys {sorted(unknown)}; accepted: {sorted(_DEFAULT)}")
    out = {**_DEFAULT, **spec}
    check_choice(out["warmup"], f"{name}['warmup']", WARMUPS)
    if out["decay"] not in DECAYS:
        raise ValueError(f"{name}['decay'] must be one of {DECAYS}, got {out['decay']!r}")
    check_scalar(
        out["decay_start"],
        f"{name}['decay_start']",
        low=0.0,
        high=1.0,
        high_inclusive=False,
        allow_tensor=False,
    )
    check_scalar(
        out["final_scale"], f"{name}['final_scale']", low=0.0, low_inclusive=False, allow_tensor=False
    )
    if out["decay"] is not None:
        if out["total_steps"] is None:
            raise ValueError(f"{name}['total_steps'] must be an int >= 1 when {name}['decay'] is set")
        check_int(out["total_steps"], f"{name}['total_steps']", low=1)
    return out


def clip_threshold(c: float, k: int, lr: float, peak_lr: float, warmup_steps: int, schedule: dict) -> float:
    """Clip threshold ``c_k`` for step index ``k`` (0-based count of previous ``step()`` calls).

    Formula (Jiang, Semenov and Stich 2026 §F.3, "standard", plus the optional final decay):

    - warm-up (``k < warmup_steps`` and ``schedule['warmup'] == 'inverse_lr'``):
      ``c_k = c * lr_peak / lr_k``, which keeps ``c_k * lr_k`` (the spectral-norm bound of the update)
      constant while the LR ramps up. ``lr_k`` is the group's *current* ``lr`` (whatever LR scheduler set
      it) and ``lr_peak`` the group's ``peak_lr`` (recorded at construction). If ``lr_k <= 0`` the update
      is zero anyway and ``c_k = c``.
    - decay (``schedule['decay']`` set): with ``T = total_steps``, ``k0 = decay_start * T``,
      ``t = clip((k - k0) / (T - k0), 0, 1)``: ``c_k = c * (f + (1 - f) s(t))``, ``f = final_scale``,
      ``s`` = 1 - t (linear), (1 + cos(pi t))/2 (cosine) or 1 - sqrt(t) (sqrt).
    - otherwise ``c_k = c``.
    """
    ck = float(c)
    if ck == math.inf:  # no clipping at any step
        return ck
    if schedule["warmup"] == "inverse_lr" and k < warmup_steps and lr > 0:
        ck *= peak_lr / lr
    if schedule["decay"] is not None:
        total = schedule["total_steps"]
        k0 = schedule["decay_start"] * total
        t = min(max((k - k0) / max(total - k0, 1e-12), 0.0), 1.0)
        f = schedule["final_scale"]
        ck *= f + (1.0 - f) * _decay_shape(schedule["decay"], t)
    return ck
