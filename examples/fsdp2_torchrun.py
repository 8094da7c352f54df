"""SPECTRA with FSDP2 under torchrun: ``fully_shard`` the model, then a plain SPECTRA preset on the sharded
(DTensor) parameters; checkpoints with ``torch.distributed.checkpoint`` (DCP), through
``spectrakit.distributed.save_checkpoint``/``load_checkpoint``, which read a checkpoint folder without running
code from it (DCP itself unpickles its ``.metadata`` file freely).

    torchrun --standalone --nproc_per_node=2 examples/fsdp2_torchrun.py --steps 200 --ckpt /tmp/ckpt
    torchrun --standalone --nproc_per_node=4 examples/fsdp2_torchrun.py --steps 400 --ckpt /tmp/ckpt --resume

The preset notices the DTensor parameters and becomes ``spectrakit.distributed.sharded(SpectraAdamW)``: each
matrix's spectral clip is computed once in the job on the gathered matrix, so the result equals single-process
SPECTRA. The DCP checkpoint is sharded and can be resumed on another number of processes.

``--compile`` compiles each transformer block's forward and backward with ``torch.compile`` (in place,
before ``fully_shard``, so parameter names and checkpoints are those of the eager model; ``--compile-backend
aot_eager`` compiles in seconds on a CPU). The sharded optimizer step stays eager: it is not traced
(``torch.compile(opt.step)`` would run it eagerly, as torch does with its fused optimizers), and its matrix
transforms are batched kernels either way.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

import spectrakit
from spectrakit.data.batches import TokenBatches
from spectrakit.data.tokens import prepare
from spectrakit.distributed import load_checkpoint, save_checkpoint
from spectrakit.models.llama import Llama, LlamaConfig
from spectrakit.optim import SpectraAdamW, param_groups
from spectrakit.train.schedules import make_scheduler

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", "--max-steps", dest="max_steps", type=int, default=200,
                    help="training steps (--max-steps: the earlier spelling)")
parser.add_argument("--lr", type=float, default=3e-3)
parser.add_argument("--c", type=float, default=10.0, help="SPECTRA clip threshold")
parser.add_argument("--warmup", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=8, help="per process")
parser.add_argument("--seq-len", type=int, default=64)
parser.add_argument("--corpus", default="stdlib", help="an offline corpus name of spectrakit.data")
parser.add_argument("--data-files", nargs="*", help="text files to train on instead of --corpus")
parser.add_argument("--ckpt", default=None, help="DCP checkpoint folder, written at the end")
parser.add_argument("--resume", action="store_true", help="load --ckpt first and continue from its step")
parser.add_argument("--stop-after", type=int, default=None,
                    help="stop and checkpoint after this many steps (a preempted job); the schedule spans --steps")
parser.add_argument("--compile", action="store_true", help="torch.compile each transformer block")
parser.add_argument("--compile-backend", default="inductor",
                    help="torch.compile backend with --compile (default inductor; aot_eager compiles fastest)")
args = parser.parse_args()
# torch's CPU threads as the `spectrakit` commands choose them: OMP_NUM_THREADS when set (torchrun sets 1 per
# rank), else the cores not busy with other work (one thread per busy core made a loaded machine 10x slower)
spectrakit.set_threads()

dist.init_process_group("gloo")  # "nccl" with one GPU per process (and the model/batches on that GPU)
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)  # the same initial weights on every rank before sharding
data = prepare(args.corpus, "bytes", files=args.data_files) if rank == 0 else None
dist.barrier()  # rank 0 tokenises (and caches) the corpus once
data = data or prepare(args.corpus, "bytes", files=args.data_files)
model = Llama(LlamaConfig(vocab_size=data.tokenizer.vocab_size, dim=64, n_layers=2, n_heads=4,
                          max_seq_len=args.seq_len))
for block in model.blocks:
    if args.compile:
        block.compile(backend=args.compile_backend)  # in place: parameter names (and checkpoints) unchanged
    fully_shard(block)
fully_shard(model)  # parameters are now Shard(0) DTensors

warmup = min(args.warmup, args.max_steps)
opt = SpectraAdamW(param_groups(model, weight_decay=0.1), lr=args.lr, c=args.c, betas=(0.8, 0.999),
                   warmup_steps=warmup)
sched = make_scheduler(opt, total=args.max_steps, warmup=warmup, kind="wsd")
batches = TokenBatches(data.train, args.batch_size, args.seq_len, seed=0, rank=rank, world_size=world)

start = 0
if args.resume:
    extra = load_checkpoint(args.ckpt, model, opt, extra={"sched": sched.state_dict(), "step": torch.tensor(0)})
    sched.load_state_dict(extra["sched"])
    start = int(extra["step"])
    batches.position = start  # continue the data order
    if rank == 0:
        print(f"resumed from step {start}")

end = args.max_steps if args.stop_after is None else min(args.stop_after, args.max_steps)
for step in range(start, end):
    x, y = batches.next()
    _, loss = model(x, y)
    loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    dist.all_reduce(loss := loss.detach(), op=dist.ReduceOp.AVG)
    if rank == 0:
        print(f"step {step} loss {loss.item():.4f} ({type(opt).__name__} on {world} processes)")

if args.ckpt:
    save_checkpoint(args.ckpt, model, opt, extra={"sched": sched.state_dict(), "step": torch.tensor(end)})
    if rank == 0:
        print(f"saved {os.path.abspath(args.ckpt)}")
dist.barrier()  # no rank tears down gloo while another is still in a collective
dist.destroy_process_group()
