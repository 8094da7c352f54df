"""Workers for the FSDP2 kill test (loaded by path in spawned processes): a saver that writes sharded
checkpoints in a loop until it is killed, and a loader that resumes from the newest complete one."""

from __future__ import annotations

import sys

import torch


def _model():
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    for m in model:
        fully_shard(m)
    fully_shard(model)
    return model


def _fill(model, value: float) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)


def saver(rank: int, ws: int, root: str) -> None:
    from spectrakit.optim import SpectraAdamW
    from spectrakit.train.checkpoint import save_sharded_checkpoint

    model = _model()
    opt = SpectraAdamW(model.parameters(), lr=1e-3)
    for step in range(1, 100000):
        _fill(model, float(step))
        save_sharded_checkpoint(root, model=model, optimizer=opt, step=step, data_state={"position": step})
        if step == 1 and rank == 0:
            print("ready", flush=True)
            sys.stdout.flush()


def loader(rank: int, ws: int, root: str) -> dict:
    from spectrakit.optim import SpectraAdamW
    from spectrakit.train.checkpoint import load_sharded_checkpoint

    model = _model()
    _fill(model, -1.0)
    opt = SpectraAdamW(model.parameters(), lr=1e-3)
    state = load_sharded_checkpoint(root, model=model, optimizer=opt)
    full = [p.full_tensor().detach() for p in model.parameters()]
    values = {float(t.min()) for t in full} | {float(t.max()) for t in full}
    torch.distributed.barrier()  # no rank leaves while the other is still inside a collective
    return {"step": state["step"], "data": state["data"], "values": sorted(values)}
