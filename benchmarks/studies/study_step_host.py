"""Study: where the host time of the plain presets' eager step goes, against torch's foreach / fused step.

On a GPU the eager step of a small model is host-bound: the time is the Python and the dispatch of each operator
call, not the kernels. For each optimizer on the 2-layer LLaMA parameter set of ``bench_optim.width_shapes(d)``:
the median step time over interleaved rounds (synchronised on a GPU), the top-level operators one step calls
(children of ``Optimizer.step`` in the torch profiler, 10 profiled steps), their time (on a GPU the host time of
the calls; on the CPU also the kernels' work), and the operators that take the most of it; the step time less the
operators' is the Python (validation, grouping, the skip bookkeeping) and the profiler's own cost.
Then the host time of the non-finite check, piece by piece. ``--multi-tensor`` makes spectrakit take the GPU's
multi-tensor code path on the CPU as well.

Usage: ``python benchmarks/studies/study_step_host.py [--device cuda] [--width 256] [--rounds 50] [--multi-tensor]``.
Results: docs/BENCHMARKS.md ("H100 results").
"""
import argparse
import collections
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from bench_optim import parity_makers, width_shapes  # noqa: E402


def make(maker, width, device):
    """``maker`` (one of ``bench_optim.parity_makers``) on a fresh parameter set of width ``width`` with gradients."""
    gen = torch.Generator(device=device).manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(s, device=device, generator=gen) * 0.02) for s in width_shapes(width)]
    for p in ps:
        p.grad = torch.randn(p.shape, device=device, generator=gen) * 1e-2
    return maker(ps)


def host_study_args(ap: argparse.ArgumentParser, device: str, width: int, rounds: int) -> argparse.Namespace:
    """The options of the host-time studies (``--device``, ``--width``, ``--rounds``, ``--multi-tensor``) added to
    ``ap`` with these defaults, parsed and checked (``ap.error``: one line, exit 2); with ``--multi-tensor``,
    spectrakit's optimizers take the multi-tensor (GPU) code path from here on."""
    ap.add_argument("--device", default=device)
    ap.add_argument("--width", type=int, default=width)
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--multi-tensor", action="store_true",
                    help="spectrakit takes the multi-tensor (GPU) code path on the CPU too")
    a = ap.parse_args()
    if a.rounds < 1 or a.width < 1:
        ap.error(f"--rounds and --width must be >= 1, got {a.rounds} and {a.width}")
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {a.device}: this torch has no CUDA device; use --device cpu")
    if a.multi_tensor:
        from spectrakit.optim.spectra import Spectra

        Spectra._per_tensor = Spectra._flag_copies = staticmethod(lambda device: False)
    return a


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a = host_study_args(ap, "cuda" if torch.cuda.is_available() else "cpu", 256, 50)
    cuda = a.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    cases = []
    for label, maker in parity_makers(a.device).items():  # torch's AdamW / SGD foreach and fused, our presets
        try:
            cases.append((label, make(maker, a.width, a.device)))
        except (RuntimeError, ValueError, TypeError) as e:  # e.g. no fused SGD kernel for this device in this torch
            print(f"{label}: not available ({type(e).__name__}: {str(e)[:80]})")
    cases.sort(key=lambda c: not c[0].startswith("torch SGD"))  # the reference first: torch SGD (foreach)
    for _, opt in cases:
        for _ in range(3):
            opt.step()
    sync()
    times = collections.defaultdict(list)
    for _ in range(a.rounds):  # interleaved rounds
        for label, opt in cases:
            t = time.perf_counter()
            opt.step()
            sync()
            times[label].append((time.perf_counter() - t) * 1e6)
    where = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"torch {torch.__version__}, {where}, d = {a.width}, {a.rounds} interleaved rounds, "
          f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}{', multi-tensor path' if a.multi_tensor else ''}")
    from torch.profiler import ProfilerActivity, profile

    ref = statistics.median(times[cases[0][0]])
    reps = 10
    for label, opt in cases:
        for _ in range(2):  # the profiler's own first-use costs land in the first profile: the second is read
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(reps):
                    opt.step()
                sync()
        ops = [e for e in prof.events()
               if e.cpu_parent is not None and e.cpu_parent.name.startswith("Optimizer.step")]
        host = sum(e.cpu_time_total for e in ops) / reps
        by_name = collections.Counter()
        for e in ops:
            by_name[e.name] += e.cpu_time_total / reps
        step = statistics.median(times[label])
        top = ", ".join(f"{n} {us:.0f}" for n, us in by_name.most_common(6))
        print(f"{label:26s} step {step:8.1f} us ({step / ref:.2f}x {cases[0][0]}), {len(ops) // reps:3d} ops, "
              f"their time {host:7.1f} us (profiled); top ops (us): {top}", flush=True)
    checked = [opt for label, opt in cases if label == "AdamW"]
    if checked:  # the non-finite check piece by piece: host time per call (not synchronised), median of 200
        from spectrakit.optim.joint import stack_scalars

        opt = checked[0]
        grads = [p.grad for g in opt.param_groups for p in g["params"]]
        norms = torch._foreach_norm(grads, float("inf"))
        stacked = stack_scalars(norms)
        pieces = [("_foreach_norm(grads, inf)", lambda: torch._foreach_norm(grads, float("inf"))),
                  ("stack_scalars(norms)", lambda: stack_scalars(norms)),
                  ("(norms <= bound).all()", lambda: (stacked <= 1e30).all()),
                  ("the whole check (_finite_flag)", lambda: opt._finite_flag(grads))]
        for name, fn in pieces:
            xs = []
            for _ in range(200):
                t = time.perf_counter()
                fn()
                xs.append((time.perf_counter() - t) * 1e6)
            sync()
            print(f"check: {name:32s} {statistics.median(xs):7.1f} us of host time", flush=True)

if __name__ == "__main__":
    main()
