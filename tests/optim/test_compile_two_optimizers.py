"""Two or more compiled optimizers in one process (an eager and a compiled one, two models in one notebook):
SpectraAdamW, AdamW and Muon with a float lr and with a 0-d tensor lr, both orders, each lr changed at every
step (a scheduler), under ``torch.compile(opt.step, backend="aot_eager")``: no dynamo error, the same numbers
as the eager step, and no recompile storm (a bounded number of graphs). Each order runs in a fresh process,
as a user's session would."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import sys
import torch
import torch._dynamo as dynamo
from torch._dynamo.utils import counters
import spectrakit.optim as O

torch.set_num_threads(1)
order = sys.argv[1]


def make(name, tensor_lr):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
    lr = torch.tensor(1e-3) if tensor_lr else 1e-3
    kw = {} if name == "Muon" else {"weight_decay": 0.1}
    params = [p for p in m.parameters() if p.ndim == 2] if name == "Muon" else m.parameters()
    return m, getattr(O, name)(params, lr=lr, **kw)


def run(m, opt, step, k):
    for g in opt.param_groups:
        if isinstance(g["lr"], torch.Tensor):
            g["lr"].fill_(1e-3 * (k + 1))
        else:
            g["lr"] = 1e-3 * (k + 1)
    torch.manual_seed(100 + k)
    m(torch.randn(4, 16)).square().mean().backward()
    step()
    opt.zero_grad()


for name in ("SpectraAdamW", "AdamW", "Muon"):
    for tensor_lr in ((False, True) if order == "float-first" else (True, False)):
        before = counters["stats"]["unique_graphs"]
        m, opt = make(name, tensor_lr)
        ref_m, ref = make(name, tensor_lr)
        step = torch.compile(opt.step, backend="aot_eager")
        for k in range(5):
            run(m, opt, step, k)
            run(ref_m, ref, ref.step, k)
        for p, q in zip(m.parameters(), ref_m.parameters()):
            assert torch.allclose(p, q, rtol=0, atol=1e-6), (name, tensor_lr)
        graphs = counters["stats"]["unique_graphs"] - before
        assert graphs <= 3, (name, tensor_lr, graphs)
        print(name, "tensor" if tensor_lr else "float", graphs, flush=True)
print("ok")
"""


@pytest.mark.parametrize("order", ["float-first", "tensor-first"])
def test_float_and_tensor_lr_optimizers_compile_in_one_process(order, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, order], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr[-3000:]
