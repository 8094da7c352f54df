"""The SPECTRA update pipeline as one ``torch.optim.Optimizer`` (Jiang, Semenov and Stich 2026 Alg. 2).

For every parameter ``X`` with a gradient ``g`` (matrices: ndim >= 2, conv kernels viewed as
``(out, in*k*k)``):

.. code-block:: text

    g  <- pre(g, c_pre_k)                 if pre_c is set          (Alg. 2 line 5, off by default)
    U  <- base.direction(g, state)        AdamW / Signum / SGD-M / AdEMAMix / MARS / Lion
    X  <- (1 - lr_k wd) X - lr_k * alpha * post(U, c_k)            (Alg. 2 line 11)

Implementation of one ``step()`` (no host-device synchronisation anywhere):

0. a plain AdamW/SGD group (``post="none"``, alpha = 1; CPU float32/float64 or CUDA float32 tensors; a number
   ``lr`` or a 0-d tensor on the CPU or the parameters' device) is stepped by torch's fused kernel instead of
   steps 2-5 (:mod:`spectrakit.optim.fused`; ``torch_kernel=False`` turns this off), with the flag of step 1
   as its ``found_inf``; under ``torch.compile`` through an operator that calls the same kernel (one graph, the
   eager numbers); a group with ``check_finite=False`` is left out of step 1 (its gradients are not read,
   its step is not skipped for them);
1. one fused non-finite check over all gradients gives a 0-d flag ``ok`` (``_foreach_norm(inf)``, one
   kernel, on CUDA; per-tensor ``aminmax`` on CPU, where the inf-norm is ~10x slower; traced by
   ``torch.compile``, one call of an operator running the same check, see :meth:`Spectra._device_finite`);
2. per param group, parameters are batched by (matrix shape, dtype, device) (1-D/0-d parameters of a
   group form one flat batch; with an element-wise update, ``post="none"``, the batches of one dtype,
   device and ``alpha`` form one flat batch, so that a step issues the same ops however many shapes the
   model has, see :meth:`Spectra._plan`; the plan, and a small group's work tensors, are kept across
   eager steps, :meth:`Spectra._cached_plan`); the gradients of a batch are copied into
   ONE work tensor (fp32 for bf16/fp16 parameters, else the parameter dtype) (stacked ``(B, m, n)`` or
   concatenated), all zeros on a skipped step (``where(out=)`` on CPU) or, for a base that never squares
   it (``squares = False``: Signum, SGD, Lion, EMA), with only its non-finite entries zeroed (one
   ``nan_to_num(out=)`` pass, the cost of a copy);
3. the base direction updates the fp32 states and overwrites the work tensor with ``U`` (see
   :mod:`spectrakit.optim.bases`; for an identity post-transform it also applies ``-lr alpha ok``). On CPU
   a chaining base (AdamW) runs the whole element-wise pipeline tensor by tensor (grad copy, moments,
   direction and, for ``post="none"``, the parameter update of step 5), so each tensor stays in cache
   (:class:`~spectrakit.optim.bases.Work`). While ``torch.compile`` traces the step, every device takes the
   multi-tensor form over one work tensor per parameter instead (:func:`_traced_foreach`);
4. :meth:`Spectra._post_transform_groups` post-transforms the stacked batches, one call per batch
   (a distributed subclass overrides this method to shard each batch across ranks; not called for
   ``post="none"``); the matrix pre-clip (``pre_c``) goes through :meth:`Spectra._pre_transform_groups`,
   which delegates to the same hook;
5. ``p <- p * (1 - lr wd ok) + (-lr alpha ok) * post(U)`` with two ``_foreach`` calls, ``alpha`` from
   :meth:`Spectra._update_scale` (overridable: a sharded subclass uses the global shape).

Outside the fused route of step 0 (which gives torch's fused numbers), every step is bit-identical to the
plain sequence (copy, zero non-finite entries, base direction with
``torch._foreach_*``, transform, scale, decay, add): the CPU shortcuts only remove copies, dispatches and
memory traffic, never reorder floating-point operations (tests/optim/test_step_paths.py). Reordering them
(e.g. ``m / (sqrt(v) + eps sqrt(bc2))`` for Adam, or a fused ``addcmul`` update) would save 2-4 more
passes but changes the last bits, which the FSDP2-vs-single-process Muon training test
(tests/train/test_parallel.py) amplifies beyond its tolerance.

Non-finite gradient policy: if ANY gradient of the step contains inf/nan, the whole step is a no-op
(parameters, moments and per-parameter ``step`` counters unchanged) and every group's
``skipped_steps`` (0-d int64 tensor, saved in ``state_dict``) grows by one. This is decided by tensor
arithmetic (``ok`` multiplies every state/parameter update), never by a Python ``if`` on a tensor of a
device: only an eager step whose gradients, norm and learning rates are CPU tensors or numbers (where a read
waits for nothing) reads the verdict as a Python bool, and the fused route then calls torch's kernel without
``found_inf`` or not at all (:meth:`Spectra._flags_on_host`; the same numbers, tests/optim/test_host_flag.py).
Non-finite entries of ``p.grad`` are not modified; the copies in the work tensor are zeroed. Given
``step(grad_norm=...)`` (a norm of the gradients, e.g. what ``clip_grad_norm_`` returned), the decision is
taken from it instead of a pass over the gradients: a NaN or infinite norm, or one above the bound below.
Overflow: a step whose gradients have an entry above ``GRAD_BOUND = 1e18`` in magnitude is skipped and
counted the same way. Below the bound no base can overflow: second moments are at most ``1e36`` (fp32 max
3.4e38), MARS's gradient differences and every EMA stay within a small multiple of the bound, and the
update is bounded by the base's normalisation (``m / sqrt(v)``, ``sign``) or the post-transform's clip, so
the moments and the update of a step that is taken are finite (tested at the bound for every preset).
Deciding on the gradients before the step keeps the policy a single fused check instead of a second pass
over all moments and updates; a legitimate gradient above 1e18 (no training run produces one) is skipped.

Non-finite updates: a post-transform (or pre-clip) whose output has an inf/nan entry (an iterative transform
that broke down) must not reach the weights. After each matrix batch's transform, one ``aminmax`` gives a
0-d flag that multiplies that batch's scale and decay (its non-finite entries are zeroed, so ``0 * update``
stays 0): the batch's parameters keep their values, and the step counts once in every group's
``skipped_steps``. The flag is tensor arithmetic (no host read). The base's state of that batch has already
advanced with the (finite) gradients, and the other batches of the step are applied: deferring every update
until all transforms are known would hold a second copy of all updates. A non-finite pre-clip output
cancels its batch's state update too (the flag enters the base's ``ok``).

Hyperparameters set after construction (a scheduler writing ``group["lr"] = nan``, ``betas = (1.0, 0.999)``,
an unknown ``post`` name) are checked again at every step: Python numbers cost no host sync to check, so a
bad one raises ``ValueError`` naming the param group and the argument before anything is modified. A tensor
``lr`` (accepted as by ``torch.optim.Muon``) is not read at step time: a non-finite or negative value skips
the step and counts it, like a non-finite gradient (during an ``inverse_lr`` warm-up of the clip threshold
its value is read once per step, since ``c_k = c peak_lr / lr_k`` needs it; under ``torch.compile`` inside the
kernel of an operator, :func:`~spectrakit.optim.opaque.traced_threshold`, so the traced step does not break).

Extra memory per step: one fp32 work tensor per batch plus the post-transform's temporaries (the default
fast soft clip overwrites the work tensor and adds only ``4 min(m, n)^2`` elements per matrix, see
:mod:`spectrakit.optim.transforms`; other transforms allocate a full-size output); batches are processed
one after the other, and by default no batch costs more than the group's largest parameter alone (work
copy plus workspace), so the peak is about one copy of the largest parameter (``max_batch_numel`` sets
another cap). Parameters are never cloned.
"""

from __future__ import annotations

import functools
import math
import sys
from itertools import chain, product

import torch

from spectrakit._checks import check_choice, check_int, check_scalar, value_checks_enabled
from spectrakit._groups import check_finite_hyperparameters, check_group_keys
from spectrakit._optstate import check_state_dict
from spectrakit.linalg.precision import bf16_matmul_fast
from spectrakit.optim.bases import BASES, Work, once, state_dtype, stored
from spectrakit.optim.fused import fused_base, fused_step_, number_tensor
from spectrakit.optim.lr_report import LrSkips
from spectrakit.optim.opaque import (
    aminmax_within_host,
    count_step_op,
    finite_one_,
    finite_op,
    foreach_norms,
    grads_within,
    grads_within_op,
    reads_step,
    traced_threshold,
    traced_transforms,
)
from spectrakit.optim.schedules import clip_threshold, make_schedule
from spectrakit.optim.transforms import (
    LMO_POSTS,
    POST_TRANSFORMS,
    PRE_TRANSFORMS,
    SCALES,
    matrix_shape,
    post_kwargs,
    update_scale,
    vector_clip_factors,
    workspace_numel,
)

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


# A step whose gradients have an entry above this magnitude is skipped like a non-finite one: its square
# (the second moments of AdamW-like bases) would overflow float32, and the moments would stay inf.
GRAD_BOUND = 1e18
# Smallest min(m, n) whose batch computes in bfloat16 when ``post_dtype="bfloat16"`` (hardware bf16 matmuls):
# smaller matrices compute in the work dtype. Below it the bf16 route's extra steps and conversions cost more
# launches than its cheaper products save: measured on an H100 (2-layer LLaMA sets, 7 interleaved rounds),
# SpectraAdamW with bf16 was 1.24-1.26x slower than fp32 at d = 192..512 and 0.93x at d = 1024.
BF16_MIN_DIM = 1024

def _home(group: dict) -> torch.device:
    """The device of a group's first parameter (the CPU for an empty group or parameters on the meta device)."""
    params = group["params"]
    device = params[0].device if params else torch.device("cpu")
    return torch.device("cpu") if device.type == "meta" else device


def _counter(value) -> torch.Tensor:
    """A group's ``steps_taken`` as a fresh 0-d int64 CPU tensor (from an int or a tensor of a saved state)."""
    return torch.as_tensor(value, dtype=torch.int64, device="cpu").detach().clone().reshape(())


def _count_step(group: dict) -> None:
    """``steps_taken <- steps_taken + 1``; while ``torch.compile`` traces the step, one call of the operator
    ``spectrakit::count_step_``, so that the compiled step holds no generated CPU code (on a GPU, that one
    kernel of the CPU counter cost ~45 s of the first compile: :mod:`spectrakit.optim.opaque`)."""
    counter = group["steps_taken"]
    if torch.compiler.is_compiling() and isinstance(counter, torch.Tensor):
        count_step_op(counter)
    elif isinstance(counter, torch.Tensor) and counter.dtype is torch.int64 and counter.is_cpu:
        counter.add_(_ONE_INT64)  # (a tensor operand: ~17 us with cold caches, ``+= 1`` ~30 us)
    else:
        group["steps_taken"] += 1


# the step counter's increment, kept (read only): adding a Python number wraps it in a tensor at every call
_ONE_INT64 = torch.ones((), dtype=torch.int64)


def _traced_foreach(pre_c_k) -> bool:
    """Whether a batch takes the traced form of the element-wise work: only while ``torch.compile`` traces the
    step, without pre-clip (which transforms the joint buffer in place). Every device then uses the
    multi-tensor (``torch._foreach_*``) form over one work tensor per parameter: ``where(ok, g, 0)`` of its
    gradient (no views of one buffer: after functionalization each write to a view of a buffer is a copy of
    the whole buffer), and no per-tensor chains (the CPU's eager form traces as a few nodes per parameter
    and operation). Same floating-point operations per element as the eager step (bit-identical with
    ``aot_eager``). Measured (inductor, CPU, 1 thread, SpectraAdamW on the 21 parameters of the width-16
    2-layer LLaMA set): see docs/BENCHMARKS.md "Compile-first"."""
    return torch.compiler.is_compiling() and pre_c_k is None


def _nonzero(x) -> bool:
    """``x != 0`` for a Python number; True for a tensor (its value is not read: no host sync)."""
    return True if isinstance(x, torch.Tensor) else x != 0


def _expected_state(group: dict, saved: dict, p: torch.Tensor) -> dict:
    """The state ``base.init_state`` creates for ``p`` (a meta tensor) under the saved group's base."""
    name = saved.get("base", group["base"])
    if name not in BASES:
        raise ValueError(f"cannot load the optimizer state: unknown base {str(name)[:40]!r} "
                         f"(accepted: {', '.join(sorted(BASES))})")
    return BASES[name].init_state(p)


class Spectra(torch.optim.Optimizer):
    r"""One update pipeline for SPECTRA, Muon and the plain optimizers (Jiang, Semenov and Stich 2026 Alg. 2).

    ``X <- (1 - lr_k wd) X - lr_k * alpha * post(base(pre(g)), c_k)``.

    Args (all are per-group hyperparameters; a param group dict may override any of them, including
    ``base``/``post``, e.g. ``{"params": [emb.weight], "post": "none"}``):
        params: iterable of tensors or of param-group dicts.
        base: base direction, one of ``"adamw"``, ``"signum"``, ``"sgd"``, ``"ademamix"``, ``"mars"``,
            ``"lion"`` (see :mod:`spectrakit.optim.bases`).
        post: post-transform of the matrix directions, one of ``"soft_clip"`` (SPECTRA, default),
            ``"soft_clip_ns"`` (the paper's Newton-Schulz SSC), ``"soft_clip_exact"``, ``"hard_clip"``
            (exact SVD), ``"hardcap"``, ``"orthogonalize"``, ``"newton_schulz5"`` (Muon;
            ``"newton_schulz5_batched"``: batched products on the CPU too), ``"global_clip"``
            (Frobenius), ``"spectral_lmo"``, ``"linf_fw"`` (regularised Frank–Wolfe steps, below),
            ``"none"`` (see :mod:`spectrakit.optim.transforms`).
        lr: learning rate >= 0, a number or a 0-d floating tensor (any ``torch.optim.lr_scheduler`` may
            change it; values set later are checked at each step, see the module docstring).
        weight_decay: decoupled weight decay ``wd`` >= 0 (applied as ``(1 - lr wd)``).
        c: clip threshold > 0 of the post-transform (ignored by ``orthogonalize``/``none``).
        pre_c: threshold > 0 of the pre-transform of the raw gradient, or None (off, default).
        pre: pre-transform name: ``"soft_clip_accurate"`` (default), ``"soft_clip"``
            (= ``"soft_clip_fast"``), ``"soft_clip_ns"``, ``"soft_clip_exact"`` or
            ``"hard_clip"``.
        warmup_steps: int >= 0, length of the LR warm-up during which ``c_k = c * peak_lr / lr_k``.
        c_schedule, pre_c_schedule: ``"standard"`` (default for ``c``), ``"constant"`` (default for
            ``pre_c``) or a dict (see :func:`spectrakit.optim.schedules.make_schedule`; optional final decay).
        scale: ``alpha``: ``"auto"`` (1 for ``post="none"``, else ``"spectra"`` = ``max(1, sqrt(m/n))``),
            ``"muon"`` (``max(1, m/n)^0.5``), ``"moonlight"`` (``0.2 sqrt(max(m, n))``), ``"none"`` (1),
            or a positive number. 1-D parameters always use alpha = 1 unless a number is given.
        post_steps: iteration count passed to the iterative post/pre-transforms (None: their default).
        post_dtype: compute dtype of the iterative post/pre-transforms: None (the work dtype, fp32 for
            fp32/bf16 params), ``"bfloat16"``, ``"float32"`` or ``"float64"`` (a string, so that state dicts
            stay loadable with ``weights_only=True``). ``"bfloat16"`` is used only on devices whose bf16
            matmuls are hardware-accelerated (:func:`spectrakit.linalg.bf16_matmul_fast`: CUDA compute
            capability >= 8.0, CPUs with AMX; override with ``SPECTRAKIT_BF16_MATMUL=1``); elsewhere bf16
            products are emulated (40-80x slower than fp32, measured) and the work dtype is used instead;
            matrices with ``min(m, n) <`` :data:`BF16_MIN_DIM` (1024) also use the work dtype (the bf16
            route was measured slower there on an H100: more steps and conversions, launch-bound).
            The default soft clip also keeps fp32 on CPUs with AMX (see ``optim.transforms``). The presets
            named after a published optimizer (:class:`Muon`, :class:`DMuon`) keep its bf16 arithmetic
            everywhere (``exact_bf16 = True``), so they equal ``torch.optim.Muon`` bit for bit.
        vector_clip: if True, 1-D/0-d parameters get the smooth vector clip
            ``u / sqrt(1 + ||u||^2 / c^2)`` as post-transform (and as pre-transform when ``pre_c`` is set);
            ``"reference"``: the paper's discontinuous rule (``u`` unchanged while ``||u|| <= c``, else the
            smooth map; Jiang, Semenov & Stich 2026), for exact reproduction. The smooth map is the default
            because the reference rule jumps by ``1 - 1/sqrt(2)`` at ``||u|| = c``.
        peak_lr: LR peak for the warm-up rule (None: the group's ``lr`` at construction).
        max_batch_numel: None (default) or an int >= 1 capping the elements of a stacked batch plus the
            post-transform's workspace (4 ``min(m, n)^2`` per matrix for the default fast soft clip, 0
            for the other transforms); this bounds the extra memory; a single larger parameter still
            forms its own batch. Default: the cost of the group's most expensive single parameter (at
            least ``MIN_BATCH_NUMEL`` = 2^20), so the peak extra memory of a step is about one copy of
            the largest parameter (the 12-24 matrices of one transformer weight type still form 1-4
            batches).
        regularizer, b, p: the regularised Frank–Wolfe post-transforms (Jiang, Semenov & Stich 2026, §3.1):
            ``post="spectral_lmo"`` maps every singular value ``s`` of the direction to the minimiser
            ``s*`` of ``-s x + psi(x)`` over ``[0, c]`` for ``regularizer`` ``"frobenius"``
            (``psi = b/2 x^2``, ``s* = min(s/b, c)``), ``"nuclear"`` (``b x``: ``c [s > b]``), ``"schatten"``
            (``b/p x^p``, ``p > 1`` with ``1/(p-1)`` a multiple of 1/16: ``min((s/b)^(1/(p-1)), c)``) or
            ``"entropy"`` (``b (x log x - x)``: ``min(exp(s/b), c)``) (:func:`spectrakit.linalg.spectral_lmo`);
            ``post="linf_fw"`` is the l_inf-regularised step ``(||U||_1/b) clip^sp_{bc/||U||_1}(sign(U))``
            (Signum with a post spectral clip; use a momentum base such as ``"sgd"``, not ``"signum"``, whose
            direction is already a sign). ``b`` > 0 finite; ignored by the other post-transforms. The radius
            is ``c`` with its schedule, so ``||delta W||_2 <= lr alpha c`` (without weight decay; to the
            1e-3 relative accuracy of the polar routes, tested on spiked and rank-deficient directions).
        check_finite: True (default): a step whose checked gradients hold an inf/nan (or an entry above
            ``GRAD_BOUND``) is skipped and counted (module docstring); the check reads every gradient once
            (``aminmax``), a separate read pass that costs about a third of torch's fused AdamW step and half
            its fused SGD step on a CPU.
            False: this group's gradients are not checked and its step is never skipped for them, as in
            ``torch.optim`` (a bad gradient then reaches the parameters); the faster choice where the gradients
            are known finite (e.g. checked by a ``GradScaler`` or a gradient-norm clip beforehand).
        torch_kernel: True (default): a plain AdamW or SGD group (``post="none"``, alpha = 1, no pre/vector clip,
            SGD without dampening) on CPU float32/float64 or CUDA float32 tensors (a number ``lr``, or a 0-d tensor
            on the CPU or the parameters' device) takes torch's fused kernel, the numbers of
            ``torch.optim.AdamW(fused=True)`` / ``torch.optim.SGD(fused=True)`` (:mod:`spectrakit.optim.fused`;
            one pass over memory instead of ~10). False: the general pipeline, whose rounding is the same on every
            device and code path. (Not called ``fused``:
            trainers such as torchtitan pass torch's ``fused``/``foreach`` switches, which are not ours.)
        **base_kwargs: hyperparameters of the base direction (e.g. ``betas``, ``eps``, ``momentum``,
            ``nesterov``, ``dampening``, ``alpha``, ``gamma``); unknown names raise TypeError.

    Raises:
        ValueError: a hyperparameter out of range (lr < 0, c <= 0, betas outside [0, 1), ...) or an
            unknown base/post/scale name (the message lists the accepted names); the message names the
            argument and the accepted range. Also raised by ``step()`` for a value set after construction.
        TypeError: unknown keyword, or a non-floating/complex parameter.

    State: per parameter the base's buffers (fp32 for bf16/fp16 parameters, else the parameter dtype)
    and ``step``; per group ``steps_taken`` (0-d int64 tensor on the CPU, drives the
    clip schedules) and ``skipped_steps`` (0-d int64 tensor). ``state_dict``/``load_state_dict`` resume
    exactly (fp32 state of bf16 parameters stays fp32).
    """

    def __init__(
        self,
        params,
        base: str = "adamw",
        post: str = "soft_clip",
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        c: float = 10.0,
        pre_c: float | None = None,
        pre: str = "soft_clip_accurate",
        warmup_steps: int = 0,
        c_schedule="standard",
        pre_c_schedule="constant",
        scale="auto",
        post_steps: int | None = None,
        post_dtype: str | None = None,
        vector_clip: bool | str = False,
        peak_lr: float | None = None,
        max_batch_numel: int | None = None,
        regularizer: str = "frobenius",
        b: float = 1.0,
        p: float | None = None,
        check_finite: bool = True,
        torch_kernel: bool = True,
        **base_kwargs,
    ):
        check_choice(base, "base", BASES)
        unknown = set(base_kwargs) - set(BASES[base].defaults)
        if unknown:
            raise TypeError(
                f"unknown hyperparameters {sorted(unknown)} for base={base!r}; accepted: "
                f"{sorted(BASES[base].defaults)}"
            )
        defaults = dict(
            base=base,
            post=post,
            lr=lr,
            weight_decay=weight_decay,
            c=c,
            pre_c=pre_c,
            pre=pre,
            warmup_steps=warmup_steps,
            c_schedule=c_schedule,
            pre_c_schedule=pre_c_schedule,
            scale=scale,
            post_steps=post_steps,
            post_dtype=post_dtype,
            vector_clip=vector_clip,
            peak_lr=peak_lr,
            max_batch_numel=max_batch_numel,
            regularizer=regularizer,
            b=b,
            p=p,
            check_finite=check_finite,
            torch_kernel=torch_kernel,
            **BASES[base].defaults,
        )
        defaults.update(base_kwargs)
        # created once and only mutated in place afterwards: torch.compile (torch <= 2.11) refuses an
        # attribute assignment on the optimizer inside a traced step
        self._post_flags: list[torch.Tensor] = []
        self._warmed: set = set()
        self._scratch_bufs: dict = {}
        self._lr_skips = LrSkips()
        super().__init__(params, defaults)

    # ------------------------------------------------------------------ param groups and validation
    def add_param_group(self, param_group: dict) -> None:
        """Add a param group; fills the defaults of the group's own base and validates every value.

        Raises ``TypeError`` for a key that is neither a hyperparameter of the optimizer or of the group's
        base nor one that PyTorch's LR schedulers and ``named_parameters`` groups add (as for keyword
        arguments: a misspelled ``betaz`` is an error, not silently ignored)."""
        base = param_group.get("base", self.defaults["base"])
        check_choice(base, "base", BASES)
        check_group_keys(param_group, set(self.defaults) | set(BASES[base].defaults))
        for key, value in BASES[base].defaults.items():
            if base != self.defaults["base"]:
                param_group.setdefault(key, value)
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for p in group["params"]:
            if not p.is_floating_point() or p.is_complex():
                raise TypeError(f"params must be real floating-point tensors, got {p.dtype}")
        group["c_schedule"] = make_schedule(group["c_schedule"], "c_schedule")
        group["pre_c_schedule"] = make_schedule(group["pre_c_schedule"], "pre_c_schedule")
        if group["peak_lr"] is None:
            lr = group["lr"]  # a tensor lr is read once here (construction, not a step)
            group["peak_lr"] = float(lr) if isinstance(lr, torch.Tensor) and lr.numel() == 1 else lr
        # a tensor, so that a compiled step does not specialise on its value (see _schedule_step)
        group["steps_taken"] = _counter(group.get("steps_taken", 0))
        # the counter lives where the step's skip flag is computed, the parameters' device: a compiled step sees it
        # there from its first trace (moved by _init_group instead, it was still on the CPU in the traced view)
        group.setdefault("skipped_steps", torch.zeros((), dtype=torch.int64, device=_home(group)))
        group.setdefault("capturable", True)  # no host sync in the step; see _init_group
        self._validate(group)
        self._take_sharded_path(group)

    # ``sharded(cls)`` of :mod:`spectrakit.optim.sharding`, set by the ``spectrakit.optim`` package (always
    # imported first), which loads that module on first use: it builds on this one, so cannot be imported here.
    _sharded_class = None
    # presets named after a published optimizer keep its arithmetic: bf16 stays bf16 even where emulated
    exact_bf16 = False

    def _take_sharded_path(self, group: dict) -> None:
        """FSDP2 (DTensor) parameters in a plain optimizer: become ``spectrakit.distributed.sharded(type(self))``
        (same numbers as building that class; default ``process_group``/``replicated_exchange``), as
        ``torch.optim`` optimizers accept ``fully_shard``-ed parameters. Unsupported layouts raise the
        sharded optimizer's ``ValueError`` (naming the layout and the fix) at ``step()``."""
        dtensor = sys.modules.get("torch.distributed.tensor")  # not imported yet: no DTensor can exist
        if dtensor is None or not any(isinstance(p, dtensor.DTensor) for p in group["params"]):
            return
        cls = self._sharded_class(type(self))
        if cls is type(self):  # already the sharded version
            return
        self.__class__ = cls
        self._init_sharding()
        self._patch_step_function()  # torch's step hooks on the new class

    @staticmethod
    def _reads_lr_on_host(lr: torch.Tensor) -> bool:
        """Whether a step checks a tensor ``lr``'s value itself: a CPU tensor in an eager step (a read that waits
        for nothing). Elsewhere a bad value skips the step through its flag (see ``lr_skipped_steps``)."""
        return lr.is_cpu and not torch.compiler.is_compiling()

    @staticmethod
    def _validate(group: dict, at_step: bool = False) -> None:
        """Check every hyperparameter of ``group`` (the constructor, ``add_param_group``,
        ``load_state_dict`` and every ``step`` use it); numbers must be finite except ``c`` and ``pre_c``,
        whose ``inf`` turns that clip off. ``lr`` may be a 0-d real tensor (as in ``torch.optim.Muon``): its
        value is checked here except ``at_step`` (where reading it would be a host sync)."""
        check_finite_hyperparameters(group)
        for key in ("check_finite", "torch_kernel"):
            if not isinstance(group[key], bool):
                raise TypeError(f"{key} must be True or False, got {group[key]!r}")
        check_choice(group["post"], "post", POST_TRANSFORMS)
        check_choice(group["pre"], "pre", PRE_TRANSFORMS)
        lr = group["lr"]
        if isinstance(lr, torch.Tensor):
            if lr.ndim != 0 or not lr.is_floating_point():
                raise TypeError(f"lr must be a number or a 0-d floating tensor, got a {lr.dtype} tensor "
                                f"of shape {tuple(lr.shape)}")
            # read where it costs no wait: at construction, or a CPU tensor in an eager step (a GPU's is folded
            # into the step's flag instead, see LrSkips)
            if not at_step or Spectra._reads_lr_on_host(lr):
                if value_checks_enabled() and not bool(torch.isfinite(lr)):
                    raise ValueError(f"lr must be a finite number >= 0, got {lr}")
                check_scalar(lr, "lr", low=0.0)
        else:
            check_scalar(lr, "lr", low=0.0, allow_tensor=False)
        check_scalar(group["peak_lr"], "peak_lr", low=0.0, allow_tensor=False)
        check_scalar(group["weight_decay"], "weight_decay", low=0.0, allow_tensor=False)
        check_scalar(group["c"], "c", low=0.0, low_inclusive=False, allow_tensor=False)
        if group["pre_c"] is not None:
            check_scalar(group["pre_c"], "pre_c", low=0.0, low_inclusive=False, allow_tensor=False)
        check_int(group["warmup_steps"], "warmup_steps", low=0)
        if group["post_steps"] is not None:
            check_int(group["post_steps"], "post_steps", low=1)
        if group["post_dtype"] is not None:
            check_choice(group["post_dtype"], "post_dtype", _DTYPES)
        if group["vector_clip"] not in (False, True, "reference"):
            raise ValueError(f"vector_clip must be False, True or 'reference', got {group['vector_clip']!r}")
        if group["max_batch_numel"] is not None:
            check_int(group["max_batch_numel"], "max_batch_numel", low=1)
        if isinstance(group["scale"], str):
            check_choice(group["scale"], "scale", SCALES)
        else:
            check_scalar(group["scale"], "scale", low=0.0, low_inclusive=False, allow_tensor=False)
        if group["post"] in LMO_POSTS:
            from spectrakit.linalg.lmo import check_lmo_args

            kw = post_kwargs(group, group["post"])
            check_lmo_args(kw.get("regularizer", "frobenius"), kw["b"], group["c"], kw.get("p"))
        BASES[group["base"]].validate(group)

    @property
    def skipped_steps(self) -> torch.Tensor:
        """Number of steps skipped because of non-finite gradients (0-d tensor; reading it does not sync)."""
        return self.param_groups[0]["skipped_steps"]

    def lr_skipped_steps(self) -> dict[int, int]:
        """Steps skipped so far because a group's tensor ``lr`` was not finite or negative (on a GPU, where
        the step does not read it: a CPU tensor raises ``ValueError`` at the step), by group index; counted
        in eager steps. Reads the device. Such steps are also counted in ``skipped_steps``."""
        return self._lr_skips.totals()

    def release_buffers(self) -> None:
        """Free the tensors the optimizer keeps between steps besides its state: on a CPU the work tensor of
        its batches (the largest batch's size: one copy of the largest parameter by default) and the
        per-tensor temporaries, and a small model's work tensors and batching plan (all devices). The next
        step allocates them again. The step keeps them because a CPU allocator returns a freed block of
        several MiB to the system, and page-faulting it in again cost every step time (about 1000 faults a
        step for Muon at d = 512). Call it when the memory is wanted elsewhere, e.g. before evaluation."""
        self._scratch_bufs.clear()

    # ------------------------------------------------------------------ state dict
    def load_state_dict(self, state_dict: dict, *, allow_changes: bool = False) -> None:
        """Load a state dict; unlike ``torch.optim.Optimizer``, fp32 state of bf16/fp16 params stays fp32.

        A state whose groups use another ``base`` or ``post`` than this optimizer's (say a SpectraAdamW
        checkpoint loaded into a SpectraSignum) raises ``ValueError`` instead of silently continuing as the
        saved optimizer, unless ``allow_changes=True`` (the saved choice then wins, as in
        ``torch.optim``). Loaded hyperparameters are validated like the constructor's arguments. A
        ``torch.optim.AdamW`` state dict is converted (an AdamW state is a valid state of a ``base="adamw"``
        group; the clip's schedule continues at its step); another foreign one raises ValueError."""
        state_dict = self._from_torch_adamw(state_dict)
        saved_groups = state_dict.get("param_groups", []) if isinstance(state_dict, dict) else []
        if not allow_changes:
            for i, (mine, saved) in enumerate(zip(self.param_groups, saved_groups)):
                for key in ("base", "post"):
                    if isinstance(saved, dict) and key in saved and saved[key] != mine[key]:
                        raise ValueError(
                            f"the state dict's param group {i} has {key}={saved[key]!r} but this optimizer "
                            f"({type(self).__name__}) has {key}={mine[key]!r}; load it into the matching "
                            f"optimizer, or pass allow_changes=True to continue with the saved {key}")
        check_state_dict(self, state_dict, _expected_state, optional=("step",))
        before = (self.param_groups, self.state)
        try:
            self._apply_state_dict(state_dict)
        except BaseException:  # a refused hyperparameter: the optimizer stays as it was
            self.param_groups, self.state = before
            raise

    def _apply_state_dict(self, state_dict: dict) -> None:
        saved_state = state_dict["state"]
        super().load_state_dict(state_dict)
        ids = chain.from_iterable(g["params"] for g in state_dict["param_groups"])
        params = chain.from_iterable(g["params"] for g in self.param_groups)
        for pid, p in zip(ids, params):
            if pid in saved_state:
                self.state[p] = {
                    k: (v.to(device=p.device, copy=True) if torch.is_tensor(v) else v)
                    for k, v in saved_state[pid].items()
                }
        for g in self.param_groups:  # states saved when SGD, Signum and Lion still counted steps: the count goes
            if not getattr(BASES[g["base"]], "keeps_step", True):
                for p in g["params"]:
                    self.state.get(p, {}).pop("step", None)
        for g in self.param_groups:
            g["skipped_steps"] = g["skipped_steps"].to(device=_home(g), copy=True)
            g.setdefault("capturable", True)
            g.setdefault("check_finite", True)  # state dicts saved before these options existed
            g.setdefault("torch_kernel", True)
            g["steps_taken"] = _counter(g.get("steps_taken", 0))
            self._validate(g)

    def _from_torch_adamw(self, state_dict: dict) -> dict:
        """A ``torch.optim.AdamW`` state dict (groups without ``base``) as this optimizer's: an AdamW state is a
        valid state of a ``base="adamw"`` group (same ``step``, ``exp_avg``, ``exp_avg_sq``, decoupled weight
        decay); the saved lr, betas, eps and weight decay are kept, the clip's schedule continues at the saved
        step (``steps_taken``) and ``skipped_steps`` starts at 0. Any other foreign state raises ValueError."""
        saved_groups = state_dict.get("param_groups", [])
        if not saved_groups or all("base" in g for g in saved_groups):
            return state_dict
        how = ("load a torch.optim.AdamW state (without amsgrad) into groups with base='adamw', one saved group "
               "per group, or start this optimizer from scratch")
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"the state dict has {len(saved_groups)} param groups, this optimizer "
                             f"{len(self.param_groups)}; {how}")
        groups = []
        for i, (mine, saved) in enumerate(zip(self.param_groups, saved_groups)):
            if mine["base"] != "adamw" or "betas" not in saved or saved.get("amsgrad") or "momentum" in saved:
                raise ValueError(f"param group {i} of the state dict is not a torch.optim.AdamW state this "
                                 f"optimizer (base={mine['base']!r}) can continue; {how}")
            saved_state = state_dict.get("state") if isinstance(state_dict.get("state"), dict) else {}
            steps = [saved_state[pid]["step"] for pid in saved["params"]
                     if isinstance(saved_state.get(pid), dict) and "step" in saved_state[pid]]
            group = {k: v for k, v in mine.items() if k != "params"}
            group.update({k: saved[k] for k in ("lr", "betas", "eps", "weight_decay", "initial_lr") if k in saved})
            group.update(params=saved["params"], steps_taken=int(max(map(float, steps), default=0)),
                         skipped_steps=torch.zeros((), dtype=torch.int64))
            groups.append(group)
        state = {pid: {k: st[k] for k in ("step", "exp_avg", "exp_avg_sq") if k in st} if isinstance(st, dict) else st
                 for pid, st in state_dict["state"].items()}
        return {"state": state, "param_groups": groups}

    # ------------------------------------------------------------------ the step
    def _finite_flag(self, grads: list[torch.Tensor], grad_norm: torch.Tensor | None = None) -> torch.Tensor:
        """0-d fp32 tensor: 1.0 if every gradient is finite and at most :data:`GRAD_BOUND` in magnitude,
        else 0.0 (one fused reduction per device). With ``grad_norm`` (the norm of these gradients, given to
        :meth:`step`): ``1.0`` iff ``grad_norm <= GRAD_BOUND``, compared in float32 (false for NaN and inf), no
        gradient read; on the gradients' device, where the skip counter lives (a number's norm is a CPU tensor)."""
        if grad_norm is not None:
            ok = (grad_norm.detach().reshape(()).float() <= GRAD_BOUND).float()
            return ok.to(grads[0].device, non_blocking=True)
        by_device: dict[torch.device, list[torch.Tensor]] = {}
        for g in grads:
            by_device.setdefault(g.device, []).append(g)
        flags = [self._device_finite(gs) for gs in by_device.values()]
        ok = flags[0]
        for f in flags[1:]:
            ok = ok & f.to(ok.device, non_blocking=True)
        return ok.float()

    @staticmethod
    def _per_tensor(device: torch.device) -> bool:
        """Whether the element-wise work on ``device`` uses per-tensor kernels (``out=``, fused copies) rather
        than ``torch._foreach_*`` multi-tensor kernels: True on CPU, where ``_foreach_*`` is a loop over the
        tensors anyway, so the per-tensor forms save passes and copies; False elsewhere (CUDA: one launch
        per list)."""
        return device.type == "cpu"

    @classmethod
    def _flag_copies(cls, device: torch.device) -> bool:
        """Whether a traced step gives each batch its own copy of the skip flag (:func:`bases.stored`): on the
        CPU's per-tensor path, where it cut SpectraAdamW's first inductor compile from ~2.9x to ~1.8x torch
        AdamW's; not on the multi-tensor path (CUDA's), where it made an H100's first compile slower (71.6 s
        against 66.1 s; ``benchmarks/bench_compile.py --names "SpectraAdamW flag copies"``)."""
        return cls._per_tensor(device)

    def _flags_on_host(self, grads: list[torch.Tensor], grad_norm: torch.Tensor | None) -> bool:
        """Whether this step decides its non-finite check on the host: an eager step (not traced by
        ``torch.compile``: a value read would break the graph) whose gradients, ``grad_norm`` and learning
        rates are CPU tensors or numbers. Reading a CPU value waits for no device, and the verdict as a Python
        bool spares the flag's operations on 0-d tensors (the comparison's result cast to float, ``found_inf``,
        the skip counter's comparison and addition), which cost 50-90 us of a step whose caches are cold
        (measured on a CPU core: docs/BENCHMARKS.md, "Parity on shared tensors, and the check decided on the
        host"). A flag copied from a GPU
        without blocking could not be read before a synchronisation: any CUDA tensor among them keeps the
        tensor flag, and so does the multi-tensor code path forced on a CPU (the GPU's, which a study on a CPU
        then measures as it runs there)."""
        if torch.compiler.is_compiling() or (grad_norm is not None and not grad_norm.is_cpu):
            return False
        if any(isinstance(g["lr"], torch.Tensor) for g in self.param_groups):
            return False  # (a tensor lr is folded into the tensor flag, never read)
        return all(g.is_cpu for g in grads) and self._per_tensor(grads[0].device)  # (the CPU's own code path)

    def _host_finite(self, grads: list[torch.Tensor], grad_norm: torch.Tensor | None) -> bool:
        """The verdict of :meth:`_finite_flag` as a Python bool, for a step that decides it on the host
        (:meth:`_flags_on_host`): ``grad_norm <= GRAD_BOUND`` compared in float32, or every gradient entry
        finite and within the bound (:func:`~spectrakit.optim.opaque.aminmax_within_host`)."""
        if grad_norm is not None:
            if grad_norm.dtype == torch.float32:  # its value compared as a double: the float32 comparison's
                return grad_norm.item() <= GRAD_BOUND  # verdict (no float32 lies between f32(1e18) and 1e18)
            return bool(grad_norm.float() <= GRAD_BOUND)
        return aminmax_within_host(grads, GRAD_BOUND)

    def _device_finite(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """0-d bool: every entry of ``grads`` (same device) is finite and at most :data:`GRAD_BOUND` in
        magnitude (NaN fails the comparison). Multi-tensor device: the fused
        ``_foreach_norm(inf)`` (one kernel); CPU: per-tensor ``aminmax`` (min and max are finite iff every
        entry is: NaN propagates, +-inf is the max/min) into a buffer kept across steps,
        about 10x faster there than the unvectorised inf-norm. While ``torch.compile`` traces the step, on every
        device one call of the operator ``spectrakit::grads_within`` running the same check (CPU: ``aminmax``;
        :mod:`spectrakit.optim.opaque`): traced as reductions, inductor generated a kernel per gradient (CPU,
        d = 256, cold cache: plain AdamW 23 kernels and a compiled step 1.13x its eager one, against 2 kernels and
        1.07x with the operator; MARS's first compile 30.5 -> 21.9 s of CPU)."""
        # traced: one operator call of the same kernel (inductor would generate a reduction kernel per gradient)
        check = grads_within_op if torch.compiler.is_compiling() else grads_within
        return check(grads, GRAD_BOUND, self._per_tensor(grads[0].device))

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
        schedule, :meth:`_clip_thresholds`), ``steps`` (iteration count or None) and ``dtype`` (compute dtype
        or None). Returns the transformed batches (same shapes; may be ``U`` itself, overwritten: ``"none"``
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
            out.append(b["U"] if fn is None else fn(b["U"], b["c"], b["steps"], b["dtype"]))
        return out

    def _pre_transform_groups(self, batches: list[dict]) -> list[torch.Tensor]:
        """Pre-clip the stacked raw-gradient batches (``pre_c`` set; ``stage == "pre"``, same dict format as
        :meth:`_post_transform_groups`). By default it delegates to :meth:`_post_transform_groups`, so a
        subclass that overrides that hook (e.g. the distributed one) handles the pre-clip the same way;
        override this method to treat the two stages differently."""
        return self._post_transform_groups(batches)

    def _update_scale(self, group: dict, kind: str, shape: tuple | None, params: list[torch.Tensor]) -> float:
        """``alpha`` of one batch: ``update_scale(scale, post, m, n)`` for a ``"matrix"`` batch of
        matrix shape ``shape = (m, n)`` (:func:`~spectrakit.optim.transforms.update_scale`), the numeric
        ``scale`` or 1 for a ``"flat"`` batch. A subclass whose ``params`` are shards of larger tensors
        overrides it to use the global shape."""
        if kind == "matrix":
            return update_scale(group["scale"], group["post"], *shape)
        return group["scale"] if not isinstance(group["scale"], str) else 1.0

    def _init_group(self, group: dict) -> None:
        """Create the missing states of the group's parameters that have a gradient (``base.init_state``).

        Under ``torch.compile`` this method (torch's name for the state set-up of an optimizer) runs eagerly
        while the step is traced, as for ``torch.optim`` optimizers: the traced step then sees the states
        already created, so the compiled graph of the first step is also the graph of every later step (no
        recompilation on the second call). Every group carries ``capturable = True`` (torch's flag for a step
        without host synchronisation, which this step is) for the same reason: ``torch.compile`` sets it to True
        in the groups of an optimizer it traces, and a changed group would invalidate the first graph."""
        base = BASES[group["base"]]
        warm = POST_TRANSFORMS[group["post"]] is not None or group["pre_c"] is not None
        matrices = set()
        first = next((p for p in group["params"] if p.grad is not None and p.numel() > 0), None)
        if first is not None and group["skipped_steps"].device != first.device:
            # the counter lives where the step's skip flag is computed (the gradients' device): a traced step
            # that moved it at its first call was recompiled at the second (measured on CUDA)
            group["skipped_steps"] = group["skipped_steps"].to(first.device)
        state = self.state
        for p in group["params"]:
            if p.grad is not None and p.numel() > 0:
                if not state[p]:
                    state[p].update(base.init_state(p))
                if warm and p.ndim >= 2:
                    matrices.add((p.device, state_dtype(p.dtype)))
        for dev, wdt in matrices:
            self._warm_transforms(group, dev, wdt)

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

    def _state(self, p: torch.Tensor, base) -> dict:
        state = self.state[p]
        if not state:
            state.update(base.init_state(p))
        return state

    @torch.no_grad()
    def step(self, closure=None, *, grad_norm=None):
        """Perform one update (see the module docstring); returns ``closure()`` if given.

        ``grad_norm``: optional, a norm ``||g||_p`` (any ``p >= 1``: ``|g_i| <= ||g||_p`` for every entry) of all
        the gradients this step reads (those of the groups with ``check_finite=True``), as they are when
        ``step`` is called: typically the value ``torch.nn.utils.clip_grad_norm_`` returned just before (its
        gradients were scaled by at most 1 after the norm was taken, so the norm still bounds them). A 0-d
        floating tensor (not read on the host) or a number >= 0. The step then decides its non-finite check
        from it instead of reading every gradient once more: it is taken iff ``grad_norm <= GRAD_BOUND``
        (compared in float32; a NaN or infinite norm, which any non-finite entry gives, skips the step and
        counts it in ``skipped_steps``). This saves the check's pass over the gradients (on a CPU a quarter
        to a third of torch's fused AdamW step) in a loop that computes the norm anyway. It is a promise about the
        gradients: a norm of other tensors, or of the gradients before they were changed, lets entries the
        check would have caught reach the weights. Not with ``closure`` (which computes the gradients after
        the norm was taken)."""
        loss = None
        if grad_norm is not None:
            grad_norm = self._given_norm(grad_norm, closure)
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grads = [
            p.grad for g in self.param_groups for p in g["params"] if p.grad is not None and p.numel() > 0
        ]
        if not grads:
            for group in self.param_groups:
                _count_step(group)
            return loss
        sparse = [tuple(g.shape) for g in grads if g.is_sparse]
        if sparse:
            raise ValueError(f"sparse gradients are not supported (shapes {sparse}); use a dense embedding "
                             "(nn.Embedding(sparse=False)) or a sparse optimizer such as torch.optim.SparseAdam")
        for i, group in enumerate(self.param_groups):
            self._check_step_hyperparameters(i, group)
        for group in self.param_groups:
            self._init_group(group)
        checked = grads if all(g["check_finite"] for g in self.param_groups) else [
            p.grad for g in self.param_groups if g["check_finite"] for p in g["params"]
            if p.grad is not None and p.numel() > 0]
        # on the host (an eager step of CPU tensors): the verdict as a Python bool, no flag tensor
        good = self._host_finite(checked, grad_norm) if checked and self._flags_on_host(grads, grad_norm) else None
        ok = None if good is not None or not checked else self._finite_flag(checked, grad_norm)
        hyper = None
        eager = not torch.compiler.is_compiling()
        if eager:
            self._lr_skips.poll(type(self).__name__)
        for i, group in enumerate(self.param_groups):  # tensor hyperparameters (a tensor lr): folded in, never read
            if isinstance(group["lr"], torch.Tensor):
                device = grads[0].device if ok is None else ok.device
                f = self._tensor_hyper_flag(group, device)
                if eager:
                    self._lr_skips.add(i, f)
                hyper = f if hyper is None else hyper * f.to(hyper.device, non_blocking=True)
        if hyper is not None and eager:
            self._lr_skips.publish()
        if hyper is not None:
            ok = hyper if ok is None else ok * hyper.to(ok.device, non_blocking=True)
        self._post_flags.clear()
        for group in self.param_groups:  # an unchecked group still follows a bad tensor lr
            if group["check_finite"]:
                self._step_group(group, ok, good)
            else:
                self._step_group(group, hyper)
        taken = ok
        for f in self._post_flags:  # a batch whose post-transform gave a non-finite update was not applied
            taken = f if taken is None else taken * f.to(taken.device, non_blocking=True)
        self._post_flags.clear()
        if good is not None:  # (CPU flags: read; a taken step adds nothing to the counter)
            good = good and (taken is None or bool(taken))
            taken = skipped = None if good else torch.ones((), dtype=torch.int64)
        elif taken is not None:
            skipped = taken == 0  # (a product of 0/1 flags; one op where 1 - taken and a cast are two)
        for group in self.param_groups:
            if taken is not None:
                counter = group["skipped_steps"]
                # (no branch on its device while traced: dynamo's view of the group can predate _init_group)
                if not torch.compiler.is_compiling() and counter.device != taken.device:
                    counter = group["skipped_steps"] = counter.to(taken.device)
                counter.add_(skipped.to(counter.device, non_blocking=True))
            _count_step(group)
        return loss

    @staticmethod
    def _given_norm(grad_norm, closure) -> torch.Tensor:
        """``step``'s ``grad_norm`` as a tensor (a DTensor's full value; a number as a 0-d float64 tensor that
        ``torch.compile`` keeps symbolic, :func:`~spectrakit.optim.fused.number_tensor`), or ``TypeError`` /
        ``ValueError`` naming it."""
        if closure is not None:
            raise ValueError("grad_norm cannot be given with a closure: the closure computes the gradients "
                             "after the norm was taken; call the closure, take the norm, then step(grad_norm=...)")
        if isinstance(grad_norm, torch.Tensor):
            if not grad_norm.is_floating_point() or grad_norm.numel() != 1:
                raise TypeError(f"grad_norm must be a number >= 0 or a floating tensor of one element, got a "
                                f"{grad_norm.dtype} tensor of shape {tuple(grad_norm.shape)}")
            dtensor = sys.modules.get("torch.distributed.tensor")  # FSDP2: clip_grad_norm_ returns a DTensor
            return grad_norm.full_tensor() if dtensor and isinstance(grad_norm, dtensor.DTensor) else grad_norm
        if isinstance(grad_norm, bool) or not isinstance(grad_norm, (int, float)):
            raise TypeError(f"grad_norm must be a number >= 0 or a floating tensor of one element, got "
                            f"{type(grad_norm).__name__}")
        if grad_norm < 0:  # (a NaN or infinite norm is a norm: it skips the step)
            raise ValueError(f"grad_norm must be >= 0 (a norm), got {grad_norm}")
        return number_tensor(float(grad_norm))

    def _check_step_hyperparameters(self, index: int, group: dict) -> None:
        """Re-validate a group's hyperparameters at step time: a scheduler or user code may have set them
        after construction (``group["lr"] = float("nan")``, ``betas = (1.0, 0.999)``, ``post = "bogus"``).
        Python numbers cost no host sync to check, so a bad one raises ``ValueError`` naming the group and the
        argument before anything is modified; tensor values (a tensor ``lr``) are not read here but folded
        into the step's skip flag (:meth:`_tensor_hyper_flag`)."""
        try:
            self._validate(group, at_step=True)
        except (ValueError, TypeError) as e:
            raise type(e)(f"param group {index}: {e} (checked at step time; it was changed after "
                          "construction)") from None

    @staticmethod
    def _tensor_hyper_flag(group: dict, device: torch.device) -> torch.Tensor:
        """0-d fp32 on ``device``: 1 unless a tensor hyperparameter (``lr``) is non-finite or negative; a step
        with such a value is skipped and counted in ``skipped_steps`` (no host read)."""
        lr = group["lr"]
        if not isinstance(lr, torch.Tensor):
            return torch.ones((), device=device)
        lr = lr.detach().to(device=device, dtype=torch.float32, non_blocking=True)
        return (torch.isfinite(lr) & (lr >= 0)).float()

    @staticmethod
    def _clips(group: dict) -> bool:
        """Whether the group's threshold ``c`` is used: a matrix post-transform or the vector clip."""
        return POST_TRANSFORMS[group["post"]] is not None or group["vector_clip"]

    @staticmethod
    def _schedule_step(group: dict) -> int:
        """The step index ``k`` for the group's clip schedules in an eager step: ``int(steps_taken)`` when a
        schedule in use depends on it (an ``inverse_lr`` warm-up with ``warmup_steps > 0``, or a decay), else
        ``warmup_steps`` (where such a schedule is constant, ``c_k = c``), so that the counter is not read.
        Reading it costs no device sync (the counter lives on the CPU)."""
        scheds = ([group["c_schedule"]] if Spectra._clips(group) else []) + (
            [group["pre_c_schedule"]] if group["pre_c"] is not None else [])
        if any(reads_step(s, group["warmup_steps"]) for s in scheds):
            return int(group["steps_taken"])
        return group["warmup_steps"]

    @classmethod
    def _clip_thresholds(cls, group: dict) -> tuple:
        """``(c_k, pre_c_k)`` of the group's step (:func:`~spectrakit.optim.schedules.clip_threshold`;
        ``pre_c_k`` None without pre-clip, ``pre_c`` None or inf). Eagerly Python floats (a tensor ``lr`` is read
        during the warm-up only, where ``c_k = c peak_lr / lr_k`` needs its value). While ``torch.compile``
        traces the step, a threshold whose schedule depends on the step (warm-up, decay) is a 0-d float64 CPU
        tensor made by one operator call from the ``steps_taken`` and ``lr`` tensors
        (:func:`~spectrakit.optim.opaque.traced_threshold`, the same function evaluated by its kernel: the eager
        value bit for bit), so that the traced step reads neither on the host (no graph break, no recompile);
        the other thresholds stay the constant floats."""
        if torch.compiler.is_compiling():
            warmup = group["warmup_steps"]

            def traced(value, sched, used):  # constant thresholds as the eager step's (k = warmup: c_k = c)
                if used and value != math.inf and reads_step(sched, warmup):
                    return traced_threshold(value, group, sched)
                return clip_threshold(value, warmup, 0.0, group["peak_lr"], warmup, sched)

            pre_c = group["pre_c"]
            c_k = traced(group["c"], group["c_schedule"], cls._clips(group))
            if pre_c is None or pre_c == math.inf:
                return c_k, None
            return c_k, traced(pre_c, group["pre_c_schedule"], True)
        k, lr = cls._schedule_step(group), group["lr"]
        # the warm-up rule c_k = c peak_lr / lr_k needs lr_k's value: a tensor lr is read during warm-up only
        lr_c = float(lr) if isinstance(lr, torch.Tensor) and k < group["warmup_steps"] else lr
        c_k = clip_threshold(group["c"], k, lr_c, group["peak_lr"], group["warmup_steps"], group["c_schedule"])
        pre_c = group["pre_c"]
        pre_c_k = None if pre_c is None else clip_threshold(
            pre_c, k, lr_c, group["peak_lr"], group["warmup_steps"], group["pre_c_schedule"])
        if pre_c_k == math.inf:  # pre_c = inf: no pre-clip
            pre_c_k = None
        return c_k, pre_c_k

    def _step_group(self, group: dict, ok: torch.Tensor | None, good: bool | None = None) -> None:
        """One step of ``group``; ``ok``: the step's 0-d fp32 flag (1 take, 0 skip), or None where nothing
        can cancel it (``check_finite=False`` and a Python-number ``lr``); ``good``: instead of ``ok``, the
        verdict of a step whose flags are decided on the host (:meth:`_flags_on_host`): the fused route then
        calls its kernel without ``found_inf``, or nothing, and the others get the flag as a tensor."""
        if group["torch_kernel"]:
            params = [p for p in group["params"] if p.grad is not None and p.numel() > 0]
            fb = fused_base(group, params)
            if fb is not None:  # torch's fused kernel (spectrakit.optim.fused)
                if good is False:  # (what found_inf does: no write at all)
                    return
                state = self.state
                fused_step_(fb, group, params, [state[p] for p in params], ok)
                return
        if good is not None:
            ok = (torch.ones if good else torch.zeros)((), dtype=torch.float32)  # (the flag _finite_flag makes)
        base = BASES[group["base"]]
        c_k, pre_c_k = self._clip_thresholds(group)
        lr = group["lr"]
        if isinstance(lr, torch.Tensor):  # a bad value skips the step (_tensor_hyper_flag); keep 0 * lr finite
            lr = torch.nan_to_num(lr.detach(), nan=0.0, posinf=0.0, neginf=0.0).clamp_min(0.0)
        post = group["post"]
        # traced: the matrix batches' post-transforms are made after every batch's direction, in one call of
        # the hook (one operator call, spectrakit.optim.opaque): each call is a fusion barrier of the compiled
        # step, and every stretch of element-wise code between two barriers is one more generated kernel to
        # compile; eagerly, batch by batch (one work tensor alive at a time)
        pending: list | None = [] if torch.compiler.is_compiling() else None
        plan, works = self._cached_plan(group)
        # the flag on each (device, dtype), its boolean form and a zero where a path masks with them, and the
        # bases' scalars (Work.shared): made once per group, not per batch (bases.once; a traced step would
        # otherwise carry the same nodes once per batch)
        shared: list = []
        for index, (kind, shape, params, alpha) in enumerate(plan):
            # drop the previous batch's work tensor before allocating this one (peak: one batch, not two)
            buf = flat = views = w = load = store = pre = res = upd = U = batch = None
            dev, wdt = params[0].device, state_dtype(params[0].dtype)
            # bf16 only where its matmuls are hardware-accelerated (else the work dtype: never slower)
            pdt = self._compute_dtype(group, dev, shape if kind == "matrix" else None)
            traced = _traced_foreach(pre_c_k)
            per_tensor = self._per_tensor(dev) and not traced
            # traced: a copy of the flag per batch (bases.stored) where _flag_copies says so, since inductor's
            # fusion search pairs the nodes that read one buffer and every element-wise node reads the flag
            copies = traced and ok is not None and self._flag_copies(dev)

            def flag(dev=dev, wdt=wdt):
                return (torch.ones((), device=dev, dtype=wdt) if ok is None
                        else ok.to(device=dev, dtype=wdt, non_blocking=True))

            ok_d = stored(flag()) if copies else once(shared, ("flag", dev, wdt), ok, flag)

            def mask(ok_d=ok_d, wdt=wdt, dev=dev):
                """``(ok_d > 0, 0)``: the work copy's ``where`` operands, once per flag (a batch's own copy of the
                flag gets its own)."""
                return once(shared, ("mask", wdt), ok_d,
                            lambda: (ok_d > 0, torch.zeros((), dtype=wdt, device=dev)))

            grads = [p.grad for p in params]
            if traced:
                buf, views = None, None  # one work tensor per parameter, made below
            elif works is not None and index in works:  # a small group's work tensor, kept across steps
                buf, views = works[index]
            else:
                sizes = [p.numel() for p in params]
                # a larger group on a CPU: a slice of one buffer kept across steps (the largest batch's size, per
                # dtype; batches run one at a time): a CPU allocator returns a freed tensor of several MiB to the
                # system, so each step page-faulted a fresh one in again (~1000 faults a step for Muon at d = 512)
                flat = (self._scratch(sum(sizes), wdt, dev, "work")[: sum(sizes)]
                        if works is None and dev.type == "cpu" else torch.empty(sum(sizes), dtype=wdt, device=dev))
                if kind == "matrix":
                    buf = flat.view(len(params), *shape)
                    views = [v.view(p.shape) for v, p in zip(buf.unbind(0), params)]
                else:
                    buf = flat
                    views = [v.view(p.shape) for v, p in zip(torch.split_with_sizes(buf, sizes), params)]
                if works is not None:
                    works[index] = (buf, views)
            identity = POST_TRANSFORMS[post] is None if kind == "matrix" else not group["vector_clip"]
            # c = inf: no clip (a scheduled threshold traced as a tensor is finite where c is; an overflow to inf
            # makes the operator's transform the identity)
            identity = identity or (not isinstance(c_k, torch.Tensor) and c_k == math.inf)
            # a chaining base on CPU loads (and, for an identity post-transform, applies) tensor by tensor
            chain = per_tensor and getattr(base, "chains", False) and pre_c_k is None
            lr_wd = group["weight_decay"] * lr
            load = store = None
            # the work copy is the gradient when the step is taken and 0 when it is skipped (ok = 0: non-finite or
            # huge entries), so that the cancelled update stays finite; a base that never squares the gradient
            # (Signum, SGD, Lion, EMA) needs only its non-finite entries zeroed (without pre-clip): a skipped
            # step's weights (0) then cancel any finite entry exactly
            same = all(g.dtype == wdt for g in grads)
            sanitize = pre_c_k is None and not getattr(base, "squares", True)
            if traced:  # the eager multi-tensor form's copy and masked_fill, one node per parameter
                ok_b, zero = mask()
                views = [torch.where(ok_b, g.to(wdt), zero) for g in grads]
            elif chain and same and not sanitize:
                ok_b, zero = mask()

                def load(i, views=views, grads=grads, ok_b=ok_b, zero=zero):
                    torch.where(ok_b, grads[i], zero, out=views[i])

            elif chain and same:  # one nan_to_num pass costs what a copy costs (where(): 1.4-3.5x more, on CPU)

                def load(i, views=views, grads=grads):
                    torch.nan_to_num(grads[i], nan=0.0, posinf=0.0, neginf=0.0, out=views[i])

            elif per_tensor and same:  # finite work copy: one fused pass
                ok_b, zero = mask()
                for v, g in zip(views, grads):
                    torch.where(ok_b, g, zero, out=v)
            else:  # multi-tensor: one copy, then one pass over the joint work tensor
                torch._foreach_copy_(views, grads)
                if sanitize:
                    torch.nan_to_num_(buf, nan=0.0, posinf=0.0, neginf=0.0)
                else:
                    buf.masked_fill_(ok_d == 0, 0.0)  # ok_d is 0 or 1
            if chain and identity:
                decay = 1 - lr_wd * ok_d if _nonzero(lr_wd) else None

                def store(i, scale=None, params=params, views=views, decay=decay):
                    if decay is not None:
                        params[i].mul_(decay)
                    if scale is None:
                        params[i].add_(views[i])
                    else:  # the base left its (exact) scaling to this pass
                        params[i].addcmul_(views[i], scale)

            # (a traced step allocates its temporaries: no buffer kept on the optimizer inside a graph)
            scratch = None if torch.compiler.is_compiling() else self._scratch
            w = Work(views, buf, kind == "matrix", per_tensor, load, store, scratch, shared)

            # (1) pre-transform of the raw gradient
            if pre_c_k is not None:
                if kind == "matrix":
                    pre = {"U": buf, "params": params, "stage": "pre", "post": group["pre"], "c": pre_c_k,
                           "steps": group["post_steps"], "dtype": pdt}
                    res = self._pre_transform_groups([pre])[0]
                    if res is not buf:
                        buf.copy_(res)
                    # a non-finite pre-clip output: neither the state nor the parameters of this batch move
                    fin = self._finite_(buf)
                    self._post_flags.append(fin)
                    ok_d = ok_d * fin
                elif group["vector_clip"]:
                    w.mul_(vector_clip_factors(group["vector_clip"], foreach_norms(views), pre_c_k))
            scale = (-lr * alpha) * ok_d  # the update is p <- (1 - lr wd ok) p + scale * post(U)
            # (2) base direction, in place (identity post-transform: the base applies scale, its last operation)
            base.direction_(w, [self._state(p, base) for p in params], group, ok_d, scale if identity else None)
            if w.pending:
                raise RuntimeError(f"base {group['base']!r} declares chains=True but left a load/store untaken")
            views, buf = w.u, w.buf  # a base may hand over its direction in tensors of its own (Work.hand_over)
            if store is not None:
                continue  # the base applied the update tensor by tensor
            # (3) post-transform, once per stacked batch
            if identity:
                upd = buf
            elif kind == "matrix":
                # (traced: separate work tensors; a batch of one is a view of its own, which inductor lets the
                # in-place operator overwrite, where the stack of one was copied in and out of it)
                U = buf if buf is not None else (views[0].view(1, *shape) if len(views) == 1
                                                 else torch.stack([v.view(shape) for v in views]))
                batch = {"U": U, "params": params, "stage": "post", "post": post, "c": c_k,
                         "steps": group["post_steps"], "dtype": pdt, "post_kwargs": post_kwargs(group, post)}
                if pending is not None:
                    pending.append((batch, lr_wd, ok_d, scale, per_tensor))
                    continue
                upd = self._post_transform_groups([batch])[0]  # the work tensor or a fresh output: ours to modify
            else:
                w.mul_(vector_clip_factors(group["vector_clip"], foreach_norms(views), c_k))
                upd = buf
            if not identity and kind == "matrix":
                self._finish_matrix_batch(params, upd, lr_wd, ok_d, scale, per_tensor)
                continue
            # (4) p <- (1 - lr wd ok) p + upd (the base applied scale) or (vector clip) + scale * upd
            self._apply_update(params, views, lr_wd, ok_d, None if identity else scale, per_tensor, upd)
        if pending:
            updates = self._post_transform_groups([b for b, *_ in pending])
            # traced: every update's check in one operator call (one fusion barrier; see _finite_)
            fins = finite_op(updates).unbind(0) if torch.compiler.is_compiling() else [None] * len(updates)
            for (batch, lr_wd, ok_d, scale, per_tensor), upd, fin in zip(pending, updates, fins):
                self._finish_matrix_batch(batch["params"], upd, lr_wd, ok_d, scale, per_tensor, fin)

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

    @staticmethod
    def _finite_(x: torch.Tensor) -> torch.Tensor:
        """0-d tensor (x's dtype): 1 if every entry of ``x`` is finite, else 0; then zeroes ``x``'s non-finite
        entries in place (so that a cancelled update ``0 * x`` stays 0). Two passes over ``x`` (``aminmax``,
        ``nan_to_num``), no host read. Traced by ``torch.compile``: one call of the operator
        ``spectrakit::finite_`` running these same passes (:mod:`spectrakit.optim.opaque`), so that inductor
        generates no reduction kernel for it (traced as ``amax`` and ``where``, one more kernel per matrix batch
        to compile)."""
        if not x.numel():
            return x.new_ones(())
        if torch.compiler.is_compiling():
            return finite_op([x])[0].to(x.dtype)
        return finite_one_(x).to(x.dtype)

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
