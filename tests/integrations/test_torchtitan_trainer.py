"""End to end: torchtitan's own trainer (``torchrun -m torchtitan.train``) runs its Llama 3 debug model with
SpectraAdamW from :func:`spectrakit.integrations.torchtitan.spectra_optimizers`, and with Muon plus an AdamW
group for the embeddings, norms and head.

GPU only: torchtitan's trainer puts the model on CUDA and its models import Triton kernels, so it does not run
on a CPU-only machine. It also needs torchtitan's full dependencies (``pip install torchtitan``: datasets,
torchdata, ...) and a torchtitan source checkout for the debug model's tokenizer and the ``c4_test`` corpus
(``tests/assets`` of the repository, not in the wheel): set ``TORCHTITAN_SOURCE`` to that checkout. Without
any of these the test skips.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.gpu

JOB = '''
from torchtitan.models.llama3.config_registry import llama3_debugmodel
from spectrakit.integrations.torchtitan import spectra_optimizers


def spectra_adamw():
    config = llama3_debugmodel()
    config.optimizer = spectra_optimizers("SpectraAdamW", lr=8e-4, c=10.0, weight_decay=0.1)
    return config


def muon():
    config = llama3_debugmodel()
    config.optimizer = spectra_optimizers("Muon", lr=0.02, adamw_pattern=r"tok_embeddings|lm_head|norm",
                                          adamw_kwargs={"lr": 8e-4})
    return config
'''


def _source() -> Path:
    if not torch.cuda.is_available():
        pytest.skip("torchtitan's trainer needs a CUDA device")
    pytest.importorskip("torchtitan.trainer", reason="torchtitan with its trainer dependencies is not installed")
    src = os.environ.get("TORCHTITAN_SOURCE")
    if not src or not (Path(src) / "tests" / "assets" / "c4_test").is_dir():
        pytest.skip("set TORCHTITAN_SOURCE to a torchtitan checkout (its tests/assets hold the debug tokenizer "
                    "and corpus)")
    return Path(src)


@pytest.mark.parametrize("config, name", [("spectra_adamw", "SpectraAdamW"), ("muon", "Muon")])
def test_torchtitan_trainer_runs_spectrakit_optimizer(tmp_path, config, name):
    src = _source()
    (tmp_path / "spectrakit_tt_trainer_job.py").write_text(JOB)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", "-m",
           "torchtitan.train", "--module", "spectrakit_tt_trainer_job", "--config", config,
           "--training.steps", "6", "--dump_folder", str(tmp_path / "out")]
    run = subprocess.run(cmd, cwd=src, env=env, capture_output=True, text=True, timeout=600)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-4000:]
    assert f"Optimizer {name}" in log, log[-4000:]
    losses = [float(x) for x in re.findall(r"loss:\s*([0-9.eE+-]+)", re.sub(r"\x1b\[[0-9;]*m", "", log))]
    assert len(losses) >= 6 and all(math.isfinite(v) for v in losses), losses
    assert losses[-1] < losses[0], losses
