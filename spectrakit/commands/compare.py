"""The ``spectrakit compare`` command: its options and run are those of :mod:`spectrakit.experiments.compare`, which
holds the training comparison they drive (its docstring is the command's description)."""

from spectrakit.experiments import compare as _experiment

__doc__ = _experiment.__doc__
add_arguments = _experiment.add_arguments
run = _experiment.run
