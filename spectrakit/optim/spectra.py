"""The SPECTRA update pipeline as one ``torch.optim.Optimizer`` (Jiang, Semenov and Stich 2026 Alg. 2).

For every parameter ``X`` with a gradient ``g`` (matrices: ndim >= 2, conv kernels viewed as
``(out, in*k*k)``):

.. code-block:: text

    g  <- pre(g, c_pre_k)                 if pre_c is set          (Alg. 2 line 5, off by default)
    U  <- base.direction(g, state)        AdamW / Signum / SGD-M / AdEMAMix / MARS / Lion
    X  <- (1 - lr_k wd) X - lr_k * alpha * post(U, c_k)            (Alg. 2 line 11)

A step with a non-finite gradient entry (or one above :data:`GRAD_BOUND`) is skipped and counted in
``skipped_steps``; no step synchronises host and device. Its parts: the non-finite verdict
(:mod:`.verdict`), batching and transforms (:mod:`.batching`), hyperparameters and clip thresholds
(:mod:`.hyperparams`), state dicts (:mod:`.state_io`), torch's fused kernels for plain groups
(:mod:`.fused`). How one step runs, and why: docs/optim_step.md.
"""

from __future__ import annotations

import math
import os
import sys
import warnings

import torch

from spectrakit._checks import check_choice
from spectrakit._groups import check_group_keys
from spectrakit.optim.bases import BASES, Work, once, state_dtype, stored
from spectrakit.optim.batching import (  # noqa: F401 (re-exported)
    BF16_MIN_DIM,
    CUDA_WIDE_BATCH_POSTS,
    MIN_BATCH_NUMEL,
    MIN_BATCH_NUMEL_CUDA,
    BatchingMixin,
    _nonzero,
    min_batch_numel,
)
from spectrakit.optim.fused import fused_base, fused_step_
from spectrakit.optim.hyperparams import HyperMixin
from spectrakit.optim.lr_report import LrSkips
from spectrakit.optim.opaque import (
    count_step_op,
    finite_op,
    foreach_norms,
)
from spectrakit.optim.schedules import make_schedule
from spectrakit.optim.state_io import StateDictMixin, _counter, _home
from spectrakit.optim.transforms import (
    POST_TRANSFORMS,
    post_kwargs,
    vector_clip_factors,
)
from spectrakit.optim.verdict import GRAD_BOUND, VerdictMixin  # noqa: F401 (re-exported)


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


class ParamGroupWarning(UserWarning):
    """A param group that mixes parameters a model's layers would route apart (see ``param_groups``)."""


def _warn_mixed_group(group: dict) -> None:
    """Warn (once per place in the caller's code) when one group holds matrices and 1-D parameters with weight
    decay: what ``SpectraAdamW(model.parameters())`` builds. Its biases and gains then get weight decay, and
    an embedding, the output head or a weight stored ``(in, out)`` (Hugging Face's ``Conv1D``) the update of an
    ordinary ``(out, in)`` matrix; ``param_groups(model)`` routes each as the reference code does."""
    wd = group.get("weight_decay", 0)
    if not (isinstance(wd, (int, float)) and wd > 0) or group.get("post") == "none":
        return
    dims = {min(p.ndim, 2) for p in group["params"]}
    if dims >= {2} and dims & {0, 1}:
        warnings.warn("this param group holds matrices and 1-D parameters (biases, norm gains) with weight decay "
                      f"{wd:g}: the 1-D ones get decay too, and embeddings, the output head or (in, out) weights "
                      "such as Hugging Face's Conv1D are updated as plain (out, in) matrices; build the groups "
                      "with spectrakit.optim.param_groups(model)", ParamGroupWarning, stacklevel=_user_level())


def _user_level() -> int:
    """``stacklevel`` of the first caller outside spectrakit and torch (the user's line that built the optimizer)."""
    here = sys._getframe(1)
    level, frame = 1, here
    inside = (os.path.dirname(os.path.dirname(__file__)), os.path.dirname(torch.__file__))
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    return level


class Spectra(StateDictMixin, VerdictMixin, BatchingMixin, HyperMixin, torch.optim.Optimizer):
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
            change it; values set later are checked at each step, see docs/optim_step.md).
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
        split_fused: None (default: every matrix is one matrix) or the blocks of a fused weight, each updated as
            a matrix of its own: an int ``r`` (``r`` equal row blocks, e.g. 3 for a QKV weight ``(3d, d)`` stored
            ``(out, in)``) or a pair ``(r, c)`` (rows and columns, e.g. ``(1, 3)`` for Hugging Face's ``Conv1D``
            ``c_attn`` stored ``(d, 3d)``). Post- and pre-clip, and ``alpha``, then act per block, as on separate
            Q, K, V layers (the paper's per-matrix map); ``param_groups(model, split_fused=...)`` sets it by name.
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
            ``GRAD_BOUND``) is skipped and counted (docs/optim_step.md); the check reads every gradient once
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
        split_fused=None,
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
            split_fused=split_fused,
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
        _warn_mixed_group(group)

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


    # ------------------------------------------------------------------ the step


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


    def _state(self, p: torch.Tensor, base) -> dict:
        state = self.state[p]
        if not state:
            state.update(base.init_state(p))
        return state

    @torch.no_grad()
    def step(self, closure=None, *, grad_norm=None):
        """Perform one update (see docs/optim_step.md); returns ``closure()`` if given.

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
                           "steps": group["post_steps"], "dtype": pdt, "split": group["split_fused"]}
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
                         "steps": group["post_steps"], "dtype": pdt, "post_kwargs": post_kwargs(group, post),
                         "split": group["split_fused"]}
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


