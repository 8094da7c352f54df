"""The ``spectrakit`` command.

Every sub-command lives in its own module that defines ``add_arguments(parser)`` and ``run(args) -> int``;
this file only lists them. Experiments are registered in :data:`spectrakit.experiments.EXPERIMENTS`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "compare": ("spectrakit.experiments.compare",
                "train a small LM with several optimizers (default AdamW vs SpectraAdamW) and compare them"),
    "sweep": ("spectrakit.experiments.sweep",
              "tune the LR of several optimizers over seeds (and SPECTRA's c): a resumable grid of compare runs"),
    "ops": ("spectrakit.linalg.report",
            "check every matrix function against its exact SVD/eigh reference and time it"),
    "experiment": ("spectrakit.experiments.cli", "run one of the paper experiments (see `experiment --help`)"),
    "lipschitz": ("spectrakit.conv.report", "per-layer spectral-norm bounds and Lipschitz bound of a model"),
    "data": ("spectrakit.data.cli", "prepare offline corpora (`data prepare NAME`, `data list`)"),
    "plot": ("spectrakit.train.plots", "plot logs and spectral diagnostics of a training run"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spectrakit",
        description="spectrakit: control the spectrum of neural networks (matrix functions, "
                    "spectral-norm bounds, SPECTRA/Muon optimizers, reproducible experiments).",
    )
    from spectrakit import __version__

    parser.add_argument("--version", action="version", version=f"spectrakit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        mod = importlib.import_module(module)
        p = sub.add_parser(name, help=help_text, description=(mod.__doc__ or help_text).strip().split("\n\n")[0],
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "_run", None) is None:
        parser.print_help()
        return 0
    return int(args._run(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
