"""Argument validation shared by every module.

All checks raise ``ValueError``/``TypeError`` whose message names the argument and the accepted range.
Checks on tensor *values* (finiteness) synchronise the host with the device, so they are only used at
API boundaries and can be switched off for hot paths with :func:`set_value_checks`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch

_VALUE_CHECKS = True

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def value_checks_enabled() -> bool:
    """Whether public functions verify tensor values (finiteness); this costs one host sync per call."""
    return _VALUE_CHECKS


def set_value_checks(enabled: bool) -> None:
    """Globally enable/disable checks on tensor values (e.g. off inside ``torch.compile``d training)."""
    global _VALUE_CHECKS
    _VALUE_CHECKS = bool(enabled)


@contextlib.contextmanager
def no_value_checks() -> Iterator[None]:
    """Context manager: skip value checks (finiteness) inside; shape/dtype/argument checks stay on."""
    global _VALUE_CHECKS
    old, _VALUE_CHECKS = _VALUE_CHECKS, False
    try:
        yield
    finally:
        _VALUE_CHECKS = old


def check_tensor(x, name: str, *, min_ndim: int = 0, square: bool = False, finite: bool = True) -> torch.Tensor:
    """Validate a floating-point tensor argument; returns it unchanged."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be a real floating tensor (float16/bfloat16/float32/float64), got {x.dtype}")
    if x.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dims (shape (..., m, n)), got shape {tuple(x.shape)}")
    if square and x.shape[-1] != x.shape[-2]:
        raise ValueError(f"{name} must be square in its last two dims, got shape {tuple(x.shape)}")
    if finite and _VALUE_CHECKS and x.numel() and not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains non-finite values (inf or nan)")
    return x


def check_scalar(value, name: str, *, low=None, high=None, low_inclusive=True, high_inclusive=True,
                 allow_tensor: bool = True):
    """Validate a threshold that is a real number or a tensor of them, within [low, high]."""
    if isinstance(value, torch.Tensor):
        if not allow_tensor:
            raise TypeError(f"{name} must be a Python number, got a tensor")
        if value.is_complex() or not (value.is_floating_point() or value.dtype in (torch.int32, torch.int64)):
            raise TypeError(f"{name} must be a real tensor, got {value.dtype}")
        if not _VALUE_CHECKS:
            return value
        vals = value.detach()
        if vals.numel() == 0:
            return value
        lo_v, hi_v = float(vals.min()), float(vals.max())
        if math.isnan(lo_v) or math.isnan(hi_v):
            raise ValueError(f"{name} contains nan")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        lo_v = hi_v = float(value)
        if lo_v != lo_v:  # NaN; a comparison, which torch.compile traces for a symbolic float (math.isnan breaks)
            raise ValueError(f"{name} must be a number, got nan")
    else:
        raise TypeError(f"{name} must be a real number or tensor, got {type(value).__name__}")
    if low is not None and (lo_v < low or (not low_inclusive and lo_v == low)):
        raise ValueError(f"{name} must be in {_range(low, high, low_inclusive, high_inclusive)}, "
                         f"got {lo_v if lo_v == hi_v else value}")
    if high is not None and (hi_v > high or (not high_inclusive and hi_v == high)):
        raise ValueError(f"{name} must be in {_range(low, high, low_inclusive, high_inclusive)}, "
                         f"got {hi_v if lo_v == hi_v else value}")
    return value


def _range(low, high, low_inclusive: bool, high_inclusive: bool) -> str:
    """The accepted interval of :func:`check_scalar` as its messages write it, e.g. ``[0.0, inf)``."""
    return (("[" if low_inclusive else "(") + (str(low) if low is not None else "-inf") + ", "
            + (str(high) if high is not None else "inf") + ("]" if high_inclusive else ")"))


def check_choice(value, name: str, choices) -> str:
    """Validate a string option against the accepted names."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")
    return value


def check_int(value, name: str, *, low: int | None = None, high: int | None = None) -> int:
    """Validate an integer argument in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{name} must be an int in [{low}, {high if high is not None else 'inf'}], got {value}")
    return value
