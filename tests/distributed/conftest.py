"""Fixtures of the distributed tests: the worker module, and one multi-process launch per suite shared by
all tests that read its results (process start-up costs ~5 s, so each suite spawns once)."""

from __future__ import annotations

import os

import pytest

from spectrakit.distributed.launch import run_workers

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "workers.py")


@pytest.fixture(scope="session")
def workers(load_module):
    return load_module("_spectrakit_test_workers", WORKERS)


@pytest.fixture(scope="session", params=[2, 3], ids=["ws2", "ws3"])
def exchange_results(request):
    return request.param, run_workers(f"{WORKERS}:exchange_suite", request.param, timeout=120)
