"""Fixtures of the distributed tests: the worker module, and one multi-process launch per suite shared by
all tests that read its results (process start-up costs ~5 s, so each suite spawns once)."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

from spectrakit.distributed.launch import run_workers

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "workers.py")


def _load_workers():
    name = "_spectrakit_test_workers"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, WORKERS)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="session")
def workers():
    return _load_workers()


@pytest.fixture(scope="session", params=[2, 3], ids=["ws2", "ws3"])
def exchange_results(request):
    return request.param, run_workers(f"{WORKERS}:exchange_suite", request.param, timeout=120)


@pytest.fixture(scope="session")
def optim_results(tmp_path_factory):
    return run_workers(f"{WORKERS}:optim_suite", 2, args=(str(tmp_path_factory.mktemp("dcp")),), timeout=150)
