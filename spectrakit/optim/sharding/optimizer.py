"""Spectral optimizers under DDP and FSDP2 with the post-transform sharded across ranks.

:class:`ShardedSpectraMixin` turns any :class:`spectrakit.optim.Spectra` preset into a distributed
optimizer (``sharded(SpectraAdamW)(params, ...)`` or :class:`DistributedSpectra`). One step is

.. code-block:: text

    g, state, p   : local (the whole tensor under DDP, this rank's Shard(d) chunk under FSDP2)
    U   <- base.direction(g, state)                      element-wise, on the local data
    U_j <- post(U_j, c_k)  on the owner rank o(j) only   (greedy FLOP balance, assign.py)
           DDP  : every rank gets every result (all-gather / broadcasts, exchange.py)
           FSDP2: chunks -> owner (all-to-all), whole-matrix transform, chunks back (all-to-all)
    p   <- (1 - lr wd) p - lr alpha(m, n) U              local; alpha from the GLOBAL (m, n)

so every rank applies exactly the update of the single-process optimizer on the same global batch, while
each matrix's Newton–Schulz work is done once in the job instead of once per rank (SPECTRA's reference
code repeats it on every rank; Jiang, Semenov and Stich 2026 §6 leaves efficient distributed clipping as
future work)."""

# FSDP2 parameters are DTensors; during ``step()`` the param groups temporarily hold their local tensors
# (same storage, updated in place) and the optimizer states are stored as DTensors with the parameter's
# placements, so ``torch.distributed.checkpoint`` saves and reshards them like the parameters.
#
# The matrix pre-clip (``pre_c``) goes through the same sharded exchange as the post-transform (the
# optimizer's ``_pre_transform_groups`` hook), and ``alpha`` is computed from the global shape
# (``_update_scale``), so neither needs the whole tensor on every rank.
#
# Parameters sharded on several mesh dims (FSDP2 x tensor parallel, HSDP x TP) go through the block
# exchange of :mod:`spectrakit.optim.sharding.block_exchange` over their flattened sharding group.
#
# Requirements and refusals (``ValueError`` naming the parameter): placements other than ``Replicate``,
# ``Shard(d)`` and FSDP2's ``_StridedShard`` (see :func:`~spectrakit.optim.sharding.layout.layout_of`); for sharded
# parameters, group options that need a whole tensor outside the matrix transforms (``vector_clip`` of
# sharded 1-D parameters, the MARS base's per-tensor norm). Plain (non-DTensor) parameters must be
# identical on all ranks of ``process_group`` (DDP guarantees it).

from __future__ import annotations

import functools
import math

import torch
import torch.distributed as dist

from spectrakit._checks import check_choice
from spectrakit.optim.sharding.block_exchange import apply_blocks
from spectrakit.optim.sharding.exchange import SpectralSharder, group_size_rank
from spectrakit.optim.sharding.layout import Layout, is_dtensor, layout_of
from spectrakit.optim.spectra import MIN_BATCH_NUMEL, Spectra, min_batch_numel
from spectrakit.optim.transforms import POST_TRANSFORMS, matrix_shape, on_blocks, workspace_numel

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover
    DTensor = None

_NEEDS_WHOLE_TENSOR = {"mars": "the MARS base clips each gradient to unit Frobenius norm"}


class ShardedSpectraMixin:
    """Mixin for :class:`~spectrakit.optim.Spectra` subclasses: shards the post-transform across ranks and
    steps FSDP2 (DTensor) parameters on their local shards. See the module docstring for the algorithm.

    Extra keyword arguments (all others go to the optimizer):
        process_group: group over which replicated (DDP) parameters are shared; default the default group.
            Sharded (DTensor) parameters use the process group of their sharding mesh dim.
        replicated_exchange: ``"auto"``, ``"all_gather"`` or ``"broadcast"`` (see
            :meth:`spectrakit.optim.sharding.exchange.SpectralSharder.replicated_method`).

    Raises:
        ValueError: bad ``replicated_exchange``; at ``step()``, unsupported DTensor placements or group
            options that cannot run on shards (see the module docstring).
    """

    def __init__(self, params, *args, process_group=None, replicated_exchange: str = "auto", **kwargs):
        check_choice(replicated_exchange, "replicated_exchange", {"auto", "all_gather", "broadcast"})
        self._init_sharding(process_group, replicated_exchange)
        super().__init__(params, *args, **kwargs)

    def _init_sharding(self, process_group=None, replicated_exchange: str = "auto") -> None:
        """The sharding state (also set when a plain optimizer switches to this class for DTensor params)."""
        self._process_group = process_group
        self._replicated_exchange = replicated_exchange
        self._sharders: dict = {}
        self._local: dict[int, tuple[torch.Tensor, Layout]] = {}

    # ------------------------------------------------------------------ helpers
    def sharder(self, group=None) -> SpectralSharder:
        """The :class:`SpectralSharder` of a process group (``None``: ``process_group`` of the optimizer)."""
        group = self._process_group if group is None else group
        if id(group) not in self._sharders:
            self._sharders[id(group)] = SpectralSharder(group, replicated_exchange=self._replicated_exchange)
        return self._sharders[id(group)]

    def _enter_local(self) -> list[tuple[dict, int, torch.Tensor]]:
        """Swap DTensor parameters for their local tensors (and states for local views)."""
        swapped = []
        for gi, group in enumerate(self.param_groups):
            for i, p in enumerate(group["params"]):
                if not is_dtensor(p):
                    continue
                name = f"param_groups[{gi}]['params'][{i}] (shape {tuple(p.shape)})"
                layout = layout_of(p, name)
                if layout.kind != "replicated":
                    if p.ndim < 2 and group.get("vector_clip"):
                        raise ValueError(f"{name} is a sharded 1-D parameter: vector_clip needs the norm of "
                                         "the whole vector and is not supported under FSDP2; set "
                                         "vector_clip=False for this group")
                    if group["base"] in _NEEDS_WHOLE_TENSOR:
                        how = (f"Shard({layout.shard_dim})" if layout.kind == "sharded"
                               else f"placements {tuple(p.placements)}")
                        raise ValueError(f"{name} is sharded ({how}): "
                                         f"base={group['base']!r} is not supported under FSDP2 "
                                         f"({_NEEDS_WHOLE_TENSOR[group['base']]}); wrap the model with DDP "
                                         "(replicated parameters) or choose another base for this group")
                local = p.to_local()
                if p.grad is not None:
                    grad = p.grad
                    if is_dtensor(grad) and tuple(grad.placements) != tuple(p.placements):
                        layout_of(grad, f"gradient of {name}")
                        grad = grad.redistribute(p.device_mesh, p.placements)
                    local.grad = grad.to_local() if is_dtensor(grad) else grad
                else:
                    local.grad = None
                if p in self.state:
                    self.state[local] = {k: (v.to_local() if is_dtensor(v) else v)
                                         for k, v in self.state[p].items()}
                group["params"][i] = local
                self._local[id(local)] = (p, layout)
                swapped.append((group, i, p))
        return swapped

    def _exit_local(self, swapped) -> None:
        """Undo :meth:`_enter_local`: DTensor parameters back, new/replaced states wrapped as DTensors."""
        for group, i, p in swapped:
            local = group["params"][i]
            group["params"][i] = p
            new = self.state.pop(local, None)
            local.grad = None
            if new is None:
                continue
            old = self.state.get(p, {})
            state = {}
            for k, v in new.items():
                prev = old.get(k)
                if is_dtensor(prev) and prev.to_local() is v:
                    state[k] = prev
                elif torch.is_tensor(v) and v.ndim > 0 and v.shape == local.shape:
                    state[k] = DTensor.from_local(v, p.device_mesh, p.placements, run_check=False,
                                                  shape=p.shape, stride=p.stride())
                else:
                    state[k] = v
            self.state[p] = state
        self._local = {}

    # ------------------------------------------------------------------ overridden pipeline steps
    @torch.compiler.disable(reason="the sharded step swaps parameters for their shards and exchanges them")
    @torch.no_grad()
    def step(self, closure=None, *, grad_norm=None):
        """One distributed optimizer step (collective: every rank of the job must call it).

        Not traced by ``torch.compile``: under ``torch.compile(opt.step)`` it runs eagerly, like
        ``torch.optim``'s fused optimizers (the step swaps the parameters in the param groups for their
        local shards and back, and its exchanges depend on which rank owns which matrix; traced, it broke
        the graph at every batch and recompiled until dynamo's limit). Compile the model instead (each
        FSDP2 block); the step's matrix transforms are batched kernels either way. ``grad_norm``: as
        :meth:`Spectra.step`'s (the global norm, or this rank's shards' own: the ranks agree on skipping)."""
        loss = None
        if grad_norm is not None:
            grad_norm = self._given_norm(grad_norm, closure)
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for sh in self._sharders.values():
            sh.reset_loads()
        swapped = self._enter_local()
        try:
            self._inner_step(grad_norm)
        finally:
            self._exit_local(swapped)
        return loss

    def _inner_step(self, grad_norm: torch.Tensor | None = None) -> None:
        """The next class's ``step`` without ``torch.optim``'s hook wrapper (which this class's own ``step``
        already carries), so step pre/post hooks run once per step."""
        mro = type(self).__mro__
        for cls in mro[mro.index(ShardedSpectraMixin) + 1:]:
            if "step" in cls.__dict__:
                fn = cls.__dict__["step"]
                while getattr(fn, "hooked", False) and hasattr(fn, "__wrapped__"):
                    fn = fn.__wrapped__
                fn(self, grad_norm=grad_norm)
                return

    def _flags_on_host(self, grads, grad_norm):
        return False  # (the flag is all-reduced across the ranks: a tensor)

    def _finite_flag(self, grads, grad_norm=None):
        ok = super()._finite_flag(grads, grad_norm)
        groups = {id(lay.group): lay.group for _, lay in self._local.values() if lay.kind != "replicated"}
        for g in groups.values():  # shards differ across ranks: agree on skipping the step
            dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=g)
        return ok

    def _batches(self, group):
        """Batches keyed by the GLOBAL shape and layout, so every rank forms the same batches in the same
        order (local shard shapes differ across ranks); zero-size local shards still take part."""
        if not self._local:
            yield from super()._batches(group)
            return
        buckets: dict[tuple, list[torch.Tensor]] = {}
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise ValueError("sparse gradients are not supported by Spectra")
            entry = self._local.get(id(p))
            gshape = tuple(entry[0].shape) if entry else tuple(p.shape)
            if math.prod(gshape) == 0 or (len(gshape) < 2 and p.numel() == 0):
                continue
            if len(gshape) >= 2:
                lay = entry[1] if entry else None
                key = ("matrix", matrix_shape(p.shape), gshape, lay.shard_dim if lay else None,
                       id(lay.group) if lay else None, lay.blocks if lay else None)
            else:
                key = ("flat", None)
            buckets.setdefault((*key, p.dtype, p.device), []).append(p)
        def cost(kind, p):  # as Spectra._batch_cost, with the GLOBAL shape of a sharded parameter
            gshape = tuple(self._local[id(p)][0].shape) if id(p) in self._local else tuple(p.shape)
            extra = workspace_numel(group["post"], *matrix_shape(gshape)) if kind == "matrix" else 0
            return math.prod(gshape) + extra

        cap = group["max_batch_numel"]
        if cap is None:  # the single-process default (Spectra._batch_cap), from global shapes
            cap = max([MIN_BATCH_NUMEL] + [max(cost(key[0], p), min_batch_numel(p.device, group["post"]))
                                           for key, ps in buckets.items() for p in ps])
        for key, ps in buckets.items():
            kind, shape = key[0], key[1]
            chunks, chunk, size = [], [], 0
            for p in ps:
                numel = cost(kind, p)
                if chunk and size + numel > cap:
                    chunks.append(chunk)
                    chunk, size = [], 0
                chunk.append(p)
                size += numel
            chunks.append(chunk)
            for c in chunks:
                yield kind, shape, c

    def _post_transform_groups(self, batches):
        """Transform each batch (post-transform, and the pre-clip via ``_pre_transform_groups``) with every
        matrix computed once, on its owner rank (collective: all ranks make the same calls)."""
        out = []
        for b in batches:
            fn = POST_TRANSFORMS[b["post"]]
            # the in-place variant where one exists: it overwrites the gathered matrices (or U itself on its
            # owner), which are ours to modify, with the same result as the copying one
            fn = getattr(fn, "inplace", fn)
            fn = functools.partial(fn, **b["post_kwargs"]) if fn is not None and b.get("post_kwargs") else fn
            U, params = b["U"], b["params"]
            if fn is None:
                out.append(U)
                continue
            args = (b["c"], b["steps"], b["dtype"])
            split = b.get("split")
            entry = self._local.get(id(params[0])) if params else None
            if entry is None or entry[1].kind == "replicated":
                sh = self.sharder(entry[1].group if entry is not None else None)
                out.append(sh.apply_replicated(
                    [U], lambda _b, _i, x, fn=fn, args=args, split=split: on_blocks(fn, x, split, *args))[0])
                continue
            dt, lay = entry
            gshape, lshape = tuple(dt.shape), tuple(params[0].shape)
            m, n = matrix_shape(gshape)

            def full(_b, _i, x, m=m, n=n, fn=fn, args=args, split=split):
                return on_blocks(fn, x.reshape(x.shape[0], m, n), split, *args).reshape(x.shape)

            local = U.reshape(U.shape[0], *lshape)
            if lay.kind == "blocks":  # several sharding mesh dims (FSDP2 x tensor parallel)
                y = apply_blocks(self.sharder(lay.group), [local], [gshape], [lay.blocks], full)[0]
            else:
                y = self.sharder(lay.group).apply_sharded([local], [gshape], [lay.shard_dim], full)[0]
            out.append(y.reshape(U.shape))
        return out

    def _update_scale(self, group, kind, shape, params):
        """``alpha`` from the GLOBAL matrix shape of sharded (DTensor) parameters (the local shard shape
        otherwise), so that every rank applies the single-process update."""
        entry = self._local.get(id(params[0])) if kind == "matrix" and params else None
        if entry is not None:
            shape = matrix_shape(entry[0].shape)
        return super()._update_scale(group, kind, shape, params)

    @property
    def world_size(self) -> int:
        """Ranks sharing the replicated parameters (1 without an initialized process group)."""
        return group_size_rank(self._process_group)[0]


class DistributedSpectra(ShardedSpectraMixin, Spectra):
    """:class:`~spectrakit.optim.Spectra` with the sharded post-transform (``base``/``post`` arguments as
    in ``Spectra``; extra ``process_group`` and ``replicated_exchange``, see :class:`ShardedSpectraMixin`)."""


_CACHE: dict[type, type] = {}


def sharded(optimizer_cls: type) -> type:
    """The distributed version of a :class:`~spectrakit.optim.Spectra` subclass (e.g. a preset):
    ``sharded(SpectraAdamW)(model.parameters(), lr=1e-3)``; cached, so the same class is returned for the
    same input (which keeps pickling and ``isinstance`` checks simple).

    Raises:
        TypeError: ``optimizer_cls`` is not a subclass of ``Spectra``.
    """
    if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls, Spectra)):
        raise TypeError("optimizer_cls must be a subclass of spectrakit.optim.Spectra, "
                        f"got {optimizer_cls!r}")
    if issubclass(optimizer_cls, ShardedSpectraMixin):
        return optimizer_cls
    if optimizer_cls not in _CACHE:
        _CACHE[optimizer_cls] = type(f"Sharded{optimizer_cls.__name__}", (ShardedSpectraMixin, optimizer_cls),
                                     {"__doc__": f"{optimizer_cls.__name__} with the post-transform sharded "
                                                 "across ranks (see spectrakit.optim.sharding.optimizer).",
                                      "__module__": __name__})
    return _CACHE[optimizer_cls]
