"""Benchmark of the sharded spectral optimizers (spectrakit.distributed).

Three tables, written to docs/results/bench/distributed-<device>.md:

1. world size 1: ``opt.step()`` of the plain preset vs ``sharded(preset)`` (no process group, and with an
   initialized 1-rank group): the overhead of the distributed code path (target <= 2% on a GPU);
2. W processes (gloo on CPU, NCCL with one GPU per rank when W GPUs exist): optimizer step time with every
   rank repeating the spectral work (plain preset under DDP) vs the sharded preset under DDP and FSDP2;
3. the cost-model simulation (per-rank spectral GFLOP and exchange MB) for LLaMA 1B/7B at 8/64/512 ranks;
4. ``--meshes 1x2,2x2,4x1`` (section ``distributed-mesh-<device>``, alone with ``--mesh-only``): FSDP2 x tensor
   parallel on gloo, a LLaMA with tensor-parallel MLPs, embedding and head: ``opt.step()`` time per rank and
   the bytes each rank hands to the exchange's collectives, against ``cost_model.mesh_exchange``.

Usage: ``python benchmarks/bench_distributed.py [--device cuda] [--d 1024] [--layers 8] [--world-size 2]
[--meshes 1x2,2x2,4x1 [--mesh-only]]``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import command_line, sync, write_section  # noqa: E402
from spectrakit.experiments.io import markdown_table  # noqa: E402

PRESETS = ["AdamW", "SpectraAdamW", "SpectraSignum", "Muon"]


def block_shapes(d: int, layers: int) -> list[tuple[int, int]]:
    """LLaMA block matrices (q, k, v, o, gate, up, down) with d_ff = 8/3 d rounded to 16."""
    ff = (8 * d // 3 + 15) // 16 * 16
    return [s for _ in range(layers) for s in [(d, d)] * 4 + [(ff, d), (ff, d), (d, ff)]]


class Block(torch.nn.Module):
    """Pre-norm residual block with the (q, o, up, down) matrices of a LLaMA block."""

    def __init__(self, d: int, ff: int):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.q, self.o = torch.nn.Linear(d, d, bias=False), torch.nn.Linear(d, d, bias=False)
        self.up, self.down = torch.nn.Linear(d, ff, bias=False), torch.nn.Linear(ff, d, bias=False)

    def forward(self, x):
        h = self.norm(x)
        return x + self.o(torch.tanh(self.q(h))) + self.down(torch.nn.functional.silu(self.up(h)))


class Blocks(torch.nn.Module):
    """A stack of :class:`Block` (FSDP2 shards each block, then the root)."""

    def __init__(self, d: int, layers: int):
        super().__init__()
        ff = (8 * d // 3 + 15) // 16 * 16
        self.layers = torch.nn.ModuleList(Block(d, ff) for _ in range(layers))

    def forward(self, x):
        for blk in self.layers:
            x = blk(x)
        return x


def _params(shapes, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    ps = []
    for s in shapes:
        p = torch.nn.Parameter(torch.randn(s, generator=g).div_(s[1] ** 0.5).to(device))
        p.grad = torch.randn(s, generator=g).mul_(1e-2).to(device)
        ps.append(p)
    return ps


def _interleaved(fns: dict, device, reps: int) -> dict:
    """Min and median wall time (ms) of each callable, run alternately ``reps`` times after one warm-up
    each: alternating exposes every variant to the same machine load, the min is robust to a busy host."""
    for fn in fns.values():
        fn()
    times = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            times[k].append((time.perf_counter() - t0) * 1e3)
    return {k: (min(v), sorted(v)[len(v) // 2]) for k, v in times.items()}


def overhead_table(device, d, layers, reps) -> list[dict]:
    import spectrakit.optim as O
    from spectrakit.distributed import sharded

    rows = []
    shapes = block_shapes(d, layers)
    for name in PRESETS:
        cls = getattr(O, name)
        opts = {label: make(_params(shapes, device), lr=1e-3)
                for label, make in (("plain", cls), ("sharded", sharded(cls)))}
        t = _interleaved({k: o.step for k, o in opts.items()}, device, reps)
        rows.append({"optimizer": name, "matrices": len(shapes), "plain ms (min)": t["plain"][0],
                     "sharded W=1 ms (min)": t["sharded"][0],
                     "difference ms (min)": t["sharded"][0] - t["plain"][0],
                     "overhead % (min)": 100 * (t["sharded"][0] / t["plain"][0] - 1),
                     "overhead % (median)": 100 * (t["sharded"][1] / t["plain"][1] - 1)})
    return rows


def python_overhead_table(device, reps: int = 300) -> list[dict]:
    """The distributed code path's fixed cost per step: 28 tiny 8x8 matrices + 28 vectors, where the
    step is nothing but per-parameter bookkeeping (the absolute difference is what carries over)."""
    import spectrakit.optim as O
    from spectrakit.distributed import sharded

    rows = []
    shapes = [(8, 8)] * 28
    for name in ("AdamW", "Muon"):
        cls = getattr(O, name)
        opts = {}
        for label, make in (("plain", cls), ("sharded", sharded(cls))):
            vecs = [torch.nn.Parameter(p[0].detach().clone()) for p in _params(shapes, device, seed=1)]
            for p in vecs:
                p.grad = torch.randn_like(p)
            ps = _params(shapes, device) + vecs
            opts[label] = make(ps, lr=1e-3)
        t = _interleaved({k: o.step for k, o in opts.items()}, device, reps)
        rows.append({"optimizer": name, "params": 2 * len(shapes), "plain us (min)": 1e3 * t["plain"][0],
                     "sharded W=1 us (min)": 1e3 * t["sharded"][0],
                     "difference us": 1e3 * (t["sharded"][0] - t["plain"][0])})
    return rows


def _multi_worker(rank, ws, d, layers, reps, device_type):
    import torch.distributed as dist

    import spectrakit.optim as O
    from spectrakit.distributed import sharded, wrap_model

    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    out = []
    for name in PRESETS[1:]:
        for label, mode, make in (("DDP, every rank repeats", "ddp", getattr(O, name)),
                                  ("DDP, sharded", "ddp", sharded(getattr(O, name))),
                                  ("FSDP2, sharded", "fsdp2", sharded(getattr(O, name)))):
            torch.manual_seed(0)
            model = wrap_model(Blocks(d, layers).to(device), mode, device=device)
            opt = make(model.parameters(), lr=1e-3)
            x = torch.randn(8, 16, d, device=device)
            model(x).square().mean().backward()

            def step(opt=opt):
                dist.barrier()
                opt.step()
                dist.barrier()

            ms = _interleaved({"step": step}, device, reps)["step"]
            out.append({"optimizer": name, "setup": label, "ranks": ws, "opt.step ms (min)": ms[0],
                        "opt.step ms (median)": ms[1]})
    return out


def multi_table(device, d, layers, reps, world_size) -> list[dict]:
    from spectrakit.distributed import run_workers

    use_cuda = device.type == "cuda" and torch.cuda.device_count() >= world_size
    backend = "nccl" if use_cuda else "gloo"
    threads = max(1, (os.cpu_count() or 2) // world_size)
    res = run_workers(_multi_worker, world_size, args=(d, layers, reps, "cuda" if use_cuda else "cpu"),
                      timeout=1800, backend=backend, threads=threads)
    rows = res[0]
    base = {r["optimizer"]: r["opt.step ms (min)"] for r in rows if r["setup"].startswith("DDP, every")}
    for r in rows:
        r["vs repeated (min)"] = r["opt.step ms (min)"] / base[r["optimizer"]]
    return rows


def _tp_llama(d: int, layers: int, mesh):
    """A LLaMA (vocabulary 512) with the tensor-parallel plan of examples/fsdp2_tp_torchrun.py on
    ``mesh["tp"]`` and FSDP2 on ``mesh["dp"]``."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from spectrakit.models.llama import Llama, LlamaConfig

    torch.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=512, dim=d, n_layers=layers, n_heads=4, max_seq_len=64))
    plan = {"embed": RowwiseParallel(input_layouts=Replicate()), "head": ColwiseParallel(output_layouts=Replicate())}
    for i in range(layers):
        plan.update({f"blocks.{i}.mlp.gate_proj": ColwiseParallel(), f"blocks.{i}.mlp.up_proj": ColwiseParallel(),
                     f"blocks.{i}.mlp.down_proj": RowwiseParallel()})
    parallelize_module(model, mesh["tp"], plan)
    for block in model.blocks:
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


def _mesh_worker(rank, ws, shape, d, layers, reps):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    import spectrakit.optim as O
    import spectrakit.optim.sharding.exchange as ex
    from spectrakit.optim.sharding.blocks import placement_spec

    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp"))
    model = _tp_llama(d, layers, mesh)
    opt = O.SpectraAdamW(model.parameters(), lr=1e-3, c=1.0)
    g = torch.Generator().manual_seed(mesh["dp"].get_local_rank())
    x = torch.randint(0, 512, (4, 64), generator=g)
    model(x, x)[1].backward()
    opt.step()  # the first step plans the owners
    sent = [0]
    orig = (dist.all_to_all_single, ex._all_gather_flat, dist.broadcast)

    def a2a(out, inp, out_split, in_split, group=None):
        sent[0] += (sum(in_split) - in_split[dist.get_rank(group)]) * inp.element_size()
        return orig[0](out, inp, out_split, in_split, group=group)

    def ag(out, inp, group=None):
        sent[0] += (dist.get_world_size(group) - 1) * inp.numel() * inp.element_size()
        return orig[1](out, inp, group=group)

    def bc(buf, src, group=None, async_op=False):
        sent[0] += buf.numel() * buf.element_size()
        return orig[2](buf, src=src, group=group, async_op=async_op)

    dist.all_to_all_single, ex._all_gather_flat, dist.broadcast = a2a, ag, bc
    try:
        opt.step()
    finally:
        dist.all_to_all_single, ex._all_gather_flat, dist.broadcast = orig
    times = []
    for _ in range(reps):
        dist.barrier()
        t = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t)
    specs = []
    for p in model.parameters():
        if p.ndim >= 2:
            spec = [("r", -1, 1)] * mesh.ndim
            for n, e in zip(p.device_mesh.mesh_dim_names, placement_spec(p.placements, p.ndim)):
                spec[mesh.mesh_dim_names.index(n)] = e
            specs.append((tuple(p.shape), tuple(spec)))
    dist.barrier()
    return {"sent": sent[0], "ms": 1e3 * sorted(times)[len(times) // 2], "specs": specs}


def mesh_table(meshes, d: int, layers: int, reps: int) -> list[dict]:
    from spectrakit.distributed import run_workers
    from spectrakit.distributed.cost_model import mesh_exchange

    rows = []
    for shape in meshes:
        ws = shape[0] * shape[1]
        res = run_workers(_mesh_worker, ws, args=(shape, d, layers, reps), timeout=1800, threads=1)
        pred = mesh_exchange(res[0]["specs"], shape)
        sent = [r["sent"] for r in res]
        ms = [r["ms"] for r in res]
        rows.append({"mesh dp x tp": f"{shape[0]}x{shape[1]}", "opt.step ms/rank (median; min..max over ranks)":
                     f"{sorted(ms)[len(ms) // 2]:.1f} ({min(ms):.1f}..{max(ms):.1f})",
                     "pred. GFLOP max/rank": pred["max_flops"] / 1e9,
                     "pred. GFLOP ideal/rank": pred["ideal_flops"] / 1e9,
                     "KB sent/rank measured (max)": max(sent) / 1024,
                     "KB sent/rank predicted (max)": pred["max_sent"] / 1024,
                     "measured / predicted bytes (every rank)": "; ".join(
                         f"{a / b:.3f}" if b else ("1" if a == 0 else "inf") for a, b in zip(sent, pred["sent"])),
                     "ms per predicted GFLOP (max rank)": max(ms) / max(pred["max_flops"] / 1e9, 1e-12)})
    return rows


def simulation_table() -> list[dict]:
    from spectrakit.distributed import simulate

    rows = []
    for cfg in ("llama-1b", "llama-7b"):
        for emb in (True, False):
            for r in simulate(cfg, (8, 64, 512), include_embeddings=emb):
                rows.append({"model": r.pop("model"), "embeddings": "clipped" if emb else "excluded", **r})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--d", type=int, default=None, help="model width (default 1024 on CUDA, 256 on CPU)")
    ap.add_argument("--layers", type=int, default=None, help="blocks (default 8 on CUDA, 2 on CPU)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--world-size", type=int, default=2, help="processes for table 2 (0: skip it)")
    ap.add_argument("--meshes", default="", help="FSDP2 x TP meshes dp x tp for table 4, e.g. 1x2,2x2,4x1")
    ap.add_argument("--mesh-only", action="store_true", help="run table 4 only")
    ap.add_argument("--no-write", action="store_true", help="print only, do not write docs/results/bench/KEY.md")
    args = ap.parse_args(argv)
    try:
        meshes = [tuple(int(v) for v in m.split("x")) for m in args.meshes.split(",") if m]
        if any(len(m) != 2 or min(m) < 1 for m in meshes):
            raise ValueError
    except ValueError:
        ap.error(f"--meshes must be a comma-separated list such as 1x2,2x2,4x1, got {args.meshes!r}")
    device = torch.device(args.device)
    d = args.d or (1024 if device.type == "cuda" else 256)
    layers = args.layers or (8 if device.type == "cuda" else 2)
    if device.type == "cpu":
        torch.set_num_threads(1)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    now = datetime.datetime.now(datetime.timezone.utc)
    head = (f"Device: {name} ({os.cpu_count()} CPU cores), torch {torch.__version__}, "
            f"{now:%Y-%m-%d %H:%M} UTC. Command: `{command_line()}`\n")
    t0 = time.time()
    if meshes:
        mesh_d, mesh_layers = args.d or 128, args.layers or 2
        text = head + (f"\n**FSDP2 x tensor parallel** (gloo, one thread per process, LLaMA d={mesh_d}, "
                       f"{mesh_layers} blocks, vocabulary 512; TP on MLP, embedding, head; SpectraAdamW "
                       f"`opt.step()` median of {args.reps}; bytes = what each rank hands to the exchange's "
                       "collectives in one steady step, against `cost_model.mesh_exchange`)\n\n"
                       + markdown_table(mesh_table(meshes, mesh_d, mesh_layers, args.reps))
                       + f"\n\n(table time {time.time() - t0:.0f} s, load average "
                       f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the end)\n")
        print(text)
        if not args.no_write:
            write_section(f"distributed-mesh-{device.type}", text)
        if args.mesh_only:
            return 0
        t0 = time.time()
    parts = [head, f"**World size 1: plain preset vs `sharded(preset)`** (LLaMA block shapes, d={d}, "
                   f"{layers} blocks, `opt.step()`, {3 * args.reps} interleaved repetitions)\n",
             markdown_table(overhead_table(device, d, layers, 3 * args.reps)),
             "\n**Fixed cost of the distributed path** (tiny parameters, 300 interleaved steps)\n",
             markdown_table(python_overhead_table(device))]
    if args.world_size > 1:
        parts += [f"\n**{args.world_size} processes** (`opt.step()` between barriers, rank 0, min/median of "
                  f"the repetitions, d={d}, {layers} blocks; q, o, up, down per block)\n",
                  markdown_table(multi_table(device, d, layers, args.reps, args.world_size))]
    parts += ["\n**Cost model** (`spectrakit.distributed.simulate`: Newton–Schulz 5-step GFLOP per rank, "
              "exchange MB per rank per step in fp32; engine = DDP all-reduce / FSDP2 gathers + "
              "reduce-scatter)\n",
              markdown_table(simulation_table())]
    text = "\n".join(parts) + f"\n\n(total benchmark time {time.time() - t0:.0f} s)\n"
    print(text)
    if not args.no_write:
        write_section(f"distributed-{device.type}", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
