"""bf16_matmul_fast: override > environment variable > hardware detection."""

from __future__ import annotations

import pytest
import torch

from spectrakit.linalg import bf16_matmul_fast, bf16_matmul_override, set_bf16_matmul_fast
from spectrakit.linalg.precision import ENV_VAR, cpu_has_amx_bf16


def _flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def test_cpu_detection_reads_the_amx_flag(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert cpu_has_amx_bf16() == ("amx_bf16" in _flags())
    assert bf16_matmul_fast("cpu") == ("amx_bf16" in _flags())
    assert bf16_matmul_fast() == bf16_matmul_fast(torch.device("cpu"))


@pytest.mark.parametrize("raw,want", [("1", True), ("on", True), ("TRUE", True), ("0", False), ("off", False),
                                      (" no ", False)])
def test_environment_variable_forces(monkeypatch, raw, want):
    monkeypatch.setenv(ENV_VAR, raw)
    assert bf16_matmul_fast("cpu") is want


def test_environment_auto_detects(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "auto")
    assert bf16_matmul_fast("cpu") == ("amx_bf16" in _flags())


def test_unknown_environment_value_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "maybe")
    with pytest.raises(ValueError, match=ENV_VAR):
        bf16_matmul_fast("cpu")


def test_override_beats_environment_and_is_restored(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "0")
    with bf16_matmul_override(True):
        assert bf16_matmul_fast("cpu") is True
        with bf16_matmul_override(False):
            assert bf16_matmul_fast("cpu") is False
        assert bf16_matmul_fast("cpu") is True
    assert bf16_matmul_fast("cpu") is False
    set_bf16_matmul_fast(True)
    try:
        assert bf16_matmul_fast("cpu") is True
    finally:
        set_bf16_matmul_fast(None)
    assert bf16_matmul_fast("cpu") is False


@pytest.mark.parametrize("bad", [1, "yes", 0.0])
def test_override_rejects_non_bool(bad):
    with pytest.raises(TypeError, match="value"):
        set_bf16_matmul_fast(bad)


def test_constant_mark_is_the_one_torch_sets():
    """``bf16_matmul_fast`` carries the mark of ``torch.compiler.assume_constant_result`` (set without importing
    torch._dynamo at import time): if torch's decorator ever marks differently, this fails."""
    from spectrakit.linalg.precision import bf16_matmul_fast

    def probe():
        return True

    marked = torch.compiler.assume_constant_result(probe)
    ours = {k: v for k, v in vars(bf16_matmul_fast).items() if k.startswith("_dynamo")}
    theirs = {k: v for k, v in vars(marked).items() if k.startswith("_dynamo")}
    assert ours == theirs == {"_dynamo_marked_constant": True}
