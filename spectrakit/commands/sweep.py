"""The ``spectrakit sweep`` command: its options and run are those of :mod:`spectrakit.experiments.sweep`, which
holds the training comparison they drive (its docstring is the command's description)."""

from spectrakit.experiments import sweep_cli as _options

__doc__ = _options.__doc__
add_arguments = _options.add_arguments  # (no torch: --help and argument errors answer at once)


def run(args):
    from spectrakit.experiments.sweep import run as run_sweep

    return run_sweep(args)
