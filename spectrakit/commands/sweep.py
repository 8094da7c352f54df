"""The ``spectrakit sweep`` command: its options and run are those of :mod:`spectrakit.experiments.sweep`, which
holds the training comparison they drive (its docstring is the command's description)."""

from spectrakit.experiments import sweep as _experiment

__doc__ = _experiment.__doc__
add_arguments = _experiment.add_arguments
run = _experiment.run
