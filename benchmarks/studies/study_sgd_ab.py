"""SGD against torch's fused SGD, this checkout (``after``) beside an older one (``before``): the older
``spectrakit`` copied to ``BASE_DIR/spectrakit_base`` with every ``spectrakit`` renamed ``spectrakit_base``.
One parameter set stepped by every optimizer (states shared), random order per round, a 64 MiB write before each
step, CPU time. Usage:
``BASE_DIR=/tmp/base_pkg OMP_NUM_THREADS=1 python benchmarks/studies/study_sgd_ab.py 192,512 151``."""
import os
import random
import sys
import time

import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks"), os.environ.get("BASE_DIR", "/tmp/base_pkg")]
import spectrakit_base.optim as B  # noqa: E402
from bench_optim import FLUSH_BYTES, share_states, width_shapes  # noqa: E402

import spectrakit.optim as O  # noqa: E402


def main():
    torch.set_num_threads(1)
    reps = int(sys.argv[2])
    for d in map(int, sys.argv[1].split(",")):
        gen = torch.Generator().manual_seed(d)
        ps = [torch.nn.Parameter(torch.randn(s, generator=gen) * 0.02) for s in width_shapes(d)]
        for p in ps:
            p.grad = torch.randn(p.shape, generator=gen) * 1e-2
        norm = torch.nn.utils.get_total_norm([p.grad for p in ps])
        opts = {"torch fused": torch.optim.SGD(ps, lr=1e-3, momentum=0.9, fused=True)}
        for tag, mod in (("after", O), ("before", B)):
            opts[f"{tag} unchecked"] = mod.SGD(ps, lr=1e-3, check_finite=False)
        for kind in ("norm", "checked"):
            for tag, mod in (("after", O), ("before", B)):
                opts[f"{tag} {kind}"] = mod.SGD(ps, lr=1e-3)
        for opt in opts.values():
            opt.step()
        share_states(opts, ps)

        def call(key, opt, norm=norm):
            return lambda: opt.step(grad_norm=norm) if "norm" in key else opt.step()

        runs = {k: call(k, o) for k, o in opts.items()}
        flush = torch.empty(FLUSH_BYTES // 4)
        times = {k: [] for k in runs}
        rng, keys = random.Random(d), list(runs)
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
            print(f"d={d} {k:18s} {med(times[k]) * 1e3:8.3f} ms  / torch fused {ratio:.3f}", flush=True)


if __name__ == "__main__":
    main()
