"""Does this device multiply bfloat16 matrices faster than float32 ones?

bf16 pays only on hardware with bf16 matrix units: NVIDIA GPUs from compute capability 8.0 (Ampere: bf16
tensor cores) and CPUs with Intel AMX (``amx_bf16``). Elsewhere PyTorch emulates bf16 products, e.g. on an
AVX2-only AMD EPYC (``torch.backends.cpu.get_cpu_capability() == "AVX2"``) a bf16 matmul at 1 thread was
measured 40x (n = 192) to 80x (n = 1024) slower than the float32 one (docs/BENCHMARKS.md), so asking for
a bf16 compute dtype there only slows the step down.

:func:`bf16_matmul_fast` answers per device, in this order:

1. an override set by :func:`set_bf16_matmul_fast` (or the context manager :func:`bf16_matmul_override`);
2. the environment variable ``SPECTRAKIT_BF16_MATMUL``: ``1``/``true``/``on`` (bf16 is fast: use it where
   asked), ``0``/``false``/``off`` (never), ``auto`` or unset (detect);
3. detection: CUDA: ``torch.cuda.get_device_capability(device) >= (8, 0)``; CPU: the ``amx_bf16`` flag in
   ``/proc/cpuinfo`` (Linux; other systems: not detected, use the override); other devices: True (no
   fallback where nothing is known)."""

# The answer is computed on the host (no tensor values are read): safe in hot paths. Under
# ``torch.compile`` it is a constant of the compiled graph (taken when the graph is compiled; an override
# set later applies after ``torch._dynamo.reset()``), so it adds no graph break.

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator

import torch

ENV_VAR = "SPECTRAKIT_BF16_MATMUL"
_ON = ("1", "true", "on", "yes")
_OFF = ("0", "false", "off", "no")
_override: bool | None = None


@functools.lru_cache(maxsize=1)
def cpu_has_amx_bf16() -> bool:
    """True if ``/proc/cpuinfo`` lists the ``amx_bf16`` flag (Intel AMX bf16 tiles); False when it does not
    or cannot be read (non-Linux systems)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return "amx_bf16" in line.split()
    except OSError:
        return False
    return False


@functools.lru_cache(maxsize=16)
def _cuda_bf16(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (8, 0)


def _env() -> bool | None:
    raw = os.environ.get(ENV_VAR, "").strip().lower()
    if raw in ("", "auto"):
        return None
    if raw in _ON:
        return True
    if raw in _OFF:
        return False
    raise ValueError(f"{ENV_VAR} must be one of 1, 0, true, false, on, off, auto; got {raw!r}")


def _constant_under_compile(fn):
    """``torch.compiler.assume_constant_result(fn)`` without importing ``torch._dynamo`` (about 1 s, paid by
    every command-line start): that decorator only marks ``fn``, and dynamo reads the mark when it traces
    (tests/linalg/test_precision.py checks that the mark is the one torch's decorator sets)."""
    fn._dynamo_marked_constant = True
    return fn


@_constant_under_compile
def bf16_matmul_fast(device: torch.device | str | None = None) -> bool:
    """Whether bfloat16 matrix products are hardware-accelerated on ``device`` (default: CPU), i.e. whether a
    bf16 compute dtype can make a matrix function faster than float32 there (see the module docstring for
    the override, the environment variable and the detection rules).

    Raises:
        ValueError: ``SPECTRAKIT_BF16_MATMUL`` set to an unknown value.
    """
    if _override is not None:
        return _override
    env = _env()
    if env is not None:
        return env
    dev = torch.device("cpu" if device is None else device)
    if dev.type == "cpu":
        return cpu_has_amx_bf16()
    if dev.type == "cuda":
        return _cuda_bf16(torch.cuda.current_device() if dev.index is None else dev.index)
    return True


def set_bf16_matmul_fast(value: bool | None) -> None:
    """Override :func:`bf16_matmul_fast` for every device: True/False, or None to go back to the
    environment variable and detection.

    Raises:
        TypeError: ``value`` not a bool or None.
    """
    global _override
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"value must be True, False or None, got {value!r}")
    _override = value


@contextlib.contextmanager
def bf16_matmul_override(value: bool | None) -> Iterator[None]:
    """Context manager form of :func:`set_bf16_matmul_fast` (the previous override is restored on exit)."""
    old = _override
    set_bf16_matmul_fast(value)
    try:
        yield
    finally:
        set_bf16_matmul_fast(old)
