"""Study: what ``torch.compile`` adds to a CPU step that is one call of torch's fused AdamW / SGD kernel.

Our plain AdamW and SGD presets step with torch's fused kernel on a CPU, eagerly and compiled alike (compiled,
through the ``spectrakit::fused_adamw_step_`` / ``fused_sgd_step_`` operators: inductor has nothing to fuse).
This times, on the same tensors, the eager and the ``torch.compile``-d (inductor) call of

- ``bare``: the operator alone (step counters advanced, the kernel called; no optimizer, no check): the least
  that any compiled step built on that kernel costs;
- ``step``: our optimizer's step with ``check_finite=False`` (the operator plus the optimizer's Python, which
  the compiled call runs only while tracing);

one call of each per round in a random order, a 64 MiB buffer written before each call (a training step's
forward and backward leave the optimizer's data out of the caches), CPU time of this thread. Prints the medians
and the medians of the per-round compiled / eager ratios, and (``--profile``) the torch profiler's split of
the compiled bare call's time beyond the kernel (10 calls back to back): dynamo's cache lookup (the guards), the
compiled region, the generated wrapper (``Call CompiledFxGraph``: its size and stride checks of every input),
the operator's dispatch to its Python kernel and AOT's runtime prologue.

Usage: ``OMP_NUM_THREADS=1 python benchmarks/studies/study_compiled_floor.py [--widths 16,192,512] [--rounds 61]
[--profile]``. Results: docs/BENCHMARKS.md ("The compiled step's floor on a CPU").
"""
import argparse
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from bench_optim import FLUSH_BYTES, parse_widths, width_shapes  # noqa: E402

# the profiler's events of a compiled call that are not the kernel's own ops
OVERHEAD_EVENTS = ("TorchDynamo Cache Lookup", "Torch-Compiled Region", "Call CompiledFxGraph",
                   "spectrakit::fused_", "AOTDispatcher Runtime Wrapper Prologue", "Pregraph bytecode")


def calls(name: str, d: int, backend: str = "inductor", warm: int = 3) -> tuple[dict, torch.optim.Optimizer]:
    """The eager and compiled (``backend``) callables of ``name`` ("AdamW" or "SGD") at width ``d``, all on one
    set of parameters, gradients and states: ``{(kind, compiled): fn}``, each already called ``warm`` times, and
    the optimizer whose step and states they share."""
    import spectrakit.optim as O
    from spectrakit.optim import fused

    gen = torch.Generator().manual_seed(d)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen) * 0.02) for s in width_shapes(d)]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen) * 1e-2
    opt = getattr(O, name)(params, lr=1e-3, check_finite=False)
    opt.step()  # the states the bare calls step too
    states = [opt.state[p] for p in params]
    grads = [p.grad for p in params]
    # the bare calls run under no_grad, as the optimizer's step does (the parameters require gradients)
    if name == "AdamW":
        m, v = [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states]
        steps = [s["step"] for s in states]

        def bare(op):
            return torch.no_grad()(lambda: op(params, grads, m, v, steps, None, 1e-3, None, 0.9, 0.999, 0.01, 1e-8))

        ops = fused._adamw_step, fused._adamw_op
    else:
        bufs = [s["momentum_buffer"] for s in states]

        def bare(op):
            return torch.no_grad()(lambda: op(params, grads, bufs, None, 1e-3, None, 0.0, 0.9, False))

        ops = fused._sgd_step, fused._sgd_op
    out = {("bare", False): bare(ops[0]), ("bare", True): torch.compile(bare(ops[1]), backend=backend),
           ("step", False): opt.step, ("step", True): torch.compile(opt.step, backend=backend)}
    for fn in out.values():
        for _ in range(warm):
            fn()
    return out, opt


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--widths", default="16,192,512")
    ap.add_argument("--rounds", type=int, default=61)
    ap.add_argument("--profile", action="store_true", help="split the compiled bare call's time beyond the kernel")
    a = ap.parse_args()
    widths = parse_widths(ap, a.widths, "--widths")
    if a.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {a.rounds}")
    torch._dynamo.config.recompile_limit = 64
    flush = torch.empty(FLUSH_BYTES // 4)
    print(f"torch {torch.__version__}, cpu, {torch.get_num_threads()} thread(s), {a.rounds} rounds, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")

    def med(xs):
        return sorted(xs)[len(xs) // 2]

    for d in widths:
        for name in ("AdamW", "SGD"):
            runs, _ = calls(name, d)
            times = {k: [] for k in runs}
            rng, keys = random.Random(d), list(runs)
            for r in range(a.rounds):
                for k in rng.sample(keys, len(keys)):
                    flush.fill_(float(r))
                    t0 = time.thread_time()
                    runs[k]()
                    times[k].append((time.thread_time() - t0) * 1e3)
            for kind in ("bare", "step"):
                e, c = times[(kind, False)], times[(kind, True)]
                print(f"d={d:5d} {name:5s} {kind:4s}: eager {med(e):8.3f} ms, compiled {med(c):8.3f} ms, "
                      f"compiled / eager {med([x / y for x, y in zip(c, e)]):.3f}")
            if a.profile:
                fn = runs[("bare", True)]
                with torch.profiler.profile() as prof:
                    for _ in range(10):
                        fn()
                split = {}
                for ev in prof.key_averages():
                    for key in OVERHEAD_EVENTS:
                        if ev.key.startswith(key) or (key.startswith("Call") and key in ev.key):
                            split[key] = split.get(key, 0.0) + ev.self_cpu_time_total / 10
                print("    compiled bare call beyond the kernel (self CPU us per call, 10 calls back to back): "
                      + ", ".join(f"{k} {v:.0f}" for k, v in split.items()) + f"; total {sum(split.values()):.0f}")


if __name__ == "__main__":
    main()
