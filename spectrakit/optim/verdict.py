"""The non-finite verdict of a :class:`~spectrakit.optim.spectra.Spectra` step: one fused check of the
gradients (or of ``step(grad_norm=...)``) gives a 0-d flag ``ok`` that multiplies every update, decided on
the host only where a read waits for nothing (an eager step of CPU tensors); a step with a gradient entry that
is not finite or above :data:`GRAD_BOUND` is skipped and counted."""

from __future__ import annotations

import sys

import torch

from spectrakit.optim.fused import number_tensor
from spectrakit.optim.opaque import (
    aminmax_within_host,
    finite_one_,
    finite_op,
    grads_within,
    grads_within_op,
)

# A step whose gradients have an entry above this magnitude is skipped like a non-finite one: its square
# (the second moments of AdamW-like bases) would overflow float32, and the moments would stay inf.
GRAD_BOUND = 1e18


class VerdictMixin:
    """The step's non-finite check (a mixin of :class:`~spectrakit.optim.spectra.Spectra`)."""

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
