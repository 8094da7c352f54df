"""The matrix post-/pre-transforms as one opaque operator call per batch in a ``torch.compile``-d step."""

# Traced by ``torch.compile``, a transform of :data:`~spectrakit.optim.transforms.POST_TRANSFORMS` (the soft
# clip's Polar-Express iteration on ``U U^T + c^2 I``, Jiang, Semenov and Stich 2026 §5.1; the accurate
# route's 3 tall + 6 Gram steps; the hard cap; Newton-Schulz, Jordan et al. 2024; the regularised
# Frank-Wolfe posts, §3.1) unrolls into every iteration's matmuls and element-wise operations, for every
# (shape, dtype) batch, and inductor generates and compiles code for each: the first compile of
# ``SpectraAdamW`` took 7.7x torch AdamW's on a CPU, 8.7x on an H100, and a matmul-bound iteration gains
# nothing from the generated code. Under ``torch.compile`` the optimizer therefore calls the transforms of a
# param group's matrix batches as one operator, ``torch.ops.spectrakit.post_transform_(Us, name, c, steps,
# dtype, regularizer, b, p)`` (``Us``: the list of batches), defined with :class:`torch.library.Library` (as
# :mod:`spectrakit.optim.fused`): it overwrites each batch with its transform (``Tensor(a!)[]``), its kernel the
# eager function itself (the in-place variant ``fn.inplace`` on the batch, the call the eager step makes on its
# contiguous work tensor; a non-contiguous batch through a contiguous copy), so that the compiled step gives the
# eager numbers bit for bit; its fake kernel computes nothing. Functionalization turns the call into one on copies
# of the batches, and inductor's re-inplacing removes those copies where a batch is not read afterwards (the
# traced step's stacked directions are not): no second copy of the group's matrices (an operator returning new
# tensors held the inputs and its outputs at once, and the compiled step page-faulted both in on a CPU). The traced
# step makes every batch's direction first, then this one call, then every batch's update
# (``Spectra._step_group``): each operator call is a fusion barrier, and each stretch of element-wise code between
# two barriers one more generated kernel to compile (on a CPU, one compiler run each). The price: the work tensors
# of all the group's matrix batches are alive at once in the compiled step (one copy of the group's matrices),
# where the eager step holds one batch's.
#
# The arguments are those of a transform call: ``c`` a Python float (the clip threshold, constant without a
# step-dependent clip schedule), ``steps`` and ``dtype`` fixed per group, ``regularizer``/``b``/``p`` the group's
# Frank-Wolfe options (ignored by the other transforms). During a clip schedule's warm-up or decay the threshold
# ``c_k`` changes every step: the overload ``post_transform_.scheduled`` takes it as a 0-d float64 CPU tensor
# (read by the kernel, which runs eagerly: no graph break, no recompile), made by a second operator,
# ``torch.ops.spectrakit.clip_threshold(steps_taken, lr, ...)``, whose kernel evaluates
# :func:`~spectrakit.optim.schedules.clip_threshold` on the group's step counter (a 0-d int64 CPU tensor) and
# ``lr`` (a tensor ``lr`` is read during the warm-up only, as the eager step does), so that the traced step's
# threshold is the eager step's bit for bit. An infinite threshold (no clip) makes the transform the identity.
#
# The non-finite check is a third operator, ``torch.ops.spectrakit.grads_within(grads, bound, per_tensor)``:
# ``max_i ||g_i||_inf <= bound`` by torch's multi-tensor inf-norm kernel (one launch for the list on a GPU), or on
# the CPU's path by each gradient's ``aminmax`` (the eager check). Traced as ``torch._foreach_norm``, inductor
# generated one reduction kernel per gradient (a plain AdamW step on an H100: 24 kernels and a 52 s first compile,
# torch AdamW's 10 s), and traced as one ``amax`` per gradient on the CPU one kernel each too (plain AdamW: 23
# kernels, a compiled step 1.13x its eager one); as an operator call it compiles none. For the same reason two
# more reductions of the step are operator calls: ``torch.ops.spectrakit.finite_(xs)`` checks a matrix batch's
# transformed update and zeroes its non-finite entries in place (the eager ``aminmax`` and ``nan_to_num``; traced
# as ``amax`` and ``where``, a reduction kernel per matrix batch), and ``torch.ops.spectrakit.norms(xs)`` gives the
# Frobenius norms of a list (torch's multi-tensor norm kernel: MARS's per-parameter clip, the vector clip; traced,
# a reduction kernel per tensor). Both also give the compiled step the eager step's numbers.
#
# The step counter of each param group (``steps_taken``, a 0-d int64 CPU tensor: the clip schedules read it on the
# host without a device sync) is advanced by a fourth, ``torch.ops.spectrakit.count_step_(counter)``
# (``counter <- counter + 1`` in place). Traced as ``+= 1``, inductor generated a C++ kernel for it, the only CPU
# code of a step on a GPU, and that one kernel cost ~45 s of a cold first compile on an H100 (inductor probes the
# host's vector instruction sets by compiling test programs, then compiles the kernel): 58.6 s for a plain AdamW
# step there, against torch AdamW's 11.9 s; an operator call compiles nothing.

from __future__ import annotations

import functools
import math
import threading

import torch

from spectrakit.optim.fused import number_tensor
from spectrakit.optim.joint import stack_scalars
from spectrakit.optim.schedules import clip_threshold
from spectrakit.optim.transforms import LMO_POSTS, POST_TRANSFORMS, check_split, on_blocks

_SCRATCH = threading.local()  # per-thread scratch of the checks (_aminmax_out)


def _alias(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and a.numel() > 0


def _one_(U: torch.Tensor, name: str, c: float, steps: int | None, dtype: torch.dtype | None,
          kwargs: dict, split=None) -> None:
    """Overwrite the batch ``U`` with its transform, by the eager step's own call: the in-place variant
    ``fn.inplace`` where one exists, on ``U`` itself when it is contiguous (the eager step's work tensor is), else
    on a contiguous copy written back; ``split``: per block (:func:`~spectrakit.optim.transforms.on_blocks`)."""
    fn = POST_TRANSFORMS[name] if c != math.inf else None  # c = inf: no clip (as the eager step)
    if fn is None:
        return
    x = U if U.is_contiguous() else U.contiguous()
    out = on_blocks(functools.partial(getattr(fn, "inplace", fn), **kwargs), x, split, c, steps, dtype)
    if out is U or (out.data_ptr() == U.data_ptr() and out.stride() == U.stride()):  # U itself, overwritten
        return
    U.copy_(out.clone() if _alias(out, U) else out)  # a new tensor, the copy, or an overlapping view of U


def _post_transform_(U: list[torch.Tensor], name: str, c: float, steps: int | None, dtype: torch.dtype | None,
                     regularizer: str, b: float, p: float | None, split: list[int]) -> None:
    """The kernel: each batch of ``U`` overwritten with its transform ``name`` (per block, ``split = [r, c]``)."""
    kwargs = {"regularizer": regularizer, "b": b, "p": p} if name in LMO_POSTS else {}
    for u in U:
        _one_(u, name, c, steps, dtype, kwargs, tuple(split))


def _post_transform_scheduled_(U: list[torch.Tensor], name: str, c: torch.Tensor, steps: int | None,
                               dtype: torch.dtype | None, regularizer: str, b: float, p: float | None,
                               split: list[int]) -> None:
    """The kernel with the threshold as a 0-d CPU tensor (read on the host: no device sync)."""
    _post_transform_(U, name, float(c), steps, dtype, regularizer, b, p, split)


def _threshold(steps_taken: torch.Tensor, lr: torch.Tensor, c: float, peak_lr: float, warmup_steps: int, warmup: str,
               decay: str | None, decay_start: float, total_steps: int | None, final_scale: float) -> torch.Tensor:
    """The kernel: ``clip_threshold(c, k, lr_k, ...)`` as a 0-d float64 CPU tensor, ``k = int(steps_taken)``,
    ``lr_k = float(lr)`` read during the warm-up only (as the eager step reads a tensor ``lr``)."""
    k = int(steps_taken)
    lr_k = float(lr) if k < warmup_steps else 0.0  # (not used after the warm-up)
    schedule = {"warmup": warmup, "decay": decay, "decay_start": decay_start, "total_steps": total_steps,
                "final_scale": final_scale}
    return torch.tensor(clip_threshold(c, k, lr_k, peak_lr, warmup_steps, schedule), dtype=torch.float64)


def _threshold_fake(steps_taken, lr, c, peak_lr, warmup_steps, warmup, decay, decay_start, total_steps,
                    final_scale):
    return torch.empty((), dtype=torch.float64, device=steps_taken.device)


def _aminmax_out(n: int, dtype: torch.dtype, device: torch.device) -> tuple:
    """A ``(2, n)`` buffer of ``dtype`` on ``device`` and its 0-d ``(min, max)`` views, column by column: the
    ``out=`` of :func:`aminmax_within`, kept across calls (one per thread, shape, dtype and device; 2n numbers).
    Writing there instead of stacking 2n fresh 0-d results, and making the views once, saves ~60 us per check of
    21 gradients (measured on a CPU core), in the eager step and in the kernel of a compiled step's
    ``spectrakit::grads_within`` alike."""
    cache = getattr(_SCRATCH, "aminmax", None)
    if cache is None:
        cache = _SCRATCH.aminmax = {}
    key = (n, dtype, device)
    out = cache.get(key)
    if out is None:  # a normal tensor even under inference mode (an inference tensor is read-only outside it)
        with torch.inference_mode(False):
            buf = torch.empty((2, n), dtype=dtype, device=device)
            out = cache[key] = (buf, [(buf[0, i], buf[1, i]) for i in range(n)])
    return out


def aminmax_within(grads: list[torch.Tensor], bound: float) -> torch.Tensor:
    """0-d bool tensor: every entry of ``grads`` is finite and ``|g| <= bound``, from each gradient's ``aminmax``
    (its min and max are finite and within the bound iff every entry is: NaN propagates, +-inf is the max/min;
    on a CPU about 10x faster than the unvectorised inf-norm), written into a buffer kept across calls
    (:func:`_aminmax_out`)."""
    return all_within(_extremes(grads), bound)


def aminmax_within_host(grads: list[torch.Tensor], bound: float) -> bool:
    """:func:`aminmax_within`'s verdict as a Python bool, for CPU gradients: the ``2n`` extremes are read with one
    ``tolist()`` and compared in Python with the bound rounded to their dtype (where it rounds to inf, float16,
    with ``isfinite``), as the tensor comparison does; no operation on 0-d tensors after the reductions."""
    ext = _extremes(grads)
    b, values = _bound_in(ext.dtype, bound), ext.view(-1).tolist()
    if b == math.inf:
        return all(map(math.isfinite, values))
    return all(-b <= x <= b for x in values)  # (false for NaN)


def _extremes(grads: list[torch.Tensor]) -> torch.Tensor:
    """The ``(min, max)`` of every gradient: the kept ``(2, n)`` buffer of their dtype, or for gradients of several
    dtypes a new float64 tensor of the ``2n`` values."""
    dtype = grads[0].dtype
    if any(g.dtype is not dtype for g in grads):
        return torch.stack([x.double() for g in grads for x in torch.aminmax(g)])
    buf, views = _aminmax_out(len(grads), dtype, grads[0].device)
    for g, lo_hi in zip(grads, views):
        torch.aminmax(g, out=lo_hi)
    return buf


@functools.cache
def _bound_in(dtype: torch.dtype, bound: float) -> float:
    """``bound`` rounded to ``dtype`` (what a comparison of a ``dtype`` tensor with the number uses), from a CPU
    tensor: for the host's verdict only."""
    return torch.tensor(bound, dtype=dtype).item()


def all_within(x: torch.Tensor, bound: float) -> torch.Tensor:
    """0-d bool tensor: every entry of ``x`` is finite and ``|x| <= bound``, compared in ``x``'s dtype. Where
    ``bound`` exceeds the dtype's largest finite value (float16: 65504 < 1e18), it rounds to inf there and
    ``inf <= inf`` would pass an infinite entry; every finite entry is then within the bound, so the test is
    ``isfinite``."""
    if torch.finfo(x.dtype).max < bound:
        return torch.isfinite(x).all()
    return (x.abs() <= bound).all()


def grads_within(grads: list[torch.Tensor], bound: float, per_tensor: bool = False) -> torch.Tensor:
    """0-d bool tensor: ``max_i ||g_i||_inf <= bound`` (a NaN entry fails the comparison) for gradients on one
    device; the kernel of ``torch.ops.spectrakit.grads_within``. ``per_tensor`` (the CPU's code path):
    :func:`aminmax_within`; else torch's multi-tensor inf-norm kernel (one launch for the list on a GPU)."""
    if per_tensor:
        return aminmax_within(grads, bound)
    return all_within(stack_scalars(torch._foreach_norm(grads, float("inf"))), bound)


def count_step(counter: torch.Tensor) -> None:
    """``counter <- counter + 1`` in place: the kernel of ``torch.ops.spectrakit.count_step_``."""
    counter.add_(1)


def norms(xs: list[torch.Tensor]) -> torch.Tensor:
    """``(len(xs),)`` tensor of the Frobenius norms ``||x_i||_F`` (``xs``: one dtype and device), by torch's
    multi-tensor norm kernel (one launch on a GPU): the kernel of ``torch.ops.spectrakit.norms``."""
    return stack_scalars(torch._foreach_norm(xs))


def _norms_fake(xs):
    return torch.empty(len(xs), dtype=xs[0].dtype, device=xs[0].device)


def foreach_norms(xs: list[torch.Tensor]) -> torch.Tensor:
    """:func:`norms` of ``xs``; while ``torch.compile`` traces, one call of ``torch.ops.spectrakit.norms`` with
    the same kernel (traced as ``torch._foreach_norm``, inductor generates a reduction kernel per tensor to
    compile, and its sums may round unlike the eager kernel's)."""
    return (norms_op if torch.compiler.is_compiling() else norms)(xs)


def _extremes_then_zero_(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(min(x), max(x))`` (0-d; zeros for an empty ``x``), then ``x``'s non-finite entries set to 0 in place."""
    if not x.numel():  # (aminmax has no empty reduction) finite
        return x.new_zeros(()), x.new_zeros(())
    ends = torch.aminmax(x)
    torch.nan_to_num_(x, nan=0.0, posinf=0.0, neginf=0.0)
    return ends


def finite_one_(x: torch.Tensor) -> torch.Tensor:
    """0-d bool tensor: every entry of ``x`` is finite (from ``aminmax``: NaN propagates, +-inf is the min/max);
    then ``x``'s non-finite entries are set to 0 in place (``nan_to_num``). Two passes over ``x``, no host read."""
    lo, hi = _extremes_then_zero_(x)
    return torch.isfinite(lo) & torch.isfinite(hi)


def finite_(xs: list[torch.Tensor]) -> torch.Tensor:
    """``(len(xs),)`` bool tensor, entry ``i`` the :func:`finite_one_` flag of ``xs[i]``, whose non-finite entries
    become 0: the kernel of ``torch.ops.spectrakit.finite_`` (the matrix batches' transformed updates of a traced
    step). One ``aminmax`` and one ``nan_to_num_`` per tensor, then one finiteness test of all the extremes."""
    ends = [e for x in xs for e in _extremes_then_zero_(x)]
    if any(e.dtype != ends[0].dtype for e in ends):
        ends = [e.double() for e in ends]
    return torch.isfinite(torch.stack(ends)).view(len(xs), 2).all(1)


def _finite_fake(xs):
    return torch.empty(len(xs), dtype=torch.bool, device=xs[0].device)


def _grads_within_fake(grads, bound, per_tensor=False):
    return torch.empty((), dtype=torch.bool, device=grads[0].device)


_LIB = torch.library.Library("spectrakit", "FRAGMENT")
_LIB.define("grads_within(Tensor[] grads, float bound, bool per_tensor=False) -> Tensor")
_LIB.impl("grads_within", grads_within, "CompositeExplicitAutograd")
torch.library.register_fake("spectrakit::grads_within", _grads_within_fake, lib=_LIB)
grads_within_op = torch.ops.spectrakit.grads_within.default
_LIB.define("norms(Tensor[] xs) -> Tensor")
_LIB.impl("norms", norms, "CompositeExplicitAutograd")
torch.library.register_fake("spectrakit::norms", _norms_fake, lib=_LIB)
norms_op = torch.ops.spectrakit.norms.default
_LIB.define("finite_(Tensor(a!)[] xs) -> Tensor")
_LIB.impl("finite_", finite_, "CompositeExplicitAutograd")
torch.library.register_fake("spectrakit::finite_", _finite_fake, lib=_LIB)
finite_op = torch.ops.spectrakit.finite_.default
_LIB.define("count_step_(Tensor(a!) counter) -> ()")
_LIB.impl("count_step_", count_step, "CompositeExplicitAutograd")
torch.library.register_fake("spectrakit::count_step_", lambda counter: None, lib=_LIB)
count_step_op = torch.ops.spectrakit.count_step_.default
_ARGS = "int? steps, ScalarType? dtype, str regularizer, float b, float? p, int[] split) -> ()"
_LIB.define(f"post_transform_(Tensor(a!)[] U, str name, float c, {_ARGS}")
_LIB.define(f"post_transform_.scheduled(Tensor(a!)[] U, str name, Tensor c, {_ARGS}")
_LIB.impl("post_transform_", _post_transform_, "CompositeExplicitAutograd")
_LIB.impl("post_transform_.scheduled", _post_transform_scheduled_, "CompositeExplicitAutograd")
torch.library.register_fake("spectrakit::post_transform_", lambda U, *args: None, lib=_LIB)
torch.library.register_fake("spectrakit::post_transform_.scheduled", lambda U, *args: None, lib=_LIB)
_LIB.define("clip_threshold(Tensor steps_taken, Tensor lr, float c, float peak_lr, "
            "int warmup_steps, str warmup, str? decay, float decay_start, int? total_steps, float final_scale) "
            "-> Tensor")
_LIB.impl("clip_threshold", _threshold, "CompositeExplicitAutograd")
torch.library.register_fake("spectrakit::clip_threshold", _threshold_fake, lib=_LIB)
post_transform_op = torch.ops.spectrakit.post_transform_.default
scheduled_post_transform_op = torch.ops.spectrakit.post_transform_.scheduled
clip_threshold_op = torch.ops.spectrakit.clip_threshold.default


def reads_step(schedule: dict, warmup_steps: int) -> bool:
    """Whether a clip ``schedule`` depends on the step index: an ``inverse_lr`` warm-up with ``warmup_steps > 0``,
    or a decay (else ``c_k = c`` at every step)."""
    return (schedule["warmup"] == "inverse_lr" and warmup_steps > 0) or schedule["decay"] is not None


def traced_threshold(c: float, group: dict, schedule: dict) -> torch.Tensor:
    """The threshold ``c_k`` of a step-dependent ``schedule`` (:func:`reads_step`) of the param ``group`` as a
    0-d float64 CPU tensor, for a step traced by ``torch.compile``: one call of
    ``torch.ops.spectrakit.clip_threshold`` on the group's ``steps_taken`` and ``lr`` (no host read of either in
    the traced code: no graph break, and no guard on their values; a Python-number ``lr`` enters as a float64
    tensor of its exact value, so that a symbolic ``lr`` is not specialised either)."""
    lr = group["lr"]
    lr = lr.detach() if isinstance(lr, torch.Tensor) else number_tensor(lr)
    total = schedule["total_steps"]
    return clip_threshold_op(group["steps_taken"], lr, float(c),
                             float(group["peak_lr"]), int(group["warmup_steps"]), schedule["warmup"],
                             schedule["decay"], float(schedule["decay_start"]), None if total is None else int(total),
                             float(schedule["final_scale"]))


def _key(batch: dict) -> tuple:
    """The arguments of a batch's call but the threshold (compared by :func:`_same_c`)."""
    kw = batch.get("post_kwargs") or {}
    return (batch["post"], batch["steps"], batch["dtype"], str(kw.get("regularizer", "frobenius")),
            float(kw.get("b", 1.0)), None if kw.get("p") is None else float(kw["p"]),
            list(check_split(batch.get("split"))))


def _same_c(a, b) -> bool:
    """Same threshold: the same tensor (a scheduled ``c_k``: one per group and step), or equal numbers."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    return float(a) == float(b)


def traced_transforms(batches: list[dict]) -> list[torch.Tensor]:
    """The transforms of ``batches`` (the dicts of ``Spectra._post_transform_groups``: ``U``, ``post``, ``c``,
    ``steps``, ``dtype``, ``post_kwargs``) as calls of ``torch.ops.spectrakit.post_transform_``, one per run of
    consecutive batches with the same transform and arguments (for a step traced by ``torch.compile``), each
    overwriting its batches; returns the batches ``U`` themselves (an identity, ``post="none"``, calls nothing).
    A tensor ``c`` (a scheduled threshold, :func:`traced_threshold`) goes to the ``scheduled`` overload."""
    i = 0
    while i < len(batches):
        key, c = _key(batches[i]), batches[i]["c"]
        j = i + 1
        while j < len(batches) and _key(batches[j]) == key and _same_c(batches[j]["c"], c):
            j += 1
        if POST_TRANSFORMS[key[0]] is not None:
            Us = [b["U"] for b in batches[i:j]]
            if isinstance(c, torch.Tensor):
                scheduled_post_transform_op(Us, key[0], c, *key[1:])
            else:
                post_transform_op(Us, key[0], float(c), *key[1:])
        i = j
    return [b["U"] for b in batches]
