"""Plain presets (``SpectraAdamW(model.parameters())``, no ``sharded(...)``) on FSDP2 parameters, 2 gloo
ranks: they take the sharded path themselves, equal to the single process and bit-identical to
``sharded(cls)``; a base that needs whole tensors raises a ValueError naming the layout and the fix."""

from __future__ import annotations

import os
import sys

import pytest
import torch

import spectrakit.optim as O
from spectrakit.distributed.launch import run_workers

from ..forked_ranks import fork_ranks

WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers.py")

pytestmark = pytest.mark.distributed

NAMES = ["SpectraAdamW", "SpectraSignum", "Muon"]


@pytest.fixture(scope="module")
def results():
    return run_workers(f"{WORKERS}:plain_fsdp_suite", 2, timeout=150)


@pytest.mark.parametrize("name", NAMES)
def test_plain_preset_under_fsdp2_matches_single_process(workers, results, name):
    model = workers.make_model()
    opt = getattr(O, name)(model.parameters(), **workers.OPT_KW[name])
    workers.train_steps(model, opt, 0, workers.STEPS)
    ref = {n: p.detach() for n, p in model.named_parameters()}
    for r in range(2):
        got = results[r][(name, "plain")]
        assert results[r][(name, "plain", "class")] == (True, True)
        for n in ref:
            torch.testing.assert_close(got[n], ref[n], rtol=0, atol=1e-5, msg=f"{name} rank {r} {n}")
            assert torch.equal(got[n], results[r][(name, "sharded")][n])  # same numbers as sharded(cls)
            assert torch.equal(got[n], results[0][(name, "plain")][n])  # ranks agree


def test_whole_tensor_base_names_layout_and_fix(results):
    msg = results[0]["mars"]
    assert msg.startswith("ValueError") and "Shard(0)" in msg and "DDP" in msg and "mars" in msg


ONLY_OPTIM = """
import sys, tempfile, torch, torch.distributed as dist
# forked from the fork server, which has imported parts of the distributed layer and of the training loop: out of
# the module table, so that any import of them below (which the check must catch) runs again and shows
for name in [m for m in sys.modules if m.startswith(("spectrakit.distributed", "spectrakit.train"))]:
    del sys.modules[name]
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from spectrakit.optim import SpectraAdamW

dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Tanh(), torch.nn.Linear(6, 4))
ref = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Tanh(), torch.nn.Linear(6, 4))
ref.load_state_dict(model.state_dict())
fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
opt, ref_opt = SpectraAdamW(model.parameters(), lr=0.05, c=0.5), SpectraAdamW(ref.parameters(), lr=0.05, c=0.5)
x = torch.randn(5, 8)
for _ in range(3):
    for m, o in ((model, opt), (ref, ref_opt)):
        m(x).square().sum().backward()
        o.step()
        o.zero_grad()
diff = max(float((p.full_tensor() - q).abs().max()) for p, q in zip(model.parameters(), ref.parameters()))
dist.destroy_process_group()
loaded = sorted(m for m in sys.modules if m.startswith(("spectrakit.distributed", "spectrakit.train")))
print(type(opt).__name__, type(ref_opt).__name__, diff, loaded)
"""


def test_plain_preset_takes_the_sharded_path_with_only_optim_imported(tmp_path):
    """The switch to the sharded step needs nothing but ``spectrakit.optim`` (no distributed layer loaded):
    one gloo rank, FSDP2 parameters, the same numbers as the plain optimizer on plain tensors. The process is
    forked from the fork server (torch imported once; ``fork_ranks``), its table of loaded modules emptied of
    the distributed layer and the training loop first."""
    script = tmp_path / "only_optim.py"
    script.write_text(ONLY_OPTIM)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out, _ = fork_ranks([sys.executable, str(script)], [env], str(tmp_path), timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    name, ref_name, diff, loaded = out.stdout.split(maxsplit=3)
    assert (name, ref_name) == ("ShardedSpectraAdamW", "SpectraAdamW")
    assert float(diff) == 0.0
    assert loaded.strip() == "[]"
