"""Where SGD's step time went (run on commit 3d362d1, whose SGD states still had step counters): torch's fused
SGD step, ours, the fused route's eager function (counters advanced, kernel called) and torch's kernel alone,
one parameter set, random order per round, a 64 MiB write before each call, CPU time.
Usage: ``OMP_NUM_THREADS=1 python benchmarks/studies/study_sgd_dissect.py 192 201``."""
import os
import random
import sys
import time

import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]
from bench_optim import FLUSH_BYTES, share_states, width_shapes  # noqa: E402

import spectrakit.optim as O  # noqa: E402
from spectrakit.optim import fused  # noqa: E402

KERNEL = dict(weight_decay=0.0, momentum=0.9, lr=1e-3, dampening=0.0, nesterov=False, maximize=False,
              is_first_step=False)


def main():
    torch.set_num_threads(1)
    d, reps = int(sys.argv[1]), int(sys.argv[2])
    gen = torch.Generator().manual_seed(d)
    ps = [torch.nn.Parameter(torch.randn(s, generator=gen) * 0.02) for s in width_shapes(d)]
    for p in ps:
        p.grad = torch.randn(p.shape, generator=gen) * 1e-2
    opts = {"torch": torch.optim.SGD(ps, lr=1e-3, momentum=0.9, fused=True),
            "ours": O.SGD(ps, lr=1e-3, check_finite=False)}
    for opt in opts.values():
        opt.step()
    share_states(opts, ps)
    states = [opts["ours"].state[p] for p in ps]
    grads = [p.grad for p in ps]
    bufs = [s["momentum_buffer"] for s in states]
    steps = [s["step"] for s in states]
    rev = [x[::-1] for x in (ps, grads, bufs, steps)]

    @torch.no_grad()
    def bare_advance():
        fused._sgd_step(*rev, None, 1e-3, None, 0.0, 0.9, False)

    @torch.no_grad()
    def kernel_reversed():
        torch._fused_sgd_(*rev[:3], **KERNEL)

    @torch.no_grad()
    def kernel_forward():
        torch._fused_sgd_(ps, grads, bufs, **KERNEL)

    runs = {"torch fused": opts["torch"].step, "ours": opts["ours"].step, "bare+advance": bare_advance,
            "bare kernel rev": kernel_reversed, "bare kernel fwd": kernel_forward}
    flush = torch.empty(FLUSH_BYTES // 4)
    times = {k: [] for k in runs}
    rng, keys = random.Random(0), list(runs)
    for r in range(reps):
        for k in rng.sample(keys, len(keys)):
            flush.fill_(float(r))
            t0 = time.thread_time()
            runs[k]()
            times[k].append(time.thread_time() - t0)

    def med(xs):
        return sorted(xs)[len(xs) // 2]

    for k in runs:
        ratio = med([a / b for a, b in zip(times[k], times["torch fused"])])
        print(f"d={d} {k:16s} {med(times[k]) * 1e3:7.3f} ms  / torch fused {ratio:.3f}")


if __name__ == "__main__":
    main()
