"""Study: the eager CPU step with its non-finite check decided on the host (a Python bool read from CPU tensors)
against the same step keeping the check's flag a tensor (as on a GPU), for plain AdamW and SGD, checked and with
``step(grad_norm=...)``, beside the unchecked step.

One optimizer per preset and width steps in every mode (the mode switched on the same object: the same tensors,
so no difference of where they lie in memory enters the ratios; two instances of one torch step on their own
copies differed by up to 13%), one step of each mode per round with the order rotated, and a 64 MiB buffer written
before each step (a training step's forward and backward leave the optimizer's data out of the caches). Prints
the CPU-time median of each mode and the medians of its per-round ratios to the unchecked step.

Usage: ``OMP_NUM_THREADS=1 python benchmarks/studies/study_host_flag.py [--widths 16,192,512] [--rounds 300]``.
Results: docs/BENCHMARKS.md ("Parity on shared tensors, and the check decided on the host").
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from bench_optim import FLUSH_BYTES, parse_widths, width_shapes  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--widths", default="16,192,512")
    ap.add_argument("--rounds", type=int, default=300)
    a = ap.parse_args()
    widths = parse_widths(ap, a.widths, "--widths")
    if a.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {a.rounds}")
    import spectrakit.optim as O
    from spectrakit.optim.spectra import Spectra

    flush = torch.empty(FLUSH_BYTES // 4)
    print(f"torch {torch.__version__}, cpu, {torch.get_num_threads()} thread(s), {a.rounds} rounds, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    for d in widths:
        for name in ("AdamW", "SGD"):
            gen = torch.Generator().manual_seed(d)
            params = [torch.nn.Parameter(torch.randn(s, generator=gen) * 0.02) for s in width_shapes(d)]
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen) * 1e-2
            norm = torch.nn.utils.get_total_norm([p.grad for p in params])
            opt = getattr(O, name)(params, lr=1e-3)
            group = opt.param_groups[0]

            def run(checked, host, given, opt=opt, group=group, norm=norm):
                group["check_finite"] = checked
                if host:
                    opt.__dict__.pop("_flags_on_host", None)  # the class's decision (the host on a CPU)
                else:
                    opt._flags_on_host = lambda grads, grad_norm: False
                opt.step(**({"grad_norm": norm} if given else {}))

            modes = {"unchecked": (False, True, False), "norm, host": (True, True, True),
                     "norm, tensor flag": (True, False, True), "checked, host": (True, True, False),
                     "checked, tensor flag": (True, False, False)}
            for mode in modes.values():
                run(*mode)
            times = {m: [] for m in modes}
            names = list(modes)
            for r in range(a.rounds):
                for m in names[r % len(names):] + names[:r % len(names)]:
                    flush.fill_(float(r))
                    t0 = time.thread_time()
                    run(*modes[m])
                    times[m].append(time.thread_time() - t0)

            def med(xs):
                return sorted(xs)[len(xs) // 2]

            base = times["unchecked"]
            print(f"d = {d} {name}: " + ", ".join(
                f"{m} {med(times[m]) * 1e6:.0f} us ({med([x / y for x, y in zip(times[m], base)]):.3f})"
                for m in names))
            assert Spectra._flags_on_host(opt, [p.grad for p in params], None)


if __name__ == "__main__":
    main()
