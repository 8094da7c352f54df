"""Workers for FSDP2 x tensor parallel (2-D and 3-D meshes), run by ``run_workers``; not collected by pytest.

A tiny LLaMA with the usual tensor-parallel plan on the MLP (gate/up Colwise, down Rowwise), the embedding
(Rowwise on the vocabulary) and the head (Colwise, logits gathered); attention and norms stay replicated on
the tensor-parallel mesh dim, so the step sees (_StridedShard/Shard, Shard) blocks, one-dim shards and
replicated matrices together. Vocabulary 66 and MLP width 40 give uneven shards.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from spectrakit.models.llama import Llama, LlamaConfig

CFG = dict(vocab_size=66, dim=16, n_layers=2, n_heads=2, mlp_hidden=40, max_seq_len=8)
STEPS = 20
GLOBAL_BATCH = 4

# fp32 post-transforms throughout (Muon's published bf16 iteration amplifies the summation-order rounding of
# a sharded forward, see workers.OPT_KW); the Frank-Wolfe run also pre-clips the raw gradient (pre_c), which
# goes through the same block exchange
OPT_KW = {"SpectraAdamW": dict(lr=1e-2, c=0.5),
          "SpectraSignum": dict(lr=1e-2, c=1.0, post_dtype="float64"),
          "Muon": dict(lr=2e-2, post_dtype="float32"),
          "Spectra": dict(lr=1e-2, base="adamw", post="spectral_lmo", c=1.0, pre_c=0.05, pre="soft_clip_exact")}


# SpectraSignum's update is a function of signs only: a 1e-7 relative perturbation of the fp32 gradients
# (the summation order of a tensor-parallel forward) flips signs of near-zero momentum entries and moves the
# parameters by ~0.1 within 20 steps, with or without sharding (measured); it is compared in float64 (model
# and spectral iteration; the model's loss is still fp32, so with a pre-clip, which spreads that rounding to
# every entry, signs flip again: measured 0.16 on 2x2 with pre_c=0.05, 1.4e-9 for SpectraAdamW so run)
DTYPE = {"SpectraSignum": torch.float64}


def make_llama(seed: int = 0, dtype=torch.float32) -> Llama:
    torch.manual_seed(seed)
    return Llama(LlamaConfig(**CFG)).to(dtype)


def batch(step: int):
    g = torch.Generator().manual_seed(500 + step)
    idx = torch.randint(0, CFG["vocab_size"], (GLOBAL_BATCH, CFG["max_seq_len"] + 1), generator=g)
    return idx[:, :-1], idx[:, 1:]


def train_steps(model, opt, s0: int, s1: int, dp_rank: int = 0, dp: int = 1) -> None:
    for s in range(s0, s1):
        x, y = batch(s)
        x, y = x.chunk(dp)[dp_rank], y.chunk(dp)[dp_rank]
        opt.zero_grad()
        model(x, y)[1].backward()
        opt.step()


def tp_fsdp_wrap(model: Llama, mesh):
    """The tensor-parallel plan on ``mesh["tp"]``, then FSDP2 on the data-parallel dims (``"dp"``, or
    ``("rep", "dp")`` as HSDP on a 3-D mesh)."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = {"embed": RowwiseParallel(input_layouts=Replicate()),
            "head": ColwiseParallel(output_layouts=Replicate())}
    for i in range(len(model.blocks)):
        plan.update({f"blocks.{i}.mlp.gate_proj": ColwiseParallel(), f"blocks.{i}.mlp.up_proj": ColwiseParallel(),
                     f"blocks.{i}.mlp.down_proj": RowwiseParallel()})
    parallelize_module(model, mesh["tp"], plan)
    dp_mesh = mesh["rep", "dp"] if "rep" in mesh.mesh_dim_names else mesh["dp"]
    for block in model.blocks:
        fully_shard(block, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    return model


def full_params(model) -> dict:
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in model.named_parameters()}


def _dp_coord(mesh) -> tuple[int, int]:
    """(this rank's data-parallel index, data-parallel degree) over all data-parallel mesh dims."""
    names = [n for n in mesh.mesh_dim_names if n != "tp"]
    idx, size = 0, 1
    for n in names:
        idx = idx * mesh[n].size() + mesh[n].get_local_rank()
        size *= mesh[n].size()
    return idx, size


def tp_suite(rank: int, ws: int, shape: tuple, names: tuple = tuple(OPT_KW)) -> dict:
    """Train every optimizer of ``names`` for STEPS steps on a mesh of ``shape`` (``(dp, tp)`` or
    ``(rep, dp, tp)``) with the PLAIN presets (they must take the sharded path themselves)."""
    from torch.distributed.device_mesh import init_device_mesh

    import spectrakit.optim as O
    from spectrakit.optim.sharding.layout import layout_of
    from spectrakit.optim.sharding.optimizer import ShardedSpectraMixin

    dims = ("dp", "tp") if len(shape) == 2 else ("rep", "dp", "tp")
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=dims)
    dp_rank, dp = _dp_coord(mesh)
    res: dict = {}
    for name in names:
        model = tp_fsdp_wrap(make_llama(dtype=DTYPE.get(name, torch.float32)), mesh)
        opt = getattr(O, name)(model.parameters(), **OPT_KW[name])
        train_steps(model, opt, 0, STEPS, dp_rank, dp)
        res[name] = full_params(model)
        res[(name, "sharded_path")] = isinstance(opt, ShardedSpectraMixin)
    res["layouts"] = {n: (str(tuple(p.placements)), layout_of(p, n).kind)
                      for n, p in model.named_parameters()}
    res["bytes"], res["specs"] = exchange_bytes(mesh)
    # the local tensor of every parameter is the block the layout computes
    from spectrakit.optim.sharding.blocks import block_ranges, placement_spec

    ok = {}
    full = full_params(model)
    coord = tuple(mesh.get_coordinate())
    for n, p in model.named_parameters():
        ranges = block_ranges(tuple(p.shape), placement_spec(p.placements, p.ndim), tuple(mesh.mesh.shape)
                              if p.device_mesh.ndim == mesh.ndim else tuple(p.device_mesh.mesh.shape),
                              coord if p.device_mesh.ndim == mesh.ndim else tuple(p.device_mesh.get_coordinate()))
        idx = [torch.cat([torch.arange(a, b) for a, b in r]) if r else torch.empty(0, dtype=torch.long)
               for r in ranges]
        expect = full[n][torch.meshgrid(*idx, indexing="ij")] if p.ndim > 1 else full[n][idx[0]]
        ok[n] = torch.equal(expect, p.to_local())
    res["blocks_match_local"] = ok
    dist.barrier()
    return res


def mesh_specs(model, mesh) -> list[tuple]:
    """``(global shape, placement spec on the whole mesh)`` of every matrix parameter, in order (a DTensor
    on a sub-mesh, such as FSDP2-only parameters on ``mesh["dp"]``, is Replicate on the other mesh dims)."""
    from spectrakit.optim.sharding.blocks import placement_spec

    out = []
    for p in model.parameters():
        if p.ndim < 2:
            continue
        spec = [("r", -1, 1)] * mesh.ndim
        sub = placement_spec(p.placements, p.ndim)
        for name, entry in zip(p.device_mesh.mesh_dim_names, sub):
            spec[mesh.mesh_dim_names.index(name)] = entry
        out.append((tuple(p.shape), tuple(spec)))
    return out


def exchange_bytes(mesh, steps: int = 2) -> tuple[int, list]:
    """Bytes this rank hands to the exchange's collectives in step ``steps`` (a steady step) of
    SpectraAdamW (no pre-clip), and the matrices' specs for the cost model."""
    import spectrakit.optim as O
    import spectrakit.optim.sharding.exchange as ex

    dp_rank, dp = _dp_coord(mesh)
    model = tp_fsdp_wrap(make_llama(), mesh)
    opt = O.SpectraAdamW(model.parameters(), **OPT_KW["SpectraAdamW"])
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

    train_steps(model, opt, 0, steps - 1, dp_rank, dp)
    x, y = batch(steps - 1)
    opt.zero_grad()
    model(x.chunk(dp)[dp_rank], y.chunk(dp)[dp_rank])[1].backward()
    dist.all_to_all_single, ex._all_gather_flat, dist.broadcast = a2a, ag, bc
    try:
        opt.step()
    finally:
        dist.all_to_all_single, ex._all_gather_flat, dist.broadcast = orig
    return sent[0], mesh_specs(model, mesh)


def _mesh(shape: tuple):
    from torch.distributed.device_mesh import init_device_mesh

    dims = ("dp", "tp") if len(shape) == 2 else ("rep", "dp", "tp")
    return init_device_mesh("cpu", shape, mesh_dim_names=dims)


def full_state(opt, model) -> dict:
    """Every optimizer state tensor, whole, by parameter name (plus the param groups' step counters)."""
    names = {id(p): n for n, p in model.named_parameters()}
    out = {}
    for p, st in opt.state.items():
        for k, v in st.items():
            if torch.is_tensor(v):
                out[(names[id(p)], k)] = (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
    out["steps_taken"] = [int(g["steps_taken"]) for g in opt.param_groups]  # a copy: the counter grows in place
    return out


CKPT_OPT = "SpectraAdamW"


def ckpt_suite(rank: int, ws: int, shape: tuple, load_from: str | None, save_to: str, s0: int, s1: int) -> dict:
    """On a mesh of ``shape``: build, load ``load_from`` (if given; the model starts from another init so
    the load must overwrite it), record the loaded state, train steps ``s0..s1``, save to ``save_to``."""
    import spectrakit.optim as O
    from spectrakit.distributed.checkpoint import load_checkpoint, save_checkpoint

    mesh = _mesh(shape)
    dp_rank, dp = _dp_coord(mesh)
    model = tp_fsdp_wrap(make_llama(seed=0 if load_from is None else 1), mesh)
    opt = getattr(O, CKPT_OPT)(model.parameters(), **OPT_KW[CKPT_OPT])
    res: dict = {}
    if load_from is not None:
        extra = load_checkpoint(load_from, model, opt, extra={"step": torch.tensor(0)})
        res["loaded_step"] = int(extra["step"])
        res["loaded_params"], res["loaded_state"] = full_params(model), full_state(opt, model)
    train_steps(model, opt, s0, s1, dp_rank, dp)
    save_checkpoint(save_to, model, opt, extra={"step": torch.tensor(s1)})
    res["saved_params"], res["saved_state"] = full_params(model), full_state(opt, model)
    dist.barrier()
    return res
