"""Base directions ``U_k`` of the update pipeline (Jiang, Semenov and Stich 2026 §2 eq. (1), Alg. 2 line 10).

A base direction is a small stateless object with

- ``defaults``: its hyperparameters and their default values (merged into the param group),
- ``init_state(p) -> dict``: buffers for one parameter in :func:`state_dtype` (fp32 for bf16/fp16
  parameters) plus ``step``, a 0-d tensor,
- ``direction_(w, states, group, ok, scale=None)``: consumes the (pre-transformed) gradients held in the
  work tensors ``w.u`` (one per parameter, a :class:`Work`), updates the states and overwrites ``w.u``
  with the directions, multiplied by ``scale`` (None or a 0-d tensor) as the very last operation when
  given (the optimizer passes ``-lr alpha ok`` for an identity post-transform; a base that ends with a
  copy writes the scaled copy in one pass)."""

# ``ok`` is a 0-d tensor (work dtype), 1 for a normal step and 0 for a skipped one (non-finite gradients): every
# state update is written as ``buf <- buf + ok * w * (new - buf)`` so a skipped step leaves the states
# (and ``step``) exactly unchanged without a Python branch on a tensor value. ``w.mul_(f)``/``w.add_(f)``
# multiply/shift ``u[i]`` by ``f[i]`` for a ``(B,)`` (or 0-d) tensor ``f`` (one kernel on a stacked batch).
# The element-wise loops are ``torch._foreach_*`` calls over the members of one batch or single kernels on
# the whole work tensor, except on CPU (``w.per_tensor``), where ``torch._foreach_*`` is a loop over the
# tensors anyway: there the bases with ``chains = True`` (AdamW, Signum, SGD, Lion) run their whole pipeline
# tensor by tensor with ``out=`` kernels (e.g. ``u <- sqrt(v)`` in one pass instead of copy + sqrt), taking
# over the optimizer's gradient copy and, for an identity post-transform, the parameter update (see
# :class:`Work`), so each tensor stays in cache. Every path performs the same floating-point operations in
# the same order per element, so the result is bit-identical across paths and batchings (tested against the
# multi-tensor path in tests/optim/test_step_paths.py).
#
# Decoupled weight decay and the learning rate are not part of the direction: the optimizer applies
# ``p <- (1 - lr wd) p - lr * alpha * post(U)``.

from __future__ import annotations

import math

import torch

from spectrakit._checks import check_scalar
from spectrakit.optim.opaque import foreach_norms


def _check_betas(betas, n: int, name: str = "betas"):
    if not isinstance(betas, (tuple, list)) or len(betas) != n:
        raise ValueError(f"{name} must be a tuple of {n} numbers in [0, 1), got {betas!r}")
    for i, b in enumerate(betas):
        check_scalar(b, f"{name}[{i}]", low=0.0, high=1.0, high_inclusive=False, allow_tensor=False)


def state_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype of optimizer state and work tensors: fp32 for fp16/bf16 parameters, else the parameter's."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _zeros(p: torch.Tensor) -> torch.Tensor:
    return torch.zeros(p.shape, dtype=state_dtype(p.dtype), device=p.device)


def _step(p: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=state_dtype(p.dtype), device=p.device)


def once(memo: list | None, key, ok, make):
    """``make()`` the first time ``key`` (numbers, dtypes, devices) and the object ``ok`` (a flag tensor, compared
    by identity, or None) are passed with the list ``memo`` of one group's step, that value again later (``memo``
    None: every call makes it). A step traced by ``torch.compile`` would otherwise repeat the same nodes once per
    batch (the flag on each device, its boolean form, the bases' moment weights)."""
    if memo is None:
        return make()
    for k, o, value in memo:
        if o is ok and k == key:
            return value
    value = make()
    memo.append((key, ok, value))
    return value


class Work:
    """The work tensors of one batch of ``B`` parameters.

    ``u``: list of ``B`` tensors shaped like the parameters, views of ``buf`` (a stacked ``(B, m, n)``
    tensor when ``stacked``, else a flat concatenation), or, in a step traced by ``torch.compile``, separate
    tensors (``buf`` None; every operation then is a ``torch._foreach_*`` call over ``u``).
    ``per_tensor``: use per-tensor kernels instead of
    ``torch._foreach_*`` (True on CPU, see the module docstring).

    ``load``/``store`` (CPU, bases with ``chains = True`` only): the optimizer may defer the load of
    ``u[i]`` (the zeroed-non-finite gradient copy) and, for an identity post-transform, hand over the
    update of parameter ``i``; a chaining base then runs the whole per-element pipeline tensor by tensor
    (``load(i)``, its operations on ``u[i]``, ``store(i)``), so each tensor stays in the CPU cache between
    its ~13 passes instead of streaming the whole batch through memory once per pass. The operations and
    their order per element are unchanged (bit-identical results)."""

    __slots__ = ("u", "buf", "stacked", "per_tensor", "_load", "_store", "_scratch", "_shared")

    def __init__(self, u: list[torch.Tensor], buf: torch.Tensor, stacked: bool, per_tensor: bool,
                 load=None, store=None, scratch=None, shared: list | None = None):
        self.u, self.buf, self.stacked, self.per_tensor = u, buf, stacked, per_tensor
        self._load, self._store, self._scratch, self._shared = load, store, scratch, shared

    def shared(self, key, ok: torch.Tensor, make):
        """``make()``, a scalar that depends only on ``key`` (numbers, dtypes) and the flag ``ok``: made once for
        every batch of the group's step that passes the same ``key`` and the same ``ok`` object (:func:`once` on
        the optimizer's list ``shared``; without it, every call makes it)."""
        return once(self._shared, key, ok, make)

    def weight(self, c: float, ok: torch.Tensor) -> torch.Tensor:
        """``c * ok`` (a moment's weight, 0 on a skipped step), once per group and step (:meth:`shared`)."""
        return self.shared(("c * ok", c), ok, lambda: c * ok)

    def scratch(self, like: torch.Tensor) -> torch.Tensor:
        """A temporary shaped like ``like`` (a per-tensor body's third operand), valid until the next call:
        from the optimizer's ``scratch(numel, dtype, device)`` (one buffer kept across steps) when given,
        else a fresh tensor."""
        if self._scratch is None:
            return torch.empty_like(like)
        return self._scratch(like.numel(), like.dtype, like.device)[: like.numel()].view(like.shape)

    def take_load(self):
        """The deferred loader ``load(i)`` (or None); the caller must call it for every ``i`` before using
        ``u[i]``."""
        f, self._load = self._load, None
        return f

    def take_store(self):
        """The handed-over update ``store(i, scale=None)`` (or None); the caller must call it for every ``i``
        once ``u[i]`` holds the final (scaled) direction, or pass ``scale`` (a 0-d tensor) to have the
        update add ``scale * u[i]`` in one pass (``addcmul``; exact only where ``scale * u[i]`` is, e.g.
        for a sign direction)."""
        f, self._store = self._store, None
        return f

    @property
    def stores(self) -> bool:
        """Whether the parameter update is handed over (``store`` not taken yet)."""
        return self._store is not None

    def each(self, body, *lists, scale=None) -> None:
        """The per-tensor pipeline: for every ``i`` the deferred ``load(i)``, then
        ``body(u[i], *(l[i] for l in lists))``, then the handed-over ``store(i, scale)`` (takes both)."""
        load, store = self.take_load(), self.take_store()
        for i, items in enumerate(zip(self.u, *lists)):
            if load is not None:
                load(i)
            body(*items)
            if store is not None:
                store(i, scale)

    def hand_over(self, u: list[torch.Tensor]) -> None:
        """Make ``u`` (tensors shaped like the parameters, the base's own) the work tensors: a base whose
        direction ends in a temporary hands it over instead of copying it back (one pass fewer); the
        optimizer then reads the direction from ``w.u`` (``buf`` None: no joint tensor)."""
        self.u, self.buf = u, None

    @property
    def pending(self) -> bool:
        """Whether a deferred load or update was not taken (the optimizer then does it itself)."""
        return self._load is not None or self._store is not None

    def _apply(self, f: torch.Tensor, op: str) -> None:
        if self.buf is None:  # separate work tensors (a traced step)
            getattr(torch, f"_foreach_{op}")(self.u, f if f.ndim == 0 else list(f.unbind(0)))
        elif f.ndim == 0:
            getattr(self.buf, op)(f)
        elif self.stacked:
            getattr(self.buf, op)(f.view(-1, *([1] * (self.buf.ndim - 1))))
        else:
            getattr(torch, f"_foreach_{op}")(self.u, list(f.unbind(0)))

    def unary_(self, op: str, *args) -> None:
        """``u[i] <- op(u[i], *args)`` for every ``i`` (``op`` an in-place tensor method name such as
        ``"sqrt_"``): one kernel on the joint buffer, or one ``torch._foreach_*`` call over the separate work
        tensors of a traced step (``buf`` None)."""
        if self.buf is None:
            getattr(torch, f"_foreach_{op}")(self.u, *args)
        else:
            getattr(self.buf, op)(*args)

    def mul_(self, f: torch.Tensor | float) -> None:
        """``u[i] <- u[i] * f[i]`` for a ``(B,)`` tensor ``f`` (a 0-d ``f`` or a number multiplies every ``u[i]``)."""
        if isinstance(f, torch.Tensor):
            self._apply(f, "mul_")
        else:
            self.unary_("mul_", f)

    def add_(self, f: torch.Tensor) -> None:
        """``u[i] <- u[i] + f[i]`` for a ``(B,)`` tensor ``f`` (a 0-d ``f`` is added to every ``u[i]``)."""
        self._apply(f, "add_")

    def scale_(self, scale: torch.Tensor | None) -> None:
        """``u <- scale * u`` unless ``scale`` is None."""
        if scale is not None:
            self.unary_("mul_", scale)


def stored(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself; while ``torch.compile`` traces the step, the minimum over 16 copies of it (the same values,
    for the step's 0/1 skip flag): inductor stores a reduction's result in a buffer of its own (it unrolls one of
    fewer than 8 elements into the code that reads it), so the element-wise code that reads this copy reads a
    buffer of its own instead of the step's flag (inductor's fusion search tries the pairs of nodes that read one
    buffer: a flag read by every node of the step makes them one group; docs/BENCHMARKS.md "Compile-first").
    Storing the AdamW bias corrections and weights the same way made the first compile slower (measured)."""
    if not torch.compiler.is_compiling():
        return x
    return x.expand(16, *x.shape).amin(0)


# Largest total number of elements of a list that the eager multi-tensor moment update takes through the
# ``addcmul`` form (a temporary of that size, 64 MiB in float32: the 2-layer LLaMA sets up to d = 512 in one
# list), see :func:`foreach_lerp_`.
ADDCMUL_MAX_NUMEL = 2**24


def foreach_lerp_(targets: list[torch.Tensor], ends: list[torch.Tensor], weight, bound: float = 1.0) -> None:
    """``t <- t + weight (e - t)`` for every pair, with a 0-d tensor ``weight`` kept on the device (or a list
    of 0-d tensors, one per pair); ``bound``: an upper bound of ``|weight|`` known on the host (e.g. ``1 - b``
    for ``weight = (1 - b) ok``).

    ``torch._foreach_lerp_(targets, ends, weight)`` would pick the ``Scalar`` overload and read ``weight`` on
    the host (a sync on CUDA); the ``List`` overload with one 0-d weight per tensor does not. While
    ``torch.compile`` traces the step, inductor has no lowering for that ``List`` overload (an opaque kernel
    per call: a fusion barrier), so: with ``bound < 0.5``, ``_foreach_addcmul_(t, _foreach_sub(e, t), weight)``,
    i.e. ``t + (e - t) weight``, ``lerp``'s formula for ``|weight| < 0.5`` (the same bits as the eager ``lerp``
    on the CPU, tested, and on an H100, measured). Multi-tensor operations throughout: on a GPU
    inductor stores every output of a ``_foreach_*`` operation that a per-tensor operation reads, so the
    per-tensor ``addcmul_`` used before gave ~2 stored buffers more per parameter and moment to schedule
    (SpectraAdEMAMix at d = 256: 594 nodes into inductor's scheduler, 295 with this form). Otherwise a
    per-tensor ``lerp_`` (which inductor decomposes into both of ``lerp``'s formulas and a select).

    Eagerly, the same ``addcmul`` form where ``bound < 0.5`` and the targets (float32 or float64, as every
    optimizer state: in a 16-bit dtype ``e - t`` would round first) hold at most :data:`ADDCMUL_MAX_NUMEL`
    elements: on a GPU the ``List`` overload of ``_foreach_lerp_`` with 0-d weights
    runs tensor by tensor, and the ``addcmul`` form took half its time on an H100 (70.7 against 138.9 us per
    call for the 21 tensors of the d = 256 2-layer LLaMA set: a host-bound step) with the same bits (0 of 2.66
    million entries differed; ``benchmarks/studies/study_update_ops.py``; the whole eager step of Lion 0.86-0.92x,
    SpectraAdamW 0.91-0.99x at d = 256-512). It allocates ``e - t`` for the call, so larger lists keep the
    in-place ``lerp`` (no temporary).
    """
    weights = weight if isinstance(weight, list) else [weight] * len(targets)
    compiling = torch.compiler.is_compiling()
    if bound < 0.5 and (compiling or (targets[0].dtype in (torch.float32, torch.float64)
                                      and sum(t.numel() for t in targets) <= ADDCMUL_MAX_NUMEL)):
        torch._foreach_addcmul_(targets, torch._foreach_sub(ends, targets), weights)
    elif compiling:
        for t, e, wt in zip(targets, ends, weights):
            t.lerp_(e, wt)
    else:
        torch._foreach_lerp_(targets, ends, weights)


def foreach_select_(targets: list[torch.Tensor], ends: list[torch.Tensor], ok: torch.Tensor) -> None:
    """``t <- e`` where the 0-d flag ``ok`` is 1 and ``t`` unchanged where it is 0, for every pair (finite
    tensors): ``lerp(t, e, ok)``, exact at both ends. While ``torch.compile`` traces the step,
    ``t (1 - ok) + e ok`` in multi-tensor operations (the same values for finite entries, up to the sign of a
    zero): a per-tensor ``lerp_`` would make inductor store its ``_foreach_*`` inputs (see
    :func:`foreach_lerp_`)."""
    if torch.compiler.is_compiling():
        torch._foreach_mul_(targets, 1 - ok)
        torch._foreach_add_(targets, torch._foreach_mul(ends, ok))
        return
    torch._foreach_lerp_(targets, ends, [ok] * len(targets))


def advance_steps(states: list[dict], ok: torch.Tensor) -> torch.Tensor:
    """``step <- step + ok`` for every state; returns the new steps as a ``(B,)`` tensor, at least 1
    (so that bias corrections of a skipped first step stay finite; the update is zeroed anyway). Only the
    bases whose direction reads the step keep one (AdamW, AdEMAMix, MARS); SGD, Signum and Lion keep their
    moment alone, as torch.optim.SGD and torch.optim.Muon do."""
    steps = [s["step"] for s in states]
    torch._foreach_add_(steps, ok, alpha=1.0)  # alpha selects the Tensor overload: no host read of ok
    return torch.stack(steps).clamp_min(1.0)


class AdamW:
    """AdamW direction (Loshchilov & Hutter 2019):
    ``m <- b1 m + (1-b1) g``, ``v <- b2 v + (1-b2) g^2``, ``U = (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)``.
    Hyperparameters: ``betas`` in [0,1)^2, ``eps`` >= 0."""

    name = "adamw"
    defaults = {"betas": (0.9, 0.999), "eps": 1e-8}
    chains = True  # takes Work.load/store (see Work)
    squares = True  # g^2 of a finite gradient can overflow: a skipped step's work copy must be all zeros

    def validate(self, group):
        _check_betas(group["betas"], 2)
        check_scalar(group["eps"], "eps", low=0.0, allow_tensor=False)

    def init_state(self, p):
        return {"step": _step(p), "exp_avg": _zeros(p), "exp_avg_sq": _zeros(p)}

    def direction_(self, w, states, group, ok, scale=None):
        b1, b2 = group["betas"]
        t = advance_steps(states, ok)
        m = [s["exp_avg"] for s in states]
        v = [s["exp_avg_sq"] for s in states]
        adam_direction_(w, m, v, t, b1, b2, group["eps"], ok, scale)


def bias_corrections(t: torch.Tensor, b1: float, b2: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(1 / sqrt(1 - b2^t), 1 / (1 - b1^t))`` for a tensor of steps ``t``, computed in float64 (as
    ``torch.optim.AdamW`` does with Python floats; in fp32 ``1 - 0.999^1`` is off by 6e-6 relative) and
    rounded once to ``t``'s dtype. Stays on ``t``'s device (no host read); fp32 on MPS (no float64)."""
    hi = t.to(torch.float32 if t.device.type == "mps" else torch.float64)
    # reciprocal(): what ``1.0 / x`` computes (torch evaluates it as ``x.reciprocal() * 1.0``), one op fewer
    return torch.rsqrt(1.0 - b2**hi).to(t.dtype), torch.reciprocal(1.0 - b1**hi).to(t.dtype)


def adam_direction_(w, m, v, t, b1, b2, eps, ok, scale=None):
    """Shared Adam core: moments of ``u = w.u`` (in place), then
    ``u <- scale * (1 / (sqrt(v) / sqrt(bc2) + eps)) * m / bc1`` with ``bc_i = 1 - b_i^t``, rounded
    operation by operation in the same order on every path (sqrt, scale, add, reciprocal, multiply, scale;
    ``scale`` last), so the result does not depend on the code path (CPU per-tensor or multi-tensor) or
    the batching."""
    u, buf = w.u, w.buf
    w1, w2 = w.weight(1 - b1, ok), w.weight(1 - b2, ok)
    r, c = bias_corrections(t, b1, b2)
    if w.per_tensor:  # tensor by tensor, cache-resident (see Work)

        def body(ui, mi, vi, ri, ci):
            mi.lerp_(ui, w1)
            ui.mul_(ui)
            vi.lerp_(ui, w2)
            torch.sqrt(vi, out=ui)
            ui.mul_(ri).add_(eps).reciprocal_().mul_(mi).mul_(ci)
            if scale is not None:
                ui.mul_(scale)

        w.each(body, m, v, r.unbind(0), c.unbind(0))
        return
    foreach_lerp_(m, u, w1, 1 - b1)
    if buf is None:  # separate work tensors (a traced step)
        torch._foreach_mul_(u, u)
    else:
        buf.mul_(buf)
    foreach_lerp_(v, u, w2, 1 - b2)
    torch._foreach_copy_(u, v)
    w.unary_("sqrt_")
    w.mul_(r)
    w.unary_("add_", eps)
    w.unary_("reciprocal_")
    torch._foreach_mul_(u, m)
    w.mul_(c)
    w.scale_(scale)


class Signum:
    """Signum direction (Bernstein et al. 2018): ``m <- b m + (1-b) g``, ``U = sign(m)``; with
    ``nesterov=True``: ``U = sign((1-b) g + b m)``. Hyperparameters: ``momentum`` b in [0, 1),
    ``nesterov``."""

    name = "signum"
    keeps_step = False  # its direction never reads a step: no counter (state as torch's)
    defaults = {"momentum": 0.9, "nesterov": False}

    def validate(self, group):
        check_scalar(
            group["momentum"], "momentum", low=0.0, high=1.0, high_inclusive=False, allow_tensor=False
        )

    def init_state(self, p):
        return {"momentum_buffer": _zeros(p)}

    chains = True
    squares = False  # a skipped step only needs the non-finite gradient entries zeroed (see Spectra._step_group)

    def direction_(self, w, states, group, ok, scale=None):
        b, u = group["momentum"], w.u
        m = [s["momentum_buffer"] for s in states]
        wt = w.weight(1 - b, ok)
        if w.per_tensor:  # tensor by tensor (see Work)
            # a sign times the scale is exact: the update adds it in one pass (addcmul) where it is handed over
            fused = self.sign and scale is not None and w.stores

            def body(ui, mi):
                mi.lerp_(ui, wt)
                if group["nesterov"]:
                    ui.lerp_(mi, b)
                    if self.sign:
                        ui.sign_()
                elif self.sign:
                    torch.sign(mi, out=ui)
                else:
                    ui.copy_(mi)
                if scale is not None and not fused:
                    ui.mul_(scale)

            w.each(body, m, scale=scale if fused else None)
            return
        foreach_lerp_(m, u, wt, 1 - b)
        if group["nesterov"]:
            torch._foreach_lerp_(u, m, b)
        elif self.sign and scale is not None:  # the update's direction: sign(m) scaled, in tensors of its own
            d = torch._foreach_sign(m)
            torch._foreach_mul_(d, scale)
            w.hand_over(d)
            return
        else:
            torch._foreach_copy_(u, m)
        if self.sign:
            torch._foreach_sign_(u)
        w.scale_(scale)

    sign = True


class EMA(Signum):
    """EMA-momentum direction, Muon's (Jordan et al. 2024; ``torch.optim.Muon``): ``m <- m + (1-b)(g - m)``
    (``lerp``), ``U = m``; with ``nesterov=True``: ``U = g + b (m - g)``. The Signum recursion without the
    sign, in the same ``lerp`` arithmetic as ``torch.optim.Muon`` (bit-identical momentum). Hyperparameters:
    ``momentum`` b in [0, 1), ``nesterov``."""

    name = "ema"
    defaults = {"momentum": 0.95, "nesterov": True}
    sign = False


class SGD:
    """SGD-momentum direction (torch.optim.SGD convention): ``m <- b m + (1-d) g``, ``U = m``; with
    ``nesterov=True``: ``U = (1-d) g + b m``. ``dampening`` d = 0 is torch's SGD (heavy ball), d = b the
    EMA form used by Keller Jordan's Muon. Hyperparameters: ``momentum`` in [0, 1), ``dampening`` in [0, 1],
    ``nesterov``."""

    name = "sgd"
    keeps_step = False  # its direction never reads a step: no counter (state as torch's)
    defaults = {"momentum": 0.9, "dampening": 0.0, "nesterov": False}

    def validate(self, group):
        check_scalar(
            group["momentum"], "momentum", low=0.0, high=1.0, high_inclusive=False, allow_tensor=False
        )
        check_scalar(group["dampening"], "dampening", low=0.0, high=1.0, allow_tensor=False)

    def init_state(self, p):
        return {"momentum_buffer": _zeros(p)}

    chains = True
    squares = False  # a skipped step only needs the non-finite gradient entries zeroed (see Spectra._step_group)

    def direction_(self, w, states, group, ok, scale=None):
        b, d, u = group["momentum"], group["dampening"], w.u
        m = [s["momentum_buffer"] for s in states]
        # (1-d) g, zero on a skipped step; b m, unchanged then
        fg = w.weight(1 - d, ok)
        fm = w.shared(("1-w", 1 - b), ok, lambda: 1 - (1 - b) * ok)
        if w.per_tensor:  # tensor by tensor (see Work)

            def body(ui, mi):
                ui.mul_(fg)
                mi.mul_(fm).add_(ui)
                if group["nesterov"]:
                    ui.add_(mi, alpha=b)
                    if scale is not None:
                        ui.mul_(scale)
                elif scale is not None:
                    torch.mul(mi, scale, out=ui)
                else:
                    ui.copy_(mi)

            w.each(body, m)
            return
        w.mul_(fg)
        torch._foreach_mul_(m, fm)
        torch._foreach_add_(m, u)
        if group["nesterov"]:
            torch._foreach_add_(u, m, alpha=b)
        else:
            torch._foreach_copy_(u, m)
        w.scale_(scale)


class Lion:
    """Lion direction (Chen et al. 2023): ``U = sign(b1 m + (1-b1) g)``, then ``m <- b2 m + (1-b2) g``.
    Hyperparameters: ``betas`` in [0,1)^2 (default (0.9, 0.99))."""

    name = "lion"
    keeps_step = False  # its direction never reads a step: no counter
    defaults = {"betas": (0.9, 0.99)}

    def validate(self, group):
        _check_betas(group["betas"], 2)

    def init_state(self, p):
        return {"exp_avg": _zeros(p)}

    chains = True
    squares = False  # a skipped step only needs the non-finite gradient entries zeroed (see Spectra._step_group)

    def direction_(self, w, states, group, ok, scale=None):
        b1, b2 = group["betas"]
        u = w.u
        m = [s["exp_avg"] for s in states]
        wt = w.weight(1 - b2, ok)
        if w.per_tensor:  # tensor by tensor (see Work)
            # the interpolation goes to the optimizer's scratch buffer (kept across steps): a fresh tensor per
            # parameter and step costs its page faults (Lion's CPU step was 1.6-2.3x Signum's at d = 1024)

            fused = scale is not None and w.stores  # sign times scale is exact: one addcmul pass (see Signum)

            def body(ui, mi):
                interp = torch.lerp(ui, mi, b1, out=w.scratch(ui))
                mi.lerp_(ui, wt)
                torch.sign(interp, out=ui)
                if scale is not None and not fused:
                    ui.mul_(scale)

            w.each(body, m, scale=scale if fused else None)
            return
        interp = torch._foreach_lerp(u, m, b1)
        foreach_lerp_(m, u, wt, 1 - b2)
        torch._foreach_sign_(interp)
        if scale is None:
            torch._foreach_copy_(u, interp)
        else:  # the update's direction: the scaled temporary itself (no copy back into the work tensor)
            torch._foreach_mul_(interp, scale)
            w.hand_over(interp)


class AdEMAMix:
    """AdEMAMix direction (Pagliardini et al. 2024):
    ``m1 <- b1 m1 + (1-b1) g``, ``m2 <- b3_t m2 + (1-b3_t) g``, ``v <- b2 v + (1-b2) g^2``,
    ``U = (m1 / (1-b1^t) + alpha_t m2) / (sqrt(v / (1-b2^t)) + eps)``, with the warm-ups
    ``alpha_t = min(t alpha / T_alpha, alpha)`` and
    ``b3_t = min(exp(ln(b1) ln(b3) / ((1 - t/T_b3) ln(b3) + (t/T_b3) ln(b1))), b3)`` (off when T is None).
    Hyperparameters: ``betas`` (b1, b2, b3) in [0,1)^3, ``alpha`` >= 0, ``alpha_warmup`` T_alpha and
    ``beta3_warmup`` T_b3 (None or int >= 1), ``eps`` >= 0."""

    name = "ademamix"
    defaults = {
        "betas": (0.9, 0.999, 0.9999),
        "alpha": 2.0,
        "alpha_warmup": None,
        "beta3_warmup": None,
        "eps": 1e-8,
    }

    def validate(self, group):
        _check_betas(group["betas"], 3)
        check_scalar(group["alpha"], "alpha", low=0.0, allow_tensor=False)
        check_scalar(group["eps"], "eps", low=0.0, allow_tensor=False)
        for key in ("alpha_warmup", "beta3_warmup"):
            if group[key] is not None:
                check_scalar(group[key], key, low=1, allow_tensor=False)

    def init_state(self, p):
        return {"step": _step(p), "exp_avg": _zeros(p), "exp_avg_slow": _zeros(p), "exp_avg_sq": _zeros(p)}

    @staticmethod
    def schedules(t: torch.Tensor, group) -> tuple[torch.Tensor, torch.Tensor]:
        """``(alpha_t, b3_t)`` for a tensor of steps ``t`` (pure tensor arithmetic, no host sync)."""
        b1, _, b3 = group["betas"]
        alpha, ta, tb = group["alpha"], group["alpha_warmup"], group["beta3_warmup"]
        alpha_t = torch.clamp(t * (alpha / ta), max=alpha) if ta else torch.full_like(t, alpha)
        if tb and b1 > 0:
            lb1, lb3 = math.log(b1), math.log(b3)
            frac = t / tb
            b3_t = torch.clamp(torch.exp(lb1 * lb3 / ((1 - frac) * lb3 + frac * lb1)), max=b3)
        else:
            b3_t = torch.full_like(t, b3)
        return alpha_t, b3_t

    def direction_(self, w, states, group, ok, scale=None):
        b1, b2, b3 = group["betas"]
        u, mul_ = w.u, w.mul_
        t = advance_steps(states, ok)
        m1 = [s["exp_avg"] for s in states]
        m2 = [s["exp_avg_slow"] for s in states]
        v = [s["exp_avg_sq"] for s in states]
        foreach_lerp_(m1, u, w.weight(1 - b1, ok), 1 - b1)
        if group["alpha_warmup"] or group["beta3_warmup"]:
            alpha_t, b3_t = self.schedules(t, group)
            # b3_t stays within [b1, b3] when b1 <= b3 (the warm-up interpolates between them, then the clamp)
            foreach_lerp_(m2, u, list(((1 - b3_t) * ok).unbind(0)), 1 - b1 if b1 <= b3 else 1.0)
        else:  # constant alpha and b3: one shared weight, a number (the schedules' values, the same roundings)
            alpha_t = float(group["alpha"])  # (multiplied in the work dtype: the value full_like rounds to)
            # (1 - b3 as the bound: the float32 weight differs from it by an ulp of b3, far from lerp's 0.5)
            foreach_lerp_(m2, u, w.shared(("1-full", b3, t.dtype), ok,
                                          lambda: (1 - torch.full((), b3, dtype=t.dtype, device=t.device)) * ok),
                          1 - b3)
        torch._foreach_mul_(u, u)
        foreach_lerp_(v, u, w.weight(1 - b2, ok), 1 - b2)
        torch._foreach_copy_(u, v)  # u <- 1 / (sqrt(v_hat) + eps)
        torch._foreach_sqrt_(u)
        r, c = bias_corrections(t, b1, b2)
        mul_(r)
        torch._foreach_add_(u, group["eps"])
        torch._foreach_reciprocal_(u)
        fast = torch._foreach_mul(u, m1)
        torch._foreach_mul_(u, m2)
        mul_(alpha_t)
        torch._foreach_mul_(fast, list(c.unbind(0)))
        torch._foreach_add_(u, fast)
        w.scale_(scale)


class MARS:
    """MARS-AdamW direction (Yuan et al. 2024, the practical "approx" variant with the previous step's
    gradient): ``c = g + gamma * b1/(1-b1) * (g - g_prev)``, ``c <- c / max(1, ||c||_F)`` (unit-norm clip,
    per parameter), then the AdamW moments and direction of ``c``. ``g_prev`` starts at 0 (zero-initialised
    buffer, as in the official code). Hyperparameters: ``betas`` in [0,1)^2 (default (0.95, 0.99)),
    ``gamma`` >= 0 (default 0.025), ``eps`` >= 0."""

    name = "mars"
    defaults = {"betas": (0.95, 0.99), "gamma": 0.025, "eps": 1e-8}

    def validate(self, group):
        _check_betas(group["betas"], 2)
        check_scalar(group["gamma"], "gamma", low=0.0, allow_tensor=False)
        check_scalar(group["eps"], "eps", low=0.0, allow_tensor=False)

    def init_state(self, p):
        return {"step": _step(p), "exp_avg": _zeros(p), "exp_avg_sq": _zeros(p), "last_grad": _zeros(p)}

    def direction_(self, w, states, group, ok, scale=None):
        b1, b2 = group["betas"]
        u = w.u
        t = advance_steps(states, ok)
        last = [s["last_grad"] for s in states]
        diff = torch._foreach_sub(u, last)
        foreach_select_(last, u, ok)  # g_prev <- g (unchanged on a skipped step)
        torch._foreach_add_(u, diff, alpha=group["gamma"] * b1 / (1 - b1))
        del diff
        w.mul_(1.0 / foreach_norms(u).clamp_min(1.0))
        m = [s["exp_avg"] for s in states]
        v = [s["exp_avg_sq"] for s in states]
        adam_direction_(w, m, v, t, b1, b2, group["eps"], ok, scale)


BASES = {cls.name: cls() for cls in (AdamW, Signum, SGD, Lion, AdEMAMix, MARS, EMA)}
