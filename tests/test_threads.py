"""The command line's thread policy: free cores measured from /proc/stat (load average as fallback),
overrides by flag or environment."""

import os
import subprocess
import sys
import time

import pytest
import torch

from spectrakit import _threads


def test_free_cores_from_busy_cores(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(_threads, "usable_cores", lambda: 2)
    for busy, want in ((0.0, 2), (0.4, 2), (0.6, 1), (2.0, 1), (9.0, 1)):
        monkeypatch.setattr(_threads, "busy_cores", lambda b=busy: b)
        assert _threads.choose_threads()[0] == want, busy
    monkeypatch.setattr(_threads, "usable_cores", lambda: 16)
    monkeypatch.setattr(_threads, "busy_cores", lambda: 3.6)
    assert _threads.choose_threads() == (12, "16 cores, 3.6 busy with other work")


def test_load_average_fallback(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(_threads, "usable_cores", lambda: 2)
    monkeypatch.setattr(_threads, "busy_cores", lambda: None)
    monkeypatch.setattr(os, "getloadavg", lambda: (2.3, 2.0, 1.0))
    assert _threads.choose_threads() == (1, "2 cores, load average 2.3")
    monkeypatch.setattr(os, "getloadavg", lambda: (0.1, 0.1, 0.1))
    assert _threads.choose_threads()[0] == 2


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs Linux /proc/stat")
def test_busy_cores_sees_a_busy_process():
    """A real measurement: a spinning process shows up as about one busy core, and an idle sample is
    within [0, cores]; the previous minute's work (which the load average would still count) does not."""
    quiet = _threads.busy_cores(0.3)
    assert quiet is not None and 0.0 <= quiet <= _threads.usable_cores() + 1e-9
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        assert _threads.busy_cores(0.5) >= 0.6
    finally:
        spin.kill()
        spin.wait()


def test_overrides(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert _threads.choose_threads() == (3, "OMP_NUM_THREADS")
    assert _threads.choose_threads(5) == (5, "--threads")


def test_cli_flag_sets_threads_and_header(capsys, tmp_path):
    from spectrakit.cli import main

    n = torch.get_num_threads()
    try:
        assert main(["ops", "--shapes", "8x8", "--dtypes", "fp32", "--reps", "1", "--threads", "1"]) == 0
        assert torch.get_num_threads() == 1
        assert "1 thread: --threads)" in capsys.readouterr().out
    finally:
        torch.set_num_threads(n)


def test_public_set_threads(monkeypatch):
    import spectrakit

    before = torch.get_num_threads()
    try:
        assert spectrakit.set_threads(1) == 1 == torch.get_num_threads()
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        monkeypatch.setattr(_threads, "usable_cores", lambda: 4)
        monkeypatch.setattr(_threads, "busy_cores", lambda: 1.2)
        assert spectrakit.set_threads("auto") == 3 == torch.get_num_threads()
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        assert spectrakit.set_threads() == 2 == torch.get_num_threads()
        for bad, exc in ((0, ValueError), ("many", ValueError), (True, TypeError), (2.0, TypeError)):
            with pytest.raises(exc, match="threads"):
                spectrakit.set_threads(bad)
    finally:
        torch.set_num_threads(before)


# Importing spectrakit leaves torch's thread count alone: checked in the fresh interpreter of
# tests/test_packaging.py, which imports torch and spectrakit (from the installed wheel) anyway.
