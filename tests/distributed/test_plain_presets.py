"""Plain presets (``SpectraAdamW(model.parameters())``, no ``sharded(...)``) on FSDP2 parameters, 2 gloo
ranks: they take the sharded path themselves, equal to the single process and bit-identical to
``sharded(cls)``; a base that needs whole tensors raises a ValueError naming the layout and the fix."""

from __future__ import annotations

import os

import pytest
import torch

import spectrakit.optim as O
from spectrakit.distributed.launch import run_workers

WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers.py")

pytestmark = pytest.mark.distributed

NAMES = ["SpectraAdamW", "SpectraSignum", "Muon"]


@pytest.fixture(scope="module")
def results():
    return run_workers(f"{WORKERS}:plain_fsdp_suite", 2, timeout=150)


@pytest.mark.parametrize("name", NAMES)
def test_plain_preset_under_fsdp2_matches_single_process(workers, results, name):
    model = workers.make_model()
    opt = getattr(O, name)(model.parameters(), **workers.OPT_KW[name])
    workers.train_steps(model, opt, 0, 20)
    ref = {n: p.detach() for n, p in model.named_parameters()}
    for r in range(2):
        got = results[r][(name, "plain")]
        assert results[r][(name, "plain", "class")] == (True, True)
        for n in ref:
            torch.testing.assert_close(got[n], ref[n], rtol=0, atol=1e-5, msg=f"{name} rank {r} {n}")
            assert torch.equal(got[n], results[r][(name, "sharded")][n])  # same numbers as sharded(cls)
            assert torch.equal(got[n], results[0][(name, "plain")][n])  # ranks agree


def test_whole_tensor_base_names_layout_and_fix(results):
    msg = results[0]["mars"]
    assert msg.startswith("ValueError") and "Shard(0)" in msg and "DDP" in msg and "mars" in msg
