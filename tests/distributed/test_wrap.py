"""wrap_model without a process group, and the choice of FSDP2 units (multi-process wrapping is checked
in test_optimizer.py::test_wrap_model_modes)."""

from __future__ import annotations

import pytest
import torch

from spectrakit.distributed.wrap import default_fsdp_units, wrap_model


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Sequential(torch.nn.Linear(4, 4)),
                                           torch.nn.ModuleDict({"a": torch.nn.Linear(4, 4)})])
        self.head = torch.nn.Linear(4, 10)


def test_default_units_are_list_members_without_containers():
    net = Net()
    units = default_fsdp_units(net)
    assert units == [net.blocks[0], net.blocks[1]]
    assert default_fsdp_units(torch.nn.Linear(2, 2)) == []


@pytest.mark.parametrize("mode", ["none", "ddp", "fsdp2"])
def test_single_process_returns_model_unchanged(mode):
    net = Net()
    assert wrap_model(net, mode) is net


def test_errors():
    with pytest.raises(ValueError, match="mode must be one of"):
        wrap_model(Net(), "fsdp1")
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        wrap_model("net", "ddp")
