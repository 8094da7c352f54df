"""torch's fused CPU kernels as the step of the plain element-wise AdamW and SGD groups.

A param group whose update is element-wise (``post="none"``, no ``vector_clip``, no ``pre_c``, alpha = 1) with
base ``"adamw"`` or ``"sgd"`` (no dampening, momentum > 0) computes exactly what ``torch.optim.AdamW`` /
``torch.optim.SGD`` compute (AdamW: Loshchilov & Hutter 2019, ``m <- b1 m + (1-b1) g``,
``v <- b2 v + (1-b2) g^2``, ``p <- (1 - lr wd) p - lr (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)``; SGD with
momentum, Polyak 1964, Nesterov form as in Sutskever et al. 2013: ``m <- b m + g``, ``p <- p - lr m``,
Nesterov ``p <- p - lr (g + b m)``). On the CPU that step is torch's fused kernel (``torch._fused_adamw_`` /
``torch._fused_sgd_``, what the functional ``torch.optim.adamw.adamw`` / ``torch.optim.sgd.sgd`` with
``fused=True`` call once they have grouped the tensors by device and dtype, which the route's conditions
already ensure): one pass over each parameter, its gradient and its state, where the general pipeline
makes ~10. The skip of a step with a non-finite gradient is the kernel's own
``found_inf`` (the flag of the optimizer's check, a 0-d tensor: the kernel leaves parameters and moments
unchanged, the step counters are advanced by ``ok``); no value is read in Python. SGD's decoupled weight
decay ``(1 - lr wd ok) p`` is one multiplication before the kernel (torch's SGD decay is coupled).

The route is taken only where it gives torch's numbers with this optimizer's state layout: CPU tensors,
dense and contiguous, float32 or float64 parameters with gradients and states of the same dtype, a
Python-number ``lr``, eager mode (a traced step keeps the general pipeline: one graph, no recompiles).
"""

from __future__ import annotations

import torch

_DTYPES = (torch.float32, torch.float64)


def fused_base(group: dict, params: list[torch.Tensor]) -> str | None:
    """``"adamw"`` or ``"sgd"`` when ``group`` (its parameters with gradients are ``params``, with their states
    created) may take torch's fused kernel (see the module docstring), else None."""
    base = group["base"]
    if base not in ("adamw", "sgd") or not group["torch_kernel"] or not params:
        return None
    if (group["post"] != "none" or group["vector_clip"] or group["pre_c"] is not None
            or isinstance(group["lr"], torch.Tensor) or torch.compiler.is_compiling()):
        return None
    scale = group["scale"]
    if not (scale in ("auto", "none") or (not isinstance(scale, str) and scale == 1)):
        return None  # "muon"/"moonlight" scale matrices by a shape factor
    if base == "sgd" and (group["dampening"] != 0 or group["momentum"] == 0):
        return None
    dtype = params[0].dtype
    if dtype not in _DTYPES:
        return None
    for p in params:  # (the states exist, in the parameter's dtype: Spectra._init_group made them)
        g = p.grad
        if (p.dtype is not dtype or g.dtype is not dtype or not p.is_contiguous() or not g.is_contiguous()
                or g.is_sparse or not p.is_cpu or (type(p) is not torch.nn.Parameter and type(p) is not torch.Tensor)):
            return None
    return base


def fused_step_(base: str, group: dict, params: list[torch.Tensor], states: list[dict],
                ok: torch.Tensor | None) -> None:
    """One step of ``base`` (from :func:`fused_base`) on ``params`` with torch's fused kernel; ``ok``: the
    step's 0-d fp32 flag (1 take, 0 skip) or None (the gradients were not checked)."""
    grads = [p.grad for p in params]
    found_inf = None if ok is None else 1.0 - ok
    steps = [s["step"] for s in states]
    if ok is None:
        torch._foreach_add_(steps, 1.0)
    else:
        torch._foreach_add_(steps, ok, alpha=1.0)  # the Tensor overload: no host read of ok
    lr, wd = group["lr"], group["weight_decay"]
    if base == "adamw":  # the kernel reads the advanced step; on found_inf it returns before any write
        b1, b2 = group["betas"]
        torch._fused_adamw_(params, grads, [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states], [],
                            steps, lr=lr, beta1=b1, beta2=b2, weight_decay=wd, eps=group["eps"], amsgrad=False,
                            maximize=False, grad_scale=None, found_inf=found_inf)
        return
    if wd != 0:  # decoupled decay (1 - lr wd ok) p, as the pipeline's; torch's SGD decay is coupled
        torch._foreach_mul_(params, 1.0 - lr * wd if ok is None else 1.0 - lr * wd * ok.to(params[0].dtype))
    torch._fused_sgd_(params, grads, [s["momentum_buffer"] for s in states], weight_decay=0.0,
                      momentum=group["momentum"], lr=lr, dampening=0.0, nesterov=group["nesterov"], maximize=False,
                      is_first_step=False, grad_scale=None, found_inf=found_inf)
