"""Run the GPU validation suite: tests, matrix functions, optimizer steps, training step, a short optimizer
comparison and convolution norms, each stage writing its part of one report (REPORT.md and report.json).

Stages run in the order given (default: all), each within a time budget; a stage that fails records its
error in the report and the next stage still runs. Reports of earlier runs in the same folder are kept and
merged, so stages can run in separate commands. With --device cpu --tiny every stage runs the same code at
toy sizes in seconds.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from spectrakit._cliargs import name_list, positive_int
from spectrakit.experiments.gpu_suite import STAGES, run_suite


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stage", action="append", type=name_list(list(STAGES)), default=None, metavar="NAME,...",
                        help=f"comma-separated stages to run (the option may also repeat), from: {', '.join(STAGES)} "
                        "(default: all, in this order)")
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda or cuda:N")
    parser.add_argument("--tiny", action="store_true",
                        help="toy sizes: the same code path in seconds per stage (for checking the suite on a CPU)")
    parser.add_argument("--out", default="gpu_report", help="report folder (REPORT.md, report.json, stage files)")
    parser.add_argument("--budget", type=positive_int, default=420,
                        help="seconds per stage after which a stage skips its remaining optional work (and the "
                        "compare run is interrupted)")
    parser.add_argument("--compare-steps", type=positive_int, default=None,
                        help="steps of the compare stage (default: its setting's)")
    parser.add_argument("--reference", default=None, metavar="PATH",
                        help="scale stage: a local checkout of the authors' SPECTRA code (its src/optim/spectra.py "
                        "and post_process.py are imported from there and timed beside ours)")
    parser.add_argument("--scale-steps", type=positive_int, default=None,
                        help="scale stage: training steps of each large-LR run (default 600; tiny 6)")


def run(args: argparse.Namespace) -> int:
    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    stages = list(dict.fromkeys([s for names in args.stage for s in names] if args.stage else STAGES))
    if sys.argv[1:2] == ["gpu-suite"]:
        command = "spectrakit " + shlex.join(sys.argv[1:])
    else:  # called from Python: the equivalent command line
        command = shlex.join(["spectrakit", "gpu-suite", "--device", device, *(["--tiny"] if args.tiny else []),
                              "--out", args.out, "--budget", str(args.budget),
                              *[a for s in stages for a in ("--stage", s)]])
    report = run_suite(stages, device=device, tiny=args.tiny, out=args.out, budget_s=float(args.budget),
                       options={"compare_steps": args.compare_steps, "reference": args.reference,
                                "scale_steps": args.scale_steps}, command=command)
    failed = [n for n in stages if report["stages"][n]["status"] != "ok"]
    print(f"report: {args.out}/REPORT.md" + (f"; failed stages: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0
