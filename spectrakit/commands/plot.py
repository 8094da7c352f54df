"""Plot the logs and spectral diagnostics of training runs: ``spectrakit plot RUN_DIR [RUN_DIR ...]``.

The figures are those of :func:`spectrakit.train.plots.plot_runs`; their paths are printed.
"""

from __future__ import annotations

import argparse
import os

from spectrakit._cliargs import UsageError
from spectrakit.train.plots import plot_runs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "runs", nargs="+", help="run folders (with metrics.jsonl), e.g. runs/compare/adamw-s0"
    )
    parser.add_argument("--out", default=None, help="folder for the PNGs (default: the first run folder)")
    parser.add_argument("--layers", default=None, help="comma-separated parameter names for the spectra plot")


def run(args: argparse.Namespace) -> int:
    for d in args.runs:
        if not os.path.isfile(os.path.join(d, "metrics.jsonl")):
            what = "has no metrics.jsonl (not a training run folder)" if os.path.isdir(d) else "is not a folder"
            raise UsageError(f"{d} {what}; pass run folders such as runs/compare/adamw-s0")
    layers = [s for s in args.layers.split(",") if s] if args.layers else None
    try:
        paths = plot_runs(args.runs, args.out or args.runs[0], layers=layers)
    except ValueError as e:  # a log that is not a regular file of sane size, or not JSON lines
        raise UsageError(f"cannot plot {', '.join(args.runs)}: {str(e).splitlines()[0][:200]}") from None
    for path in paths:
        print(path)
    return 0
