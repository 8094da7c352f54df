"""The command line answers at once: ``--help`` and argument errors of these sub-commands import no torch (about
0.2 s instead of 2-4 s on a 2-core machine)."""

from __future__ import annotations

import subprocess
import sys

import pytest

CODE = """
import sys
from spectrakit.cli import main
try:
    main(sys.argv[1:])
except SystemExit as e:
    code = e.code
print("TORCH" if "torch" in sys.modules else "NO-TORCH", code, file=sys.stderr)
"""


@pytest.mark.parametrize("argv,code", [
    (["ops", "--help"], 0), (["ops", "--reps", "0"], 2), (["ops", "--shapes", "3x"], 2),
    (["ops", "--dtypes", "fp8"], 2),
    (["lipschitz", "--help"], 0), (["lipschitz", "--input-shape", "3,x,32"], 2), (["lipschitz", "--model", "vgg"], 2),
    (["gpu-suite", "--help"], 0), (["gpu-suite", "--stage", "nope"], 2), (["report", "--help"], 0),
    (["plot", "--help"], 0), (["--help"], 0),
    (["compare", "--help"], 0), (["compare", "--seeds", "0,,1"], 2), (["compare", "--optimizers", "nope"], 2),
    (["compare", "--preset", "huge"], 2), (["compare", "--tokenizer", "bpe3"], 2),
    (["sweep", "--help"], 0), (["sweep", "--lrs", "1e-3", "--steps", "0"], 2),
    (["data", "--help"], 0), (["data", "prepare", "--help"], 0), (["data", "prepare", "nope"], 2),
    (["experiment", "--help"], 0), (["experiment", "nope"], 2), (["experiment", "grokking", "--help"], 0),
    (["experiment", "grokking", "--dualizers", "nope"], 2), (["experiment", "conv-bounds", "--help"], 0),
], ids=lambda v: " ".join(v) if isinstance(v, list) else str(v))
def test_help_and_argument_errors_import_no_torch(argv, code):
    proc = subprocess.run([sys.executable, "-c", CODE, *argv], capture_output=True, text=True, timeout=120)
    last = proc.stderr.strip().splitlines()[-1]
    assert last == f"NO-TORCH {code}", proc.stderr[-2000:]


def test_lipschitz_model_names_are_the_models():
    from spectrakit.commands.lipschitz import MODEL_NAMES
    from spectrakit.models.cnn import MODELS

    assert sorted(MODEL_NAMES) == sorted(MODELS)


def test_option_names_are_the_registries():
    """compare's options name the registries' entries without importing them: the lists stay equal."""
    from spectrakit.experiments import compare_cli
    from spectrakit.models.llama import PRESETS
    from spectrakit.train.distributed import PARALLEL_MODES
    from spectrakit.train.optimizers import OPTIMIZERS
    from spectrakit.train.schedules import SCHEDULES

    assert compare_cli.OPTIMIZERS == tuple(OPTIMIZERS) and sorted(compare_cli.PRESETS) == sorted(PRESETS)
    assert compare_cli.SCHEDULES == tuple(SCHEDULES) and compare_cli.PARALLEL_MODES == tuple(PARALLEL_MODES)


def test_experiment_option_names_are_the_experiments_tables():
    from spectrakit.data.fashion_mnist import DEFAULT_ROOT
    from spectrakit.experiments import conv_regularization, grokking, options, spike_noise, xor_transfer

    assert options.SPIKE_NOISE_METHODS == tuple(spike_noise.METHODS)
    assert options.CONV_REGULARIZERS == tuple(conv_regularization.REGULARIZERS)
    assert options.FASHION_MNIST_ROOT == DEFAULT_ROOT
    assert (options.XOR_SETS, options.XOR_WIDTHS, options.XOR_LRS) == (
        tuple(xor_transfer.SETS), tuple(xor_transfer.DEFAULT_WIDTHS), tuple(xor_transfer.DEFAULT_LRS))
    assert options.GROKKING_DUALIZERS == tuple(grokking.DUALIZER_RUNS)
