"""Cost of the spectral-set building blocks and dualizers vs matrix size (Cesista 2025).

For a batch of ``B`` square ``n x n`` matrices on the boundary of each set (retracted random points),
time: the face projectors (``faces``), one tangent projection with
precomputed faces, the retraction, and the dualizers (naive LMO, 1-step alternating, PDHG with 8 steps,
dual ascent with 8 steps). Prints a markdown table and writes it into docs/results/bench/
(section ``manifold-<device>``).

    python benchmarks/bench_manifold.py [--sizes 64 128 256] [--batch 4] [--device cuda] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import command_line, time_fn, write_section  # noqa: E402
from spectrakit._checks import no_value_checks  # noqa: E402
from spectrakit.experiments.io import environment, markdown_table  # noqa: E402
from spectrakit.manifold import PSDCone, Spectrahedron, SpectralBall, steepest_direction  # noqa: E402


def _boundary_point(S, B, n, device, dtype):
    W = torch.randn(B, n, n, device=device, dtype=dtype) * 2
    return S.retract(W)


def _row(name, S, n, batch, device, dtype, reps):
    W = _boundary_point(S, batch, n, device, dtype)
    G = torch.randn_like(W)
    with no_value_checks():
        faces = S.faces(W)
        row = {"set": name, "n": n, "batch": batch,
               "faces_ms": time_fn(lambda: S.faces(W), device, reps=reps),
               "proj_T_ms": time_fn(lambda: S.project_tangent(W, G, faces), device, reps=reps),
               "retract_ms": time_fn(lambda: S.retract(W + 0.1 * G), device, reps=reps),
               "naive_ms": time_fn(lambda: steepest_direction(S, W, G, 0.1, dualizer="naive"), device,
                                   reps=reps)}
        for d, steps in [("alternating", 1), ("pdhg", 8), ("dual_ascent", 8)]:
            fn = (lambda d=d, steps=steps:
                  steepest_direction(S, W, G, 0.1, dualizer=d, steps=steps, faces=faces))
            row[f"{d}{steps}_ms"] = time_fn(fn, device, reps=reps)
    return row


def bench(sizes, batch, device, dtype, reps):
    rows = []
    sets = {"psd": PSDCone(), "spectrahedron": Spectrahedron(-1.0, 1.0), "ball": SpectralBall(1.0, rms=True)}
    for n in sizes:
        for name, S in sets.items():
            rows.append(_row(name, S, n, batch, device, dtype, reps))
            print(rows[-1], flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=None)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sizes = args.sizes or ([256, 512, 1024, 2048] if device.type == "cuda" else [64, 128, 256])
    rows = bench(sizes, args.batch, device, getattr(torch, args.dtype), args.reps)
    env = environment()
    text = (f"### manifold: set operations and dualizers ({args.dtype}, median ms per batched call)\n\n"
            f"device: {env['device']} · torch {env['torch']} · {env['date']}\n\n"
            f"command: `{command_line()}`\n\n" + markdown_table(rows) + "\n")
    print(text)
    if not args.no_write:
        write_section(f"manifold-{device.type}", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
