"""How a :class:`~spectrakit.optim.spectra.Spectra` step batches its parameters: by (matrix shape, dtype,
device) into work tensors no larger than a cap (about one copy of the largest parameter), the plan cached
across eager steps, the matrix transforms called once per batch (the hook a sharded subclass overrides), the
compute dtype of the transforms, and the update applied batch by batch."""

from __future__ import annotations

import functools
from itertools import product

import torch

from spectrakit.linalg.precision import bf16_matmul_fast
from spectrakit.optim.opaque import (
    traced_transforms,
)
from spectrakit.optim.transforms import (
    POST_TRANSFORMS,
    block_shape,
    matrix_shape,
    on_blocks,
    post_kwargs,
    update_scale,
    workspace_numel,
)

# Smallest min(m, n) whose batch computes in bfloat16 when ``post_dtype="bfloat16"`` (hardware bf16 matmuls):
# smaller matrices compute in the work dtype. Below it the bf16 route's extra steps and conversions cost more
# launches than its cheaper products save: measured on an H100 (2-layer LLaMA sets, 7 interleaved rounds),
# SpectraAdamW with bf16 was 1.24-1.26x slower than fp32 at d = 192..512 and 0.93x at d = 1024.
BF16_MIN_DIM = 1024


_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}
# Floor of the default batch budget (elements, 4 MiB in fp32): below it the per-batch overhead dominates
# and the extra memory is negligible, so small parameters are never split into more batches.
MIN_BATCH_NUMEL = 2**20
# The floor on CUDA (256 MiB in fp32) for the post-transforms whose temporaries are small or modelled (the
# soft clips' Gram and Newton-Schulz iterations, Muon's orthogonalisation, element-wise updates): there a
# batch costs a few hundred kernel launches (10-20 us of host time each) whatever its size, so splitting
# same-shape matrices into more batches multiplies the step time. Measured on an H100 (2-layer LLaMA sets,
# d = 512 / 1024): SpectraAdamW 40.5 / 37.0 ms with the 2^20 floor, 9.9 / 23.2 ms with this one (peak extra
# 40 / 160 MiB); Muon 10.4 / 11.8 ms against 4.5 / 4.7 ms. The other post-transforms (Frank-Wolfe
# oracles, hard clips) allocate several full-size temporaries per batch and keep the 2^20 floor.
# Parameters larger than the floor keep the largest-parameter rule, so large models keep their memory bound.
MIN_BATCH_NUMEL_CUDA = 2**26
CUDA_WIDE_BATCH_POSTS = frozenset({"none", "soft_clip", "soft_clip_fast", "soft_clip_ns", "orthogonalize",
                                   "newton_schulz5", "newton_schulz5_batched", "newton_schulz5_spectral"})
def min_batch_numel(device: torch.device, post: str = "none") -> int:
    """Floor of the default batch budget for post-transform ``post`` on ``device``:
    :data:`MIN_BATCH_NUMEL_CUDA` on CUDA for the posts of :data:`CUDA_WIDE_BATCH_POSTS`, else
    :data:`MIN_BATCH_NUMEL`."""
    wide = device.type == "cuda" and post in CUDA_WIDE_BATCH_POSTS
    return MIN_BATCH_NUMEL_CUDA if wide else MIN_BATCH_NUMEL


def _nonzero(x) -> bool:
    """``x != 0`` for a Python number; True for a tensor (its value is not read: no host sync)."""
    return True if isinstance(x, torch.Tensor) else x != 0


class BatchingMixin:
    """Batches, their transforms and their updates (a mixin of :class:`~spectrakit.optim.spectra.Spectra`)."""

    def _batches(self, group: dict):
        """Split a group's parameters with gradients into batches: (kind, shape, params).

        ``kind`` is ``"matrix"`` (ndim >= 2, same ``(m, n)`` view, dtype, device) or ``"flat"``
        (ndim < 2, same dtype and device); the :meth:`_batch_cost` of a batch (elements plus the
        post-transform's workspace) stays within ``max_batch_numel``, by default :meth:`_batch_cap`."""
        buckets: dict[tuple, list[torch.Tensor]] = {}
        for p in group["params"]:
            if p.grad is None or p.numel() == 0:
                continue
            if p.grad.is_sparse:
                raise ValueError("sparse gradients are not supported by Spectra")
            key = ("matrix", matrix_shape(p.shape)) if p.ndim >= 2 else ("flat", None)
            if key[0] == "matrix" and group["split_fused"] is not None:
                block_shape(key[1], group["split_fused"])  # a ValueError when the blocks do not tile it
            buckets.setdefault((*key, p.dtype, p.device), []).append(p)
        cap = group["max_batch_numel"]
        if cap is None:
            cap = self._batch_cap(group)
        for (kind, shape, _, _), ps in buckets.items():
            chunk, size = [], 0
            for p in ps:
                numel = self._batch_cost(group, kind, shape, p)
                if chunk and size + numel > cap:
                    yield kind, shape, chunk
                    chunk, size = [], 0
                chunk.append(p)
                size += numel
            yield kind, shape, chunk

    @staticmethod
    def _batch_cost(group: dict, kind: str, shape: tuple | None, p: torch.Tensor) -> int:
        """Elements that parameter ``p`` adds to the peak memory of its batch: its work copy plus, for a
        matrix, the workspace of the group's post-transform
        (:func:`~spectrakit.optim.transforms.workspace_numel`, e.g. the Gram matrices of the fast soft
        clip)."""
        extra = workspace_numel(group["post"], *shape) if kind == "matrix" else 0
        return p.numel() + extra

    def _batch_cap(self, group: dict) -> int:
        """Default batch budget (``max_batch_numel=None``): the largest :meth:`_batch_cost` of a single
        parameter of the group (the unavoidable peak: one copy of the largest parameter plus its
        workspace), so that no batch needs more extra memory than the largest parameter alone; at least
        :func:`min_batch_numel` of the parameters' device (small models keep their same-shape matrices in
        one batch; on CUDA up to 2^26 elements for the posts with small temporaries, where kernel launches,
        not memory, limit the step)."""
        cap = MIN_BATCH_NUMEL
        for p in group["params"]:
            if p.grad is not None and p.numel() > 0:
                cap = max(cap, min_batch_numel(p.device, group["post"]))
                kind, shape = ("matrix", matrix_shape(p.shape)) if p.ndim >= 2 else ("flat", None)
                cap = max(cap, self._batch_cost(group, kind, shape, p))
        return cap

    def _cached_plan(self, group: dict) -> list[tuple]:
        """:meth:`_plan` of the group, kept across eager steps while what it depends on is unchanged: the
        identity, shape, dtype and device of every parameter, whether it has a gradient, and the
        hyperparameters that batch them (``post``, ``scale``, ``vector_clip``, ``pre_c``, ``max_batch_numel``).
        Building the plan walks the parameters in Python several times (a quarter of a small model's
        multi-tensor step, measured on CPU); comparing this key costs one pass.

        Returns ``(plan, works)``: ``works`` is a dict (batch index -> work tensor and its views, filled by
        the step) when the group's parameters hold at most :data:`MIN_BATCH_NUMEL` elements in all, so that a
        small model's step allocates and slices no work tensor (4 MiB in fp32 at most, kept with the plan),
        else None. While ``torch.compile`` traces the step: the plan computed afresh (constants of the graph)
        and no kept tensor."""
        if torch.compiler.is_compiling():
            return self._plan(group), None
        key = (group["post"], group["scale"], group["vector_clip"], group["pre_c"], group["max_batch_numel"],
               group["split_fused"],
               tuple((id(p), p.shape, p.dtype, p.device, p.grad is None) for p in group["params"]))
        slot = ("plan", id(group))
        hit = self._scratch_bufs.get(slot)
        if hit is None or hit[0] != key:
            if hit is None:  # a new group (load_state_dict makes new group dicts): drop the plans of the old ones
                live = {id(g) for g in self.param_groups}
                for old in [k for k in self._scratch_bufs if k[0] == "plan" and k[1] not in live]:
                    del self._scratch_bufs[old]
            plan = self._plan(group)
            small = sum(p.numel() for batch in plan for p in batch[2]) <= MIN_BATCH_NUMEL
            hit = self._scratch_bufs[slot] = (key, plan, {} if small else None)
        return hit[1], hit[2]

    def _plan(self, group: dict) -> list[tuple]:
        """The batches of one step: ``(kind, shape, params, alpha)`` for each batch of :meth:`_batches`,
        ``alpha`` from :meth:`_update_scale`. When the group's update is element-wise (``post="none"``, no
        ``vector_clip``, no ``pre_c``), the batches of one (dtype, device, alpha) are merged into ``"flat"``
        batches of at most ``max_batch_numel`` elements (default: :meth:`_batch_cap`, on CUDA at least
        2^26), in order: the same arithmetic per element, and a number of ops per step that does not grow
        with the number of distinct shapes (each batch issues ~20 ops, which bound a small model's step on a
        GPU by the host). A flat batch applies per-parameter factors (AdamW's bias corrections) as one
        ``torch._foreach_mul_`` over a list of 0-d tensors, as ``torch.optim.AdamW(foreach=True,
        capturable=True)`` does."""
        plan = [(kind, shape, ps, self._update_scale(group, kind, shape, ps))
                for kind, shape, ps in self._batches(group)]
        if (POST_TRANSFORMS[group["post"]] is not None or group["vector_clip"] or group["pre_c"] is not None
                or len(plan) < 2):
            return plan
        cap = group["max_batch_numel"]
        if cap is None:
            cap = self._batch_cap(group)
        out, flat = [], {}
        for batch in plan:
            ps, alpha = batch[2], batch[3]
            key = (ps[0].dtype, ps[0].device, alpha)
            for p in ps:
                cur = flat.get(key)
                if cur is None or (cur[1] and cur[1] + p.numel() > cap):
                    cur = flat[key] = [("flat", None, [], alpha), 0]
                    out.append(cur[0])
                cur[0][2].append(p)
                cur[1] += p.numel()
        return out

    def _post_transform_groups(self, batches: list[dict]) -> list[torch.Tensor]:
        """Transform stacked matrix batches: one call of the named transform per batch.

        Each batch is a dict with ``U`` (work dtype, ``(B, m, n)``), ``params`` (the ``B`` parameters whose
        directions ``U`` stacks, in order), ``stage`` (``"pre"`` or ``"post"``), ``post`` (the transform
        name, a key of ``POST_TRANSFORMS``; the group's ``pre`` name for the pre-clip), ``c`` (float
        threshold; a 0-d float64 CPU tensor in a step traced by ``torch.compile`` during a step-dependent clip
        schedule, :meth:`_clip_thresholds`), ``steps`` (iteration count or None), ``dtype`` (compute dtype
        or None) and ``split`` (optional: the group's ``split_fused``, each block transformed as a matrix of its
        own, :func:`~spectrakit.optim.transforms.on_blocks`). Returns the transformed batches (same shapes;
        may be ``U`` itself, overwritten: ``"none"``
        and the in-place variant ``fn.inplace`` of a transform, used when present, e.g. the fast soft clip).
        This is the step a distributed subclass overrides (split each batch by owner rank, transform the own
        slice, exchange)."""
        if torch.compiler.is_compiling():  # opaque operator calls, one per run of alike batches
            return traced_transforms(batches)
        out = []
        for b in batches:
            fn = POST_TRANSFORMS[b["post"]]
            fn = getattr(fn, "inplace", fn)  # the in-place variant where one exists (may overwrite U)
            fn = functools.partial(fn, **b["post_kwargs"]) if fn is not None and b.get("post_kwargs") else fn
            out.append(b["U"] if fn is None else on_blocks(fn, b["U"], b.get("split"), b["c"], b["steps"], b["dtype"]))
        return out

    def _pre_transform_groups(self, batches: list[dict]) -> list[torch.Tensor]:
        """Pre-clip the stacked raw-gradient batches (``pre_c`` set; ``stage == "pre"``, same dict format as
        :meth:`_post_transform_groups`). By default it delegates to :meth:`_post_transform_groups`, so a
        subclass that overrides that hook (e.g. the distributed one) handles the pre-clip the same way;
        override this method to treat the two stages differently."""
        return self._post_transform_groups(batches)

    def _update_scale(self, group: dict, kind: str, shape: tuple | None, params: list[torch.Tensor]) -> float:
        """``alpha`` of one batch: ``update_scale(scale, post, m, n)`` for a ``"matrix"`` batch of
        matrix shape ``shape = (m, n)`` (:func:`~spectrakit.optim.transforms.update_scale`; of one block
        with ``split_fused``), the numeric
        ``scale`` or 1 for a ``"flat"`` batch. A subclass whose ``params`` are shards of larger tensors
        overrides it to use the global shape."""
        if kind == "matrix":
            return update_scale(group["scale"], group["post"], *block_shape(shape, group["split_fused"]))
        return group["scale"] if not isinstance(group["scale"], str) else 1.0

    def _warm_transforms(self, group: dict, device: torch.device, dtype: torch.dtype) -> None:
        """Run the group's matrix post-/pre-transforms once on a small matrix of the work ``dtype`` on
        ``device`` (once per optimizer and setting): the iterative transforms compute their coefficient tables
        on the host at their first call and cache them, and a first call traced by ``torch.compile`` would
        break its graph there (a host read of a tensor value)."""
        post_dtype = self._compute_dtype(group, device)
        dtypes = [post_dtype]
        if post_dtype == torch.bfloat16 and not self.exact_bf16:
            dtypes.append(None)  # matrices below BF16_MIN_DIM compute in the work dtype
        stages = [(group["post"], post_kwargs(group, group["post"]))]
        if group["pre_c"] is not None:
            stages.append((group["pre"], {}))
        warmed = self._warmed
        for (name, kwargs), post_dtype in product(stages, dtypes):
            fn = POST_TRANSFORMS[name]
            key = (name, tuple(sorted(kwargs.items())), group["post_steps"], post_dtype, str(device), dtype)
            if fn is None or key in warmed:
                continue
            warmed.add(key)
            x = torch.linspace(-1.0, 1.0, 6, dtype=dtype, device=device).reshape(1, 2, 3)
            for u in (x, x.mT.contiguous()):
                fn(u, 1.0, group["post_steps"], post_dtype, **kwargs)  # the tables do not depend on c (inf: off)

    def _compute_dtype(self, group: dict, device: torch.device, shape: tuple | None = None) -> torch.dtype | None:
        """Compute dtype of the group's iterative transforms on ``device``: ``post_dtype``, except that
        bfloat16 falls back to the work dtype (None) where bf16 matmuls are emulated, or for a matrix batch of
        ``shape`` ``(m, n)`` with ``min(m, n) <`` :data:`BF16_MIN_DIM`, unless the preset keeps published bf16
        arithmetic (``exact_bf16``)."""
        post_dtype = None if group["post_dtype"] is None else _DTYPES[group["post_dtype"]]
        if post_dtype == torch.bfloat16 and not self.exact_bf16:
            if not bf16_matmul_fast(device) or (shape is not None and min(shape) < BF16_MIN_DIM):
                return None
        return post_dtype

    def _scratch(self, numel: int, dtype: torch.dtype, device: torch.device, slot: str = "tmp") -> torch.Tensor:
        """A 1-D buffer of at least ``numel`` elements, kept across steps (not in ``state_dict``), one per
        ``slot``, dtype and device: ``"tmp"``, the temporaries of the per-tensor bodies (:meth:`Work.scratch`,
        Lion's interpolation; at most one parameter's size), and ``"work"``, the work tensor of a CPU step's
        batches (at most the largest batch: the peak the step needs anyway). Allocating them afresh each step
        costs page faults on CPU. While ``torch.compile`` traces the step, a fresh tensor instead: a graph that read
        a buffer kept on the optimizer would be guarded on it (a recompile at the next call)."""
        if torch.compiler.is_compiling():
            return torch.empty(numel, dtype=dtype, device=device)
        cache = self._scratch_bufs
        key = (slot, dtype, str(device))
        buf = cache.get(key)
        if buf is None or buf.numel() < numel:
            buf = cache[key] = None  # the smaller one freed first (no peak of both)
            buf = cache[key] = torch.empty(numel, dtype=dtype, device=device)
        return buf

    def _finish_matrix_batch(self, params, upd, lr_wd, ok_d, scale, per_tensor: bool, fin=None) -> None:
        """Steps (3)-(4) after a matrix batch's post-transform ``upd`` (``(B, m, n)``, ours to modify): a
        non-finite update (a post-transform that broke down) is not applied (this batch's parameters keep their
        values and the step counts as skipped, no host read), else ``p <- (1 - lr wd ok) p + scale * upd``.
        ``fin``: None, or ``upd``'s finiteness as a 0-d bool tensor already found (its non-finite entries
        zeroed), as :meth:`_finite_` does."""
        fin = self._finite_(upd) if fin is None else fin.to(upd.dtype)
        self._post_flags.append(fin)
        ok_d, scale = ok_d * fin, scale * fin
        deltas = [d.view(p.shape) for d, p in zip(upd.unbind(0), params)]
        self._apply_update(params, deltas, lr_wd, ok_d, scale, per_tensor, upd)

    @staticmethod
    def _apply_update(params, deltas, lr_wd: float, ok: torch.Tensor, scale, per_tensor: bool, upd) -> None:
        """``p <- (1 - lr wd ok) p + scale * delta`` for every parameter (``scale``: None or a 0-d tensor;
        ``upd``: the tensor that ``deltas`` view, ours to modify): scale, decay, then add (three roundings,
        in this order on every path; a fused ``addcmul`` would round differently on some CPUs). On CPU
        tensor by tensor, so that each delta and parameter stays in cache for the three operations."""
        decay = 1 - lr_wd * ok if _nonzero(lr_wd) else None
        if per_tensor:
            for p, d in zip(params, deltas):
                if scale is not None:
                    d.mul_(scale)
                if decay is not None:
                    p.mul_(decay)
                p.add_(d)
            return
        if scale is not None:
            if upd is None:  # traced: separate work tensors
                torch._foreach_mul_(deltas, scale)
            else:
                upd.mul_(scale)
        if decay is not None:
            torch._foreach_mul_(params, decay)
        torch._foreach_add_(params, deltas)
