"""Tune the learning rate of several optimizers over seeds: a grid of `spectrakit compare` runs.

Every (optimizer, LR, seed[, c]) point trains with the compare settings (every compare option applies) in its
own folder under ``--out``; a finished point (its ``run.json`` complete) is skipped when the sweep is run
again. Per optimizer the best LR minimises the mean validation loss over seeds (diverged points are kept in
the table but never chosen), as in the tuned comparisons of Jiang, Semenov and Stich (2026, §6.2, Fig. 2-3,
Table 3). Writes ``sweep.json``, ``sweep.md``, the LR-sensitivity plot (validation loss vs LR), the loss
curves and weight norms at the best LRs and, with ``--cs``, validation loss vs SPECTRA's clip threshold ``c``.
"""

from __future__ import annotations

import argparse

from spectrakit.experiments import compare_cli


def add_arguments(parser: argparse.ArgumentParser) -> None:
    compare_cli.add_arguments(parser)
    parser.set_defaults(out="runs/sweep")
    parser.add_argument("--lrs", required=True,
                        help="comma-separated peak LRs (the --lr of each point); a value such as 2x is that "
                        "multiple of each optimizer's default LR (e.g. 0.25x,0.5x,1x,2x,4x)")
    parser.add_argument("--cs", default="", help="comma-separated SPECTRA clip thresholds c (> 0, finite) to "
                        "sweep for SPECTRA optimizers (default: --c only); c = inf is the base optimizer")
    parser.add_argument("--shard", default="0/1",
                        help="I/N: train only every N-th grid point starting at I (0 <= I < N), to run N sweeps "
                        "side by side on one --out; a last run without --shard reports the whole grid")
    parser.add_argument("--tol", type=float, default=0.05,
                        help="report the LR range within this many nats of the best mean validation loss")
    parser.add_argument("--extend", type=int, default=0,
                        help="up to this many rounds (0..20) that add the LR one grid step beyond an edge of "
                        "the grid whose loss is within --tol of the best, until the best LR lies inside")
