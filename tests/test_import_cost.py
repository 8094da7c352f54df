"""What a fresh interpreter pays at start-up: ``import spectrakit.cli`` (every command-line start) and
``import spectrakit.optim`` (every user, every command that builds an optimizer) load neither torch._dynamo
nor torch.distributed.checkpoint nor DTensor (about 1-3 s each); the sharded optimizer step
(``spectrakit.optim.sharding``, which needs DTensor and torch._dynamo) is loaded when first needed: a DTensor
parameter, ``spectrakit.distributed``, or the module asked for by name."""

import subprocess
import sys

import pytest

import spectrakit.optim

HEAVY = ("torch._dynamo", "torch.distributed.checkpoint", "torch.distributed.tensor", "spectrakit.optim.sharding")

# one launch, several stages; each prints the heavy modules loaded so far
_PROBE = f"""
import sys
heavy = {HEAVY!r}
def loaded(stage):
    print(stage, *[m for m in heavy if m in sys.modules], sep=",")
import spectrakit.cli
loaded("cli")
import spectrakit.optim
loaded("optim")
import torch
p = torch.nn.Parameter(torch.randn(6, 4))
opt = spectrakit.optim.SpectraAdamW([p], lr=0.1)
p.grad = torch.randn(6, 4)
opt.step()
loaded("step")
print("type", type(opt).__name__, sep=",")
sharding = spectrakit.optim.sharding
loaded("asked")
print("type", spectrakit.optim.Spectra._sharded_class(spectrakit.optim.AdamW).__name__, sep=",")
"""


def test_start_up_imports_stay_light():
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True).stdout
    lines = [line.split(",") for line in out.split()]
    assert lines == [
        ["cli"],
        ["optim"],
        # torch.optim.Optimizer.add_param_group loads torch._dynamo (and with it DTensor) itself; a plain
        # optimizer on plain tensors still leaves the sharding module out
        ["step", "torch._dynamo", "torch.distributed.tensor"],
        ["type", "SpectraAdamW"],
        ["asked", "torch._dynamo", "torch.distributed.tensor", "spectrakit.optim.sharding"],  # asked by name
        ["type", "ShardedAdamW"],
    ], out


def test_sharded_class_hook_is_the_sharding_modules():
    """The class a plain optimizer switches to for DTensor parameters is ``sharded(type(opt))`` (cached:
    the same class object, so ``isinstance`` and pickling see one class)."""
    from spectrakit.distributed import DistributedSpectra, sharded

    for cls in (spectrakit.optim.AdamW, spectrakit.optim.SpectraAdamW, spectrakit.optim.Muon):
        assert spectrakit.optim.Spectra._sharded_class(cls) is sharded(cls)
    assert spectrakit.optim.Spectra._sharded_class(DistributedSpectra) is DistributedSpectra
    assert spectrakit.optim.sharding.sharded is sharded
    with pytest.raises(AttributeError, match="no attribute 'shardin'"):
        spectrakit.optim.shardin  # noqa: B018
