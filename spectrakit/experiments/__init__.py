"""Paper experiments, each a function returning a result table (a list of dicts).

``EXPERIMENTS`` maps the command-line name to the module that implements it. Each module defines
``run(**options) -> list[dict]`` (the table), ``add_arguments(parser)`` and ``main(args) -> int``
(which calls :func:`spectrakit.experiments.io.report` to print the table and save JSON/PNG).
"""

EXPERIMENTS: dict[str, str] = {
    "fw-logistic": "spectrakit.experiments.fw_logistic",
    "spike-noise": "spectrakit.experiments.spike_noise",
    "conv-regularization": "spectrakit.experiments.conv_regularization",
    "conv-bounds": "spectrakit.experiments.conv_bounds",
    "xor-transfer": "spectrakit.experiments.xor_transfer",
    "grokking": "spectrakit.experiments.grokking",
}
