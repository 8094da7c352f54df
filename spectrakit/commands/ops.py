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

from spectrakit._cliargs import positive_int

DTYPE_NAMES = ("fp32", "bf16", "fp64")  # (torch dtypes in run(): the options need no torch)


def _shapes(text: str) -> list[tuple[int, int]]:
    """``type=`` of ``--shapes``: comma-separated ``MxN`` with M, N >= 2."""
    try:
        shapes = [tuple(int(v) for v in s.strip().lower().split("x")) for s in text.split(",")]
    except ValueError:
        shapes = []
    if not shapes or any(len(s) != 2 or min(s) < 2 for s in shapes):
        raise argparse.ArgumentTypeError(f"expected MxN shapes with M, N >= 2 such as 256x768,512x512, got {text!r}")
    return shapes


def _dtypes(text: str) -> list[str]:
    """``type=`` of ``--dtypes``: comma-separated names from :data:`DTYPE_NAMES`."""
    names = [d.strip() for d in text.split(",")]
    if not all(names) or any(d not in DTYPE_NAMES for d in names):
        raise argparse.ArgumentTypeError(f"expected names from {', '.join(DTYPE_NAMES)}, got {text!r}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", help="cpu, cuda, or auto (cuda when available)")
    parser.add_argument("--shapes", type=_shapes, default=[(192, 384)],
                        help="comma-separated MxN shapes (default: 192x384)")
    parser.add_argument("--dtypes", type=_dtypes, default=["fp32", "bf16"],
                        help="comma-separated: fp32, bf16, fp64 (default: fp32,bf16)")
    parser.add_argument("--reps", type=positive_int, default=3, help="timing repetitions (median)")
    parser.add_argument("--out", default=None, help="folder for results.json/results.md (optional)")


def run(args: argparse.Namespace) -> int:
    import torch

    from spectrakit._tables import environment, markdown_table, report
    from spectrakit.linalg.report import COLUMNS, rows_for

    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                          else ("cpu" if args.device == "auto" else args.device))
    table = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp64": torch.float64}
    shapes, dtypes = args.shapes, [table[d] for d in args.dtypes]
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
