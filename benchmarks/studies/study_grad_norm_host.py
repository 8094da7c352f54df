"""Study: the host cost of one eager plain AdamW / SGD step with the non-finite check, with ``step(grad_norm=...)``
(the check taken from the gradients' norm) and without the check, against torch's fused and foreach steps.

At a small width the step is host-bound (on a GPU, and on a CPU too): what is measured is the Python and the
dispatch of each operator. ``--multi-tensor`` makes spectrakit take the GPU's multi-tensor code path on the CPU.
Every optimizer steps once per round (interleaved rounds), on the 2-layer LLaMA parameter set of
``bench_optim.width_shapes``; the norm is taken once, as a training loop has it anyway. Prints the median step
time of each and its ratio to torch's fused step.

``--compile`` also times ``torch.compile(opt.step)`` (inductor), checked and with the norm given, and prints each
compiled step against its eager twin.

Usage: ``python benchmarks/studies/study_grad_norm_host.py [--width 16] [--rounds 301] [--multi-tensor] [--device cpu]
[--compile]``.
Results: docs/BENCHMARKS.md ("The gradient norm as the non-finite check").
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from bench_optim import width_shapes  # noqa: E402
from study_step_host import host_study_args  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compile", action="store_true",
                    help="also time torch.compile(opt.step), checked and with the norm given")
    a = host_study_args(ap, "cpu", 16, 301)
    import spectrakit.optim as O

    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    gen = torch.Generator(device=a.device).manual_seed(0)
    init = [torch.randn(s, device=a.device, generator=gen) * 0.02 for s in width_shapes(a.width)]
    grads = [torch.randn(t.shape, device=a.device, generator=gen) * 1e-2 for t in init]
    norm = torch.nn.utils.get_total_norm(grads)

    def params():
        ps = [torch.nn.Parameter(t.clone()) for t in init]
        for p, g in zip(ps, grads):
            p.grad = g.clone()
        return ps

    print(f"torch {torch.__version__}, {a.device}, d = {a.width}, {a.rounds} interleaved rounds, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}{', multi-tensor path' if a.multi_tensor else ''}")
    for name in ("AdamW", "SGD"):
        kw = {"momentum": 0.9} if name == "SGD" else {}
        ours, theirs = getattr(O, name), getattr(torch.optim, name)
        opts = {"torch fused": theirs(params(), lr=1e-3, fused=True, **kw),
                "torch foreach": theirs(params(), lr=1e-3, foreach=True, **kw),
                "checked": ours(params(), lr=1e-3, **kw),
                "grad norm given": ours(params(), lr=1e-3, **kw),
                "check_finite=False": ours(params(), lr=1e-3, check_finite=False, **kw)}
        calls = {k: opt.step for k, opt in opts.items()}
        calls["grad norm given"] = lambda opt=opts["grad norm given"]: opt.step(grad_norm=norm)
        if a.compile:
            calls["compiled checked"] = torch.compile(ours(params(), lr=1e-3, **kw).step)
            given = torch.compile(ours(params(), lr=1e-3, **kw).step)
            calls["compiled grad norm given"] = lambda step=given: step(grad_norm=norm)
        times: dict = {k: [] for k in calls}
        for fn in calls.values():  # the first step creates the states
            fn()
        sync()
        for _ in range(a.rounds):
            for k, fn in calls.items():
                t0 = time.perf_counter()
                fn()
                sync()
                times[k].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
        print(f"{name}: " + ", ".join(f"{k} {v:.0f} us ({v / med['torch fused']:.2f}x)" for k, v in med.items()))
        if a.compile:
            print(f"{name}: compiled / eager: checked {med['compiled checked'] / med['checked']:.3f}, grad norm given "
                  f"{med['compiled grad norm given'] / med['grad norm given']:.3f}")


if __name__ == "__main__":
    main()
