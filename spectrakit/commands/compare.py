"""The ``spectrakit compare`` command: its options and run are those of :mod:`spectrakit.experiments.compare`, which
holds the training comparison they drive (its docstring is the command's description)."""

from spectrakit.experiments import compare_cli as _options

__doc__ = _options.__doc__
add_arguments = _options.add_arguments  # (no torch: --help and argument errors answer at once)


def run(args):
    from spectrakit.experiments.compare import run as run_compare

    return run_compare(args)
