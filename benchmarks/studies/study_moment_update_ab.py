"""Study: the eager multi-tensor step with its moment updates in the ``addcmul`` form against the ``List``
overload of ``_foreach_lerp_`` (``spectrakit.optim.bases.foreach_lerp_``), in one process, the form switched by
``bases.ADDCMUL_MAX_NUMEL`` every round (interleaved rounds of 5 steps, medians; CUDA-synchronised).

Usage: ``python benchmarks/studies/study_moment_update_ab.py [--device cuda] [--width 256] [--rounds 30]`` (on a CPU the
multi-tensor path is forced). Results: docs/BENCHMARKS.md ("H100 results (2026-11-28)").
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from bench_optim import width_shapes  # noqa: E402

import spectrakit.optim as O  # noqa: E402
import spectrakit.optim.bases as B  # noqa: E402

NAMES = ["Lion", "Signum", "SpectraAdamW"]
FORMS = {"List lerp": 0, "addcmul": B.ADDCMUL_MAX_NUMEL}  # ADDCMUL_MAX_NUMEL for each form


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=30)
    a = ap.parse_args()
    if a.rounds < 1 or a.width < 1:
        ap.error("--rounds and --width must be >= 1")
    dev = a.device
    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    if not dev.startswith("cuda"):
        O.Spectra._per_tensor = staticmethod(lambda device: False)

    def make(name):
        gen = torch.Generator(device=dev).manual_seed(0)
        ps = [torch.nn.Parameter(torch.randn(s, device=dev, generator=gen) * 0.02) for s in width_shapes(a.width)]
        for p in ps:
            p.grad = torch.randn(p.shape, device=dev, generator=gen) * 1e-2
        return getattr(O, name)(ps, lr=1e-3)

    opts = {n: make(n) for n in NAMES}
    for o in opts.values():
        for _ in range(3):
            o.step()
    times = {(n, f): [] for n in NAMES for f in FORMS}
    for r in range(a.rounds):
        for form in (list(FORMS) if r % 2 == 0 else list(FORMS)[::-1]):
            B.ADDCMUL_MAX_NUMEL = FORMS[form]
            for n, o in opts.items():
                sync()
                t = time.perf_counter()
                for _ in range(5):
                    o.step()
                sync()
                times[(n, form)].append((time.perf_counter() - t) / 5)
    where = torch.cuda.get_device_name() if dev.startswith("cuda") else "cpu (multi-tensor path forced)"
    print(f"torch {torch.__version__}, {where}, d = {a.width}, {a.rounds} rounds, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    for n in NAMES:
        lerp, addcmul = (statistics.median(times[(n, f)]) for f in FORMS)
        print(f"{n:14s} step: List lerp {lerp * 1e6:9.1f} us, addcmul {addcmul * 1e6:9.1f} us, "
              f"addcmul / List lerp {addcmul / lerp:.3f}")


if __name__ == "__main__":
    main()
