"""The command line's thread policy: free cores from the load average, overrides by flag or environment."""

import os

import torch

from spectrakit import _threads


def test_free_cores_from_load(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(_threads, "usable_cores", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.1, 0.1, 0.1))
    assert _threads.choose_threads()[0] == 2
    monkeypatch.setattr(os, "getloadavg", lambda: (2.3, 2.0, 1.0))
    assert _threads.choose_threads()[0] == 1
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    assert _threads.choose_threads()[0] == 1
    monkeypatch.setattr(_threads, "usable_cores", lambda: 16)
    monkeypatch.setattr(os, "getloadavg", lambda: (3.6, 2.0, 1.0))
    assert _threads.choose_threads()[0] == 12


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
