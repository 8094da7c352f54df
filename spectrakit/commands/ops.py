"""Check every matrix function against its exact (float64 SVD/eigh) reference and time it.

``spectrakit ops`` builds random and ill-conditioned test matrices on the available device, runs each
function of :mod:`spectrakit.linalg` in the requested dtypes, and prints one table row per
(function, input, dtype) as soon as it is measured: relative Frobenius error against the exact path, a
verdict (within or outside the documented accuracy for that input and dtype, with the paper's Newton-Schulz
soft clip's known failure beside a large spike marked as expected), time of the function, time of the exact
path (float64 SVD/eigh on the same device) and the speed-up.
"""

from __future__ import annotations

import argparse
import sys

import torch

from spectrakit._cliargs import UsageError, positive_int
from spectrakit._tables import environment, markdown_table, report
from spectrakit.linalg.report import COLUMNS, rows_for

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp64": torch.float64}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", help="cpu, cuda, or auto (cuda when available)")
    parser.add_argument("--shapes", default="192x384", help="comma-separated MxN shapes")
    parser.add_argument("--dtypes", default="fp32,bf16", help="comma-separated: fp32, bf16, fp64")
    parser.add_argument("--reps", type=positive_int, default=3, help="timing repetitions (median)")
    parser.add_argument("--out", default=None, help="folder for results.json/results.md (optional)")


def run(args: argparse.Namespace) -> int:
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                          else ("cpu" if args.device == "auto" else args.device))
    try:
        shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes.split(",") if s]
        dtypes = [DTYPES[d.strip()] for d in args.dtypes.split(",") if d.strip()]
    except (ValueError, KeyError) as e:
        raise UsageError(f"--shapes must look like 256x768,512x512 and --dtypes like fp32,bf16, from "
                         f"{', '.join(DTYPES)} ({e})") from None
    if any(len(s) != 2 or min(s) < 2 for s in shapes):
        raise UsageError("--shapes: each shape must be MxN with M, N >= 2")
    rows = []
    env = environment()
    print(f"## spectrakit ops: matrix functions vs exact SVD/eigh\n\ndevice: {env['device']} · torch {env['torch']} · "
          f"{env['date']}\n", flush=True)
    print("| " + " | ".join(COLUMNS) + " |\n|" + "|".join("---" for _ in COLUMNS) + "|", flush=True)
    for m, n in shapes:
        rows += rows_for(m, n, device, dtypes, reps=args.reps,
                         on_row=lambda r: print(markdown_table([r], COLUMNS).splitlines()[-1], flush=True))
    print()
    report("spectrakit ops: matrix functions vs exact SVD/eigh", rows, args.out, columns=COLUMNS, echo=False,
           command="spectrakit " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["ops"] else "spectrakit ops")
    ok = sum(r["verdict"].startswith("ok") for r in rows)
    outside = sum(r["verdict"].startswith("OUTSIDE") for r in rows)
    print(f"{ok} of {len(rows)} rows within the documented accuracy, {len(rows) - ok - outside} known limitations "
          f"of the paper's method, {outside} OUTSIDE" + (f"; results in {args.out}" if args.out else ""))
    return 0
