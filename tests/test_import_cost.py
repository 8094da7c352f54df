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

# one launch (a fresh interpreter: the test process has all of these loaded), two stages
_PROBE = f"""
import sys
heavy = {HEAVY!r}
import spectrakit.cli
print("cli", *[m for m in heavy if m in sys.modules], sep=",")
import spectrakit.optim
print("optim", *[m for m in heavy if m in sys.modules], sep=",")
"""


def test_start_up_imports_stay_light():
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True).stdout
    assert [line.split(",") for line in out.split()] == [["cli"], ["optim"]], out


def test_plain_tensors_never_ask_for_the_sharded_class(monkeypatch):
    """Building and stepping an optimizer on plain tensors never reaches the sharded class (whose first use
    imports the sharding module); a DTensor parameter does (tests/distributed/test_plain_presets.py)."""
    import torch

    def fail(cls):
        raise AssertionError(f"sharded class asked for {cls.__name__} on plain tensors")

    monkeypatch.setattr(spectrakit.optim.Spectra, "_sharded_class", staticmethod(fail))
    p = torch.nn.Parameter(torch.randn(6, 4))
    for cls in (spectrakit.optim.SpectraAdamW, spectrakit.optim.Muon):
        opt = cls([p], lr=0.1)
        opt.add_param_group({"params": [torch.nn.Parameter(torch.randn(3))]})
        p.grad = torch.randn(6, 4)
        opt.step()
        assert type(opt) is cls


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
