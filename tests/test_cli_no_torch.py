"""The command line answers at once: ``--help`` and argument errors of these sub-commands import no torch (about
0.2 s instead of 2-4 s on a 2-core machine). compare, sweep, experiment and data still import it with their
option definitions."""

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
], ids=lambda v: " ".join(v) if isinstance(v, list) else str(v))
def test_help_and_argument_errors_import_no_torch(argv, code):
    proc = subprocess.run([sys.executable, "-c", CODE, *argv], capture_output=True, text=True, timeout=120)
    last = proc.stderr.strip().splitlines()[-1]
    assert last == f"NO-TORCH {code}", proc.stderr[-2000:]


def test_lipschitz_model_names_are_the_models():
    from spectrakit.commands.lipschitz import MODEL_NAMES
    from spectrakit.models.cnn import MODELS

    assert sorted(MODEL_NAMES) == sorted(MODELS)
