"""Distributed-checkpoint helpers in a single process (the 2-process FSDP2 resume is in test_optimizer.py)."""

from __future__ import annotations

import pytest
import torch

import spectrakit.optim as O
from spectrakit.distributed import load_checkpoint, save_checkpoint, sharded


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.parametrize("name", ["SpectraAdamW", "Muon"])
def test_single_process_resume_bit_identical(tmp_path, workers, name):
    cls = sharded(getattr(O, name))
    model = workers.make_model()
    opt = cls(model.parameters(), **workers.OPT_KW[name])
    workers.train_steps(model, opt, 0, 3)
    save_checkpoint(tmp_path / "ck", model, opt, extra={"step": torch.tensor(3)})
    workers.train_steps(model, opt, 3, 6)
    model2 = workers.make_model(seed=5)
    opt2 = cls(model2.parameters(), **workers.OPT_KW[name])
    extra = load_checkpoint(tmp_path / "ck", model2, opt2, extra={"step": torch.tensor(0)})
    assert int(extra["step"]) == 3
    workers.train_steps(model2, opt2, 3, 6)
    for (n, p), q in zip(model.named_parameters(), model2.parameters()):
        assert torch.equal(p, q), n


def test_errors(tmp_path):
    model = torch.nn.Linear(2, 2)
    opt = O.AdamW(model.parameters())
    with pytest.raises(FileNotFoundError, match="is not a checkpoint directory"):
        load_checkpoint(tmp_path / "missing", model, opt)
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        save_checkpoint(tmp_path / "x", "model", opt)
    with pytest.raises(TypeError, match="optimizer must be a torch.optim.Optimizer"):
        save_checkpoint(tmp_path / "x", model, "opt")
    with pytest.raises(TypeError, match="path must be a str or os.PathLike"):
        save_checkpoint(3, model, opt)
