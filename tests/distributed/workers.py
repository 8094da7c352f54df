"""Worker functions run on several local processes by ``spectrakit.distributed.launch.run_workers``.

Each returns plain data (tensors, numbers, strings) that the tests compare against single-process
oracles computed in the pytest process. Not collected by pytest (no ``test_`` prefix).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

from spectrakit.optim.sharding.layout import chunk_sizes

# ---------------------------------------------------------------------------------------------- models


class SmallNet(torch.nn.Module):
    """Conv1d kernel (6, 4, 3) -> matrix (6, 12); two (16, 16) matrices (one batch); (16, 18); (15, 16),
    whose rank-0 shard (8, 16) has the shape of the (16, 16) shards while rank 1 holds (7, 16) (batches
    must follow global shapes or the ranks' collectives would not match); (3, 15) (shards of 2 and 1
    rows on 2 ranks); biases (1-D, element-wise path)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(4, 6, 3)
        self.fc1 = torch.nn.Linear(18, 16)
        self.fc2 = torch.nn.Linear(16, 16)
        self.fc3 = torch.nn.Linear(16, 16)
        self.fc4 = torch.nn.Linear(16, 15)
        self.out = torch.nn.Linear(15, 3)

    def forward(self, x):
        h = torch.tanh(self.conv(x)).flatten(1)
        h = torch.tanh(self.fc1(h))
        h = torch.tanh(self.fc2(h))
        h = torch.tanh(self.fc3(h))
        h = torch.tanh(self.fc4(h))
        return self.out(h)


def make_model(seed: int = 0) -> SmallNet:
    torch.manual_seed(seed)
    return SmallNet()


def batch(step: int, size: int = 16):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(size, 4, 5, generator=g), torch.randn(size, 3, generator=g)


def loss_fn(model, x, y):
    return F.mse_loss(model(x), y)


# Muon's published bf16 Newton-Schulz amplifies the fp32 rounding of the all-reduced gradient (a different
# summation order than one big batch) far beyond 1e-5 within 20 steps, with or without sharding (world
# size 1 is bitwise equal, tested); the fp32 equivalence check therefore runs its iteration in fp32.
# SpectraSignum also pre-clips the raw gradient (pre_c): the pre-clip goes through the same sharded hook.
OPT_KW = {"AdamW": dict(lr=1e-2), "SpectraAdamW": dict(lr=1e-2, c=0.5),
          "SpectraSignum": dict(lr=1e-2, c=1.0, pre_c=0.05, pre="soft_clip_exact"),
          "Muon": dict(lr=2e-2, post_dtype="float32")}


# steps of the equivalence runs (the optimizer states, momenta and moments, are in play from the second step
# on; 4 steps: 2 before the checkpoint, so that it holds states already updated twice, and 2 after it, the
# second of which continues from states the resumed run has updated itself), and the step of the checkpoint in
# the resume runs. A sharding or exchange error shows in the first step.
STEPS = 4
CKPT_STEP = STEPS // 2


def train_steps(model, opt, s0, s1, rank=0, ws=1):
    for s in range(s0, s1):
        x, y = batch(s)
        if ws > 1:
            x, y = x.chunk(ws)[rank], y.chunk(ws)[rank]
        opt.zero_grad()
        loss_fn(model, x, y).backward()
        opt.step()


def fsdp_wrap(model, mesh=None):
    from torch.distributed.fsdp import fully_shard

    for mod in (model.conv, model.fc1, model.fc2, model.fc3, model.fc4, model.out):
        fully_shard(mod, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def split_groups(model) -> list[dict]:
    """fc2's weight as 4 row blocks (each clipped as a matrix of its own), the rest as one group."""
    rest = [p for n, p in model.named_parameters() if n != "fc2.weight"]
    return [{"params": rest}, {"params": [model.fc2.weight], "split_fused": 4}]


def full_params(model) -> dict:
    out = {}
    for n, p in model.named_parameters():
        n = n.replace("module.", "")
        out[n] = p.full_tensor().detach().clone() if hasattr(p, "full_tensor") else p.detach().clone()
    return out


# ---------------------------------------------------------------------------------------------- exchange


def tag(b, idx, x):
    """Exact transform that needs the right matrix in the right slot: 2x + (matrix index) + 100 b."""
    t = torch.tensor(idx, dtype=x.dtype, device=x.device).view(-1, *([1] * (x.ndim - 1)))
    return x * 2 + t + 100 * b


def whole(b, idx, x):
    """Needs every entry of the matrix: polar factor (float64 SVD) of the (m, prod(rest)) view, plus the
    column mean (sums over all rows)."""
    k = x.shape[0]
    m = x.reshape(k, x.shape[1], math.prod(x.shape[2:])).double()
    u, _, vh = torch.linalg.svd(m, full_matrices=False)
    y = u @ vh + m.mean(dim=1, keepdim=True)
    return y.reshape(x.shape).to(x.dtype)


EXCHANGE_SHAPES = [((3, 5, 7), torch.float32), ((1, 4, 4), torch.float64), ((4, 9, 2), torch.float32),
                   ((2, 3, 6), torch.bfloat16), ((0, 5, 5), torch.float32), ((2, 1, 8), torch.float32),
                   ((2, 6, 4, 3), torch.float32), ((5, 8, 8), torch.float32)]
SHARD_DIMS = [0, 1, 0, 1, 0, 0, 1, 0]


def exchange_inputs():
    g = torch.Generator().manual_seed(7)
    xs = []
    for i, (shape, dtype) in enumerate(EXCHANGE_SHAPES):
        x = torch.randn(shape, generator=g, dtype=torch.float64)
        if i == 2 and x.numel():
            x[0] *= 1e30   # huge
            x[1] *= 1e-30  # tiny
            x[2] = 0.0     # zero matrix
        if i == 0:         # non-contiguous batch (a transposed view)
            x = x.transpose(-1, -2).contiguous().transpose(-1, -2)
        xs.append(x.to(dtype))
    return xs


def exchange_suite(rank: int, ws: int) -> dict:
    from spectrakit.optim.sharding.exchange import SpectralSharder

    xs = exchange_inputs()
    res: dict = {"noncontig": not xs[0].is_contiguous()}
    for method in ("all_gather", "broadcast", "auto"):
        sh = SpectralSharder(replicated_exchange=method)
        res[f"rep_tag_{method}"] = sh.apply_replicated(xs, tag)
        res[f"rep_whole_{method}"] = sh.apply_replicated(xs, whole)
        res[f"owners_{method}"] = sh.owners([(x.shape[0], tuple(x.shape[1:])) for x in xs])
    sh = SpectralSharder()
    locs = [torch.split(x, chunk_sizes(x.shape[1 + d], ws), dim=1 + d)[rank] for x, d in zip(xs, SHARD_DIMS)]
    res["shard_tag"] = sh.apply_sharded(locs, [x.shape[1:] for x in xs], SHARD_DIMS, tag)
    res["shard_whole"] = sh.apply_sharded(locs, [x.shape[1:] for x in xs], SHARD_DIMS, whole)
    # errors: wrong local shape, wrong fn output
    for key, call in {
        "err_local_shape": lambda: sh.apply_sharded([xs[7]], [xs[7].shape[1:]], [0], tag),
        "err_fn_dtype": lambda: sh.apply_replicated([xs[0]], lambda b, i, x: x.double()),
        "err_shard_dim": lambda: sh.apply_sharded([locs[7]], [xs[7].shape[1:]], [5], tag),
    }.items():
        try:
            call()
            res[key] = None
        except ValueError as e:
            res[key] = str(e)
    # bytes actually handed to the collectives, for the cost model
    sent = {"all_to_all": 0, "all_gather": 0}
    orig = (dist.all_to_all_single, dist.all_gather_single if hasattr(dist, "all_gather_single") else None,
            dist.broadcast)
    import spectrakit.optim.sharding.exchange as ex

    def a2a(out, inp, out_split, in_split, group=None):
        sent["all_to_all"] += (sum(in_split) - in_split[rank]) * inp.element_size()
        return orig[0](out, inp, out_split, in_split, group=group)

    def ag(out, inp, group=None):
        sent["all_gather"] += (ws - 1) * inp.numel() * inp.element_size()
        return (orig[1] or dist.all_gather_into_tensor)(out, inp, group=group)

    shapes = [(4, (16, 16)), (1, (48, 16)), (1, (16, 48)), (3, (33, 16)), (1, (7, 5))]
    mats = [torch.randn(k, *s) for k, s in shapes]
    dist.all_to_all_single, ex._all_gather_flat = a2a, ag
    try:
        rep, shd = SpectralSharder(replicated_exchange="all_gather"), SpectralSharder()
        for step in range(2):  # one call per batch, as the optimizer does; count the 2nd (steady) step
            rep.reset_loads()
            shd.reset_loads()
            if step == 1:
                sent.update(all_to_all=0, all_gather=0)
            for m in mats:
                rep.apply_replicated([m], tag)
                loc = torch.split(m, chunk_sizes(m.shape[1], ws), dim=1)[rank]
                shd.apply_sharded([loc], [m.shape[1:]], [0], tag)
    finally:
        dist.all_to_all_single = orig[0]
        ex._all_gather_flat = orig[1] or dist.all_gather_into_tensor
    res["bytes"] = sent
    res["bytes_shapes"] = shapes
    return res


# ---------------------------------------------------------------------------------------------- optimizer


def optim_suite(rank: int, ws: int) -> dict:
    """The sharded optimizers against one process (DDP, FSDP2, HSDP), the non-finite skip and the refusals.
    The compiled step and the checkpoints are in ``optim_resume_suite``: a second launch of about the same
    cost, so that neither fixture's test waits for the whole suite."""
    import spectrakit.optim as O
    import spectrakit.optim.transforms as T
    from spectrakit.optim.sharding.optimizer import sharded

    counts = {"matrices": 0}
    wrapped = {}
    for name, fn in list(T.POST_TRANSFORMS.items()):
        if fn is None:
            continue

        def counting(U, *args, fn=fn, **kwargs):
            if U.shape[-2:] not in ((2, 3), (3, 2)):  # not the optimizer's one-time warm-up of its tables
                counts["matrices"] += U.shape[0]
            return fn(U, *args, **kwargs)

        wrapped[name] = counting
    T.POST_TRANSFORMS.update(wrapped)

    res: dict = {}
    for cls_name, kw in OPT_KW.items():
        cls = sharded(getattr(O, cls_name))
        for mode in ("ddp", "fsdp2"):
            model = make_model()
            model = torch.nn.parallel.DistributedDataParallel(model) if mode == "ddp" else fsdp_wrap(model)
            opt = cls(model.parameters(), **kw)
            counts["matrices"] = 0
            train_steps(model, opt, 0, STEPS, rank, ws)
            res[(cls_name, mode)] = full_params(model)
            res[(cls_name, mode, "transformed")] = counts["matrices"]
            if mode == "fsdp2":
                st = opt.state[next(iter(model.parameters()))]
                res[(cls_name, mode, "state_types")] = sorted({type(v).__name__ for v in st.values()})

    # HSDP-style 2-D mesh (Replicate, Shard(0)) for one optimizer
    from torch.distributed.device_mesh import init_device_mesh

    mesh2 = init_device_mesh("cpu", (1, ws), mesh_dim_names=("replicate", "shard"))
    model = fsdp_wrap(make_model(), mesh=mesh2)
    opt = sharded(O.SpectraAdamW)(model.parameters(), **OPT_KW["SpectraAdamW"])
    train_steps(model, opt, 0, STEPS, rank, ws)
    res[("SpectraAdamW", "hsdp")] = full_params(model)

    # a fused weight clipped per block (fc2: 4 row blocks; the shards hold rows of several blocks)
    model = fsdp_wrap(make_model())
    opt = sharded(O.SpectraAdamW)(split_groups(model), **OPT_KW["SpectraAdamW"])
    train_steps(model, opt, 0, STEPS, rank, ws)
    res[("SpectraAdamW", "fsdp2", "split")] = full_params(model)

    # a non-finite gradient in ONE rank's shard: every rank must skip the step (the flag is all-reduced)
    model = fsdp_wrap(make_model())
    opt = sharded(O.SpectraAdamW)(model.parameters(), **OPT_KW["SpectraAdamW"])
    train_steps(model, opt, 0, 2, rank, ws)
    before = full_params(model)
    x, y = batch(2)
    opt.zero_grad()
    loss_fn(model, x.chunk(ws)[rank], y.chunk(ws)[rank]).backward()
    if rank == ws - 1:
        model.fc1.weight.grad.to_local()[0, 0] = float("inf")
    opt.step()
    after = full_params(model)
    res["nonfinite_one_rank"] = (all(torch.equal(before[n], after[n]) for n in before),
                                 int(opt.skipped_steps), int(opt.param_groups[0]["steps_taken"]))

    # step(grad_norm=): each rank's own shards' norm, infinite on one rank only, skips the step on every rank;
    # then the (DTensor) norm clip_grad_norm_ returns takes it on every rank
    for k, infinite in enumerate((True, False)):
        opt.zero_grad()
        x, y = batch(3 + k)
        loss_fn(model, x.chunk(ws)[rank], y.chunk(ws)[rank]).backward()
        if infinite:
            norm = torch.linalg.vector_norm(torch.stack([p.grad.to_local().norm() for p in model.parameters()]))
            norm = norm * float("inf") if rank == ws - 1 else norm
        else:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e6)
        before = full_params(model)
        opt.step(grad_norm=norm)
        after = full_params(model)
        res[("given_norm", infinite)] = (all(torch.equal(before[n], after[n]) for n in before),
                                         int(opt.skipped_steps), type(norm).__name__)

    # unsupported layouts and options -> clear errors
    res["errors"] = optim_errors(rank, ws)
    return res


def optim_resume_suite(rank: int, ws: int, ckpt_dir: str) -> dict:
    """``torch.compile`` of a sharded step, and distributed checkpoint -> resume (``optim_suite``'s other half)."""
    import spectrakit.optim as O
    from spectrakit.distributed.checkpoint import load_checkpoint, save_checkpoint
    from spectrakit.optim.sharding.optimizer import sharded

    res: dict = {}
    # torch.compile(opt.step) of a sharded optimizer runs the eager step (not traced): the same numbers as
    # the eager FSDP2 run, nothing compiled
    import torch._dynamo as dynamo

    dynamo.reset()
    dynamo.utils.counters.clear()
    model = fsdp_wrap(make_model())
    opt = sharded(O.SpectraAdamW)(model.parameters(), **OPT_KW["SpectraAdamW"])
    opt.step = torch.compile(opt.step, backend="aot_eager")
    train_steps(model, opt, 0, STEPS, rank, ws)
    res[("SpectraAdamW", "fsdp2", "compiled")] = full_params(model)
    res["compiled_counters"] = {k: dict(v) for k, v in dynamo.utils.counters.items()}

    # checkpoint -> resume -> continue, bit-identical; control: a fresh optimizer without loading
    for cls_name in ("SpectraAdamW", "Muon"):
        cls = sharded(getattr(O, cls_name))
        path = f"{ckpt_dir}/{cls_name}"
        model = fsdp_wrap(make_model())
        opt = cls(model.parameters(), **OPT_KW[cls_name])
        train_steps(model, opt, 0, CKPT_STEP, rank, ws)
        save_checkpoint(path, model, opt, extra={"step": torch.tensor(CKPT_STEP)})
        train_steps(model, opt, CKPT_STEP, STEPS, rank, ws)
        uninterrupted = full_params(model)
        model2 = fsdp_wrap(make_model(seed=1))  # different init: the load must overwrite it
        opt2 = cls(model2.parameters(), **OPT_KW[cls_name])
        extra = load_checkpoint(path, model2, opt2, extra={"step": torch.tensor(0)})
        train_steps(model2, opt2, CKPT_STEP, STEPS, rank, ws)
        model3 = fsdp_wrap(make_model())  # control: same init, no checkpoint (optimizer state lost)
        opt3 = cls(model3.parameters(), **OPT_KW[cls_name])
        train_steps(model3, opt3, 0, CKPT_STEP, rank, ws)
        opt3 = cls(model3.parameters(), **OPT_KW[cls_name])
        train_steps(model3, opt3, CKPT_STEP, STEPS, rank, ws)
        res[("ckpt", cls_name)] = (uninterrupted, full_params(model2), full_params(model3),
                                   int(extra["step"]), opt2.param_groups[0]["steps_taken"])
    return res


def _error(call) -> str | None:
    try:
        call()
    except (ValueError, TypeError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def optim_errors(rank: int, ws: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    import spectrakit.optim as O
    from spectrakit.optim.sharding.layout import layout_of
    from spectrakit.optim.sharding.optimizer import sharded

    out = {}
    mesh = init_device_mesh("cpu", (ws,))

    def one_step(p, **kw):
        p.grad = p.detach().clone() * 0 + 1
        sharded(O.SpectraAdamW)([p], **kw).step()

    w = torch.nn.Parameter(DTensor.from_local(torch.randn(4, 6), mesh, [Partial()], run_check=False))
    out["partial"] = _error(lambda: one_step(w))
    mesh2 = init_device_mesh("cpu", (ws, 1), mesh_dim_names=("dp", "tp"))
    w2 = torch.nn.Parameter(DTensor.from_local(torch.randn(4, 6), mesh2, [Shard(0), Shard(1)],
                                               run_check=False))
    out["two_mesh_dims"] = _error(lambda: one_step(w2))
    w3 = torch.nn.Parameter(DTensor.from_local(torch.randn(4, 6), mesh, [Shard(0)], run_check=False))
    v3 = torch.nn.Parameter(DTensor.from_local(torch.randn(3), mesh, [Shard(0)], run_check=False))
    out["vector_clip"] = _error(lambda: one_step(v3, vector_clip=True))
    out["matrix_vector_clip_pre_c_ok"] = _error(lambda: one_step(w3, vector_clip=True, pre_c=1.0))
    out["mars"] = _error(lambda: one_step(w3, base="mars"))
    out["bad_exchange"] = _error(lambda: sharded(O.SpectraAdamW)([w3], replicated_exchange="ring"))
    out["not_spectra"] = _error(lambda: sharded(torch.optim.AdamW))
    from spectrakit.distributed.wrap import wrap_model

    net = torch.nn.Sequential(torch.nn.ModuleList([torch.nn.Linear(4, 6), torch.nn.Linear(6, 6)]),
                              torch.nn.Linear(6, 2))
    wrapped = wrap_model(net, "fsdp2")
    out["fsdp2_wrap"] = sorted({(type(p).__name__, str(tuple(p.placements))) for p in wrapped.parameters()})
    out["ddp_wrap"] = type(wrap_model(torch.nn.Linear(3, 3), "ddp")).__name__
    out["bad_mode"] = _error(lambda: wrap_model(torch.nn.Linear(3, 3), "zero3"))
    w4 = DTensor.from_local(torch.randn(4, 6), mesh, [Replicate()], run_check=False)
    out["replicate_kind"] = layout_of(w4).kind
    out["shard_kind"] = (layout_of(w3).kind, layout_of(w3).shard_dim, tuple(w3.to_local().shape))
    return out


def plain_fsdp_suite(rank: int, ws: int) -> dict:
    """The PLAIN presets (no ``sharded(...)``) on ``fully_shard``-ed parameters, the FSDP2 convention:
    they take the sharded path themselves. Also runs ``sharded(cls)`` for a bit-for-bit comparison, and a
    MARS preset (needs whole tensors) for its error message."""
    import spectrakit.optim as O
    from spectrakit.optim.sharding.optimizer import ShardedSpectraMixin, sharded

    res: dict = {}
    for cls_name in ("SpectraAdamW", "SpectraSignum", "Muon"):
        for label, cls in (("plain", getattr(O, cls_name)), ("sharded", sharded(getattr(O, cls_name)))):
            model = fsdp_wrap(make_model())
            opt = cls(model.parameters(), **OPT_KW[cls_name])
            train_steps(model, opt, 0, STEPS, rank, ws)
            res[(cls_name, label)] = full_params(model)
            res[(cls_name, label, "class")] = (isinstance(opt, ShardedSpectraMixin), isinstance(opt, cls))
    model = fsdp_wrap(make_model())
    res["mars"] = _error(lambda: train_steps(model, O.MARS(model.parameters(), lr=1e-3), 0, 1, rank, ws))
    return res
