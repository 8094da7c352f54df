"""torch's fused CPU and CUDA kernels as the step of the plain element-wise AdamW and SGD groups.

A param group whose update is element-wise (``post="none"``, no ``vector_clip``, no ``pre_c``, alpha = 1) with base
``"adamw"`` or ``"sgd"`` (no dampening, momentum > 0) computes exactly what ``torch.optim.AdamW`` /
``torch.optim.SGD`` compute (AdamW: Loshchilov & Hutter 2019, ``m <- b1 m + (1-b1) g``, ``v <- b2 v + (1-b2) g^2``,
``p <- (1 - lr wd) p - lr (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)``; SGD with momentum, Polyak 1964, Nesterov
form as in Sutskever et al. 2013: ``m <- b m + g``, ``p <- p - lr m``, Nesterov ``p <- p - lr (g + b m)``). On the
CPU and on CUDA that step is torch's fused kernel (``torch._fused_adamw_`` / ``torch._fused_sgd_``, what the
functional ``torch.optim.adamw.adamw`` / ``torch.optim.sgd.sgd`` with ``fused=True`` call once they have grouped the
tensors by device and dtype, which the route's conditions already ensure): one pass over each parameter, its
gradient and its state, where the general pipeline makes ~10 (on a GPU, where a step of small tensors costs its
kernel launches, also far fewer launches). The skip of a step with a non-finite gradient is the kernel's own
``found_inf`` (the flag of the optimizer's check, a 0-d tensor: the kernel leaves parameters and moments unchanged,
AdamW's step counters are advanced by ``ok``); no value is read in Python. An eager step of CPU tensors, whose flag a
read costs nothing, decides on the host instead (``Spectra._flags_on_host``): a taken step calls the kernel without
``found_inf``, a skipped one calls nothing (what ``found_inf`` does). SGD's decoupled weight decay
``(1 - lr wd ok) p`` is one multiplication before the kernel (torch's SGD decay is coupled)."""

# The kernel walks the tensors in reverse order: the non-finite check has just read the gradients in order, so the
# last ones are still in the cache when the kernel reads them again (each tensor's update is independent of the
# others: same numbers in any order).
#
# Under ``torch.compile`` the same step is one call of an operator (``spectrakit::fused_adamw_step_`` /
# ``spectrakit::fused_sgd_step_``, defined with :class:`torch.library.Library`, its schema declaring the parameters,
# states and step counters mutated): dynamo traces it without a graph break (torch's own fused optimizers run outside
# the graph, and the bare ``torch._fused_adamw_`` cannot be functionalized), inductor calls it in place, and the
# compiled step computes what the eager one does, bit for bit.
#
# The route is taken only where it gives torch's numbers with this optimizer's state layout: tensors on one CPU or
# CUDA device, dense and contiguous, float32 parameters (float64 too on the CPU; torch's CUDA kernels read the step
# counters as float32, which are float64 here for float64 parameters) with gradients and states of the same dtype, a
# Python-number ``lr`` or a 0-d tensor on the CPU or (float32) on the parameters' device (the kernel's tensor-``lr``
# form, as ``torch.optim.AdamW(fused=True, lr=tensor)``: a compiled step then does not recompile when a scheduler
# changes it in place; a non-finite or negative value skips the step through the same ``found_inf``).
#
# A Python-number ``lr`` enters a traced step as a tensor (:func:`number_tensor`: a scheduler's new value each step is
# then an input of the graph, not a recompile): on the CPU a float64 CPU tensor, which the kernel reads as the same
# double (the compiled step equals the eager one bit for bit); on CUDA a float32 tensor on the device
# (:func:`device_lr`), the kernel's device form, since a CPU tensor made in the traced step would be its only CPU
# code, which inductor compiles with a C++ compiler after probing the host's vector instruction sets (~45 s of an
# H100's cold first compile). The compiled CUDA step so computes with ``lr`` rounded to float32 (a relative change
# of at most 2^-24 in the step size): the numbers of ``torch.optim.AdamW(fused=True)`` given that lr as a device
# tensor, bit for bit, and within one rounding of the parameter of the eager step with the Python number.

from __future__ import annotations

import torch

# the parameter dtypes of the route on each device: the CUDA kernels read the step counters as float32, which
# this optimizer keeps in the parameter's dtype (float64 counters for float64 parameters)
_DEVICE_DTYPES = {"cpu": (torch.float32, torch.float64), "cuda": (torch.float32,)}


def fused_base(group: dict, params: list[torch.Tensor]) -> str | None:
    """``"adamw"`` or ``"sgd"`` when ``group`` (its parameters with gradients are ``params``, with their states
    created) may take torch's fused kernel (see the module docstring), else None."""
    base = group["base"]
    if base not in ("adamw", "sgd") or not group["torch_kernel"] or not params:
        return None
    if group["post"] != "none" or group["vector_clip"] or group["pre_c"] is not None:
        return None
    scale = group["scale"]
    if not (scale in ("auto", "none") or (not isinstance(scale, str) and scale == 1)):
        return None  # "muon"/"moonlight" scale matrices by a shape factor
    if base == "sgd" and (group["dampening"] != 0 or group["momentum"] == 0):
        return None
    dtype, device = params[0].dtype, params[0].device
    if dtype not in _DEVICE_DTYPES.get(device.type, ()):
        return None
    lr = group["lr"]
    if isinstance(lr, torch.Tensor) and not (lr.is_cpu or (lr.device == device and lr.dtype is torch.float32)):
        return None  # (torch's CUDA kernels read an lr on the device as float32)
    plain = (torch.nn.Parameter, torch.Tensor)
    for p in params:  # (the states exist, in the parameter's dtype: Spectra._init_group made them)
        g = p.grad
        if (p.dtype is not dtype or g.dtype is not dtype or p.device != device or g.device != device
                or type(p) not in plain or g.is_sparse or not p.is_contiguous() or not g.is_contiguous()):
            return None
    return base


def number_tensor(x: float) -> torch.Tensor:
    """A Python number as a 0-d float64 CPU tensor of its exact value, ``1 * x``: an operation that dynamo keeps
    symbolic for a symbolic float (an ``lr`` that a scheduler changes every step, after its first recompile),
    where ``torch.tensor(x)`` or ``torch.full`` would specialise it (one recompile per value)."""
    return torch.ones((), dtype=torch.float64) * x


def device_lr(x: float, device: torch.device) -> torch.Tensor:
    """A Python-number ``lr`` as a 0-d float32 tensor on ``device``, ``float32(x)`` (rounded to nearest), made
    there: the form torch's CUDA fused kernels read from the device (as ``torch.optim.AdamW(fused=True,
    lr=torch.tensor(x, device="cuda"))``). Computed in float64 and rounded once, for a Python ``x`` (a constant
    of the traced step) and for a symbolic one (a 0-d float64 CPU input of the graph) alike."""
    return (torch.ones((), dtype=torch.float64, device=device) * x).to(torch.float32)


# the CPU counters' increment, kept (read only) instead of a new 0-d tensor per step
_ONE = torch.ones(())


def _advance(steps: list[torch.Tensor], ok: torch.Tensor | None) -> None:
    """``step <- step + ok`` (1 when ``ok`` is None) with the Tensor overload of ``_foreach_add_``: no host read of
    ``ok``, and on 0-d CPU counters about 7x faster than the Scalar overload (measured: 120 us against 17 us for
    29 counters), which adds a Python number tensor by tensor; on CUDA counters without ``ok``, the Scalar
    overload (one kernel for the list)."""
    if ok is not None:
        torch._foreach_add_(steps, ok, alpha=1.0)
    elif steps[0].is_cpu:
        torch._foreach_add_(steps, _ONE, alpha=1.0)
    else:  # one kernel for the list
        torch._foreach_add_(steps, 1.0)


def _adamw_step(params: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor],
                exp_avg_sqs: list[torch.Tensor], steps: list[torch.Tensor], ok: torch.Tensor | None, lr: float,
                lr_tensor: torch.Tensor | None, beta1: float, beta2: float, weight_decay: float, eps: float) -> None:
    _advance(steps, ok)
    # the kernel reads the advanced step; on found_inf it returns before any write (a bad tensor lr is never read:
    # its step is skipped, Spectra._tensor_hyper_flag)
    torch._fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, [], steps, lr=lr if lr_tensor is None else lr_tensor,
                        beta1=beta1, beta2=beta2,
                        weight_decay=weight_decay, eps=eps, amsgrad=False, maximize=False, grad_scale=None,
                        found_inf=None if ok is None else 1.0 - ok)


def _sgd_step(params: list[torch.Tensor], grads: list[torch.Tensor], momentum_buffers: list[torch.Tensor],
              ok: torch.Tensor | None, lr: float, lr_tensor: torch.Tensor | None, weight_decay: float,
              momentum: float, nesterov: bool) -> None:
    # (no step counters: SGD keeps its momentum alone, as torch.optim.SGD does)
    if weight_decay != 0:  # decoupled decay (1 - lr wd ok) p, as the pipeline's; torch's SGD decay is coupled
        if lr_tensor is None:
            lr_wd = lr * weight_decay
        else:  # a bad value skips the step (ok = 0): keep 0 * lr finite
            lr_wd = torch.nan_to_num(lr_tensor, nan=0.0, posinf=0.0, neginf=0.0).clamp_min(0.0) * weight_decay
        torch._foreach_mul_(params, 1.0 - lr_wd if ok is None else 1.0 - lr_wd * ok.to(params[0].dtype))
    torch._fused_sgd_(params, grads, momentum_buffers, weight_decay=0.0, momentum=momentum,
                      lr=lr if lr_tensor is None else lr_tensor, dampening=0.0,
                      nesterov=nesterov, maximize=False, is_first_step=False, grad_scale=None,
                      found_inf=None if ok is None else 1.0 - ok)


# the same steps as operators that torch.compile traces in one graph: defined with torch.library.Library (a Python
# kernel for every dispatch key, a fake kernel for tracing), whose call costs ~35 us for 21 parameters where a
# ``torch.library.custom_op`` (autograd wrapper, version bumps in Python) costs ~150 us (measured on this CPU)
_LIB = torch.library.Library("spectrakit", "FRAGMENT")
_LIB.define("fused_adamw_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, "
            "Tensor(d!)[] steps, Tensor? ok, float lr, Tensor? lr_tensor, float beta1, float beta2, "
            "float weight_decay, float eps) -> ()")
_LIB.define("fused_sgd_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] momentum_buffers, "
            "Tensor? ok, float lr, Tensor? lr_tensor, float weight_decay, float momentum, bool nesterov) -> ()")
_LIB.impl("fused_adamw_step_", _adamw_step, "CompositeExplicitAutograd")
_LIB.impl("fused_sgd_step_", _sgd_step, "CompositeExplicitAutograd")
for _name in ("fused_adamw_step_", "fused_sgd_step_"):
    torch.library.register_fake(f"spectrakit::{_name}", lambda *args: None, lib=_LIB)
_adamw_op = torch.ops.spectrakit.fused_adamw_step_.default
_sgd_op = torch.ops.spectrakit.fused_sgd_step_.default


def fused_step_(base: str, group: dict, params: list[torch.Tensor], states: list[dict],
                ok: torch.Tensor | None) -> None:
    """One step of ``base`` (from :func:`fused_base`) on ``params`` with torch's fused kernel; ``ok``: the
    step's 0-d fp32 flag (1 take, 0 skip) or None (the gradients were not checked). Eager: the kernel
    itself; traced by ``torch.compile``: the custom operator that calls it."""
    params, states = params[::-1], states[::-1]  # the last-checked gradients first (module docstring)
    if ok is not None and ok.device != params[0].device:  # the flag of groups on several devices: one copy each
        ok = ok.to(params[0].device, non_blocking=True)
    grads = [p.grad for p in params]
    compiling = torch.compiler.is_compiling()
    lr, wd = group["lr"], float(group["weight_decay"])
    lr, lr_tensor = (0.0, lr.detach()) if isinstance(lr, torch.Tensor) else (float(lr), None)
    if compiling and lr_tensor is None:  # a new Python lr per step: an input of the graph, not a guard per value
        # (CPU: the kernel reads it as the same double; CUDA: float32 on the device, see the module docstring)
        lr, lr_tensor = 0.0, (number_tensor(lr) if params[0].is_cpu else device_lr(lr, params[0].device))
    if base == "adamw":
        b1, b2 = group["betas"]
        (_adamw_op if compiling else _adamw_step)(
            params, grads, [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
            [s["step"] for s in states], ok, lr, lr_tensor,
            float(b1), float(b2), wd, float(group["eps"]))
        return
    (_sgd_op if compiling else _sgd_step)(params, grads, [s["momentum_buffer"] for s in states], ok, lr,
                                          lr_tensor, wd, float(group["momentum"]), bool(group["nesterov"]))
