"""A torchtitan container of spectrakit optimizers on FSDP2 parameters (2 gloo ranks, ``fully_shard`` per
block and at the root as torchtitan shards a LLaMA): the spectrakit optimizers take their sharded step by
themselves, match one process, and resume from torchtitan's DCP checkpoint (CheckpointManager) exactly."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("torchtitan.components.optimizer", reason="torchtitan is not installed")

from spectrakit.distributed.launch import run_workers  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "torchtitan_workers.py")

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_workers(f"{WORKERS}:fsdp_suite", 2, args=(str(tmp_path_factory.mktemp("titan")),), timeout=150)


@pytest.fixture(scope="module")
def workers(load_module):
    return load_module("_spectrakit_torchtitan_workers", WORKERS)


@pytest.mark.parametrize("name", ["SpectraAdamW", "Muon"])
def test_fsdp2_container_matches_one_process(workers, results, name):
    model = workers.make_model()
    opt = workers.configs()[name].build(model_parts=[model])
    workers.train(model, opt, 0, workers.STEPS)
    # the spectrakit optimizer is sharded; torch's AdamW side group (Muon's) is not a spectrakit class
    assert results[0][(name, "sharded")] == ([True] if name == "SpectraAdamW" else [False, True])
    for r in range(2):
        got = results[r][(name, "params")]
        for n, p in model.named_parameters():
            torch.testing.assert_close(got[n], p.detach(), rtol=0, atol=1e-5, msg=f"{name} rank {r} {n}")
            assert torch.equal(got[n], results[0][(name, "params")][n])  # ranks agree


@pytest.mark.parametrize("name", ["SpectraAdamW", "Muon"])
def test_fsdp2_resume_from_torchtitan_checkpoint(results, name):
    for r in range(2):
        assert results[r][(name, "loaded")]
        for n, p in results[r][(name, "params")].items():
            assert torch.equal(results[r][(name, "resumed")][n], p), f"{name} rank {r} {n}"
