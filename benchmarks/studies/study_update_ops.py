"""Study: the cost of the multi-tensor forms of a moment update with a device-side weight, and of the non-finite
check, on the 2-layer LLaMA parameter set (``bench_optim.width_shapes(d)``).

A skipped step must leave the moments unchanged without the host reading the skip flag, so the eager multi-tensor
step updates a moment with a weight that is a 0-d tensor on the device, ``w = (1 - b) ok``:
``m <- m + w (g - m)``. Torch's multi-tensor operations take such a weight in different overloads, and on a GPU
some of them run tensor by tensor (a launch per parameter) where others are one launch per list. Variants of the
update (each on the same ``m``, ``g`` and ``w``):

- ``lerp List``: ``torch._foreach_lerp_(m, g, [w] * n)`` (the eager GPU step's form);
- ``sub mul add``: ``d = _foreach_sub(g, m); _foreach_mul_(d, w); _foreach_add_(m, d)`` (``w`` through the
  Tensor overload of ``_foreach_mul_``);
- ``addcmul List``: ``torch._foreach_addcmul_(m, _foreach_sub(g, m), [w] * n)`` (the traced step's form);
- ``lerp Scalar``: ``torch._foreach_lerp_(m, g, 0.1)``, a Python weight (``torch.optim``'s form; no skip);
- ``lerp per tensor``: ``m_i.lerp_(g_i, w)`` for each parameter.

And of the non-finite check of the gradients (every entry finite and at most 1e18 in magnitude):

- ``norm stack le all``: ``(stack(_foreach_norm(g, inf)) <= 1e18).all()`` (the eager GPU step's check);
- ``norm max le``: ``stack(_foreach_norm(g, inf)).max() <= 1e18``;
- ``amp check``: ``torch._amp_foreach_non_finite_check_and_unscale_(g, found, 1.0)`` (non-finite entries only,
  one launch, no bound; it rewrites the gradients with their own values).

For each: the median over interleaved rounds of the time per call (50 calls, then a device synchronisation: on a
host-bound GPU step this is the host time of the calls), and for the update variants, how many entries differ from
``lerp List``'s result after one update (their roundings). Usage: ``python benchmarks/studies/study_update_ops.py
[--device cuda] [--width 256] [--rounds 15]``. Results: docs/BENCHMARKS.md.
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from bench_optim import width_shapes  # noqa: E402

BOUND = 1e18


def update_variants(m, g, w):
    n = len(m)

    def lerp_list():
        torch._foreach_lerp_(m, g, [w] * n)

    def sub_mul_add():
        d = torch._foreach_sub(g, m)
        torch._foreach_mul_(d, w)
        torch._foreach_add_(m, d)

    def addcmul_list():
        torch._foreach_addcmul_(m, torch._foreach_sub(g, m), [w] * n)

    def lerp_scalar():
        torch._foreach_lerp_(m, g, 0.1)

    def lerp_per_tensor():
        for a, b in zip(m, g):
            a.lerp_(b, w)

    return {"lerp List": lerp_list, "sub mul add": sub_mul_add, "addcmul List": addcmul_list,
            "lerp Scalar": lerp_scalar, "lerp per tensor": lerp_per_tensor}


def check_variants(g):
    found, one = torch.zeros((), device=g[0].device), torch.ones((), device=g[0].device)

    def norm_stack_le_all():
        return (torch.stack(torch._foreach_norm(g, float("inf"))) <= BOUND).all()

    def norm_max_le():
        return torch.stack(torch._foreach_norm(g, float("inf"))).max() <= BOUND

    def amp_check():
        torch._amp_foreach_non_finite_check_and_unscale_(g, found, one)
        return found

    return {"norm stack le all": norm_stack_le_all, "norm max le": norm_max_le, "amp check": amp_check}


def timed(fn, sync, calls=50):
    sync()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t) / calls


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {a.rounds}")
    if a.width < 1:
        ap.error(f"--width must be >= 1, got {a.width}")
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    gen = torch.Generator(device=dev).manual_seed(0)
    shapes = width_shapes(a.width)
    m = [torch.randn(s, device=dev, generator=gen) for s in shapes]
    g = [torch.randn(s, device=dev, generator=gen) for s in shapes]
    w = torch.full((), 0.1, device=dev)
    where = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"torch {torch.__version__}, {where}, d = {a.width}, {len(shapes)} tensors, {a.rounds} rounds, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)

    # roundings: one update from the same start, entries that differ from the eager step's form
    outs = {}
    for name in update_variants(m, g, w):
        mm = [t.clone() for t in m]
        update_variants(mm, g, w)[name]()
        outs[name] = mm
    ref = outs["lerp List"]
    total = sum(t.numel() for t in ref)
    for name, mm in outs.items():
        diff = sum(int((x != y).sum()) for x, y in zip(mm, ref))
        print(f"update {name:18s} entries differing from lerp List: {diff} of {total}", flush=True)

    work = [t.clone() for t in m]
    for title, variants in (("update", update_variants(work, g, w)), ("check", check_variants(g))):
        times = {k: [] for k in variants}
        for fn in variants.values():  # warm-up
            timed(fn, sync, 5)
        for r in range(a.rounds):
            order = list(variants.items())
            for name, fn in order if r % 2 == 0 else order[::-1]:
                times[name].append(timed(fn, sync))
                if title == "update":  # keep the moments bounded
                    for t, s in zip(work, m):
                        t.copy_(s)
        base = statistics.median(next(iter(times.values())))
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"{title} {name:18s} {med * 1e6:9.1f} us per call ({med / base:.2f}x the first)", flush=True)


if __name__ == "__main__":
    main()
