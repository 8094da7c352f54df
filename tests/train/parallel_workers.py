"""Workers for ``test_parallel.py``: the training entry (``wrap_model`` -> ``build_optimizer`` ->
``train``) on N gloo processes, and the same entry in one process on the same global batches."""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import pattern_tokens  # noqa: E402

from spectrakit.data.batches import TokenBatches  # noqa: E402
from spectrakit.models.llama import Llama, LlamaConfig  # noqa: E402
from spectrakit.train.checkpoint import unwrap  # noqa: E402
from spectrakit.train.distributed import DistInfo, setup, wrap_model  # noqa: E402
from spectrakit.train.loop import TrainConfig, train  # noqa: E402
from spectrakit.train.optimizers import build_optimizer  # noqa: E402
from spectrakit.train.schedules import make_scheduler  # noqa: E402

STEPS, BATCH, SEQ, WS = 4, 4, 12, 2
# 15 rows in the width-15 matrices: uneven Shard(0) chunks (8 + 7) on 2 ranks
MODEL = dict(vocab_size=15, dim=16, n_layers=2, n_heads=2, mlp_hidden=24, max_seq_len=16)
# label -> (preset, options). The Muon preset runs Newton-Schulz in bfloat16: FSDP2's reduce-scatter sums
# the gradient in another order, and a last-bit fp32 difference can flip a bf16 rounding, so the preset
# matches the single process to bf16 precision; with an fp32 Newton-Schulz it matches to fp32 precision.
OPTIMIZERS = {"spectra-adamw": ("spectra-adamw", dict(c=0.5)), "muon": ("muon", {}),
              "muon-fp32": ("muon", dict(post_dtype="float32"))}
LR = 1e-2


def tokens():
    return pattern_tokens(20000, vocab=15), pattern_tokens(4000, vocab=15, seed=1)


class Interleaved:
    """One process's view of the global batch of ``WS`` ranks: micro-batch ``2 i + r`` is rank ``r``'s
    batch ``i`` (with ``grad_accum = WS`` the mean gradient equals the data-parallel one)."""

    def __init__(self, train_tokens):
        self.streams = [TokenBatches(train_tokens, BATCH, SEQ, seed=0, rank=r, world_size=WS)
                        for r in range(WS)]
        self.batch_size, self.seq_len, self.position = BATCH, SEQ, 0

    def next(self):
        out = self.streams[self.position % WS].batch(self.position // WS)
        self.position += 1
        return out

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = int(state["position"])


def full(model) -> dict:
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in unwrap(model).named_parameters()}


def _run(info, mode, label, data, *, steps=STEPS, seed=0, ckpt_dir=None, resume=None, grad_accum=1):
    torch.manual_seed(seed)
    model = wrap_model(Llama(LlamaConfig(**MODEL)), info, mode)
    name, options = OPTIMIZERS[label]
    opt = build_optimizer(name, model, lr=LR, warmup_steps=1, world_size=info.world_size, **options)
    sched = make_scheduler(opt, total=STEPS, warmup=1, kind="wsd")
    cfg = TrainConfig(steps=steps, grad_accum=grad_accum, grad_clip=0.5, log_every=1, eval_every=100,
                      eval_tokens=96, progress=False, ckpt_dir=ckpt_dir, resume=resume)
    res = train(model, opt, sched, data, tokens()[1], cfg, dist_info=info)
    return {"losses": [r["loss"] for r in res.logs], "val": res.final_val_loss, "params": full(model),
            "optimizer": type(opt).__name__, "steps_taken": opt.param_groups[0]["steps_taken"]}


def distributed(rank: int, ws: int, ckpt_root: str) -> dict:
    info = setup("cpu")
    assert info.world_size == ws and info.rank == rank
    out = {}
    train_tokens = tokens()[0]

    def data():
        return TokenBatches(train_tokens, BATCH, SEQ, seed=0, rank=rank, world_size=ws)

    for mode in ("ddp", "fsdp2"):
        for name in OPTIMIZERS:
            out[(mode, name)] = _run(info, mode, name, data())
    # FSDP2 checkpoint: every rank writes its shards (ckpt_dir given on rank 0 only: it is broadcast)
    ckpt = os.path.join(ckpt_root, "fsdp2")
    _run(info, "fsdp2", "spectra-adamw", data(), steps=2, ckpt_dir=ckpt if rank == 0 else None)
    step_dir = os.path.join(ckpt, "checkpoints", "step_00000002")
    out["ckpt_files"] = sorted(os.listdir(step_dir)) if os.path.isdir(step_dir) else []
    out["resumed"] = _run(info, "fsdp2", "spectra-adamw", data(), seed=1,
                          resume=os.path.join(ckpt, "checkpoints"))
    return out


def single() -> dict:
    info = DistInfo()
    return {name: _run(info, "none", name, Interleaved(tokens()[0]), grad_accum=WS) for name in OPTIMIZERS}
