"""Optimizer-step time and peak extra memory on the parameter set of a LLaMA model (random gradients).

Compares, in one run: torch AdamW (fused where available), our AdamW (``post="none"``), SpectraAdamW,
SpectraSignum, its regularised Frank-Wolfe variants (``post="spectral_lmo"`` with the nuclear, Schatten-3
and entropy regularisers, and ``post="linf_fw"``; Jiang, Semenov & Stich 2026, §3.1), Muon and a faithful
re-implementation of the SPECTRA paper's reference step (per-parameter loop: clone the weight, run the base
AdamW step, recover ``U`` from the weight difference, 10-step coupled Newton-Schulz soft clip (Alg. 1 + 3,
bf16 on GPU) with its host-synchronising ``if s_max <= c``).

For our optimizers it also times the matrix-function calls alone (``post ms``: the batched post/pre-transform
calls of one step, recorded through the ``_post_transform_groups`` hook and replayed on the same inputs),
interleaved rep by rep with steps (``step (interleaved) ms``), and their difference (``step - post ms``:
non-finite check, grad copy, base direction, update), so the step overhead beyond the matrix function is
visible.

Peak extra memory of one step (``peak_extra_MiB``, ``extra / largest param``; the target is about one
copy of the largest parameter): on CUDA ``torch.cuda.max_memory_allocated`` over the timed steps minus the
memory held before them; on CPU the peak of allocated-minus-freed bytes over one step from the profiler's
memory events (:func:`spectrakit.linalg.timing.cpu_peak_extra_bytes`; the allocation pattern does not depend
on the device).

Also reports the FLOP-count bound of the soft clips of SpectraAdamW: model FLOPs of
``linalg.soft_clip(method="polar")`` divided by the measured matmul throughput of the device in the compute
dtype, and (CUDA) whether ``torch.cuda.set_sync_debug_mode("error")`` passes for our optimizers.

``--compile-widths 192`` (with ``--presets``, ``--backend``; ``--presets`` also takes
``SpectraSignum-nuclear`` and ``SpectraSignum-linf_fw``, the Frank-Wolfe posts): for each preset and width,
the eager step and the ``torch.compile``-d step (``torch.compile(opt.step)``, default inductor) of our
optimizer and of its torch counterpart (torch AdamW for AdamW, Lion and Signum, torch SGD for SGD; foreach on
CPU, fused on CUDA), in interleaved rounds, medians of the per-round ratios; the first compiled call's time (the
compile; set ``TORCHINDUCTOR_CACHE_DIR`` to an empty folder for a cold compile, else inductor's caches shorten
it), graph breaks (``torch._dynamo.explain`` of a twin optimizer) and recompiles over the timed calls.

``--host-overhead 16``: the host (Python and dispatch) cost of the multi-tensor step, the path a GPU takes
(forced on a CPU, where a small width makes the step host-bound too): step time and the ops one step issues, of
torch AdamW (foreach), AdamW (``torch_kernel=False``), Lion, Signum, SGD (``torch_kernel=False``) and
SpectraAdamW, interleaved rounds.

``--parity-widths 192,256,512,1024``: the eager step of the plain AdamW, SGD, Lion and Signum presets against
torch's AdamW / SGD (foreach and fused), interleaved rounds, medians of the per-round ratios, and the non-finite
check of a step alone (the part of a checked AdamW/SGD step beyond torch's fused kernel). All of them step the
same tensors (parameters, gradients, and the states whose layouts agree), with the CPU's caches flushed before
each step: separate copies made a step's time depend on where its tensors lay (up to 13% between two instances
of the same torch step). ``--clock cpu`` times
by this thread's CPU time instead of the wall clock: on a machine shared with other jobs the wall time of a step
also counts the time the process waited for a core, which made the parts of a step seem not to add up.

Usage: ``python benchmarks/bench_optim.py`` (GPU: the 124M LLaMA preset, d = 768, 12 layers, SwiGLU 2048,
untied 50304 vocab; CPU: the ``small`` preset, d = 192, 2 layers, hidden 512, vocab 2048).
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import command_line, parse_widths, time_fn, write_section  # noqa: E402
from spectrakit.experiments.io import environment, markdown_table  # noqa: E402
from spectrakit.linalg.flops import soft_clip_fast_flops_by_dtype, soft_clip_polar_flops  # noqa: E402
from spectrakit.linalg.timing import cpu_peak_extra_bytes  # noqa: E402
from spectrakit.optim import AdamW, Muon, SpectraAdamW, SpectraSignum  # noqa: E402
from spectrakit.optim.transforms import POST_TRANSFORMS  # noqa: E402

PRESETS = {
    "124m": dict(d=768, layers=12, hidden=2048, vocab=50304),
    "small": dict(d=192, layers=2, hidden=512, vocab=2048),
}


def llama_shapes(d: int, layers: int, hidden: int, vocab: int) -> list[tuple[int, ...]]:
    """Parameter shapes of an untied LLaMA: embedding, per layer q,k,v,o + SwiGLU gate/up/down + 2 RMSNorm
    weights, final norm, output head."""
    shapes: list[tuple[int, ...]] = [(vocab, d)]
    for _ in range(layers):
        shapes += [(d, d)] * 4 + [(hidden, d), (hidden, d), (d, hidden), (d,), (d,)]
    return shapes + [(d,), (vocab, d)]


class PaperReferenceSpectra:
    """The paper's reference wrapper, re-implemented faithfully: a base ``torch.optim.AdamW`` (weight decay
    0) stepped on every parameter, ``U`` recovered as ``(old - new) / lr`` from a clone of each weight, then
    ``X = (1 - lr wd) old - lr alpha SSC_c(U)`` per matrix with Algorithm 1 (Gershgorin/Frobenius bound,
    ``if s_max <= c: return X``) and Algorithm 3 (coupled Newton-Schulz inverse square root, ``Ns`` steps)."""

    def __init__(self, params, lr=1e-3, weight_decay=0.1, c=10.0, ns=10, dtype=torch.bfloat16):
        self.params = list(params)
        self.lr, self.wd, self.c, self.ns, self.dtype = lr, weight_decay, c, ns, dtype
        self.base = torch.optim.AdamW(self.params, lr=lr, weight_decay=0.0, foreach=False)

    def ssc(self, X: torch.Tensor) -> torch.Tensor:
        tall = X.shape[0] > X.shape[1]
        Xw = (X.T if tall else X).to(self.dtype)
        G = Xw @ Xw.T
        s_max2 = min(float(torch.linalg.matrix_norm(G.float())), float(G.float().abs().sum(1).max()))
        if s_max2**0.5 <= self.c:  # the reference's host-synchronising branch
            return X
        alpha = 1 + s_max2 / self.c**2
        eye = torch.eye(G.shape[0], dtype=self.dtype, device=X.device)
        Y, Z = (eye + G / self.c**2) / alpha, eye
        for _ in range(self.ns):
            T = (3 * eye - Z @ Y) / 2
            Y, Z = Y @ T, T @ Z
        out = (Z / math.sqrt(alpha)) @ Xw
        return (out.T if tall else out).to(X.dtype)

    @torch.no_grad()
    def step(self):
        old = [p.detach().clone() for p in self.params]
        self.base.step()
        for p, o in zip(self.params, old):
            if p.ndim < 2:
                p.add_(o, alpha=-self.lr * self.wd)  # 1-D: base update + decoupled decay of the old weight
                continue
            U = (o - p) / self.lr
            m, n = p.shape[0], p[0].numel()
            p.copy_(
                o * (1 - self.lr * self.wd)
                - self.lr * max(1.0, math.sqrt(m / n)) * self.ssc(U.reshape(m, n)).reshape(p.shape)
            )


def soft_clip_flops(shapes, dtype) -> float:
    """Matmul FLOPs of SpectraAdamW's default soft clip over every matrix parameter, counted by
    :mod:`spectrakit.linalg.flops` (the products the implementation issues): the fast Gram-level route
    (``soft_clip(tall_steps=0)``) for fp32/fp64 compute, the accurate polar route for bf16 (its fallback)."""

    def one(m: int, n: int) -> float:
        if dtype == torch.bfloat16:
            return soft_clip_polar_flops(m, n, dtype)
        return sum(soft_clip_fast_flops_by_dtype(m, n, dtype=dtype).values())

    return sum(one(s[0], math.prod(s[1:])) for s in shapes if len(s) >= 2)


def record_transform_calls(opt) -> list[tuple]:
    """Run one step of a :class:`~spectrakit.optim.Spectra` optimizer and return its matrix-transform calls
    ``(name, U, c, steps, dtype, kwargs)`` (inputs cloned before the call; ``kwargs``: the group's extra
    transform arguments, e.g. the regularizer of ``post="spectral_lmo"``), in order."""
    calls: list[tuple] = []
    hook = opt._post_transform_groups

    def recording(batches):
        calls.extend(
            (b["post"], b["U"].clone(), b["c"], b["steps"], b["dtype"], b.get("post_kwargs") or {}) for b in batches
        )
        return hook(batches)

    opt._post_transform_groups = recording
    try:
        opt.step()
    finally:
        del opt._post_transform_groups
    return calls


def replay(calls: list[tuple]) -> None:
    """The recorded transform calls alone (same inputs, same order), with the variant the optimizer calls
    (``fn.inplace`` where one exists: it overwrites the recorded input, which changes neither the work nor
    the memory traffic of the next replay)."""
    for name, U, c, steps, dtype, kwargs in calls:
        fn = POST_TRANSFORMS[name]
        fn = getattr(fn, "inplace", fn)
        if fn is not None:
            fn(U, c, steps, dtype, **kwargs)


def matmul_tflops(device, dtype, size: int) -> float:
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    ms = time_fn(lambda: a @ b, device, warmup=2, reps=5)
    return 2 * size**3 / (ms * 1e-3) / 1e12


def bench(preset: str, device: str, reps: int) -> tuple[list[dict], dict]:
    shapes = llama_shapes(**PRESETS[preset])
    cuda = device.startswith("cuda")
    post_dtype = "bfloat16" if cuda else None
    gen = torch.Generator(device=device).manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, device=device, generator=gen) * 0.02) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, device=device, generator=gen) * 1e-2
    largest = max(p.numel() * p.element_size() for p in params)
    fused = dict(fused=True) if cuda else dict(foreach=True)
    makers = {
        "torch AdamW" + (" (fused)" if cuda else " (foreach)"): lambda ps: torch.optim.AdamW(
            ps, lr=1e-3, **fused
        ),
        "spectrakit AdamW": lambda ps: AdamW(ps, lr=1e-3),
        "SpectraAdamW": lambda ps: SpectraAdamW(ps, lr=1e-3, post_dtype=post_dtype),
        "SpectraAdamW (soft_clip_accurate)": lambda ps: SpectraAdamW(
            ps, lr=1e-3, post="soft_clip_accurate", post_dtype=post_dtype
        ),
        "SpectraAdamW (soft_clip_ns)": lambda ps: SpectraAdamW(
            ps, lr=1e-3, post="soft_clip_ns", post_dtype=post_dtype
        ),
        "SpectraSignum": lambda ps: SpectraSignum(ps, lr=1e-3, post_dtype=post_dtype),
        # the regularised Frank-Wolfe variants (Jiang, Semenov & Stich 2026, §3.1), at the b of the CLI presets
        "SpectraSignum (lmo nuclear)": lambda ps: SpectraSignum(
            ps, lr=1e-3, post="spectral_lmo", regularizer="nuclear", b=4.0, post_dtype=post_dtype
        ),
        "SpectraSignum (lmo schatten-3)": lambda ps: SpectraSignum(
            ps, lr=1e-3, post="spectral_lmo", regularizer="schatten", p=3.0, b=0.1, post_dtype=post_dtype
        ),
        "SpectraSignum (lmo entropy)": lambda ps: SpectraSignum(
            ps, lr=1e-3, post="spectral_lmo", regularizer="entropy", b=4.0, post_dtype=post_dtype
        ),
        "SpectraSignum (linf_fw)": lambda ps: SpectraSignum(ps, lr=1e-3, post="linf_fw", post_dtype=post_dtype),
        "Muon": lambda ps: Muon(ps, lr=0.02, post_dtype="bfloat16" if cuda else "float32"),
        "paper reference (clone + NS10 SSC)": lambda ps: PaperReferenceSpectra(
            ps, dtype=torch.bfloat16 if cuda else torch.float32
        ),
    }
    rows = []
    for name, make in makers.items():
        opt = make(params)
        opt.step()  # allocate state
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base_mem = torch.cuda.memory_allocated()
        ms = time_fn(opt.step, device, warmup=2, reps=reps)
        row = {"optimizer": name, "step_ms": ms}
        extra = torch.cuda.max_memory_allocated() - base_mem if cuda else cpu_peak_extra_bytes(opt.step)
        row["peak_extra_MiB"] = extra / 2**20
        row["extra / largest param"] = extra / largest
        if cuda:
            if not name.startswith(("torch", "paper")):
                try:
                    torch.cuda.set_sync_debug_mode("error")
                    opt.step()
                    torch.cuda.synchronize()
                    row["host syncs"] = "none"
                except RuntimeError:
                    row["host syncs"] = "SYNC"
                finally:
                    torch.cuda.set_sync_debug_mode(0)
        if hasattr(opt, "_post_transform_groups"):
            # step and transform-alone reps interleaved (same machine state), medians of each
            calls = record_transform_calls(opt)
            replay(calls)
            steps, posts = [], []
            for _ in range(reps):
                steps.append(time_fn(opt.step, device, warmup=0, reps=1))
                posts.append(time_fn(lambda calls=calls: replay(calls), device, warmup=0, reps=1) if calls else 0.0)
            row["step (interleaved) ms"] = sorted(steps)[len(steps) // 2]
            row["post ms"] = sorted(posts)[len(posts) // 2]
            row["step - post ms"] = row["step (interleaved) ms"] - row["post ms"]
            del calls
        rows.append(row)
        del opt
        for p in params:  # keep the weights bounded across many steps
            p.data.normal_(0, 0.02, generator=gen)
    ref = next(r["step_ms"] for r in rows if r["optimizer"].startswith("paper"))
    for r in rows:
        r["ref / this"] = ref / r["step_ms"]
    cdt = torch.bfloat16 if cuda else torch.float32
    tflops = matmul_tflops(device, cdt, 8192 if cuda else 1024)
    flops = soft_clip_flops(shapes, cdt)
    info = {
        "params (M)": sum(math.prod(s) for s in shapes) / 1e6,
        "matrices": sum(len(s) >= 2 for s in shapes),
        "soft-clip GFLOP": flops / 1e9,
        "matmul TFLOP/s": tflops,
        "soft-clip FLOP bound (ms)": flops / (tflops * 1e12) * 1e3,
        "largest param (MiB)": largest / 2**20,
    }
    return rows, info


def width_shapes(d: int) -> list[tuple[int, ...]]:
    """The 2-layer LLaMA parameter set of width ``d``: SwiGLU hidden ``8d/3`` rounded up to a multiple of 64,
    vocab 2048 (d = 192 is the ``small`` preset)."""
    return llama_shapes(d, 2, -(-8 * d // 3 // 64) * 64, 2048)


def ns_flops(shapes) -> float:
    """Matmul FLOPs of 10 coupled Newton-Schulz steps per matrix (Gram, 30 products of m x m, final product)."""
    total = 0.0
    for s in shapes:
        if len(s) >= 2:
            m, n = sorted((s[0], math.prod(s[1:])))
            total += 4 * m * m * n + 60 * m**3
    return total


def _timed_step(opt, device, ctx) -> float:
    with ctx():
        return time_fn(opt.step, device, warmup=0, reps=1)


def _polar_lmo():
    """Context: ``spectral_lmo``'s default method is the polar route on every device (the route of the
    regularised Frank-Wolfe posts before the Gram route; for comparison rows)."""
    import contextlib

    import spectrakit.linalg.lmo as lmo

    @contextlib.contextmanager
    def ctx():
        old = lmo.GRAM_DEVICE_TYPES
        lmo.GRAM_DEVICE_TYPES = ()
        try:
            yield
        finally:
            lmo.GRAM_DEVICE_TYPES = old

    return ctx()


LMO_VARIANTS = {
    "lmo nuclear": dict(post="spectral_lmo", regularizer="nuclear", b=4.0),
    "lmo frobenius": dict(post="spectral_lmo", regularizer="frobenius", b=4.0),
    "lmo schatten-3": dict(post="spectral_lmo", regularizer="schatten", p=3.0, b=0.1),
    "lmo entropy": dict(post="spectral_lmo", regularizer="entropy", b=4.0),
    "linf_fw": dict(post="linf_fw"),
}


def bench_widths(widths, device: str, reps: int, max_bf16_s: float, lmo: bool = True,
                 polar_lmo: bool = False, only: list[str] | None = None) -> list[dict]:
    """For each width: step times of the optimizers in interleaved rounds (one step of each per round),
    medians of the per-round ratios to torch AdamW and to the two Newton-Schulz yardsticks (the paper's
    Alg. 1 + 3 with 10 steps as the optimizer computes it: ``post="soft_clip_ns"``, in bf16 and in fp32),
    and the peak extra memory of one step. The bf16 yardstick forces bf16 (``bf16_matmul_override(True)``:
    the published algorithm computes in bf16 whatever the hardware); it is skipped where its estimated
    step (FLOPs / measured bf16 matmul rate) exceeds ``max_bf16_s`` seconds (emulated bf16). ``lmo``: also
    SpectraSignum with the regularised Frank-Wolfe posts (:data:`LMO_VARIANTS`, default routes), with a
    ``/ SpectraSignum`` ratio; ``polar_lmo``: and the same posts on the polar route (``_polar_lmo``)."""
    import contextlib

    from spectrakit.linalg import bf16_matmul_override

    cuda = device.startswith("cuda")
    plain = contextlib.nullcontext
    rows = []
    for d in widths:
        shapes = width_shapes(d)
        gen = torch.Generator(device=device).manual_seed(d)
        init = [torch.randn(s, device=device, generator=gen) * 0.02 for s in shapes]
        grads = [torch.randn(s, device=device, generator=gen) * 1e-2 for s in shapes]
        largest = max(t.numel() * t.element_size() for t in init)
        bf16_rate = matmul_tflops(device, torch.bfloat16, d) * 1e12
        est_bf16_s = ns_flops(shapes) / bf16_rate
        makers = {
            "torch AdamW (" + ("fused" if cuda else "foreach") + ")": (
                lambda ps: torch.optim.AdamW(ps, lr=1e-3, **(dict(fused=True) if cuda else dict(foreach=True))), plain),
            "SpectraAdamW": (lambda ps: SpectraAdamW(ps, lr=1e-3), plain),
            "SpectraAdamW (post_dtype=bfloat16)": (lambda ps: SpectraAdamW(ps, lr=1e-3, post_dtype="bfloat16"), plain),
            "yardstick NS10 fp32": (lambda ps: SpectraAdamW(ps, lr=1e-3, post="soft_clip_ns"), plain),
        }
        if est_bf16_s <= max_bf16_s:
            makers["yardstick NS10 bf16"] = (
                lambda ps: SpectraAdamW(ps, lr=1e-3, post="soft_clip_ns", post_dtype="bfloat16"),
                lambda: bf16_matmul_override(True))
            # what post_dtype="bfloat16" computed before it followed bf16_matmul_fast: the bf16 polar route
            makers["SpectraAdamW (bf16 polar route, forced)"] = (
                lambda ps: SpectraAdamW(ps, lr=1e-3, post="soft_clip_accurate", post_dtype="bfloat16"),
                lambda: bf16_matmul_override(True))
        if lmo:
            makers["SpectraSignum"] = (lambda ps: SpectraSignum(ps, lr=1e-3), plain)
            for label, kw in LMO_VARIANTS.items():
                makers[f"SpectraSignum ({label})"] = (lambda ps, kw=kw: SpectraSignum(ps, lr=1e-3, **kw), plain)
                if polar_lmo:
                    makers[f"SpectraSignum ({label}, polar route)"] = (
                        lambda ps, kw=kw: SpectraSignum(ps, lr=1e-3, **kw), _polar_lmo)
        if only is not None:
            first = next(iter(makers))
            makers = {k: v for k, v in makers.items() if k == first or k in only}
        opts = {}
        for name, (make, ctx) in makers.items():
            ps = [torch.nn.Parameter(t.clone()) for t in init]
            for p, g in zip(ps, grads):
                p.grad = g.clone()
            opt = make(ps)
            with ctx():
                opt.step()  # allocate state
                extra = cpu_peak_extra_bytes(opt.step) if not cuda else None
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                with ctx():
                    opt.step()
                torch.cuda.synchronize()
                extra = torch.cuda.max_memory_allocated() - base
            opts[name] = (opt, ctx, extra)
        times = {name: [] for name in opts}
        for _ in range(reps):  # interleaved rounds: one step of each optimizer per round
            for name, (opt, ctx, _) in opts.items():
                times[name].append(_timed_step(opt, device, ctx))

        def med(xs):
            return sorted(xs)[len(xs) // 2]

        base_name = next(iter(opts))
        for name, (_, _, extra) in opts.items():
            row = {"d": d, "optimizer": name, "step ms": med(times[name])}
            for label, ref in (("/ torch AdamW", base_name), ("/ NS10 bf16", "yardstick NS10 bf16"),
                               ("/ NS10 fp32", "yardstick NS10 fp32"), ("/ SpectraSignum", "SpectraSignum")):
                row[label] = (med([a / b for a, b in zip(times[name], times[ref])]) if ref in times
                              else float("nan"))
            row["peak extra MiB"] = extra / 2**20
            row["extra / largest param"] = extra / largest
            rows.append(row)
        if "yardstick NS10 bf16" not in opts:
            rows.append({"d": d, "optimizer": f"yardstick NS10 bf16: skipped, estimated {est_bf16_s:.0f} s/step "
                         f"(bf16 matmul {bf16_rate / 1e9:.1f} GFLOP/s at n={d})"})
        del opts
    return rows


TORCH_COUNTERPART = {"AdamW": "AdamW", "SGD": "SGD", "Lion": "AdamW", "Signum": "AdamW"}
# --presets names beyond the optimizer classes: (class, options); the regularised Frank-Wolfe post at the b of the
# CLI presets (Jiang, Semenov & Stich 2026, §3.1)
COMPILE_VARIANTS = {
    "SpectraSignum-nuclear": ("SpectraSignum", dict(post="spectral_lmo", regularizer="nuclear", b=4.0)),
    "SpectraSignum-linf_fw": ("SpectraSignum", dict(post="linf_fw")),
}


def _make(name: str, params, cuda: bool):
    """Our preset ``name`` or, for ``"torch X"``, torch's optimizer X (foreach on CPU, fused on CUDA) with
    the same hyperparameters where they exist."""
    from spectrakit import optim as O

    if name.startswith("torch "):
        kind = dict(fused=True) if cuda else dict(foreach=True)
        if name == "torch SGD":
            return torch.optim.SGD(params, lr=1e-3, momentum=0.9, **kind)
        return torch.optim.AdamW(params, lr=1e-3, **kind)
    name, options = COMPILE_VARIANTS.get(name, (name, {}))
    return getattr(O, name)(params, lr=1e-3, **options)


def bench_compile(widths, presets, device: str, reps: int, backend: str) -> list[dict]:
    """Eager and compiled step times of ``presets`` and their torch counterparts at each width (see the module
    docstring); one row per (width, optimizer). Every compiled step keeps its own graphs (each optimizer is
    a separate guard entry of the same ``step`` code: the recompile limit is raised for the run). The eager
    and compiled optimizers of a name step the same tensors (states shared after one eager step each, so the
    compile time is that of the first compiled call after one eager step); the timed rounds take the steps in
    a random order, with the CPU's caches flushed before each."""
    from torch._dynamo.utils import counters

    torch._dynamo.config.recompile_limit = 64
    cuda = device.startswith("cuda")
    refs = {p: "torch " + TORCH_COUNTERPART.get(p, "AdamW") for p in presets}
    names = list(dict.fromkeys(n for p in presets for n in (refs[p], p)))
    rows = []
    for d in widths:
        torch._dynamo.reset()
        shapes = width_shapes(d)
        gen = torch.Generator(device=device).manual_seed(d)
        init = [torch.randn(s, device=device, generator=gen) * 0.02 for s in shapes]
        grads = [torch.randn(s, device=device, generator=gen) * 1e-2 for s in shapes]
        runs = {}
        for name in names:
            # the eager and the compiled optimizer of a name step the same parameters and keep their states in
            # the same tensors (each stepped once eagerly, then shared): their ratio compares the two steps, not
            # where two copies lie (separate copies moved a step's time by up to 13%, "Parity on shared tensors")
            ps = [torch.nn.Parameter(t.clone()) for t in init]
            for p, g in zip(ps, grads):
                p.grad = g.clone()
            pair = {compiled: _make(name, ps, cuda) for compiled in (False, True)}
            for opt in pair.values():
                opt.step()
            share_states(pair, ps)
            for compiled, opt in pair.items():
                step, info = opt.step, {}
                if compiled:
                    # graph breaks: torch._dynamo.explain of a twin optimizer (the global counters mix the runs)
                    twin = [torch.nn.Parameter(t.clone()) for t in init]
                    for p, g in zip(twin, grads):
                        p.grad = g.clone()
                    info["graph breaks"] = torch._dynamo.explain(_make(name, twin, cuda).step)().graph_break_count
                    del twin
                    graphs0 = counters["stats"]["unique_graphs"]
                    step = torch.compile(opt.step, backend=backend)
                    info["compile s"] = time_fn(step, device, warmup=0, reps=1) / 1e3
                    graphs1 = counters["stats"]["unique_graphs"]
                    for _ in range(3):
                        step()
                    info["graphs"] = graphs1 - graphs0
                    info["recompiles"] = counters["stats"]["unique_graphs"] - graphs1
                runs[(name, compiled)] = (step, info)
        times = {k: [] for k in runs}
        order, keys = random.Random(d), list(runs)
        flush = None if cuda else torch.empty(FLUSH_BYTES // 4)
        for r in range(reps):  # interleaved rounds: one step of each, in a random order, caches flushed (CPU)
            for k in order.sample(keys, len(keys)):
                if flush is not None:
                    flush.fill_(float(r))
                times[k].append(time_fn(runs[k][0], device, warmup=0, reps=1))

        def med(xs):
            return sorted(xs)[len(xs) // 2]

        def ratio(a, b, times=times):
            return med([x / y for x, y in zip(times[a], times[b])])

        for name in names:
            ref = refs.get(name, name)
            info = runs[(name, True)][1]
            rows.append({"d": d, "optimizer": name, "torch counterpart": ref,
                         "eager ms": med(times[(name, False)]),
                         "eager / torch eager": ratio((name, False), (ref, False)),
                         "compiled ms": med(times[(name, True)]),
                         "compiled / torch compiled": ratio((name, True), (ref, True)),
                         "compiled / own eager": ratio((name, True), (name, False)),
                         "compile s": info["compile s"], "graphs": info["graphs"],
                         "graph breaks": info["graph breaks"], "recompiles (calls 2-4)": info["recompiles"]})
    return rows


# eager parity of the plain presets: (our preset, its keyword options) against torch's (foreach, fused) forms
PARITY = {
    "AdamW": ("AdamW", {}),
    "AdamW (check_finite=False)": ("AdamW", dict(check_finite=False)),
    "SGD": ("SGD", {}),
    "SGD (check_finite=False)": ("SGD", dict(check_finite=False)),
    "Lion": ("Lion", {}),
    "Signum": ("Signum", {}),
}


# the non-finite check of a step alone (the per-gradient aminmax and the flag), timed in the parity rounds
CHECK = "non-finite check alone"

# presets stepped with ``step(grad_norm=...)``: the gradients' norm, taken once before the rounds (a training loop
# that clips or logs the norm has it anyway), decides the step's non-finite check instead of a pass over them
GIVEN_NORM = {"AdamW (grad norm given)": "AdamW", "SGD (grad norm given)": "SGD"}


def parity_makers(device: str) -> dict:
    """Every optimizer of the eager-parity rounds: torch AdamW / SGD (momentum 0.9) foreach and, where torch
    has it on ``device``, fused; our presets of :data:`PARITY` (an option this version of spectrakit lacks
    leaves its row out)."""
    from spectrakit import optim as O

    makers = {}
    for kind in ("foreach", "fused"):
        makers[f"torch AdamW ({kind})"] = lambda ps, k=kind: torch.optim.AdamW(ps, lr=1e-3, **{k: True})
        makers[f"torch SGD ({kind})"] = lambda ps, k=kind: torch.optim.SGD(ps, lr=1e-3, momentum=0.9, **{k: True})
    for label, (name, kw) in PARITY.items():
        makers[label] = lambda ps, name=name, kw=kw: getattr(O, name)(ps, lr=1e-3, **kw)
    for label, name in GIVEN_NORM.items():
        makers[label] = lambda ps, name=name: getattr(O, name)(ps, lr=1e-3)
    return makers


def _cpu_time_ms(fn) -> float:
    """CPU time of this thread during ``fn()`` in ms: on a shared machine the wall time also counts the time
    the process waited for a core (memory stalls are CPU time, so a memory-bound step is still measured)."""
    t0 = time.thread_time()
    fn()
    return (time.thread_time() - t0) * 1e3


def share_states(opts: dict, params: list[torch.Tensor]) -> int:
    """Make the optimizers of ``opts`` (all built on ``params``, each stepped once) keep their states in the same
    tensors wherever their layouts agree (torch's AdamW and ours: ``step``, ``exp_avg``, ``exp_avg_sq``; torch's
    SGD and ours: ``momentum_buffer``): the first optimizer's tensor of a (parameter, key) is put in the others'
    state. Returns how many state tensors were replaced. With the parameters and gradients shared too, every
    optimizer of a round reads and writes the same memory, so a ratio of two steps compares their code and not
    where their tensors happen to lie (two instances of torch's fused SGD, each on its own copies, differed by
    3-13% in one process here, 2026-11-28)."""
    first: dict[tuple[int, str], torch.Tensor] = {}
    replaced = 0
    for opt in opts.values():
        for i, p in enumerate(params):
            state = opt.state.get(p, {})
            for key, value in list(state.items()):
                if not isinstance(value, torch.Tensor):
                    continue
                mine = first.setdefault((i, key), value)
                if mine is not value and (mine.shape, mine.dtype, mine.device) == (value.shape, value.dtype,
                                                                                      value.device):
                    state[key] = mine
                    replaced += 1
    return replaced


# written before each timed parity step (not timed): a training step's forward and backward leave the optimizer's
# tensors and Python objects out of the CPU's caches, and so does this (the largest CPU caches here hold 32 MiB)
FLUSH_BYTES = 64 << 20


def bench_parity(widths, device: str, reps: int, clock: str = "wall", instances: int = 3) -> list[dict]:
    """Eager step of the plain presets against torch at each width: one step of every optimizer per round
    (interleaved rounds, in a random order each round), medians of the per-round ratios. AdamW and
    SGD against torch's AdamW / SGD (momentum 0.9), foreach and fused; Lion and Signum (no torch counterpart)
    against torch AdamW. Also the non-finite check alone (what a checked AdamW / SGD step does beyond torch's
    fused kernel), timed on the same gradients in the same rounds. All optimizers step the same parameters and
    gradients and share their states where the layouts agree (:func:`share_states`), each through ``instances``
    optimizer objects taken in turn; on a CPU a 64 MiB buffer is written before each timed step
    (caches cold, as after a forward and backward pass). ``clock``: ``"wall"`` (device-synchronised wall time) or
    ``"cpu"`` (this thread's CPU time, CPU device only)."""
    timer = _cpu_time_ms if clock == "cpu" else (lambda fn: time_fn(fn, device, warmup=0, reps=1))
    flush = torch.empty(FLUSH_BYTES // 4) if torch.device(device).type == "cpu" else None
    rows = []
    for d in widths:
        shapes = width_shapes(d)
        gen = torch.Generator(device=device).manual_seed(d)
        params = [torch.nn.Parameter(torch.randn(s, device=device, generator=gen) * 0.02) for s in shapes]
        for p in params:
            p.grad = torch.randn(p.shape, device=device, generator=gen) * 1e-2
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True)
        opts, calls = {}, {}
        for name, make in parity_makers(device).items():
            try:
                for k in range(instances):
                    opt = opts[(name, k)] = make(params)
                    if name in GIVEN_NORM:
                        opt.step(grad_norm=norm)
                        calls.setdefault(name, []).append(functools.partial(opt.step, grad_norm=norm))
                    else:
                        opt.step()
                        calls.setdefault(name, []).append(opt.step)
            except (TypeError, RuntimeError) as e:  # an option or a fused kernel this version lacks
                print(f"d={d}: {name} left out ({str(e).splitlines()[0][:120]})")
                for k in range(instances):
                    opts.pop((name, k), None)
                calls.pop(name, None)
        share_states(opts, params)
        if ("AdamW", 0) in opts and hasattr(opts[("AdamW", 0)], "_finite_flag"):
            calls[CHECK] = [lambda o=opts[("AdamW", k)], gs=[p.grad for p in params]: o._finite_flag(gs)
                            for k in range(instances)]
        names = list(calls)
        times = {name: [] for name in names}
        order = random.Random(d)
        # a random order each round: in a rotation each step had the same predecessor, and a step right after one
        # of the same code ran up to 6% faster
        for r in range(reps):
            for name in order.sample(names, len(names)):
                if flush is not None:
                    flush.fill_(float(r))
                times[name].append(timer(calls[name][r % instances]))

        def med(xs):
            return sorted(xs)[len(xs) // 2]

        def ratio(a, b, times=times):
            return med([x / y for x, y in zip(times[a], times[b])]) if b in times else float("nan")

        for name in names:
            if name.startswith("torch"):
                continue
            base = GIVEN_NORM.get(name) or (PARITY[name][0] if name in PARITY else None)
            ref = "torch SGD" if base == "SGD" else "torch AdamW"
            rows.append({"d": d, "optimizer": name, "step ms": med(times[name]), "torch": ref,
                         "torch foreach ms": med(times[f"{ref} (foreach)"]),
                         "torch fused ms": med(times[f"{ref} (fused)"]) if f"{ref} (fused)" in times else float("nan"),
                         "/ torch foreach": ratio(name, f"{ref} (foreach)"),
                         "/ torch fused": ratio(name, f"{ref} (fused)")})
    return rows


HOST = {
    "torch AdamW (foreach)": lambda O, ps: torch.optim.AdamW(ps, lr=1e-3, foreach=True),
    "AdamW (torch_kernel=False)": lambda O, ps: O.AdamW(ps, lr=1e-3, torch_kernel=False),
    "Lion": lambda O, ps: O.Lion(ps, lr=1e-3),
    "Signum": lambda O, ps: O.Signum(ps, lr=1e-3),
    "SGD (torch_kernel=False)": lambda O, ps: O.SGD(ps, lr=1e-3, torch_kernel=False),
    "SpectraAdamW": lambda O, ps: O.SpectraAdamW(ps, lr=1e-3),
}


def _top_level_ops(opt) -> int:
    """Ops that one ``opt.step()`` issues directly (children of torch's ``Optimizer.step`` profiler range)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        opt.step()
    events = prof.events()
    top = [e for e in events if e.cpu_parent is None and e.name.startswith("Optimizer.step")]
    return sum(1 for e in events if e.cpu_parent is not None and e.cpu_parent.id in {t.id for t in top})


def bench_host(d: int, device: str, reps: int) -> list[dict]:
    """Host (Python and dispatch) cost of the multi-tensor step, the one a GPU runs: on a CPU the multi-tensor
    path is forced (``Spectra._per_tensor`` and ``Spectra._flag_copies`` False, restored afterwards) at a small
    width ``d``, where the step is host-bound too. One step of every optimizer per round (interleaved rounds),
    median step time, median of the per-round ratios to torch AdamW (foreach), and the ops one step issues
    (:func:`_top_level_ops`)."""
    from spectrakit import optim as O
    from spectrakit.optim.spectra import Spectra

    saved = {n: Spectra.__dict__.get(n) for n in ("_per_tensor", "_flag_copies")}  # (None: inherited)
    if device.startswith("cpu"):
        Spectra._per_tensor = Spectra._flag_copies = staticmethod(lambda device: False)
    try:
        gen = torch.Generator(device=device).manual_seed(d)
        shapes = width_shapes(d)
        opts = {}
        for name, make in HOST.items():
            ps = [torch.nn.Parameter(torch.randn(s, device=device, generator=gen) * 0.02) for s in shapes]
            for p in ps:
                p.grad = torch.randn(p.shape, device=device, generator=gen) * 1e-2
            opts[name] = make(O, ps)
            opts[name].step()
        ops = {name: _top_level_ops(opt) for name, opt in opts.items()}
        times = {name: [] for name in opts}
        for _ in range(reps):
            for name, opt in opts.items():
                times[name].append(time_fn(opt.step, device, warmup=0, reps=1))
    finally:
        for name, value in saved.items():
            if value is None:
                if name in Spectra.__dict__:
                    delattr(Spectra, name)
            else:
                setattr(Spectra, name, value)
    ref = times["torch AdamW (foreach)"]

    def med(xs):
        return sorted(xs)[len(xs) // 2]

    return [{"d": d, "parameters": len(shapes), "optimizer": name, "step ms": med(ts),
             "/ torch AdamW foreach": med([x / y for x, y in zip(ts, ref)]), "ops per step": ops[name]}
            for name, ts in times.items()]


def _report(args, title: str, rows: list[dict], section: str, load: tuple, detail: str = "") -> None:
    """Print one measurement as a markdown section (title, device, torch, threads, ``detail``, date, load at the
    start and end, the command, the table) and, unless ``--no-write``, put it into docs/results/bench/ under the
    marker ``section`` followed by the device kind."""
    env = environment()
    text = (
        f"### optim: {title}\n\ndevice: {env['device']} · torch {env['torch']} · threads {torch.get_num_threads()} · "
        f"{detail}{env['date']} · load average {load[0]:.1f} (start), {os.getloadavg()[0]:.1f} (end)\n\n"
        f"command: `{command_line()}`\n\n" + markdown_table(rows) + "\n"
    )
    print(text)
    if not args.no_write:
        key = "cuda" if args.device.startswith("cuda") else "cpu"
        write_section(section.format(key=key), text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--preset",
        choices=list(PRESETS),
        default=None,
        help="parameter set (default: 124m on CUDA, small on CPU)",
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--no-write", action="store_true", help="do not write docs/results/bench/KEY.md")
    parser.add_argument("--widths", default=None,
                        help="comma-separated model widths, e.g. 192,256,512,1024: 2-layer LLaMA parameter sets "
                             "(vocab 2048), interleaved rounds, ratios to torch AdamW and to the 10-step "
                             "Newton-Schulz soft clip in bf16 and fp32")
    parser.add_argument("--no-lmo", action="store_true",
                        help="with --widths: leave out SpectraSignum and its regularised Frank-Wolfe posts")
    parser.add_argument("--polar-lmo", action="store_true",
                        help="with --widths: also time the Frank-Wolfe posts on the polar route (slow on CPU)")
    parser.add_argument("--only", default=None,
                        help="with --widths: comma-separated optimizer names (as in the table); time only those "
                             "(torch AdamW is always timed)")

    parser.add_argument("--parity-widths", default=None,
                        help="comma-separated widths: eager step of AdamW, SGD, Lion, Signum against torch's AdamW / "
                             "SGD (foreach and fused), interleaved rounds, medians of per-round ratios")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="with --parity-widths: time each step by wall clock, or by this thread's CPU time "
                             "(CPU device only; on a shared machine it leaves out the time spent waiting for a core)")
    parser.add_argument("--host-overhead", type=int, default=None, metavar="WIDTH",
                        help="host cost of the multi-tensor step (forced on a CPU) at one small width, e.g. 16: "
                             "step time and ops per step of torch AdamW foreach and the plain presets")
    parser.add_argument("--compile-widths", default=None,
                        help="comma-separated widths: eager and torch.compile-d steps of --presets and their torch "
                             "counterparts, compile time, graph breaks, recompiles")
    parser.add_argument("--presets", default="AdamW,SGD,Lion,Signum",
                        help="with --compile-widths: comma-separated preset names of spectrakit.optim, or "
                             "SpectraSignum-nuclear / SpectraSignum-linf_fw (its Frank-Wolfe posts)")
    parser.add_argument("--backend", default="inductor", help="with --compile-widths: torch.compile backend")
    parser.add_argument("--max-bf16-s", type=float, default=30.0,
                        help="with --widths: skip the bf16 yardstick where its estimated step exceeds this many "
                             "seconds (bf16 products emulated in software)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.parity_widths:
        widths = parse_widths(parser, args.parity_widths, "--parity-widths")
        load = os.getloadavg()
        if args.clock == "cpu" and not args.device.startswith("cpu"):
            parser.error(f"--clock cpu needs --device cpu, got --device {args.device}")
        rows = bench_parity(widths, args.device, args.reps, args.clock)
        clock = "" if args.clock == "wall" else f"-{args.clock}"
        _report(args, "eager parity of the plain presets with torch (2-layer LLaMA, vocab 2048), interleaved rounds",
                rows, f"optim-parity-{{key}}-{args.parity_widths}{clock}", load, f"clock {args.clock} · ")
        return
    if args.host_overhead is not None:
        width = parse_widths(parser, str(args.host_overhead), "--host-overhead")[0]
        load = os.getloadavg()
        rows = bench_host(width, args.device, args.reps)
        _report(args, f"host overhead of the multi-tensor step (2-layer LLaMA, vocab 2048, d = {width}), interleaved "
                "rounds", rows, f"optim-host-{{key}}-{width}", load)
        return
    if args.compile_widths:
        widths = parse_widths(parser, args.compile_widths, "--compile-widths")
        import spectrakit.optim as O

        presets = [p for p in args.presets.split(",") if p]
        bad = [p for p in presets if not isinstance(getattr(O, p, None), type) and p not in COMPILE_VARIANTS]
        if bad or not presets:
            parser.error(f"--presets must name optimizers of spectrakit.optim or {', '.join(COMPILE_VARIANTS)}, "
                         f"got {bad or args.presets!r}")
        load = os.getloadavg()
        rows = bench_compile(widths, presets, args.device, args.reps, args.backend)
        _report(args, "eager and compiled steps against torch (2-layer LLaMA, vocab 2048), interleaved rounds", rows,
                f"optim-compile-{{key}}-{args.backend}-{args.compile_widths}", load, f"backend {args.backend} · ")
        return
    if args.widths:
        widths = parse_widths(parser, args.widths, "--widths")
        load = os.getloadavg()
        only = None if args.only is None else [w.strip() for w in args.only.split(",") if w.strip()]
        rows = bench_widths(widths, args.device, args.reps, args.max_bf16_s, lmo=not args.no_lmo,
                            polar_lmo=args.polar_lmo, only=only)
        from spectrakit.linalg import bf16_matmul_fast

        tag = args.widths + ("" if only is None else "-" + "-".join(only).replace(" ", "_"))
        _report(args, "step time by width (2-layer LLaMA, vocab 2048), interleaved rounds", rows,
                f"optim-widths-{{key}}-{tag}", load, f"CPU capability {torch.backends.cpu.get_cpu_capability()} · "
                f"bf16 matmuls fast: {bf16_matmul_fast(args.device)} · ")
        return
    preset = args.preset or ("124m" if args.device.startswith("cuda") else "small")
    rows, info = bench(preset, args.device, args.reps)
    env = environment()
    text = (
        f"### optim: optimizer step on the `{preset}` LLaMA parameter set ({PRESETS[preset]})\n\n"
        f"device: {env['device']} · torch {env['torch']} · {env['date']} · load average "
        f"{os.getloadavg()[0]:.1f}\n\ncommand: `{command_line()}`\n\n"
        + markdown_table(rows)
        + "\n\n"
        + markdown_table([info])
        + "\n"
    )
    print(text)
    if not args.no_write:
        write_section(f"optim-{'cuda' if args.device.startswith('cuda') else 'cpu'}", text)


if __name__ == "__main__":
    main()
