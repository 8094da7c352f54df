"""The training entry under data parallelism: 2 gloo processes on 127.0.0.1 train a tiny LLaMA with
``wrap_model(model, info, "ddp"|"fsdp2")`` -> ``build_optimizer(..., world_size=2)`` (the sharded
SPECTRA/Muon optimizer) -> ``train`` and must give the single-process losses, validation loss and
parameters on the same global batches; under FSDP2 the checkpoint is a DCP directory written by every
rank, and resuming from it continues bit-exactly."""

from __future__ import annotations

import os

import pytest
import torch

from spectrakit.distributed import run_workers

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "parallel_workers.py")

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def workers(load_module):
    return load_module("_spectrakit_train_parallel_workers", WORKERS)


@pytest.fixture(scope="module")
def results(tmp_path_factory, workers):
    ckpt = str(tmp_path_factory.mktemp("ckpt"))
    ranks = run_workers(f"{WORKERS}:distributed", 2, args=(ckpt,), timeout=240)
    return ranks, workers.single()


@pytest.mark.parametrize("name", ["spectra-adamw", "muon", "muon-fp32"])
@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
def test_two_ranks_match_one_process(results, workers, mode, name):
    ranks, ref = results
    want = ref[name]
    assert len(want["losses"]) == workers.STEPS and want["losses"][-1] < want["losses"][0]
    for r in range(2):
        got = ranks[r][(mode, name)]
        assert got["optimizer"] == {"spectra-adamw": "ShardedSpectraAdamW"}.get(name, "ShardedMuon")
        assert got["steps_taken"] == workers.STEPS
        torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(want["losses"]), rtol=0,
                                   atol=1e-5)
        assert abs(got["val"] - want["val"]) < 1e-5
        # bf16 Newton-Schulz (the Muon preset): a few bf16 ulps (2^-8 each) of the lr-sized update per step
        # (1.9e-4 measured at 2 threads); a sharding error moves parameters by ~lr and fails here and in fp32
        atol = workers.STEPS * workers.LR * 2.0**-6 if name == "muon" else 2e-5
        for n, p in want["params"].items():
            torch.testing.assert_close(got["params"][n], p, rtol=0, atol=atol,
                                       msg=f"{mode} {name} rank {r} {n}")
            assert torch.equal(got["params"][n], ranks[0][(mode, name)]["params"][n])  # ranks agree


def test_fsdp2_checkpoint_is_a_directory_written_by_every_rank_and_resumes_exactly(results, workers):
    ranks, _ = results
    for r in range(2):
        files = ranks[r]["ckpt_files"]
        assert {"train_state_rank0.pt", "train_state_rank1.pt", ".metadata", "manifest.json"} <= set(files), files
        assert sum(f.endswith(".distcp") for f in files) == 2  # one shard file per rank
        resumed, straight = ranks[r]["resumed"], ranks[r][("fsdp2", "spectra-adamw")]
        assert resumed["steps_taken"] == workers.STEPS
        # resumed at step 2 from a differently seeded model: steps 3-4 and the result equal the straight run
        assert resumed["losses"] == straight["losses"][2:]
        for n, p in straight["params"].items():
            assert torch.equal(resumed["params"][n], p), n


def test_load_sharded_checkpoint_without_rank_file_raises(tmp_path):
    from spectrakit.train.checkpoint import load_sharded_checkpoint

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    from spectrakit.train.checkpoint import CheckpointError, write_manifest

    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        load_sharded_checkpoint(str(tmp_path), model=model, optimizer=opt)
    step = tmp_path / "step_00000003"
    step.mkdir()
    (step / "train_state_rank1.pt").write_bytes(b"x")
    write_manifest(str(step), 3)
    with pytest.raises(CheckpointError, match="train_state_rank0.pt"):
        load_sharded_checkpoint(str(tmp_path), model=model, optimizer=opt)
