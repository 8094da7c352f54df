"""SPECTRA with FSDP2 x tensor parallel under torchrun: a (dp, tp) device mesh, the MLPs, the embedding and
the output head split by tensor parallelism (``parallelize_module``), then ``fully_shard`` over the
data-parallel ranks, and a plain SPECTRA preset on the resulting 2-D DTensors; checkpoints with
``torch.distributed.checkpoint`` that resume on another mesh shape.

    torchrun --standalone --nproc_per_node=4 examples/fsdp2_tp_torchrun.py --dp 2 --tp 2 --steps 200 --ckpt /tmp/ck
    torchrun --standalone --nproc_per_node=2 examples/fsdp2_tp_torchrun.py --dp 2 --tp 1 --steps 400 --ckpt /tmp/ck \\
        --resume

The preset notices the DTensor parameters and takes the sharded step: each matrix is gathered on one owner
rank across both mesh dims (one all-to-all), clipped there, and the owner's result goes back to the shards
(a second all-to-all), so the update equals single-process SPECTRA. The attention projections stay whole on
the tensor-parallel ranks (this small model's attention reshapes by the full width); the tensor-parallel ranks
of a data-parallel group read the same batches. The batches depend on the number of data-parallel ranks
(``--batch-size`` is per rank), so a run resumed with another ``--dp`` continues on other data.

``--compile`` compiles each transformer block's forward and backward with ``torch.compile`` (in place, after
tensor parallelism and before ``fully_shard``, so parameter names and checkpoints are those of the eager model;
``--compile-backend aot_eager`` compiles in seconds on a CPU); the sharded optimizer step stays eager. The
embedding's output is copied (``clone``) before it enters the first compiled block: tensor parallelism hands it
over as the pending result of its all-reduce (an ``AsyncCollectiveTensor``), and a compiled region that takes
such a tensor as its input loses the gradient of it in torch 2.13 (pytorch/pytorch#184980; on a CPU with gloo
the embedding's gradient came out zero under FSDP2, and without FSDP2 the backward raised an ``AttributeError``).
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import spectrakit
from spectrakit.data.batches import TokenBatches
from spectrakit.data.tokens import prepare
from spectrakit.distributed import load_checkpoint, save_checkpoint
from spectrakit.models.llama import Llama, LlamaConfig
from spectrakit.optim import SpectraAdamW, param_groups
from spectrakit.train.schedules import make_scheduler

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--dp", type=int, default=2, help="data-parallel (FSDP2) ranks")
parser.add_argument("--tp", type=int, default=2, help="tensor-parallel ranks; dp * tp = processes")
parser.add_argument("--steps", "--max-steps", dest="max_steps", type=int, default=200,
                    help="training steps (--max-steps: the earlier spelling)")
parser.add_argument("--lr", type=float, default=3e-3)
parser.add_argument("--c", type=float, default=10.0, help="SPECTRA clip threshold")
parser.add_argument("--warmup", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=8, help="per data-parallel rank")
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

world = int(os.environ.get("WORLD_SIZE", "1"))  # set by torchrun; checked before any rank joins the group,
if args.dp < 1 or args.tp < 1 or args.dp * args.tp != world:  # so that every rank exits 2 on its own
    parser.error(f"--dp * --tp must equal the number of processes ({world}), got {args.dp} * {args.tp}")
dist.init_process_group("gloo")  # "nccl" with one GPU per process (and the model/batches on that GPU)
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (args.dp, args.tp), mesh_dim_names=("dp", "tp"))
torch.manual_seed(0)  # the same initial weights on every rank before sharding
data = prepare(args.corpus, "bytes", files=args.data_files) if rank == 0 else None
dist.barrier()  # rank 0 tokenises (and caches) the corpus once
data = data or prepare(args.corpus, "bytes", files=args.data_files)
model = Llama(LlamaConfig(vocab_size=data.tokenizer.vocab_size, dim=64, n_layers=2, n_heads=4,
                          max_seq_len=args.seq_len))

plan = {"embed": RowwiseParallel(input_layouts=Replicate()),          # vocabulary rows split
        "head": ColwiseParallel(output_layouts=Replicate())}          # logits gathered for the loss
for i in range(len(model.blocks)):
    plan.update({f"blocks.{i}.mlp.gate_proj": ColwiseParallel(), f"blocks.{i}.mlp.up_proj": ColwiseParallel(),
                 f"blocks.{i}.mlp.down_proj": RowwiseParallel()})
parallelize_module(model, mesh["tp"], plan)
if args.compile:
    # a plain tensor into the compiled blocks, not the all-reduce's pending result (module docstring)
    model.embed.register_forward_hook(lambda module, inputs, out: out.clone())
for block in model.blocks:
    if args.compile:
        block.compile(backend=args.compile_backend)  # in place: parameter names (and checkpoints) unchanged
    fully_shard(block, mesh=mesh["dp"])
fully_shard(model, mesh=mesh["dp"])  # tensor-parallel matrices are now 2-D DTensors on (dp, tp)

warmup = min(args.warmup, args.max_steps)
opt = SpectraAdamW(param_groups(model, weight_decay=0.1), lr=args.lr, c=args.c, betas=(0.8, 0.999),
                   warmup_steps=warmup)
sched = make_scheduler(opt, total=args.max_steps, warmup=warmup, kind="wsd")
dp_rank = mesh["dp"].get_local_rank()
batches = TokenBatches(data.train, args.batch_size, args.seq_len, seed=0, rank=dp_rank, world_size=args.dp)

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
        print(f"step {step} loss {loss.item():.4f} ({type(opt).__name__} on {args.dp}x{args.tp} dp x tp)")

if args.ckpt:
    save_checkpoint(args.ckpt, model, opt, extra={"sched": sched.state_dict(), "step": torch.tensor(end)})
    if rank == 0:
        print(f"saved {os.path.abspath(args.ckpt)}")
dist.barrier()  # no rank tears down gloo while another is still in a collective
dist.destroy_process_group()
