"""The regularised Frank-Wolfe posts alone against SpectraSignum's fast soft clip, on the d = 1024 matrices
of the 2-layer LLaMA parameter set (1024 x 2752 and 1024 x 1024): the optimizer's in-place calls on the same
input, interleaved rounds, medians of the per-round ratios. A quicker check than a whole d = 1024 step.

Usage: ``python benchmarks/bench_lmo_posts.py [--reps 5]`` (1 thread)."""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import time  # noqa: E402

import torch  # noqa: E402

from spectrakit._checks import no_value_checks  # noqa: E402
from spectrakit.optim.transforms import POST_TRANSFORMS  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    print("load", os.getloadavg()[0], time.strftime("%H:%M UTC", time.gmtime()))
    for shape in ((1, 1024, 2752), (1, 1024, 1024)):
        u0 = torch.randn(*shape, generator=g) * 1e-2
        fns = {"soft_clip (SpectraSignum)": (POST_TRANSFORMS["soft_clip"].inplace, {}),
               "lmo nuclear": (POST_TRANSFORMS["spectral_lmo"].inplace, dict(regularizer="nuclear", b=4.0)),
               "lmo schatten-3": (POST_TRANSFORMS["spectral_lmo"].inplace, dict(regularizer="schatten", b=0.1, p=3.0)),
               "linf_fw": (POST_TRANSFORMS["linf_fw"].inplace, dict(b=1.0))}
        times = {k: [] for k in fns}
        for _ in range(args.reps):
            for k, (fn, kw) in fns.items():
                u = u0.clone()
                t = time.perf_counter()
                with no_value_checks():
                    fn(u, 1.0, None, None, **kw)
                times[k].append(time.perf_counter() - t)
        base = times["soft_clip (SpectraSignum)"]
        for k, ts in times.items():
            ratios = sorted(a / b for a, b in zip(ts, base))
            print(shape, k, f"median s {sorted(ts)[len(ts) // 2]:.2f}",
                  f"median ratio {ratios[len(ratios) // 2]:.2f}", flush=True)
    print("load", os.getloadavg()[0], time.strftime("%H:%M UTC", time.gmtime()))


if __name__ == "__main__":
    main()
